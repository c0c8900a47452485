"""The upgrade check: does a loop train the same after moving TensorFlow/Keras from one version to
another (``python -m suite.check pkg.mod:factory --from ENV_A --to ENV_B``; pytest side, no
TensorFlow).

Both versions run the workload from the same initial values (the ``from`` version's) on the
same data (checked by a digest of every batch): with no strategy, and under each selected spec.
Each spec's run on ``to`` is compared with its run on ``from`` after every step (loss, every
model variable, the optimizer's state matched by role, metrics) with the loop check's norm-wise
tolerance plus a rounding allowance: the largest relative difference between two runs of the
``from`` version under that spec. Each version's run under a spec is also checked against that
version's own one-device run (the loop check, suite/harness/loopcheck/usercheck.py), which names
the known deviations that apply there. A difference is attributed (ATTRIBUTIONS):

- ``appears`` / ``disappears``: a known deviation explains the spec's run on one version and not
  on the other (its signature predicted the value there, or its remedy removes the difference);
- ``one_device``: the difference is already there with no strategy, and under the spec each
  version trains what its one device trains: the release changed the math, not the distribution;
- ``rule_changed``: the replicas received other examples (how a batch is split among replicas
  is an observed rule, reference/input.py): behaviour changed, not a bug;
- ``unexplained``: none of the above (the first diverging step and quantity, to against from).

Statuses and exit codes are the loop check's (usercheck.EXIT): PASS the spec trains the same
on both versions; DEVIATION every difference is a known deviation's (appears, disappears) or a
changed observed rule; BLOCKED such a deviation raises on one version; FAIL a difference no
catalogued cause explains (on one device: the release changed what this loop computes); ERROR
the suite could not run the spec. A loop that does not import, build or train with no strategy
on one version is an input error (exit 2), not a difference.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

from ...common import matching
from ...common.specs import SpecError, parse_spec
from ..judging import deviations
from ..pool import versions
from ..pool.pool import EngineError, EnginePool, EngineUnavailable
from . import differential, render
from .runs import stitch
from .usercheck import EXIT, Checker, CheckInputError

ATTRIBUTIONS = {
    "same": "trains the same on both versions",
    "appears": "a known deviation of the newer side explains it (appears)",
    "disappears": "a known deviation of the older side explains it (disappears)",
    "one_device": "already on one device: the release changed the math, not the distribution",
    "rule_changed": "an observed rule changed: the replicas received other examples",
    "unexplained": "no catalogued cause",
}
# Keras 2's slot names and Keras 3's for the same optimizer state (keras/src/optimizers/adam.py of
# each: "m", "v", "vhat" against "momentum", "velocity", "velocity_hat")
SLOT_SYNONYMS = {"m": "momentum", "v": "velocity", "vhat": "velocity_hat", "iteration": "iterations"}
ONE_SIDED = "state on one version only, not compared: "
RULE = "reference/input.py: batch_sizes_for_worker, an observed rule (how a global batch is split among the replicas)"


# -- matching one version's variables to the other's --------------------------------------------
def optimizer_key(name: str, model_names: list[str]) -> tuple | None:
    """An optimizer variable's role: ``(model variable index, slot)`` for a slot, ``(None, name)``
    for the optimizer's own state (iterations, learning rate). Keras 3 names a slot
    ``OPT/PATH_WITH_UNDERSCORES_SLOT`` (add_variable_from_reference), Keras 2's optimizer
    ``SLOT/VARIABLE``, Keras 2's legacy optimizers ``OPT/VARIABLE/SLOT``; the longest variable
    name that fits wins (``dense_1/kernel`` over ``dense/kernel``)."""
    best = None
    for i, model_name in enumerate(model_names):
        flat = model_name.replace("/", "_")
        last = name.rsplit("/", 1)[-1]
        for slot, fits in ((last[len(flat) + 1:], last.startswith(flat + "_")),  # Keras 3
                           (name[:-len(model_name) - 1].rsplit("/", 1)[-1], name.endswith("/" + model_name)),  # Keras 2
                           (name.rsplit("/", 1)[-1], name.rsplit("/", 1)[0].endswith(model_name))):  # legacy
            if fits and slot and (best is None or len(model_name) > best[0]):
                best = (len(model_name), (i, SLOT_SYNONYMS.get(slot, slot)))
    if best is not None:
        return best[1]
    last = name.rsplit("/", 1)[-1]
    return None, SLOT_SYNONYMS.get(last, last)


def _described(run) -> list:
    return [(n, tuple(getattr(x, "shape", ())), t) for n, x, t in zip(run.names, run.initial, run.trainable)]


def init_of(run) -> dict:
    """The probe's options that load ``run``'s initial values into another version's build."""
    return {"init": run.initial, "init_names": run.names, "init_trainable": run.trainable}


def align(a, b) -> tuple[object, object, list[str]]:
    """The two runs restricted to what both have, in ``a``'s order and under ``a``'s names: the
    model variables matched by suite/common/matching.py (every trainable one must match: both
    versions build the same model), the optimizer variables by role (``optimizer_key``). What only
    one side has is listed, not compared. Raises CheckInputError when the models differ."""
    mine, theirs = _described(a), _described(b)
    to_a = matching.match(mine, theirs)
    if any(t and i is None for (_, _, t), i in zip(theirs, to_a)) or \
            sum(t for _, _, t in mine) != sum(t for _, _, t in theirs):
        raise CheckInputError(f"the workload builds other trainable variables on the two versions ({len(mine)} and "
                              f"{len(theirs)} model variables): the upgrade check compares the same model")
    model_pairs = sorted((i, j) for j, i in enumerate(to_a) if i is not None)
    only_model = [a.names[i] for i in range(len(mine)) if i not in {i for i, _ in model_pairs}] + \
                 [b.names[j] for j, i in enumerate(to_a) if i is None]
    keys_a = [optimizer_key(n, a.names) for n in a.optimizer_names]
    keys_b = [optimizer_key(n, b.names) for n in b.optimizer_names]
    # a slot's key names its variable by ``b``'s index: translate it to ``a``'s
    keys_b = [(to_a[k[0]], k[1]) if k[0] is not None else k for k in keys_b]
    where_b = {k: j for j, k in enumerate(keys_b)}
    pairs = [(i, where_b[k]) for i, k in enumerate(keys_a) if k in where_b]
    only = only_model + [n for n, k in zip(a.optimizer_names, keys_a) if k not in where_b] + \
        [n for n, k in zip(b.optimizer_names, keys_b) if k not in set(keys_a)]
    notes = [f"{ONE_SIDED}{', '.join(only)}"] if only else []

    def keep(run, model, opt, names=None, opt_names=None):
        steps = [dataclasses.replace(s, variables=[s.variables[j] for j in model],
                                     optimizer=[s.optimizer[j] for j in opt]) for s in run.steps]
        return dataclasses.replace(run, names=names or [run.names[j] for j in model],
                                   trainable=[run.trainable[j] for j in model], initial=[run.initial[j] for j in model],
                                   optimizer_names=opt_names or [run.optimizer_names[j] for j in opt], steps=steps)
    kept_a = keep(a, [i for i, _ in model_pairs], [i for i, _ in pairs])
    kept_b = keep(b, [j for _, j in model_pairs], [j for _, j in pairs], kept_a.names, kept_a.optimizer_names)
    return kept_a, kept_b, notes


def allowance(first, second) -> float:
    """The largest relative difference between two runs of one version (rounding: zero where the
    run repeats itself bit for bit)."""
    _, worst, found = differential.compare(first, second, 1e300, 0.0)
    return max([worst] + [m.relative for m in found if math.isfinite(m.relative)])


# -- one row of the table ----------------------------------------------------------------------
@dataclasses.dataclass
class Row:
    spec: str
    status: str  # differential.STATUSES
    attribution: str  # ATTRIBUTIONS
    lines: list = dataclasses.field(default_factory=list)  # what differs and why, for the user
    mismatches: list = dataclasses.field(default_factory=list)  # at the first step that differs
    steps: int = 0
    agreed: int = 0
    allowance: float = 0.0
    worst: float = 0.0  # the largest relative difference between the versions in the steps that agreed
    sides: tuple = ("", "")  # the loop check's status on each version (the spec against its own one device)
    deviations: list = dataclasses.field(default_factory=list)  # [id, "appears" | "disappears" | "both"]
    seconds: float = 0.0

    @property
    def first_step(self) -> int | None:
        return self.mismatches[0].step if self.mismatches else None

    def as_json(self) -> dict:
        return {"spec": self.spec, "status": self.status, "attribution": self.attribution,
                "attribution_text": ATTRIBUTIONS[self.attribution], "lines": self.lines,
                "steps": self.steps, "agreed_steps": self.agreed, "rounding_allowance": self.allowance,
                "worst_relative_difference": self.worst,
                "loop_check": {"from": self.sides[0], "to": self.sides[1]},
                "first_diverging_step": self.first_step, "seconds": round(self.seconds, 2),
                "known_deviations": [{"id": i, "change": c} for i, c in self.deviations],
                "mismatches": [m.as_json() for m in self.mismatches]}


def _named(v) -> list[str]:
    return list(dict.fromkeys(i for i, _ in v.deviations if i != "unrecorded"))


def _rows_differ(a, b, upto: int | None) -> tuple[int, list, list] | None:
    """The first step (up to ``upto``) whose replicas received other examples on the two versions."""
    for k, (sa, sb) in enumerate(zip(a.steps, b.steps), 1):
        if upto is not None and k > upto:
            break
        if list(sa.rows) != list(sb.rows):
            return k, list(sa.rows), list(sb.rows)
    return None


def _raised_line(run, label: str) -> str | None:
    if run.raised is None:
        return None
    return f"on {label} {run.raised.where} raised {run.raised.type}: {render.short_error(run.raised.message, 200)}"


def judge_row(spec: str, a_runs: list, a_again: list, b_runs: list, va, vb, one_device: Row, labels: tuple,
              rtol: float, atol: float) -> Row:
    """The row of a spec from both versions' runs under it (``a_again``: ``from`` once more, for the
    rounding allowance) and each version's loop-check verdict there (``va``, ``vb``); ``one_device``
    is the row of the runs with no strategy."""
    a, again, b = (stitch(r) for r in (a_runs, a_again, b_runs))
    a, b, notes = align(a, b)
    slack = allowance(a, align(again, again)[0]) if again is not None else 0.0
    agreed, worst, found = differential.compare(a, b, rtol + 2 * slack, atol)
    row = Row(spec, "PASS", "same", steps=min(len(a.steps), len(b.steps)), agreed=agreed, mismatches=found,
              allowance=slack, sides=(va.status, vb.status), worst=worst)
    raised = [x for x in (_raised_line(a, labels[0]), _raised_line(b, labels[1])) if x]
    differs = bool(found) or (a.raised is None) != (b.raised is None) or len(a.steps) != len(b.steps)
    named_a, named_b = _named(va), _named(vb)
    appear = [i for i in named_b if i not in named_a]
    disappear = [i for i in named_a if i not in named_b]
    row.deviations = [[i, "appears"] for i in appear] + [[i, "disappears"] for i in disappear] + \
                     [[i, "both"] for i in named_a if i in named_b]
    lines = [f"under {spec} on {labels[0]} the loop check says {va.status}, on {labels[1]} {vb.status}"]
    if not differs and not appear and not disappear and va.status == vb.status:
        row.lines = notes + ([f"on both versions the loop check says {va.status} under {spec} (python -m "
                              "suite.check): the upgrade changes nothing there"] if va.status != "PASS" else [])
        return row
    first = [f"first difference at step {found[0].step}: {found[0].line()} ({labels[1]} against {labels[0]})"] \
        if found else []
    sides_right = "FAIL" not in (va.status, vb.status) and "ERROR" not in (va.status, vb.status)
    if (appear or disappear) and sides_right and (one_device.status == "PASS" or not found):
        row.status = "BLOCKED" if "BLOCKED" in (va.status, vb.status) else "DEVIATION"
        row.attribution = "appears" if appear else "disappears"
        row.lines = [f"known deviation {i} applies on {labels[1]}, not on {labels[0]} (appears)" for i in appear] + \
                    [f"known deviation {i} applies on {labels[0]}, not on {labels[1]} (disappears)" for i in disappear] + \
                    lines + first + raised + notes
        return row
    if found and one_device.status != "PASS" and va.status == vb.status == "PASS" and not (appear or disappear):
        row.status, row.attribution = one_device.status, "one_device"
        row.lines = [f"the difference is already there with no strategy (see default); under {spec} each version "
                     "trains what its own one device trains"] + first + notes
        return row
    split = _rows_differ(a, b, found[0].step if found else None)
    if split is not None and sides_right:
        k, rows_a, rows_b = split
        row.status, row.attribution = "DEVIATION", "rule_changed"
        row.lines = [f"behaviour changed since {labels[1]}: at step {k} the replicas received {rows_b} examples, on "
                     f"{labels[0]} {rows_a} ({RULE})"] + first + notes
        return row
    row.status, row.attribution = "FAIL", "unexplained"
    row.lines = first + raised + lines + [f"known deviation {i} {c} (it does not explain every difference)"
                                          for i, c in row.deviations if c != "both"] + notes
    return row


def judge_one_device(a, b, labels: tuple, rtol: float, atol: float, remedied=None) -> Row:
    """The row of the runs with no strategy (both repeat themselves bit for bit: no allowance).
    ``remedied(entry, side)``: the run of ``side`` (0 from, 1 to) with an entry's remedy applied, or
    None; an entry with a remedy that applies to one version only explains the difference when its
    remedy makes that version train what the other trains."""
    raw = (a, b)
    a, b, notes = align(a, b)
    agreed, worst, found = differential.compare(a, b, rtol, atol)
    row = Row("default", "PASS", "same", steps=min(len(a.steps), len(b.steps)), agreed=agreed, mismatches=found,
              sides=("", ""), lines=notes, worst=worst)
    if not found and len(a.steps) == len(b.steps):
        return row
    first = [f"first difference at step {found[0].step}: {found[0].line()} ({labels[1]} against {labels[0]})"] \
        if found else [f"{labels[0]} ran {len(a.steps)} steps, {labels[1]} {len(b.steps)}"]
    for entry, side in (remedied.candidates if remedied is not None else ()):
        fixed = remedied(entry, side)
        if fixed is None:
            continue
        x, y, _ = align(fixed, raw[1]) if side == 0 else align(raw[0], fixed)
        _, _, still = differential.compare(x, y, rtol, atol)
        if not still and len(x.steps) == len(y.steps):
            change = "appears" if side == 1 else "disappears"
            row.status, row.attribution = "DEVIATION", change
            row.deviations = [[entry.id, change]]
            row.lines = [f"known deviation {entry.id} applies on {labels[side]}, not on {labels[1 - side]} ({change}): "
                         f"with its remedy ({deviations.REMEDIES[entry.remedy]}) {labels[side]} trains what "
                         f"{labels[1 - side]} trains"] + first + notes
            return row
    row.status, row.attribution = "FAIL", "unexplained"
    row.lines = ["with no strategy the two versions train this loop differently: the release changed what it "
                 "computes, and no catalogued cause explains it"] + first + notes
    return row


class _Remedies:
    """The entries with a remedy (deviations.REMEDIES) that apply to exactly one of the two
    versions and whose evidence the run shows (``dense_gradients``: a gradient was a
    tf.IndexedSlices), and the remedied one-device run of that version."""

    def __init__(self, checkers: tuple, refs: tuple):
        self.checkers, self.refs = checkers, refs
        self.candidates = []
        for entry in deviations.load():
            if entry.remedy != "dense_gradients":  # the one remedy the workload probe applies (the script probe's:
                continue                           # scriptcheck.SCRIPT_REMEDIES)
            applies = [entry.applies_to(c.versions.get("tensorflow"), c.versions.get("keras")) for c in checkers]
            if applies.count(True) != 1:
                continue
            side = applies.index(True)
            if entry.remedy == "dense_gradients" and not refs[side].facts.sparse_gradients:
                continue
            self.candidates.append((entry, side))

    def __call__(self, entry, side: int):
        checker = self.checkers[side]
        try:
            run = checker.rerun(checker.default, **{entry.remedy: True})
        except EngineError:
            return None
        return None if run[0].raised is not None else run[0]


# -- the report --------------------------------------------------------------------------------
@dataclasses.dataclass
class UpgradeReport:
    target: str
    labels: tuple  # how each side is named: its env (or "this interpreter") and versions
    versions: tuple  # each side's {"tensorflow", "keras"}
    global_batch: int
    steps: int
    rtol: float
    atol: float
    rows: list

    def exit_code(self, accept_known: bool = False) -> int:
        statuses = {r.status for r in self.rows}
        if "FAIL" in statuses:
            return EXIT["FAIL"]
        if "ERROR" in statuses:
            return EXIT["ERROR"]
        if statuses & {"DEVIATION", "BLOCKED"} and not accept_known:
            return EXIT["KNOWN"]
        return EXIT["PASS"]

    def summary(self) -> str:
        bad = {s: [r.spec for r in self.rows if r.status == s] for s in differential.STATUSES}
        if bad["FAIL"]:
            return (f"FAIL: the loop trains differently on {self.labels[1]} under {', '.join(bad['FAIL'])}, and no "
                    "catalogued cause explains it: see each spec's first difference")
        if bad["ERROR"]:
            return f"ERROR: the suite could not run {', '.join(bad['ERROR'])}: see the error, then run again"
        known = bad["DEVIATION"] + bad["BLOCKED"]
        if known:
            return (f"KNOWN CHANGES: the loop trains differently under {', '.join(known)}, as known deviations of "
                    f"TensorFlow/Keras (or a changed observed rule) explain; exit {EXIT['KNOWN']}, or 0 with "
                    "--accept-known")
        return f"PASS: the loop trains on {self.labels[1]} what it trained on {self.labels[0]}, under every spec"

    def table(self) -> str:
        rows = [("spec", f"from: {self.labels[0]}", f"to: {self.labels[1]}", "verdict", "steps agreed",
                 "allowance", "worst agreeing", "first difference", "attribution", "time")]
        for r in self.rows:
            first = "" if r.first_step is None else f"step {r.first_step}"
            named = ", ".join(f"{i} ({c})" for i, c in r.deviations if c != "both")
            what = named if r.attribution in ("appears", "disappears") and named else ATTRIBUTIONS[r.attribution]
            rows.append((r.spec, r.sides[0] or "–", r.sides[1] or "–", r.status, f"{r.agreed}/{r.steps}",
                         f"{r.allowance:.2g}", f"{r.worst:.2g}" if r.agreed else "–", first, what,
                         f"{r.seconds:.1f} s"))
        widths = [max(len(x[i]) for x in rows) for i in range(len(rows[0]))]
        out = ["  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in rows]
        return "\n".join(out[:1] + ["  ".join("-" * w for w in widths)] + out[1:])

    def text(self) -> str:
        head = (f"upgrade check of {self.target}: from {self.labels[0]} ({_versions(self.versions[0])}) to "
                f"{self.labels[1]} ({_versions(self.versions[1])}); global batch "
                f"{self.global_batch}, {self.steps} steps, rtol {self.rtol:g} plus the rounding allowance, atol "
                f"{self.atol:g}")
        parts = [head, f"both versions train from {self.labels[0]}'s initial values on the same data (every batch's "
                       "digest equal); the 'from'/'to' columns: the loop check of the spec against that version's "
                       "own one device", "", self.table()]
        unmatched = list(dict.fromkeys(x for r in self.rows for x in r.lines if x.startswith(ONE_SIDED)))
        parts += [""] + unmatched if unmatched else []  # the same on every row: said once
        for r in self.rows:
            lines = [x for x in r.lines if not x.startswith(ONE_SIDED)]
            if r.status != "PASS" or lines:
                parts += ["", f"{r.spec}: {r.status} ({ATTRIBUTIONS[r.attribution]})"] + [f"  {x}" for x in lines]
        return "\n".join(parts + ["", self.summary()])

    def as_json(self) -> dict:
        return {"kind": "upgrade", "workload": self.target,
                "from": {"label": self.labels[0], **self.versions[0]},
                "to": {"label": self.labels[1], **self.versions[1]},
                "global_batch": self.global_batch, "steps": self.steps, "rtol": self.rtol, "atol": self.atol,
                "summary": self.summary(), "exit_code": self.exit_code(), "specs": [r.as_json() for r in self.rows]}


def label(env: str | None) -> str:
    """How the report names a side: its tox env or interpreter path, or the engines' own."""
    return env or "this interpreter"


def _versions(found: dict) -> str:
    return f"TensorFlow {found.get('tensorflow')}, Keras {found.get('keras')}"


def _side(pool: EnginePool, target: str, env: str | None, init, **kwargs) -> Checker:
    """A loop checker whose engines run ``env``'s TensorFlow (None: the pool's interpreter), checked
    to have one."""
    if env is not None:
        try:
            parse_spec(f"default@{env}")
        except SpecError as exc:
            raise CheckInputError(f"--from/--to {env!r}: {str(exc).splitlines()[0]}") from None
        python = versions.interpreter(env)[0]
        if not os.path.exists(python):
            raise CheckInputError(f"{env!r}: no interpreter {python} (build the tox env first: tox run --notest -e {env})")
    checker = Checker(pool, target, env=env, init=init, **kwargs)
    if not checker.versions.get("tensorflow"):
        raise CheckInputError(f"{env or pool.python!r}: no TensorFlow installed there")
    return checker


def run(target: str, env_from: str, env_to: str | None, specs: list, pool: EnginePool, steps: int = 3,
        global_batch: int = 48, rtol: float = differential.RTOL, atol: float = differential.ATOL, seed: int = 0,
        path: str | None = None, progress=None) -> UpgradeReport:
    """The upgrade check of ``target`` from ``env_from`` to ``env_to`` (None: the pool's own
    interpreter) under ``specs`` (``default`` is always the first row)."""
    # canonical=False: the canonical step runs only where a control needs it (Checker.control), since the
    # upgrade report shows no note of the loop check
    kwargs = dict(steps=steps, global_batch=global_batch, rtol=rtol, atol=atol, seed=seed, path=path, canonical=False)
    began = time.monotonic()
    a = _side(pool, target, env_from, None, **kwargs)
    ref_a = _reference(a, env_from)
    b = _side(pool, target, env_to, init_of(ref_a), **kwargs)
    ref_b = _reference(b, env_to or "this interpreter")
    labels = (label(env_from), label(env_to))
    digests = ref_a.facts.batch_digests, ref_b.facts.batch_digests
    if digests[0] != digests[1]:
        raise CheckInputError(f"workload {target!r} trains on other data on {labels[1]} than on {labels[0]} (the "
                              "batches' digests differ): make its data with numpy from a fixed seed, not with "
                              "TensorFlow's random ops, so both versions see the same examples")
    one = judge_one_device(ref_a, ref_b, labels, rtol, atol, _Remedies((a, b), (ref_a, ref_b)))
    one.seconds = time.monotonic() - began
    if progress:
        progress(f"default (no strategy): {one.status} ({one.seconds:.1f} s)")
    rows = [one]
    chosen = [s for s in specs if s.base.text != "default"]
    for i, spec in enumerate(chosen, 1):
        began = time.monotonic()
        try:
            row = _spec_row(spec, a, b, one, labels, rtol, atol)
        except EngineUnavailable as exc:
            if progress:
                progress(f"[{i}/{len(chosen)}] {spec.text}: skipped ({exc})")
            continue
        row.seconds = time.monotonic() - began
        rows.append(row)
        if progress:
            progress(f"[{i}/{len(chosen)}] {spec.text}: {row.status} ({ATTRIBUTIONS[row.attribution]}; "
                     f"{row.seconds:.1f} s)")
    return UpgradeReport(target, labels, (a.versions, b.versions), global_batch, steps, rtol, atol, rows)


def _reference(checker: Checker, name: str):
    try:
        return checker.reference()
    except CheckInputError as exc:
        raise CheckInputError(f"on {name}: {exc}") from None


def _spec_row(spec, a: Checker, b: Checker, one: Row, labels: tuple, rtol: float, atol: float) -> Row:
    spec_a, spec_b = a.on(spec.base), b.on(spec.base)
    va, vb = a.check(spec_a), b.check(spec_b)
    if "ERROR" in (va.status, vb.status):
        bad = va if va.status == "ERROR" else vb
        return Row(spec.base.text, "ERROR", "unexplained", lines=[bad.error or "the engine failed"],
                   sides=(va.status, vb.status))
    try:
        again = a.rerun(spec_a)
    except EngineError:
        again = None
    return judge_row(spec.base.text, a.runs[spec_a.text], again, b.runs[spec_b.text], va, vb, one, labels, rtol, atol)
