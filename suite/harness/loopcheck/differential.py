"""A user's workload compared with itself on one device: the verdict of one spec, and when it
diverges, where first and why (pytest side: plain data in, plain data out, no TensorFlow).

The reference is differential: the workload's own step with no strategy on the global batch
(suite/engine/probes/workload.py). A spec passes when after every step its reported loss, every
replica's copy of every model and optimizer variable, and every metric equal the reference's
within the tolerance, and the replicas' copies equal each other. Variables are compared by
their change since the common initial value, norm-wise (``|got - expected| <= rtol x
|expected - initial| + atol x sqrt(size)``): a mistake moves a whole update (a factor of the
replica count, a missing term), rounding moves a few low bits.

At the first step that diverges, ``diagnosis.diagnose`` matches the evidence against the catalogue
(causes.py, ``CAUSES``). A cluster's replies are stitched into one run (runs.py); what the user
reads of the verdicts is rendered in render.py.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ...common.facts import named as facts_named
from ...common.given import Given, fields_named
from ...common.results import FACTORY_RAISED, SCRIPT_RAISED, Raised
from ..judging import deviations
from ..judging.quantity import Quantity
from ..judging.signatures import Seen
from .causes import CAUSES
from .diagnosis import diagnose
from .render import short_error
from .runs import first_non_finite, stitch
from .runs import norm as _norm

RTOL = 1e-4
ATOL = 1e-7


# What a spec's verdict says, and what the user does about it (docs/check.md):
STATUSES = {
    "PASS": "the spec trains what one device trains",
    "FAIL": "the loop is wrong here (or something no known deviation explains): cause, evidence, fix",
    "DEVIATION": "the loop is right; TensorFlow/Keras computes something else, as a known deviation predicts",
    "BLOCKED": "the loop is right but cannot train on this spec with these versions: a known deviation raises",
    "ERROR": "the suite could not run the spec (the engine failed or timed out)",
    "RANDOM": "the step draws random numbers of its own: one device and the replicas cannot draw the same numbers, "
              "so their runs cannot be compared value for value (neither right nor wrong is known)",
    "INCOMPARABLE": "the spec's run differs, but so does the same code under one replica of a strategy (mirrored:1, "
                    "or multi_worker:1x1 for a multi-worker spec): "
                    "what differs does not need more than one replica, so it is not distribution's, and the check "
                    "does not blame the script (neither right nor wrong is known)",
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


def _num(x) -> str:
    return f"{x:.7g}" if isinstance(x, float) else str(x)


# -- the comparison ----------------------------------------------------------------------------
def _scalar(step, quantity, got, expected, rtol, atol):
    err = abs(got - expected)
    scale = abs(expected)
    rel = err / scale if scale else (0.0 if err == 0 else math.inf)
    ok = err <= rtol * scale + atol
    return ok, rel, Mismatch(step, quantity, float(got), float(expected), rel, got / expected if expected else None)


def _array(step, quantity, got, expected, base, rtol, atol, same_as: dict | None = None):
    """The comparison of one copy of a variable (``got``) with the reference's (``expected``) by their change
    since ``base``. ``same_as``: outcomes so far, by the arrays compared: the same three arrays again (the
    replicas of a variable the engine kept once) give the same outcome, its mismatch renamed, uncomputed."""
    key = (id(got), id(expected), id(base))
    if same_as is not None and key in same_as:
        ok, rel, m = same_as[key]
        return ok, rel, dataclasses.replace(m, what=quantity)
    out = _array_of(step, quantity, got, expected, base, rtol, atol)
    if same_as is not None:
        same_as[key] = out
    return out


def _array_of(step, quantity, got, expected, base, rtol, atol):
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
    model of the rule TensorFlow follows instead is handed (``given.alternative``)."""
    worst = 0.0
    zero = np.float64(0.0)  # the optimizer variables' base before the first step (a scalar: no model-sized zeros)
    increments = _metric_increments(ref)
    facts = Given(**dist.facts.condition_given(CONDITION_FACTS))  # what a deviation's condition reads
    for k, (r, d) in enumerate(zip(ref.steps, dist.steps), 1):
        found, rels = [], []
        same_as: dict = {}  # a copy compared already, against the same value from the same base (one array for
        # every replica whose copies the engine found equal bit for bit): its outcome
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
            return facts if c is None else dataclasses.replace(facts, alternative=value, control_copies_differ=spread)

        if r.named and d.named:  # a loss per model: each compared on its own
            for name, value in r.named.items():
                got = d.named.get(name, {}).get("loss", math.nan)
                take(_scalar(k, Compared("loss", name), got, value["loss"], rtol, atol), (got, value["loss"]),
                     _same(rtol, atol))
        else:
            tracker = _mean_of(ref, "loss")  # fit's logged loss: its loss tracker's result
            take(_scalar(k, Compared("loss"), d.loss, r.loss, rtol, atol), (d.loss, r.loss), _same(rtol, atol),
                 dataclasses.replace(facts, kind="mean", increments=increments[tracker][:k]) if tracker in increments
                 else alternative(c.loss if c else None))
        for i, (name, init, rv, dv) in enumerate(zip(ref.names, ref.initial, r.variables, d.variables)):
            for rep, copy in enumerate(dv):
                want = rv[rep] if len(rv) == len(dv) else rv[0]  # replica by replica where ``ref`` ran on as many
                take(_array(k, Compared("variable", name, rep), copy, want, init, rtol, atol, same_as),
                     (copy, want), _same_array(init, rtol, atol), alternative(c.variables[i][rep] if c else None))
        prev = ref.steps[k - 2].optimizer if k > 1 else None
        for i, (name, rv, dv) in enumerate(zip(ref.optimizer_names, r.optimizer, d.optimizer)):
            base = np.asarray(prev[i][0], np.float64) if prev is not None else zero
            for rep, copy in enumerate(dv):
                want = rv[rep] if len(rv) == len(dv) else rv[0]
                take(_array(k, Compared("optimizer variable", name, rep), copy, want, base, rtol, atol, same_as),
                     (copy, want), _same_array(base, rtol, atol),
                     alternative(c.optimizer[i][rep] if c and i < len(c.optimizer) else None))
        for name, value in (r.metrics if metrics else {}).items():
            mean = _mean_of(ref, name)
            upto = None if name.startswith("evaluate ") else k  # an evaluate's batches are its own
            given = dataclasses.replace(facts, kind="mean", increments=increments[mean][:upto],
                                        **_copies(dist, mean, k if upto else -1)) if mean in increments else facts
            got = d.metrics.get(name, math.nan)
            take(_scalar(k, Compared("metric", name), got, value, rtol, atol), (got, value), _same(rtol, atol), given)
        for i, (name, init, rv, dv) in enumerate(zip(ref.names, ref.initial, r.variables, d.variables)):
            if len(rv) == len(dv) > 1:
                continue  # ``ref`` ran on as many replicas: compared replica by replica above
            for rep, copy in enumerate(dv[1:], 1):  # the replicas against each other
                if copy is dv[0]:
                    continue  # the engine found them equal bit for bit (snapshots.py: one array for both)
                ok, rel, m = _array(k, Compared("replicas", name, rep), copy, dv[0], init, rtol, atol)
                if not ok:
                    take((ok, rel, m), (copy, dv[0]), _same_array(init, rtol, atol),
                         alternative(c.variables[i][rep] if c else None))
        if found:
            return k - 1, worst, found
        worst = max([worst] + [x for x in rels if math.isfinite(x)])
    return min(len(ref.steps), len(dist.steps)), worst, []


# what the engine saw of the workload that a deviation's condition may read (signatures.CONDITIONS)
# (each a field of Facts and of Given: checked when this module loads, one line naming an unknown one)
CONDITION_FACTS = facts_named(("optimizer_clips", "optimizer_built", "optimizer_variables_before_step",
                               "optimizer_variables_after", "steps_per_execution", "step_mode", "fit_first_split"),
                              "differential.CONDITION_FACTS")
fields_named(CONDITION_FACTS, "differential.CONDITION_FACTS")


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
    states = ref.facts.metric_states or {}
    if sorted(states.get(quantity, ())) == ["count", "total"] or (
            quantity.startswith("evaluate ") and quantity in (ref.facts.metric_state_values or {})):
        return quantity  # (an evaluate's result: its metric's state read at its start and after each batch)
    if ref.facts.step_mode != "fit" or not (quantity == "loss" or quantity.startswith("fit ")):
        return None
    name = quantity.removeprefix("fit ")
    return next((m for m, st in states.items() if m.endswith(f"[{name}]") and sorted(st) == ["count", "total"]), None)


def _copies(dist, metric: str, k: int) -> dict:
    """What a deviation's model of per-replica metric state reads of the run: ``replica_states``, each
    local replica's own copy of ``metric``'s (total, count) after step ``k`` (-1: an evaluate's, at its end; the engine's
    ``metric_replica_states``), and ``replica``, the copy a read in cross-replica context returns (the
    first local one); nothing where the engine read no copies."""
    copies = (dist.facts.metric_replica_states or {}).get(metric)
    if not copies or k >= len(copies):
        return {}
    return {"replica_states": [tuple(c) for c in copies[k]], "replica": 0}


def _metric_increments(ref) -> dict:
    """Each metric's per-step increments of a (total, count) state on one device: the changes of
    its state where the engine read it at every boundary (``metric_state_values``: a script's
    Mean-like metrics), else count, the step's examples; total, result x count, less what came before."""
    out = {}
    states = ref.facts.metric_state_values or {}
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


SCOPE = "loop-check[{spec}]"  # what an entry's ``tests`` name to cover the check of a user's loop under a spec
STEP = "the step"  # the ``where`` of a step that raised
FACTORY = FACTORY_RAISED  # the ``where`` of a factory that raised under the spec (building the model, say)
RANDOM_LAYERS_RAISED = "the model's random layers in training mode"  # they raised before training


# what the ledger is asked of where something raised (by its ``where``) and of the replicas' draws
# (the random-draws property asks of the same quantity)
RAISED_IN = {STEP: Quantity.of("step", STEP), FACTORY: Quantity.of("factory", FACTORY),
             RANDOM_LAYERS_RAISED: Quantity.of("random layers", RANDOM_LAYERS_RAISED)}
DRAWS_SHARED = Quantity.of("shared draws", "whether each replica's first draw equals replica 0's")
LOOP_CHECK_KINDS = (*ROLES, *(q.kind for q in RAISED_IN.values()), DRAWS_SHARED.kind)

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


def _across_the_update(mismatches: list) -> bool:
    """Whether every difference is at most 1% of the update and at least ten times larger than its
    part along the update (|ratio - 1|): a loop that scales or drops part of an update moves along it."""
    return bool(mismatches) and all(
        m.ratio is not None and math.isfinite(m.ratio) and m.relative <= 1e-2 and abs(m.ratio - 1) * 10 <= m.relative
        for m in mismatches)


# the causes found from how the run was built, not from what it computed (a variable made outside the scope): where
# every step agreed they are a note, never a FAIL; identical dropout masks are an observation of the replicas' draws,
# which the compared steps (random layers switched off) cannot show, so they stay a cause
FROM_STRUCTURE = ("created_outside_scope",)


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
        keras_own = bool(dist.facts.random_layers_keras)
        per = dist.replicas // max(1, len(runs))
        seen = Seen(DRAWS_SHARED, shared, [False] * len(shared), lambda a, b: list(a) == list(b), spec_obj,
                    Given(alternative=[True] * len(shared), per_worker=[r % per == 0 for r in range(1, dist.replicas)])
                    if keras_own else None)  # only Keras' own random layers are what an entry describes
        entry = led.judge(seen)
        if entry is not None:
            masks_explained = True
            explained.append((entry.id, f"the model's random layers ({', '.join(dist.facts.random_layers)}) are "
                                        f"Keras' own and drew for replicas 1-{len(shared)} what replica 0 drew "
                                        f"({shared}), as known deviation {entry.id} predicts"))
    raised = dist.raised
    if dist.facts.masks_raised:  # a random layer in training mode raised before training
        kind, message, *frames = dist.facts.masks_raised
        raised = Raised(kind, message, RANDOM_LAYERS_RAISED, tuple(frames[0]) if frames else ())
    v.diagnoses = [d for d in diagnose(ref, dist, mismatches, global_batch)
                   if not (masks_explained and d.cause == "identical_dropout_masks")]
    if control is not None:  # a cause the known-right control shows too is TensorFlow's/Keras', not the loop's
        shared = [d for d in v.diagnoses if d.cause in control.causes]
        v.diagnoses = [d for d in v.diagnoses if d.cause not in control.causes]
        v.notes.extend(f"{d.title}: the control (the suite's canonical step on the workload's own model, optimizer and "
                       "data) shows it too, so it is not the loop's" for d in shared)
    v.deviations = [[i, line] for i, line in explained]
    structural = [d for d in v.diagnoses if d.cause in FROM_STRUCTURE]
    if structural and not mismatches and raised is None and len(dist.steps) >= len(ref.steps):
        # a cause found from the run's structure while every step agreed: what the training computed is one device's,
        # so it is said, never a verdict (issue 62)
        v.notes.extend(f"{d.title}: {'; '.join(d.evidence)}; every step agreed with one device here, so this is not a "
                       f"verdict on the loop, but it may not hold elsewhere: {d.fix}" for d in structural)
        v.diagnoses = [d for d in v.diagnoses if d.cause not in FROM_STRUCTURE]
    blown = first_non_finite(dist) if mismatches else None
    if blown is not None:  # the reference is finite (checked before any spec): say it plainly
        v.notes.append(f"under {spec} the run goes non-finite: {blown} (one device's stays finite)")
    if raised is not None:
        v.error = f"{raised.where} raised {raised.type}{raised.said()}: {short_error(raised.message, 300)}"
        # a script that raised before its first step is judged as a factory that raised under the spec
        what = FACTORY if raised.where == SCRIPT_RAISED else raised.where if raised.where in (RANDOM_LAYERS_RAISED,
                                                                                              FACTORY) else STEP
        # a deviation's condition reads what the engine saw of the workload (an optimizer built in the step)
        entry = led.judge(Seen(RAISED_IN[what], raised, None, lambda a, b: a == b, spec_obj,
                                 Given(**dist.facts.condition_given(CONDITION_FACTS))), raised=True)
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
    drawn = (ref.facts.random_ops or []) + (dist.facts.random_ops or [])
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
    if not dist.masks or len(dist.masks) < 2 or not dist.facts.random_layers:
        return None
    return [bool(np.array_equal(m, dist.masks[0])) for m in dist.masks[1:]]
