"""A user's workload compared with itself on one device: the verdict of one spec, and when it
diverges, where first and why (pytest side: plain data in, plain data out, no TensorFlow).

The reference is differential: the workload's own step with no strategy on the global batch
(suite/engine/probes/workload.py). A spec passes when after every step its reported loss, every
replica's copy of every model and optimizer variable, and every metric equal the reference's
within the tolerance, and the replicas' copies equal each other. Variables are compared by
their change since the common initial value, norm-wise (``|got - expected| <= rtol x
|expected - initial| + atol x sqrt(size)``): a mistake moves a whole update (a factor of the
replica count, a missing term), rounding moves a few low bits.

At the first step that diverges, ``diagnose`` matches the evidence against the catalogue
(causes.py, ``CAUSES``): ratios of the loss, of the summed gradients and of a metric to the replica count,
the examples each replica saw, the weight penalty, the gradients' norms on each replica, and
what the engine saw of the workload (the loss object's reduction, BatchNormalization layers,
variables created outside the scope, an optimizer built in the first step).
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from ...common.results import (
    FACTORY_RAISED,
    SCRIPT_RAISED,
    Raised,
    optimizer_built_lazily,
    optimizer_slots_made_in_the_step,
)
from ..verdict import deviations
from ..verdict.quantity import Quantity
from ..verdict.signatures import Seen
from .causes import CAUSES

RTOL = 1e-4
ATOL = 1e-7
RATIO_SLACK = 0.05  # a measured ratio "is" N when within 5% of it


# What a spec's verdict says, and what the user does about it (docs/check.md):
STATUSES = {
    "PASS": "the spec trains what one device trains",
    "FAIL": "the loop is wrong here (or something no known deviation explains): cause, evidence, fix",
    "DEVIATION": "the loop is right; TensorFlow/Keras computes something else, as a known deviation predicts",
    "BLOCKED": "the loop is right but cannot train on this spec with these versions: a known deviation raises",
    "ERROR": "the suite could not run the spec (the engine failed or timed out)",
    "RANDOM": "the step draws random numbers of its own: one device and the replicas cannot draw the same numbers, "
              "so their runs cannot be compared value for value (neither right nor wrong is known)",
}


ROLES = ("loss", "variable", "optimizer variable", "metric", "replicas")


@dataclasses.dataclass(frozen=True)
class Compared:
    """One quantity the loop check compares, by field (``role``: one of ROLES; ``replicas``: a
    variable's copy on ``replica`` against replica 0's); its text is for display and for the
    deviations' text signatures, never parsed back."""

    role: str
    name: str = ""  # the variable's, optimizer variable's or metric's; a loss's model in a workload of several
    replica: int | None = None

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"Compared role {self.role!r}: one of {ROLES}")

    def __str__(self) -> str:
        """As the report shows it: ``loss``, ``loss MODEL``, ``NAME (replica R)``, ``optimizer NAME
        (replica R)``, ``metric NAME``, ``NAME: replica R against replica 0``."""
        if self.role == "loss":
            return f"loss {self.name}" if self.name else "loss"
        if self.role == "metric":
            return f"metric {self.name}"
        if self.role == "replicas":
            return f"{self.name}: replica {self.replica} against replica 0"
        prefix = "optimizer " if self.role == "optimizer variable" else ""
        return f"{prefix}{self.name} (replica {self.replica})"

    def asked(self, step: int) -> Quantity:
        """The quantity after ``step`` as the deviations ledger is asked of it: ``loss``, ``variable
        NAME (replica R)``, ``optimizer variable NAME (replica R)``, ``metric NAME``, ``variable NAME:
        replica R against replica 0``, then `` after step K``; its fields are the role, the name,
        the replica and the step."""
        if self.role in ("loss", "metric"):
            text = str(self)
        elif self.role == "optimizer variable":
            text = f"optimizer variable {self.name} (replica {self.replica})"
        else:  # a variable, or its copies against replica 0's
            text = f"variable {self}"
        fields = {"name": self.name, "step": step, **({} if self.replica is None else {"replica": self.replica})}
        return Quantity.of(self.role, f"{text} after step {step}", **fields)

    @property
    def of_variable(self) -> bool:
        """A model variable's value or its copies' agreement (not the optimizer's state, a loss or a metric)."""
        return self.role in ("variable", "replicas")


@dataclasses.dataclass
class Mismatch:
    step: int
    what: Compared
    got: float | str
    expected: float | str
    relative: float  # |got - expected| over the scale the tolerance is relative to
    ratio: float | None = None  # got / expected (scalars), or the update's projection (variables)

    @property
    def quantity(self) -> str:
        return str(self.what)

    @property
    def role(self) -> str:
        return self.what.role

    def as_json(self) -> dict:
        return {"step": self.step, "quantity": self.quantity, "got": self.got, "expected": self.expected,
                "relative": self.relative, "ratio": self.ratio}

    def line(self) -> str:
        ratio = f", ratio {self.ratio:.4g}" if self.ratio is not None and math.isfinite(self.ratio) else ""
        return f"{self.quantity}: got {_num(self.got)}, expected {_num(self.expected)} " \
               f"(relative difference {self.relative:.3g}{ratio})"


@dataclasses.dataclass
class Diagnosis:
    cause: str
    evidence: list
    model: str = ""  # the model (and its optimizer) it concerns, in a workload of several

    @property
    def title(self) -> str:
        return f"{self.model}: {CAUSES[self.cause].title}" if self.model else CAUSES[self.cause].title

    @property
    def fix(self) -> str:
        return CAUSES[self.cause].fix


@dataclasses.dataclass
class Verdict:
    spec: str
    replicas: int
    status: str  # STATUSES
    steps: int = 0  # steps compared
    agreed: int = 0  # steps that agreed before the first divergence
    worst: float = 0.0  # largest relative difference seen in agreeing steps
    seconds: float = 0.0  # the spec's run (its engine's start not included)
    start_seconds: float = 0.0  # the engine's start, when this check started it
    mismatches: list = dataclasses.field(default_factory=list)  # at the first diverging step
    diagnoses: list = dataclasses.field(default_factory=list)
    error: str | None = None
    deviations: list = dataclasses.field(default_factory=list)  # [[deviation id, evidence]] of what they explained
    notes: list = dataclasses.field(default_factory=list)  # what the control showed, where it did not decide

    @property
    def deviation(self) -> list | None:
        """The first known deviation the verdict names, ``[id, evidence]``, or None."""
        return self.deviations[0] if self.deviations else None

    @property
    def first_step(self) -> int | None:
        return self.mismatches[0].step if self.mismatches else None

    def as_json(self) -> dict:
        return {"spec": self.spec, "replicas": self.replicas, "status": self.status, "steps": self.steps,
                "agreed_steps": self.agreed, "worst_relative_difference": self.worst, "seconds": round(self.seconds, 2),
                "engine_start_seconds": round(self.start_seconds, 2),
                "first_diverging_step": self.first_step, "error": self.error,
                "known_deviations": [{"id": i, "evidence": e} for i, e in self.deviations], "notes": self.notes,
                "mismatches": [m.as_json() for m in self.mismatches],
                "diagnoses": [{"cause": d.cause, "model": d.model, "title": d.title, "evidence": d.evidence, "fix": d.fix}
                              for d in self.diagnoses]}


def _summary(entry, limit: int = 420) -> str:
    """A deviation's summary on one line, cut after its last whole sentence within ``limit``."""
    text = " ".join(entry.summary.split())
    if len(text) <= limit:
        return text
    cut = text[:limit].rfind(". ")
    return text[:cut + 1] if cut > 0 else text[:limit] + " ..."


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def short_error(message: str, limit: int = 220) -> str:
    """A TensorFlow error without its traceback lines: graph errors repeat the Python stack
    ("File ..., line N, in f") before what went wrong."""
    message = ANSI.sub("", message)  # Keras' bold/reset codes: noise outside a terminal
    tail = re.split(r'File "[^"]*", line \d+, in \S+', message)[-1].strip()
    tail = re.sub(r"\[\[\{\{node [^]]*\]\]|\[Op:[^]]*\]", "", tail).strip(" .")
    return tail[:limit] if tail else message[:limit]


def _num(x) -> str:
    return f"{x:.7g}" if isinstance(x, float) else str(x)


def _norm(x) -> float:
    return float(np.linalg.norm(np.asarray(x, np.float64).ravel()))


# -- combining a cluster's replies -------------------------------------------------------------
def stitch(runs: list):
    """One run of every replica from the replies of a spec's processes (each holds its local
    replicas): per step the replica lists concatenated in worker order."""
    first = runs[0]
    if len(runs) == 1:
        return first
    count = min(len(r.steps) for r in runs)
    # a custom train_step under fit: each worker's loss per model is its own replicas' (what they took gradients
    # of; fit reduces no loss the script gives), so the cluster's is their sum; a loss the script reduced is global
    local = first.facts.get("step_mode") == "fit"
    steps = []
    for k in range(count):
        parts = [r.steps[k] for r in runs]
        grads = None if any(p.gradients is None for p in parts) else [g for p in parts for g in p.gradients]
        named = None if any(p.named is None for p in parts) else {
            name: {**value, "replicas": [v for p in parts for v in p.named[name]["replicas"]],
                   **({"loss": sum(p.named[name]["loss"] for p in parts)} if local else {})}
            for name, value in parts[0].named.items()}
        steps.append(dataclasses.replace(
            parts[0], loss=sum(v["loss"] for v in named.values()) if local and named else parts[0].loss,
            replica_losses=[v for p in parts for v in p.replica_losses], rows=[v for p in parts for v in p.rows],
            weights=None if any(p.weights is None for p in parts) else [v for p in parts for v in p.weights],
            variables=[[c for p in parts for c in p.variables[i]] for i in range(len(parts[0].variables))],
            optimizer=[[c for p in parts for c in p.optimizer[i]] for i in range(len(parts[0].optimizer))],
            gradients=grads, named=named))
    raised = next((r.raised for r in runs if r.raised is not None), None)
    masks = None if first.masks is None else [m for r in runs for m in (r.masks or [])]
    return dataclasses.replace(first, steps=steps, raised=raised, masks=masks, facts={**first.facts, "workers": len(runs)},
                               local_replica_ids=[i for r in runs for i in r.local_replica_ids])


# -- repeatability of the reference ------------------------------------------------------------
def first_difference(a, b) -> str | None:
    """Where two runs of the reference first differ bit for bit (None: they repeat exactly)."""
    if (a.raised is None) != (b.raised is None):
        return "one run raised and the other did not"
    for k, (sa, sb) in enumerate(zip(a.steps, b.steps), 1):
        for name, va, vb in zip(a.names, sa.variables, sb.variables):
            if not np.array_equal(va[0], vb[0]):
                return f"variable {name} after step {k} (largest difference {_largest(va[0], vb[0]):.3g})"
        for name, va, vb in zip(a.optimizer_names, sa.optimizer, sb.optimizer):
            if not np.array_equal(va[0], vb[0]):
                return f"optimizer variable {name} after step {k} (largest difference {_largest(va[0], vb[0]):.3g})"
        if sa.loss != sb.loss:
            return f"the loss of step {k} ({sa.loss!r} then {sb.loss!r})"
        for name in sa.metrics:
            if sa.metrics[name] != sb.metrics.get(name):
                return f"metric {name} after step {k}"
    if len(a.steps) != len(b.steps):
        return f"the number of steps ({len(a.steps)} then {len(b.steps)})"
    return None


def first_non_finite(run) -> str | None:
    """The first quantity of a run that is NaN or infinite, and its step (None: all finite)."""
    def bad(value) -> str | None:
        try:
            a = np.asarray(value, np.float64)
        except (TypeError, ValueError):
            return None  # not numbers (a metric's other result)
        if np.isnan(a).any():
            return "NaN"
        return "infinite" if np.isinf(a).any() else None

    for k, step in enumerate(run.steps, 1):
        for kind, names, values in (("variable", run.names, step.variables),
                                    ("optimizer variable", run.optimizer_names, step.optimizer)):
            for name, copies in zip(names, values):  # every local replica's copy
                what = next((b for b in map(bad, copies) if b), None)
                if what:
                    return f"{kind} {name} is {what} after step {k}"
        if step.loss is not None and bad(step.loss):
            return f"the loss of step {k} is {bad(step.loss)}"
        for name, value in step.metrics.items():
            if value is not None and bad(value):
                return f"metric {name} is {bad(value)} after step {k}"
    return None


def _largest(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) if np.size(a) else 0.0


# -- the comparison ----------------------------------------------------------------------------
def _scalar(step, quantity, got, expected, rtol, atol):
    err = abs(got - expected)
    scale = abs(expected)
    rel = err / scale if scale else (0.0 if err == 0 else math.inf)
    ok = err <= rtol * scale + atol
    return ok, rel, Mismatch(step, quantity, float(got), float(expected), rel, got / expected if expected else None)


def _array(step, quantity, got, expected, base, rtol, atol):
    got = np.asarray(got, np.float64)
    expected = np.asarray(expected, np.float64)
    if got.shape != expected.shape:
        return False, math.inf, Mismatch(step, quantity, f"shape {list(got.shape)}", f"shape {list(expected.shape)}",
                                         math.inf)
    moved = expected - base
    err, scale = _norm(got - expected), _norm(moved)
    rel = err / scale if scale else (0.0 if err == 0 else math.inf)
    ok = err <= rtol * scale + atol * math.sqrt(max(got.size, 1))
    ratio = float(np.vdot(got - base, moved) / np.vdot(moved, moved)) if scale else None
    shown_got = f"{got.dtype.name}{list(got.shape)} |x - initial| = {_norm(got - base):.6g}"
    shown_exp = f"|x - initial| = {scale:.6g}"
    if got.size == 1:
        shown_got, shown_exp = float(got.ravel()[0]), float(expected.ravel()[0])
    return ok, rel, Mismatch(step, quantity, shown_got, shown_exp, rel, ratio)


def compare(ref, dist, rtol: float = RTOL, atol: float = ATOL, metrics: bool = True, judge=None,
            explained: list | None = None, control=None):
    """(agreeing steps, worst relative difference while agreeing, mismatches of the first
    diverging step); compares as many steps as both ran (``metrics=False``: not the metrics).
    ``judge(quantity, got, expected, given, same)``: the known deviation that explains a
    difference (``Ledger.judge``), or None; an explained difference is no mismatch, and is listed
    in ``explained`` as ``(entry id, line)``. ``control``: the suite's known-right step trained
    on the same spec (usercheck's control): its value of each quantity is what a deviation
    model of the rule TensorFlow follows instead is handed (``given["alternative"]``)."""
    worst = 0.0
    zero_opt = [np.zeros_like(np.asarray(v[0], np.float64)) for v in (ref.steps[0].optimizer if ref.steps else [])]
    increments = _metric_increments(ref)
    facts = {f: dist.facts.get(f) for f in CONDITION_FACTS}  # what a deviation's condition reads
    for k, (r, d) in enumerate(zip(ref.steps, dist.steps), 1):
        found, rels = [], []
        c = control.steps[k - 1] if control is not None and k <= len(control.steps) else None

        def take(result, raw, same, given=None, found=found, rels=rels, k=k):
            ok, rel, mismatch = result
            if ok:
                rels.append(rel)
                return
            entry = judge(mismatch.what.asked(k), raw[0], raw[1], given, same) \
                if judge is not None else None
            if entry is None:
                found.append(mismatch)
            elif explained is not None:
                explained.append((entry.id, f"{mismatch.quantity} after step {k}: got {_num(mismatch.got)}, one "
                                            f"device {_num(mismatch.expected)}, as known deviation {entry.id} predicts"))

        spread = c is not None and any(not np.allclose(np.asarray(copy, np.float64), np.asarray(copies[0], np.float64),
                                                       rtol=rtol, atol=0.0)
                                       for copies in c.variables for copy in copies[1:])

        def alternative(value, c=c, spread=spread, facts=facts):
            return facts if c is None else {"alternative": value, "control_copies_differ": spread, **facts}

        if r.named and d.named:  # a loss per model: each compared on its own
            for name, value in r.named.items():
                got = d.named.get(name, {}).get("loss", math.nan)
                take(_scalar(k, Compared("loss", name), got, value["loss"], rtol, atol), (got, value["loss"]),
                     _same(rtol, atol))
        else:
            tracker = _mean_of(ref, "loss")  # fit's logged loss: its loss tracker's result
            take(_scalar(k, Compared("loss"), d.loss, r.loss, rtol, atol), (d.loss, r.loss), _same(rtol, atol),
                 {**facts, "kind": "mean", "increments": increments[tracker][:k]} if tracker in increments
                 else alternative(c.loss if c else None))
        for i, (name, init, rv, dv) in enumerate(zip(ref.names, ref.initial, r.variables, d.variables)):
            for rep, copy in enumerate(dv):
                want = rv[rep] if len(rv) == len(dv) else rv[0]  # replica by replica where ``ref`` ran on as many
                take(_array(k, Compared("variable", name, rep), copy, want, init, rtol, atol), (copy, want),
                     _same_array(init, rtol, atol), alternative(c.variables[i][rep] if c else None))
        prev = ref.steps[k - 2].optimizer if k > 1 else None
        for i, (name, rv, dv) in enumerate(zip(ref.optimizer_names, r.optimizer, d.optimizer)):
            base = np.asarray(prev[i][0], np.float64) if prev is not None else zero_opt[i]
            for rep, copy in enumerate(dv):
                want = rv[rep] if len(rv) == len(dv) else rv[0]
                take(_array(k, Compared("optimizer variable", name, rep), copy, want, base, rtol, atol), (copy, want),
                     _same_array(base, rtol, atol),
                     alternative(c.optimizer[i][rep] if c and i < len(c.optimizer) else None))
        for name, value in (r.metrics if metrics else {}).items():
            mean = _mean_of(ref, name)
            upto = None if name.startswith("evaluate ") else k  # an evaluate's batches are its own
            given = {**facts, "kind": "mean", "increments": increments[mean][:upto],
                     **_copies(dist, mean, k if upto else -1)} if mean in increments else facts
            got = d.metrics.get(name, math.nan)
            take(_scalar(k, Compared("metric", name), got, value, rtol, atol), (got, value), _same(rtol, atol), given)
        for i, (name, init, rv, dv) in enumerate(zip(ref.names, ref.initial, r.variables, d.variables)):
            if len(rv) == len(dv) > 1:
                continue  # ``ref`` ran on as many replicas: compared replica by replica above
            for rep, copy in enumerate(dv[1:], 1):  # the replicas against each other
                ok, rel, m = _array(k, Compared("replicas", name, rep), copy, dv[0], init, rtol, atol)
                if not ok:
                    take((ok, rel, m), (copy, dv[0]), _same_array(init, rtol, atol),
                         alternative(c.variables[i][rep] if c else None))
        if found:
            return k - 1, worst, found
        worst = max([worst] + [x for x in rels if math.isfinite(x)])
    return min(len(ref.steps), len(dist.steps)), worst, []


# what the engine saw of the workload that a deviation's condition may read (signatures.CONDITIONS)
CONDITION_FACTS = ("optimizer_clips", "optimizer_built", "optimizer_variables_before_step", "optimizer_variables_after",
                   "steps_per_execution", "step_mode", "fit_first_split")


def _same_array(base, rtol: float, atol: float):
    """The comparison's norm-wise equality of a variable (its change since ``base``), for a
    deviation's predicted value."""
    def same(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            return False
        return _norm(a - b) <= rtol * _norm(b - np.asarray(base, np.float64)) + atol * math.sqrt(max(a.size, 1))
    return same


def _same(rtol: float, atol: float):
    """The comparison's own equality, for a deviation's predicted value."""
    def same(a, b):
        try:
            a, b = float(a), float(b)
        except (TypeError, ValueError):
            return a == b
        return abs(a - b) <= rtol * abs(b) + atol
    return same


def _mean_of(ref, quantity: str) -> str | None:
    """The metric of ``ref`` whose (total, count) state a compared ``quantity`` is the result of: a
    metric of that state itself; fit's log ``fit NAME``, the script's metric named NAME
    (``model.metrics[NAME]``); fit's logged ``loss``, its loss tracker (``...[loss]``). None: no
    Mean-like metric's."""
    states = ref.facts.get("metric_states") or {}
    if sorted(states.get(quantity, ())) == ["count", "total"] or (
            quantity.startswith("evaluate ") and quantity in (ref.facts.get("metric_state_values") or {})):
        return quantity  # (an evaluate's result: its metric's state read at its start and after each batch)
    if ref.facts.get("step_mode") != "fit" or not (quantity == "loss" or quantity.startswith("fit ")):
        return None
    name = quantity.removeprefix("fit ")
    return next((m for m, st in states.items() if m.endswith(f"[{name}]") and sorted(st) == ["count", "total"]), None)


def _copies(dist, metric: str, k: int) -> dict:
    """What a deviation's model of per-replica metric state reads of the run: ``replica_states``, each
    local replica's own copy of ``metric``'s (total, count) after step ``k`` (-1: an evaluate's, at its end; the engine's
    ``metric_replica_states``), and ``replica``, the copy a read in cross-replica context returns (the
    first local one); nothing where the engine read no copies."""
    copies = (dist.facts.get("metric_replica_states") or {}).get(metric)
    if not copies or k >= len(copies):
        return {}
    return {"replica_states": [tuple(c) for c in copies[k]], "replica": 0}


def _metric_increments(ref) -> dict:
    """Each metric's per-step increments of a (total, count) state on one device: the changes of
    its state where the engine read it at every boundary (``metric_state_values``: a script's
    Mean-like metrics), else count, the step's examples; total, result x count, less what came before."""
    out = {}
    states = ref.facts.get("metric_state_values") or {}
    for name in dict.fromkeys(n for st in ref.steps for n in st.metrics):  # (an evaluate's: the last step's only)
        kept = states.get(name)
        evaluated = name.startswith("evaluate ")  # the evaluate after fit: its own batches' increments, all of them
        if kept and (evaluated or len(kept) > len(ref.steps)):
            changes = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(kept, kept[1:])]
            out[name] = changes if evaluated else changes[:len(ref.steps)]
            continue
        if any(name not in r.metrics for r in ref.steps):
            continue  # a value some step has not: no increments of every step
        total = count = 0.0
        out[name] = []
        for r in ref.steps:
            new_count = count + sum(r.rows)
            new_total = r.metrics[name] * new_count
            out[name].append((new_total - total, new_count - count))
            total, count = new_total, new_count
    return out


# -- the diagnosis -----------------------------------------------------------------------------
def _one_replicas_value(dist, metric: str, k: int):
    """``(j, values)`` where a mean metric's value after step ``k`` is the mean over the steps of
    replica j's values of what the script read with ``experimental_local_results`` (the last read
    of each step), not the mean of their sums; else None."""
    reads = (dist.facts.get("local_reads") or [])[:k]
    states = sorted(dist.facts.get("metric_states", {}).get(metric, ()))
    if len(reads) < k or not all(reads) or states != ["count", "total"] or dist.replicas < 2:
        return None
    last = [step[-1] for step in reads]
    got = dist.steps[k - 1].metrics.get(metric)
    if got is None or any(len(values) != len(last[0]) for values in last) or len(last[0]) < 2:
        return None
    if _exactly(got, sum(sum(values) for values in last) / k):
        return None
    for j in range(len(last[0])):
        series = [values[j] for values in last]
        if _exactly(got, sum(series) / k):
            return j, series
    return None


def _is(x, target) -> bool:
    return x is not None and math.isfinite(x) and target > 0 and abs(x - target) <= RATIO_SLACK * target


def _grad_evidence(r, d):
    """(ratio of the replicas' summed gradients to the reference's, projected; their cosine;
    each replica's global gradient norm; the reference's norm), or None without gradients."""
    if r.gradients is None or d.gradients is None or not r.gradients or not d.gradients:
        return None
    ref = [np.asarray(g, np.float64) for g in r.gradients[0]]
    summed = [sum(np.asarray(rep[i], np.float64) for rep in d.gradients) for i in range(len(ref))]
    dot = sum(float(np.vdot(a, b)) for a, b in zip(summed, ref))
    nr = math.sqrt(sum(_norm(g) ** 2 for g in ref))
    ns = math.sqrt(sum(_norm(g) ** 2 for g in summed))
    if not nr or not ns:
        return None
    norms = [math.sqrt(sum(_norm(g) ** 2 for g in rep)) for rep in d.gradients]
    return dot / nr ** 2, dot / (nr * ns), norms, nr


def _exactly(x, target) -> bool:
    """``x`` equals ``target`` within float32 rounding of a few sums (1e-4 relative)."""
    return x is not None and target is not None and math.isfinite(x) and abs(x - target) <= 1e-4 * abs(target)


def _replica_grad_evidence(r, d):
    """(every replica's gradients equal one device's summed-batch gradients, the replicas'
    gradients equal each other's, their global norms equal), each within 1e-3 relative."""
    ref = [np.asarray(g, np.float64) for g in r.gradients[0]]
    reps = [[np.asarray(g, np.float64) for g in rep] for rep in d.gradients]

    def close(a, b):
        scale = math.sqrt(sum(_norm(x) ** 2 for x in b)) or 1.0
        return math.sqrt(sum(_norm(x - y) ** 2 for x, y in zip(a, b))) <= 1e-3 * scale

    norms = [math.sqrt(sum(_norm(g) ** 2 for g in rep)) for rep in reps]
    return (all(close(rep, ref) for rep in reps), all(close(rep, reps[0]) for rep in reps[1:]),
            max(norms) - min(norms) <= 1e-3 * max(norms))


def _same_batches_on_every_worker(d, workers: int) -> bool:
    """Whether each worker's replicas returned exactly worker 0's losses and gradients (the same
    examples: distinct examples give the same float only by chance)."""
    per = len(d.replica_losses) // workers
    if per < 1 or any(d.replica_losses[w * per:(w + 1) * per] != d.replica_losses[:per] for w in range(1, workers)):
        return False
    return d.gradients is None or all(all(np.array_equal(a, b) for a, b in zip(d.gradients[w * per + i], d.gradients[i]))
                                      for w in range(1, workers) for i in range(per))


LOSS_REDUCTIONS_THAT_AVERAGE = ("sum_over_batch_size", "auto", "Reduction.AUTO", "Reduction.SUM_OVER_BATCH_SIZE")


def _group(run, name: str, offset: int, count: int):
    """``run`` as the diagnosis of one model and its optimizer sees it, in a workload of several: the
    gradients of that optimizer, the loss the step returned for that model and its weight penalty."""
    def step(st):
        named = (st.named or {}).get(name)
        return dataclasses.replace(
            st, gradients=None if st.gradients is None else [rep[offset:offset + count] for rep in st.gradients],
            **({"loss": named["loss"], "replica_losses": list(named["replicas"]),
                "regularization": named["regularization"], "named": None} if named else
               {"loss": math.nan, "replica_losses": [math.nan] * len(st.replica_losses), "named": None}))
    return dataclasses.replace(run, steps=[step(st) for st in run.steps],
                               facts={**run.facts, "gradient_groups": None})


def _per_model(ref, dist, mismatches: list, global_batch: int) -> list[Diagnosis]:
    """The causes of each model of several, each from its own optimizer's gradients, the loss the
    step returned for it and the differences of its own variables and optimizer state; a cause is
    named with the model (``generator: loss averaged per replica``)."""
    out, offset = [], 0
    outside = dist.facts.get("outside_scope") or []
    if mismatches and all(m.role == "metric" for m in mismatches):
        # only metrics differ, and no metric is any one model's: judged as one model's metrics are
        return diagnose(ref, dataclasses.replace(dist, facts={**dist.facts, "gradient_groups": None, "models": None}),
                        mismatches, global_batch)
    for name, count in dist.facts["gradient_groups"]:
        mine = [m for m in mismatches if (m.what.name == name if m.role == "loss"
                                          else m.role != "metric" and m.what.name.startswith(f"{name}/"))]
        if mine:
            found = diagnose(_group(ref, name, offset, count), _group(dist, name, offset, count), mine, global_batch)
            out.extend(dataclasses.replace(d, model=name) for d in found)
        theirs = [q for q in outside if q.removeprefix("optimizer: ").startswith(f"{name}/")]
        if theirs and not any(d.model == name and d.cause == "created_outside_scope" for d in out):
            # a mistake whether or not this spec's numbers show it (as for one model)
            shown = ", ".join(theirs[:4]) + (" ..." if len(theirs) > 4 else "")
            out.append(Diagnosis("created_outside_scope", [f"not created in the strategy's scope: {shown}"], model=name))
        offset += count
    # a metric of no model at one over the replica count, exactly, while every model's loss agrees: what a Mean
    # fed each replica's scaled loss shows, whatever else differs (the variables, where Keras < 3.5 applies each
    # replica's own gradients); a metric that differs otherwise is no cause's evidence
    n, metrics = dist.replicas, [m for m in mismatches if m.role == "metric"]
    if n > 1 and metrics and not any(m.role == "loss" for m in mismatches):
        exact = next((m for m in metrics if m.ratio is not None and abs(m.ratio * n - 1) <= 1e-4), None)
        if exact is not None:
            out.append(Diagnosis("metric_fed_scaled_loss", [f"{exact.quantity} after step {exact.step} is "
                                                            f"{exact.ratio:.7g} of one device's (1/{n} for {n} replicas) "
                                                            "while every model's loss agrees"]))
    return out


# what raises where an optimizer's slots are made inside the distributed step: Keras 3 under
# collectives (the placeholder its lazy build leaves in the step's cond), Keras 2 (the slot's scope);
# another raise of a step with an unbuilt optimizer (a collective's timeout) is not that cause
_SLOT_ERRORS = ("You must feed a value for placeholder tensor", "slot variable")


def diagnose(ref, dist, mismatches: list, global_batch: int) -> list[Diagnosis]:
    """The catalogued causes the evidence of the first diverging step supports (first the
    strongest); empty when none does. In a workload of several models and optimizers, each model's
    (``_per_model``)."""
    several = len(dist.facts.get("gradient_groups") or ()) > 1 or len(dist.facts.get("models") or ()) > 1
    if several and dist.facts.get("gradient_groups") and dist.raised is None:
        return _per_model(ref, dist, mismatches, global_batch)
    n = dist.replicas
    facts = dist.facts
    out: list[Diagnosis] = []

    def add(cause, *evidence):
        if cause not in [d.cause for d in out]:
            out.append(Diagnosis(cause, list(evidence)))

    if facts.get("outside_scope"):
        shown = ", ".join(facts["outside_scope"][:4]) + (" ..." if len(facts["outside_scope"]) > 4 else "")
        add("created_outside_scope", f"not created in the strategy's scope: {shown}")
    before, after = facts.get("optimizer_variables_before_step"), facts.get("optimizer_variables_after")
    lazy = optimizer_slots_made_in_the_step(facts)
    undistributed = facts.get("undistributed_inputs") or {}
    if n > 1 and undistributed and mismatches:  # a script's batch passed whole to every replica: the root cause
        where, shape = next(iter(undistributed.items()))
        k = mismatches[0].step
        r, d = ref.steps[k - 1], dist.steps[k - 1]
        returned = sum(d.replica_losses) / r.loss if r.loss and d.replica_losses else None
        add("batch_not_distributed", f"at {where} the script passed strategy.run a batch of shape {shape} that is no "
                                     f"distributed dataset's element: each of the {n} replicas got all of it",
            *([f"the losses the replicas returned in step {k} sum to {returned:.4g} x one device's ({n}, the replica "
               "count)"] if returned is not None else []))
        return out
    if dist.raised is not None:
        message = dist.raised.message
        if "Reduction" in message and ("SUM" in message or "NONE" in message) and "strategy" in message.lower():
            add("keras_loss_reduction", f"{dist.raised.where} raised {dist.raised.type}: {short_error(message)}")
        if optimizer_built_lazily(facts) and any(m in message for m in _SLOT_ERRORS):
            add("lazy_optimizer_build", f"the optimizer was not built when the first step began ({before} variables: "
                                        f"no slots yet), and {dist.raised.where} raised {dist.raised.type}: "
                                        f"{short_error(message)}")
        return out
    if dist.masks and len(dist.masks) > 1 and facts.get("random_layers"):
        if all(np.array_equal(m, dist.masks[0]) for m in dist.masks[1:]):
            add("identical_dropout_masks",
                f"the model's random layers ({', '.join(facts['random_layers'])}) in training mode gave every one of "
                f"the {len(dist.masks)} replicas the same output for the same input: the same random draws")
    if not mismatches:
        return out
    k = mismatches[0].step
    r, d = ref.steps[k - 1], dist.steps[k - 1]
    rows_ref, rows = sum(r.rows), sum(d.rows)
    if rows != rows_ref:
        if rows * n == rows_ref:
            add("per_replica_batch_size", f"step {k} gave the {n} replicas {rows} examples in all ({d.rows}), one device "
                                          f"{rows_ref}: the dataset's batches are the per-replica size, {n}x too small")
        else:
            add("per_replica_batch_size", f"step {k} gave the replicas {rows} examples ({d.rows}), one device {rows_ref}")
        return out
    # named where the lazily made slots did what such slots do: differ between the replicas; not for a slot
    # that differs from one device's, which rounding of a split batch (TensorFlow's custom-training tutorial
    # under multi_worker:2x1) or other data (its multi-worker tutorial's per-worker shuffles) also give
    if lazy and any(m.role == "replicas" for m in mismatches):
        add("lazy_optimizer_build", f"the optimizer had {before} variables when the first step began and {after} "
                                    "after it: its slots were created inside strategy.run")
    loss_ratio = d.loss / r.loss if r.loss else None
    returned = sum(d.replica_losses)
    returned_ratio = returned / r.loss if r.loss else None
    roles = {m.role for m in mismatches}
    only_metrics = roles == {"metric"}
    if only_metrics:
        for m in mismatches:
            one = _one_replicas_value(dist, m.what.name, k)
            if one is not None:
                j, series = one
                add("metric_from_one_replica", f"{m.quantity} after step {k} is {m.got}, the mean of replica {j}'s "
                                               f"values {[round(v, 7) for v in series]} that the script read with "
                                               f"experimental_local_results, not of all {n} replicas' (one device: "
                                               f"{m.expected})")
            elif _is(m.ratio, 1 / n):
                add("metric_fed_scaled_loss", f"{m.quantity} after step {k} is {m.ratio:.4g} of one device's "
                                              f"(1/{n} for {n} replicas) while the loss and every variable agree")
        return out
    reduction = str(facts.get("loss_object_reduction") or "")
    # the data loss's ratio: what the replicas' steps returned, summed, against one device's, the
    # weight penalty taken out of both (a correctly scaled penalty sums to one device's)
    reg = r.regularization or 0.0
    data_ratio = (returned - reg) / (r.loss - reg) if r.loss - reg else None
    grads = _grad_evidence(r, d)
    ratio = cosine = None
    evidence = [f"the losses the {n} replicas' steps returned sum to {data_ratio:.4g} x one device's"
                + (" (the weight penalty taken out of both)" if reg else "")] if data_ratio is not None else []
    if grads is not None:
        ratio, cosine, norms, ref_norm = grads
        evidence.append(f"the gradients they handed to apply_gradients sum to {ratio:.4g} x one device's "
                        f"(cosine {cosine:.6f})")
    # each cause is named only when every observation it predicts holds: the returned losses'
    # ratio, the summed gradients' ratio, and how each replica's gradients relate to one device's
    # and to each other's (unknown gradients contradict nothing, but predict nothing either)
    each = _replica_grad_evidence(r, d) if grads is not None else None
    grads_agree = grads is None or (_is(ratio, 1.0) and cosine > 0.99)
    # what each replica's step returned, its share of the weight penalty taken out: had each divided
    # by its own examples (or weights), those shares weighted by the examples (weights) would be
    # one device's loss exactly
    shares = [x - reg / n for x in d.replica_losses]
    data_ref = r.loss - reg
    by_rows = sum(x * rows for x, rows in zip(shares, d.rows)) / sum(d.rows) if sum(d.rows) else None
    by_weights = (sum(x * w for x, w in zip(shares, d.weights)) / sum(d.weights)
                  if d.weights and sum(d.weights) else None)
    grads_follow = grads is None or (cosine > 0.99 and data_ratio and abs(ratio - data_ratio) <= RATIO_SLACK * data_ratio)
    if n > 1 and not _is(data_ratio, 1.0) and _exactly(by_weights, data_ref) and grads_follow:
        add("weighted_loss_normalized_per_replica", *evidence,
            f"each replica divided its weighted loss by its own batch's weights {[round(w, 6) for w in d.weights]}: "
            f"the replicas' losses weighted by those sums give one device's loss ({by_weights:.7g} against "
            f"{data_ref:.7g})")
    elif n > 1 and _is(data_ratio, n) and _exactly(by_rows, data_ref) and grads_follow:
        if facts.get("user_step") and reduction in LOSS_REDUCTIONS_THAT_AVERAGE:
            add("keras_loss_reduction", *evidence, f"{n} is the replica count, and the loss object's reduction is "
                                                   f"{reduction!r}, which averages over each replica's own batch")
        else:
            add("loss_averaged_per_replica", *evidence, f"{n} is the replica count: each replica divided by its "
                                                        "own batch, not the global one")
    elif n > 1 and _is(data_ratio, 1 / n) and (grads is None or (_is(ratio, 1 / n) and cosine > 0.99)):
        add("loss_divided_twice", *evidence, f"1/{n} is one over the replica count: the loss was divided by it once "
                                             "too often")
    if each is not None and n > 1 and _is(data_ratio, 1.0):
        equal_to_summed, equal_to_each_other, norms_equal = each
        if equal_to_summed and _is(ratio, n) and cosine > 0.99:
            add("gradients_aggregated_by_hand", *evidence,
                f"every replica handed apply_gradients the gradients of the whole global batch (each equals one "
                f"device's), so apply_gradients' own sum over the {n} replicas counted them {n} times")
        elif (not equal_to_each_other and norms_equal and not _is(ratio, 1.0) and min(norms) > 0
              and abs(ref_norm - norms[0]) <= 1e-3 * ref_norm):
            add("clipped_before_aggregation",
                f"every replica handed apply_gradients gradients of its own direction but of the same global norm "
                f"{norms[0]:.6g} (on all {n}), and one device's norm is {ref_norm:.6g} too: a clip bound each "
                f"replica's gradients before apply_gradients summed them; their sum is {ratio:.4g} x one device's")
        elif not equal_to_summed and not equal_to_each_other and _is(ratio, n) and cosine > 0.99:
            add("gradient_of_per_replica_mean", *evidence,
                f"yet their gradients are each replica's own (they differ from each other and from one device's "
                f"whole-batch gradients) and sum to {n} x one device's ({n}, the replica count): each replica took the "
                "gradient of its own batch's mean, not of the loss it returned")
    if n > 1 and _is(data_ratio, 1.0) and grads is not None and grads_agree:
        moved = [m for m in mismatches if m.ratio is not None and math.isfinite(m.ratio)
                 and m.role == "variable"]
        hyper = [m for m in mismatches if m.role == "optimizer variable" and k == 1 and _is(m.ratio, n)]
        if moved and all(_is(m.ratio, n) for m in moved):
            add("optimizer_scaled_by_replicas", *evidence,
                f"yet every variable moved {moved[0].ratio:.4g} x one device's update ({n}, the replica count): the "
                "optimizer turned the same gradients into a larger step"
                + (f"; {hyper[0].quantity} is {hyper[0].ratio:.4g} x one device's from the first step" if hyper else ""))
    workers = facts.get("workers", 1)
    shuffled = facts.get("shuffled_before_sharding") or {}
    if workers > 1 and shuffled and k == 1:
        shuffle, shard = next(iter(shuffled.items()))
        add("shuffled_per_worker_before_sharding",
            f"the script shuffles at {shuffle} without a seed, and the dataset is sharded after it ({shard}): each "
            f"of the {workers} workers, a process of its own, draws its own order, so their shards overlap and miss "
            f"examples; step 1 already differs from one device's")
    if workers > 1 and _same_batches_on_every_worker(d, workers):
        add("input_not_sharded_per_worker",
            f"the replicas of all {workers} workers returned the same losses {d.replica_losses} and handed "
            "apply_gradients the same gradients, bit for bit, as worker 0's: every worker read the same examples")
    if facts.get("regularized") and reg and n > 1 and loss_ratio is not None:
        extra = d.loss - r.loss
        if abs(extra - (n - 1) * reg) <= RATIO_SLACK * (n - 1) * reg:
            add("regularization_not_scaled", f"the loss of step {k} exceeds one device's by {extra:.6g} = "
                                             f"({n} - 1) x the weight penalty {reg:.6g}: every replica added it whole")
    if not out and loss_ratio is not None and "loss" in roles and _is(loss_ratio, 1 / n):
        if facts.get("loss_reduction") == "MEAN" or _is(returned_ratio, 1.0):
            add("reduce_mean_for_sum", f"the reported loss is {loss_ratio:.4g} x one device's (1/{n}) while the "
                     f"replicas' own losses sum to {returned_ratio:.4g} x it; the loop reduces with "
                     f"{facts.get('loss_reduction')}")
    unsynced = [name for name, synced in facts.get("batch_norm", []) if not synced]
    # named only where the divergence shows in those layers' statistics (not for the layer's presence)
    statistics = [m for m in mismatches if m.what.of_variable and any(f"{name}/moving_" in m.what.name
                                                                       for name in unsynced)]
    if unsynced and n > 1 and statistics and not out:
        add("per_replica_batch_norm", f"BatchNormalization layers {', '.join(unsynced)} are not synchronized: each "
                                      f"of the {n} replicas normalizes with its own batch's statistics, one device "
                                      f"with the global batch's; their statistics diverged ({statistics[0].quantity}: "
                                      f"relative difference {statistics[0].relative:.3g})")
    if rows_ref < global_batch and len(set(d.rows)) > 1 and not out:
        agreed = f"steps 1-{k - 1} agreed; " if k > 1 else ""
        short = (f"{agreed}step {k} is a short batch of {rows_ref} examples (global batch {global_batch}), split "
                 f"{d.rows} among the replicas, and it is the first step that diverges")
        if facts.get("user_step") and reduction in LOSS_REDUCTIONS_THAT_AVERAGE:
            add("keras_loss_reduction", short, f"the loss object's reduction is {reduction!r}: under a strategy Keras 3 "
                                               "divides each replica's mean by the replica count, which is the global "
                                               "mean only when the replicas' batches are equal")
        else:
            add("short_batch_weighted_differently", short, "on the full batches before it, split evenly, the "
                                                           "denominators agreed")
    disagree = [m for m in mismatches if m.role == "replicas"]
    if disagree and not out:
        add("replicas_disagree", f"after step {k}, {disagree[0].quantity}: relative difference "
                                 f"{disagree[0].relative:.3g} ({len(disagree)} such comparisons)")
    return out


SCOPE = "loop-check[{spec}]"  # what an entry's ``tests`` name to cover the check of a user's loop under a spec
STEP = "the step"  # the quantity of a step that raised
FACTORY = FACTORY_RAISED  # the quantity of a factory that raised under the spec (building the model, say)
RANDOM_LAYERS_RAISED = "the model's random layers in training mode"  # they raised before training
SHARED_DRAWS = "whether each replica's first draw equals replica 0's"  # as the random-draws property names it


# what the ledger is asked of where something raised (by its ``where``) and of the replicas' draws
RAISED_IN = {STEP: Quantity.of("step", STEP), FACTORY: Quantity.of("factory", FACTORY),
             RANDOM_LAYERS_RAISED: Quantity.of("random layers", RANDOM_LAYERS_RAISED)}
DRAWS_SHARED = Quantity.of("shared draws", SHARED_DRAWS)
LOOP_CHECK_KINDS = (*ROLES, "step", "factory", "random layers", "shared draws")

def speaks_for_the_loop_check(signature) -> bool:
    """Whether a signature may explain what the loop check observes: where every kind it names
    (``variable``, ``{variable,replicas}``) is a kind of the loop check's quantities (a property's
    ``{variable,fit logged loss}`` or ``*`` is not)."""
    kind = signature.quantity.kind
    return all(k in LOOP_CHECK_KINDS for k in (kind[1:-1].split(",") if kind.startswith("{") and kind.endswith("}")
                                               else [kind]))


def ledger(spec, versions: dict) -> deviations.Ledger:
    """The known deviations in scope of the check of a loop under ``spec``: the entries that apply
    to the engine's versions and whose ``tests`` name ``loop-check[SPEC]``, with their signatures
    for the loop check's quantities."""
    scope = SCOPE.format(spec=spec.base.text)  # ``mirrored:2@tf215`` is in the scope of ``mirrored:2``
    return deviations.Ledger(tuple(
        dataclasses.replace(d, signatures=tuple(s for s in d.signatures if speaks_for_the_loop_check(s)))
        for d in deviations.load()
        if d.matches(scope) and d.applies_to(versions.get("tensorflow"), versions.get("keras"))), scope=scope)


def judge_for(spec, versions: dict):
    """``judge(quantity, got, expected, given, same)`` for ``compare``: the known deviation in
    scope of the loop check under ``spec`` (``ledger``) that explains an observation, or None."""
    led = ledger(spec, versions or {})

    def judge(what, got, expected, given, same):
        return led.judge(Seen(what, got, expected, same, spec, given))
    return judge


# what is observed where every difference is small and lies across the update, not along it: said,
# not judged (docs/check.md, "Small differences across the update")
ACROSS_THE_UPDATE = (
    "every difference at step {k} is small (at most {largest:.2g} of one device's update) and lies across the "
    "update, not along it (the updates' sizes agree within {along:.1g}): no catalogued mistake makes that, and float "
    "rounding can, since the split changes the order of the batch's sums and training amplifies it (an optimizer "
    "that normalizes its update, such as Adam; a variable that changes little in the step); the check cannot tell it "
    "from an uncatalogued mistake")


def _label(note: str) -> str:
    """How a verdict's note is shown: what a control showed, or what was observed of the runs."""
    controls = ("the control", "the stand-in control", "no control")
    return "control" if note.startswith(controls) or ": the control (" in note else "note"


def _across_the_update(mismatches: list) -> bool:
    """Whether every difference is at most 1% of the update and at least ten times larger than its
    part along the update (|ratio - 1|): a loop that scales or drops part of an update moves along it."""
    return bool(mismatches) and all(
        m.ratio is not None and math.isfinite(m.ratio) and m.relative <= 1e-2 and abs(m.ratio - 1) * 10 <= m.relative
        for m in mismatches)


def verdict_of(spec: str, ref, runs: list, global_batch: int, rtol: float = RTOL, atol: float = ATOL,
            seconds: float = 0.0, spec_obj=None, versions: dict | None = None, control=None) -> Verdict:
    """Compare a spec's run with the reference and diagnose its first divergence. A difference,
    a step that raised or replicas' random draws are excused only where a known deviation in
    scope (``ledger``) explains that observation, as it does for the properties:

    PASS every step agrees; FAIL something differs (or raised) that no deviation explains: the
    loop's, with a cause where one fits; DEVIATION every difference is a known deviation's
    prediction (the loop is right); BLOCKED the step raised as a known deviation of
    TensorFlow/Keras raises from its origin (the loop is right but cannot train here).
    ``control``: the suite's known-right step on the same workload under the spec (``Control``),
    whose values a deviation model of TensorFlow's rule is handed as the alternative."""
    dist = stitch(runs)
    led = ledger(spec_obj, versions or {}) if spec_obj is not None else deviations.Ledger(())

    # with a stand-in control, only the entries its own divergence shows may explain the loop's
    allowed = control.entries if control is not None else None

    def judge(what, got, expected, given, same):
        entry = led.judge(Seen(what, got, expected, same, spec_obj, given))
        return entry if entry is not None and (allowed is None or entry.id in allowed) else None

    explained: list = []
    speaks = control is not None and control.same_as_loop  # only a control that matches the loop predicts it
    agreed, worst, mismatches = compare(ref, dist, rtol, atol, judge=judge, explained=explained,
                                        control=control.run if speaks else None)
    v = Verdict(spec, dist.replicas, "PASS", steps=min(len(ref.steps), len(dist.steps)), agreed=agreed, worst=worst,
                seconds=seconds, mismatches=mismatches)
    shared = _shared_draws(dist)
    masks_explained = False
    if shared is not None and any(shared):
        keras_own = bool(dist.facts.get("random_layers_keras"))
        per = dist.replicas // max(1, len(runs))
        seen = Seen(DRAWS_SHARED, shared, [False] * len(shared), lambda a, b: list(a) == list(b), spec_obj,
                    {"alternative": [True] * len(shared), "per_worker": [r % per == 0 for r in range(1, dist.replicas)]}
                    if keras_own else None)  # only Keras' own random layers are what an entry describes
        entry = led.judge(seen)
        if entry is not None:
            masks_explained = True
            explained.append((entry.id, f"the model's random layers ({', '.join(dist.facts['random_layers'])}) are "
                                        f"Keras' own and drew for replicas 1-{len(shared)} what replica 0 drew "
                                        f"({shared}), as known deviation {entry.id} predicts"))
    raised = dist.raised
    if dist.facts.get("masks_raised"):  # a random layer in training mode raised before training
        kind, message, *frames = dist.facts["masks_raised"]
        raised = Raised(kind, message, RANDOM_LAYERS_RAISED, tuple(frames[0]) if frames else ())
    v.diagnoses = [d for d in diagnose(ref, dist, mismatches, global_batch)
                   if not (masks_explained and d.cause == "identical_dropout_masks")]
    if control is not None:  # a cause the known-right control shows too is TensorFlow's/Keras', not the loop's
        shared = [d for d in v.diagnoses if d.cause in control.causes]
        v.diagnoses = [d for d in v.diagnoses if d.cause not in control.causes]
        v.notes.extend(f"{d.title}: the control (the suite's canonical step on the workload's own model, optimizer and "
                       "data) shows it too, so it is not the loop's" for d in shared)
    v.deviations = [[i, line] for i, line in explained]
    blown = first_non_finite(dist) if mismatches else None
    if blown is not None:  # the reference is finite (checked before any spec): say it plainly
        v.notes.append(f"under {spec} the run goes non-finite: {blown} (one device's stays finite)")
    if raised is not None:
        v.error = f"{raised.where} raised {raised.type}: {short_error(raised.message, 300)}"
        # a script that raised before its first step is judged as a factory that raised under the spec
        what = FACTORY if raised.where == SCRIPT_RAISED else raised.where if raised.where in (RANDOM_LAYERS_RAISED,
                                                                                              FACTORY) else STEP
        # a deviation's condition reads what the engine saw of the workload (an optimizer built in the step)
        entry = led.judge(Seen(RAISED_IN[what], raised, None, lambda a, b: a == b, spec_obj, dist.facts), raised=True)
        if entry is not None:
            # the cause whose fix avoids the deviation is the way around it, not the loop's mistake
            around = [d for d in v.diagnoses if d.cause == entry.workaround]
            v.diagnoses = [d for d in v.diagnoses if d.cause != entry.workaround]
            way = f" Way around it: {CAUSES[entry.workaround].fix}." if around else ""
            v.deviations.insert(0, [entry.id, f"{v.error}. " + _summary(entry) + way])
        v.status = "BLOCKED" if entry is not None and not v.diagnoses else "FAIL"
        return v
    if control is not None:
        v.notes.extend(control.notes)
    drawn = (ref.facts.get("random_ops") or []) + (dist.facts.get("random_ops") or [])
    if mismatches and drawn:  # what differs may be the draws themselves: no verdict on the loop
        v.status = "RANDOM"
        v.error = (f"the step draws random numbers of its own ({', '.join(sorted(set(drawn)))} in its traced graph, "
                   "outside Keras' random layers, which the check switches off): one device and the spec's replicas do "
                   "not draw the same numbers (each replica draws for its own batch, and a tf.random.Generator made in "
                   "a strategy's scope gives each replica a stream of its own), so the runs cannot be compared value "
                   "for value; take the draws out of the step (or make them a Keras random layer) to check it")
        if v.diagnoses:
            v.notes.append("the evidence of " + ", ".join(d.title for d in v.diagnoses) + " holds too, but the draws "
                           "alone may explain what differs")
        v.diagnoses = []
        return v
    if mismatches and not v.diagnoses and speaks:
        # the suite's known-right step diverges here as the loop does: TensorFlow's/Keras', unrecorded
        v.deviations.append(["unrecorded", control.evidence])
        v.status = "DEVIATION"
    elif mismatches or v.diagnoses:
        v.status = "FAIL"
        if control is not None and control.evidence not in v.notes:
            v.notes.append(control.evidence)
        if not v.diagnoses and _across_the_update(mismatches):
            v.notes.append(ACROSS_THE_UPDATE.format(
                k=mismatches[0].step, largest=max(m.relative for m in mismatches),
                along=max(abs(m.ratio - 1) for m in mismatches)))
    elif v.deviations:
        v.status = "DEVIATION"  # the loop is right; TensorFlow/Keras is not
    if len(dist.steps) < len(ref.steps) and not mismatches:
        v.status = "FAIL"
        v.error = f"ran {len(dist.steps)} steps, one device {len(ref.steps)}: the strategy delivered fewer batches"
    return v


def _shared_draws(dist) -> list | None:
    """Whether each replica's training-mode output for the same input equalled replica 0's
    (the same random draws), or None without random layers or several replicas."""
    if not dist.masks or len(dist.masks) < 2 or not dist.facts.get("random_layers"):
        return None
    return [bool(np.array_equal(m, dist.masks[0])) for m in dist.masks[1:]]


# -- rendering ---------------------------------------------------------------------------------
def table(verdicts: list[Verdict]) -> str:
    rows = [("spec", "replicas", "verdict", "steps agreed", "worst rel. diff agreeing", "first divergence", "diagnosis",
             "time", "engine start")]
    for v in verdicts:
        first = "" if v.first_step is None else f"step {v.first_step}"
        if v.status == "ERROR":
            first = "error"
        elif v.error and not first:
            first = "raised"
        cause = v.diagnoses[0].title if v.diagnoses else ("" if v.status == "PASS" else "no catalogued cause")
        if v.status == "RANDOM":
            cause = "random draws of the step's own"
        if v.status in ("DEVIATION", "BLOCKED"):
            named = [i for i, _ in v.deviations if i != "unrecorded"]
            cause = ("known deviation " + ", ".join(dict.fromkeys(named))) if named else "unrecorded deviation"
        rows.append((v.spec, str(v.replicas), v.status, f"{v.agreed}/{v.steps}",
                     f"{v.worst:.2g}" if v.agreed else "–", first, cause,
                     f"{v.seconds:.1f} s", f"{v.start_seconds:.1f} s"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines[:1] + ["  ".join("-" * w for w in widths)] + lines[1:])


def details(v: Verdict, limit: int | None = 6) -> str:
    """What a user reads for a spec that did not pass: where it diverged, got vs expected, the
    diagnosis, or the known deviation and its evidence."""
    if v.status == "PASS":
        return ""
    if v.status == "RANDOM":
        out = [f"{v.spec}: RANDOM: the runs cannot be compared" + (f" (they differ from step {v.first_step})"
                                                                   if v.first_step else ""), f"  {v.error}"]
        out.extend(f"  note: {n}" for n in v.notes)
        return "\n".join(out)
    if v.status in ("DEVIATION", "BLOCKED"):
        head = ("DEVIATION: the loop is right; TensorFlow/Keras computes something else" if v.status == "DEVIATION"
                else "BLOCKED: the loop is right but cannot train on this spec with these versions")
        out = [f"{v.spec}: {head}"]
        out.extend(f"  known deviation {i}: {e}" if i != "unrecorded" else f"  unrecorded deviation: {e}"
                   for i, e in v.deviations[:limit])
        out.extend(f"  {_label(n)}: {n}" for n in v.notes if all(n != e for _, e in v.deviations))
        return "\n".join(out)
    out = [f"{v.spec}: {v.status}" + (f", first divergence at step {v.first_step}" if v.first_step else "")]
    if v.error:
        out.append(f"  {v.error}")
    for m in v.mismatches[:limit]:
        out.append(f"  {m.line()}")
    if limit is not None and len(v.mismatches) > limit:
        out.append(f"  ... and {len(v.mismatches) - limit} more differences at that step")
    if v.status == "FAIL" and not v.diagnoses:
        out.append("  diagnosis: no catalogued cause fits the evidence (see docs/check.md for the catalogue)")
    for d in v.diagnoses:
        out.append(f"  diagnosis: {d.title}")
        out.extend(f"    evidence: {e}" for e in d.evidence)
        out.append(f"    fix: {d.fix}")
    for i, e in v.deviations[:limit]:
        out.append(f"  known deviation {i} (TensorFlow/Keras, not the loop) explains other differences: {e}")
    out.extend(f"  {_label(n)}: {n}" for n in v.notes)
    return "\n".join(out)
