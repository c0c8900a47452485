"""Check a user's training loop against itself on one device, under every selected spec
(``python -m suite.check package.module:factory``; pytest side, no TensorFlow).

The workload (suite/engine/workload.py) is run in the ``default`` engine twice with the same
seeds (its module reloaded each time) (the reference must repeat itself bit for bit, or no divergence could be told from
noise), once with the suite's canonical step (a note when the user's own step differs from it
on one device), then under each spec from the reference's initial values; each spec's run is
compared after every step and diagnosed (suite/harness/loopcheck/differential.py).

Exit status (EXIT): 0 every spec passes; 1 some spec FAILs (the loop is wrong, or differs where no
known deviation explains it); 2 the input cannot be checked (an unknown spec, a workload that does
not import or build, a dataset smaller than one global batch, a reference that does not repeat
itself, no TensorFlow for the engines); 3 the suite could not run some spec (ERROR) and none
FAILs; 4 the only findings are known deviations of TensorFlow/Keras (DEVIATION, BLOCKED): the
loop is right, and ``--accept-known`` makes that 0; 5 some spec could not be compared because the
step draws random numbers of its own (RANDOM), and none FAILs or is ERROR; 6 a script's run under some
spec differs, but one replica under a strategy differs too (INCOMPARABLE: not distribution's), and
none of the above.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from ...common.specs import parse_spec
from ..pool import memo, versions
from ..pool.pool import (
    EngineDied,
    EngineError,
    EnginePool,
    EngineStartError,
    EngineTimeout,
    EngineUnavailable,
    ProbeError,
)
from ..pool.versions import engine_versions
from . import controls, differential, render
from .runs import first_difference, first_non_finite

EXIT = {"PASS": 0, "FAIL": 1, "USAGE": 2, "ERROR": 3, "KNOWN": 4, "RANDOM": 5, "INCOMPARABLE": 6}


class CheckInputError(Exception):
    """The workload or the options cannot be checked; the message is one line."""


class CheckEngineError(Exception):
    """The suite could not finish the reference run: its engine hung (the message says where it
    waited) or died. Not the input's fault as far as the check can tell: exit 3, not 2."""


def engine_failure(what: str, exc: EngineError) -> CheckEngineError | None:
    """An engine that hung or died during a reference run, as a one-line CheckEngineError."""
    if isinstance(exc, (EngineTimeout, EngineDied)):
        return CheckEngineError(f"{what}: the reference run did not finish: {str(exc).splitlines()[0]}")
    return None


@dataclasses.dataclass
class Report:
    target: str
    versions: dict
    global_batch: int
    steps: int
    rtol: float
    atol: float
    notes: list
    verdicts: list
    timings: dict = dataclasses.field(default_factory=dict)  # seconds: the whole check and its parts
    kind: str = "workload"  # or "script": a training script run unchanged (scriptcheck.py)
    skipped: list = dataclasses.field(default_factory=list)  # one line per spec not checked, and why
    interrupted: int = 0  # the signal that stopped the check before every spec finished (0: none did)

    @property
    def passed(self) -> bool:
        """Every spec trains what one device trains (and some spec was checked)."""
        return bool(self.verdicts) and all(v.status == "PASS" for v in self.verdicts)

    def exit_code(self, accept_known: bool = False) -> int:
        """The command's exit status (EXIT); no spec checked at all is 3, as an ERROR is: nothing passed."""
        if self.interrupted:
            return 128 + self.interrupted
        statuses = {v.status for v in self.verdicts}
        if not statuses:
            return EXIT["ERROR"]
        if "FAIL" in statuses:
            return EXIT["FAIL"]
        if "ERROR" in statuses:
            return EXIT["ERROR"]
        if "RANDOM" in statuses:
            return EXIT["RANDOM"]
        if "INCOMPARABLE" in statuses:
            return EXIT["INCOMPARABLE"]
        if statuses & {"DEVIATION", "BLOCKED"} and not accept_known:
            return EXIT["KNOWN"]
        return EXIT["PASS"]

    def text(self, verbose: bool = False) -> str:
        """The report a user reads; ``verbose``: also the notes (the canonical step's comparison on
        one device) and every difference, not the first few."""
        head = (f"{self.kind} {self.target}: TensorFlow {self.versions.get('tensorflow')}, Keras "
                f"{self.versions.get('keras')}, global batch {self.global_batch or 'not seen'}, {self.steps} steps, "
                f"rtol {self.rtol:g}, atol {self.atol:g}")
        reference = ("reference: the workload with no strategy on the global batch, run twice: it repeats itself bit "
                     "for bit" if self.kind == "workload" else
                     "reference: the script on one device, told each spec's replica count (so it computes the same "
                     "global batch), run twice: it repeats itself bit for bit")
        parts = [head, reference]
        parts += [f"note: {n}" for n in self.notes] if verbose or self.kind == "script" else []
        parts += ["", render.table(self.verdicts)] + self.skipped
        failing = [render.details(v, None if verbose else 6) for v in self.verdicts if v.status != "PASS"]
        if failing:
            parts += [""] + failing
        parts += ["", self.summary()]
        return "\n".join(parts)

    def summary(self) -> str:
        """One line: the worst status and what to do about it."""
        count = {s: [v.spec for v in self.verdicts if v.status == s] for s in differential.STATUSES}
        if self.interrupted:
            return (f"INTERRUPTED ({signal.Signals(self.interrupted).name}): {len(self.verdicts)} spec(s) finished "
                    f"(above), {len(self.skipped)} not checked; exit {self.exit_code()}")
        if not self.verdicts:
            return (f"NOT CHECKED: no spec given was checked (why: above, under each); exit {EXIT['ERROR']}: "
                    "nothing is known to train what one device trains")
        if count["FAIL"]:
            return (f"FAIL: the loop is wrong under {len(count['FAIL'])} of {len(self.verdicts)} specs "
                    f"({', '.join(count['FAIL'])}): see each spec's diagnosis")
        if count["ERROR"]:
            return f"ERROR: the suite could not run {', '.join(count['ERROR'])}: see the error, then run again"
        if count["RANDOM"]:
            return (f"RANDOM: the step draws random numbers of its own, so the check cannot compare it under "
                    f"{', '.join(count['RANDOM'])} (neither right nor wrong is known there); exit {EXIT['RANDOM']}")
        if count["INCOMPARABLE"]:
            return (f"INCOMPARABLE: under {', '.join(count['INCOMPARABLE'])} the run differs from one device, but one "
                    "replica under a strategy differs as well, so the difference is not distribution's (neither right "
                    f"nor wrong is known there); exit {EXIT['INCOMPARABLE']}")
        known = count["DEVIATION"] + count["BLOCKED"]
        if known:
            return (f"KNOWN DEVIATIONS: the loop is right; TensorFlow/Keras deviates under {', '.join(known)} "
                    f"(DEVIATION: trains something else; BLOCKED: cannot train there); exit {EXIT['KNOWN']}, "
                    "or 0 with --accept-known")
        return "PASS: every spec trains what one device trains"

    def as_json(self) -> dict:
        return {self.kind: self.target, "versions": self.versions, "global_batch": self.global_batch,
                "steps": self.steps, "rtol": self.rtol, "atol": self.atol, "notes": self.notes,
                "passed": self.passed, "summary": self.summary(),
                "exit_code": self.exit_code(), "specs": [v.as_json() for v in self.verdicts],
                "timings": {k: round(v, 2) for k, v in self.timings.items()},
                **({"not_checked": self.skipped} if self.kind == "script" or self.interrupted else {}),
                **({"interrupted": signal.Signals(self.interrupted).name} if self.interrupted else {})}


def validate_target(target: str, path: str) -> None:
    """A target that names no module fails here, before any engine starts (the module itself is
    imported only in engines: it imports TensorFlow; ``path`` is the folder it is found from)."""
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr or not attr.isidentifier():
        raise CheckInputError(f"workload {target!r}: expected 'package.module:factory'")
    if path not in sys.path:
        sys.path.insert(0, path)
    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError as exc:
        raise CheckInputError(f"workload {target!r}: no module named {exc.name!r} (run from the folder that holds "
                              "it, or put it on PYTHONPATH)") from None
    except (ImportError, ValueError) as exc:
        raise CheckInputError(f"workload {target!r}: module {module!r} does not import ({exc})") from None
    if found is None:
        raise CheckInputError(f"workload {target!r}: no module named {module!r} (run from the folder that holds "
                              "it, or put it on PYTHONPATH)")


def _input_error(target: str, exc: EngineError) -> CheckInputError | None:
    """The workload's own error (raised in the engine as WorkloadError) as a one-line input error."""
    if isinstance(exc, ProbeError) and exc.raised.type == "WorkloadError":
        return CheckInputError(exc.raised.message)
    if isinstance(exc, EngineStartError):
        return CheckInputError(f"workload {target!r}: {str(exc).splitlines()[0]}")
    return None


class Checker:
    """Runs the reference once and then any spec against it (the CLI and the pytest plugin)."""

    def __init__(self, pool: EnginePool, target: str, steps: int = 3, global_batch: int = 48,
                 rtol: float = differential.RTOL, atol: float = differential.ATOL, seed: int = 0,
                 path: str | None = None, canonical: bool = True, env: str | None = None, init: dict | None = None):
        self.path = str(path or os.getcwd())
        validate_target(target, self.path)
        if steps < 1 or global_batch < 1:
            raise CheckInputError(f"workload {target!r}: --steps and --global-batch must be positive")
        self.pool, self.target, self.steps, self.global_batch = pool, target, steps, global_batch
        self.rtol, self.atol, self.seed = rtol, atol, seed
        self.canonical = canonical  # also train the suite's canonical step on one device (a note when it differs)
        self.notes: list[str] = []
        self.ref = None
        self.canonical_ref = None  # the canonical step on one device (the control's reference), once run
        self.stand_in_ref = None  # the stand-in control on one device, once run
        # ``env``: every spec runs on that tox env's or interpreter's TensorFlow (SPEC@ENV); ``init``: the
        # model's initial values, the probe's init options (the upgrade check gives both versions one's)
        self.env, self.init = env, init
        self.default = self.on(parse_spec("default"))
        self.versions = engine_versions(*versions.interpreter(env)) if env else engine_versions(pool.python)
        self.runs: dict = {}  # each spec's last runs (its text: the engine's replies)
        self.created_at = time.monotonic()
        self._controls = threading.Lock()  # specs checked at once share the controls' one-device runs

    def on(self, spec):
        """``spec`` as this checker's engines run it (``mirrored:2@ENV`` for ``mirrored:2``)."""
        return parse_spec(f"{spec.text}@{self.env}") if self.env and not spec.python else spec

    def _run(self, spec, **kwargs):
        kwargs = dict(target=self.target, steps=self.steps, global_batch=self.global_batch, seed=self.seed,
                      path=self.path, **kwargs)
        # one device's runs (the reference, the canonical step's, the stand-in's): in a pytest session,
        # computed once (memo.py)
        return memo.MEMO.one_device(self.pool, spec, "workload.run", kwargs, content=self._content)

    def _content(self) -> str | None:
        """A digest of the files of the workload module's folder (what its runs import); None for a
        module with no file of its own (a namespace package): its runs are not kept."""
        origin = importlib.util.find_spec(self.target.partition(":")[0]).origin
        return memo.folder_digest(os.path.dirname(origin), origin) if origin else None

    def reference(self):
        """The reference run, checked to repeat itself (computed once)."""
        if self.ref is not None:
            return self.ref
        default = self.default
        try:
            # every run reloads the workload's module (suite/engine/workload.py: resolve), so state
            # kept at module level (an optimizer made at import) does not carry into the next
            first = self._run(default, **(self.init or {}))[0]
            second = self._run(default, init=first.initial)[0]
        except EngineError as exc:
            raise _input_error(self.target, exc) or engine_failure(f"workload {self.target!r}", exc) or CheckInputError(
                f"workload {self.target!r}: the reference run failed: {str(exc).splitlines()[0]}") from None
        if first.raised is not None:
            raise CheckInputError(f"workload {self.target!r}: with no strategy, {first.raised.where} raised "
                                  f"{first.raised.type}: {render.short_error(first.raised.message, 200)}")
        rows = first.facts.first_batch_rows
        if rows is not None and rows < self.global_batch:
            raise CheckInputError(f"workload {self.target!r}: its dataset gave {rows} examples, fewer than one global "
                                  f"batch of {self.global_batch} (use a larger dataset or --global-batch)")
        blown = first_non_finite(first)
        if blown is not None:
            raise CheckInputError(f"workload {self.target!r} goes non-finite with no strategy: {blown}; the check "
                                  "compares finite runs (a smaller learning rate, finite inputs)")
        moved = first_difference(first, second)
        if moved is not None:
            raise CheckInputError(f"workload {self.target!r} does not repeat itself with no strategy: {moved} differs "
                                  "between two runs with the same seeds (an unseeded random op, a non-deterministic "
                                  "kernel); fix that before checking it under strategies")
        if first.facts.user_step and self.canonical and self.control_fits(first) is None:
            try:
                canonical = self._run(default, canonical=True, init=first.initial)[0]
            except EngineError as exc:
                canonical = None
                self.notes.append(f"the suite's canonical step could not train this workload: {str(exc).splitlines()[0]}")
            self.canonical_ref = canonical
            if canonical is not None:
                agreed, _, found = differential.compare(first, canonical, self.rtol, self.atol, metrics=False)
                if canonical.raised is not None:
                    self.notes.append(f"the suite's canonical step (compute_average_loss of Workload.loss) could not "
                                      f"train this workload: {canonical.raised.type}: "
                                      f"{render.short_error(canonical.raised.message, 160)}")
                elif found:
                    self.notes.append(f"on one device your step differs from the guide's canonical step "
                                      f"(compute_average_loss of Workload.loss plus the scaled model.losses) from step "
                                      f"{found[0].step}: {found[0].line()}; the check compares your step with itself")
        self.ref = first
        return first

    def rerun(self, spec, **kwargs) -> list:
        """``spec``'s runs once more from the reference's initial values (``kwargs``: the probe's
        options, such as a remedy)."""
        return self._run(spec, init=self.reference().initial, **kwargs)

    def check(self, spec) -> differential.Verdict:
        ref = self.reference()
        began = time.monotonic()
        try:
            engine = self.pool.get(spec)  # started if it is not running: its start is not the check's time
            started = time.monotonic()
            runs = self._run(spec, init=ref.initial)
            self.runs[spec.text] = runs
        except EngineUnavailable:
            raise
        except EngineError as exc:
            bad = _input_error(self.target, exc)
            if bad is not None:
                raise bad from None
            return differential.Verdict(spec.text, spec.replicas, "ERROR", seconds=time.monotonic() - began,
                                        error=str(exc).splitlines()[0])
        v = differential.verdict_of(spec.text, ref, runs, self.global_batch, self.rtol, self.atol,
                                 seconds=time.monotonic() - started, spec_obj=spec, versions=self.versions)
        if v.status == "FAIL" and v.mismatches and v.error is None and self.control_fits(ref) is not None:
            v.notes.append(self.control_fits(ref))
        elif v.status == "FAIL" and v.mismatches and v.error is None:
            # the control tells TensorFlow's/Keras' divergence from the loop's, named cause or not
            control = self.control(spec, runs)
            if control is not None:
                v = differential.verdict_of(spec.text, ref, runs, self.global_batch, self.rtol, self.atol,
                                         seconds=time.monotonic() - started, spec_obj=spec, versions=self.versions,
                                         control=control)
            if control is None or not control.comparable:  # no control spoke: the stand-in alone may
                v = self.by_stand_in(spec, v)
        v.start_seconds = self.engine_start(engine)
        return v

    def by_stand_in(self, spec, v) -> differential.Verdict:
        """``v`` judged by the stand-in control where no other control spoke (controls.by_stand_in)."""
        try:
            with self._controls:
                if self.stand_in_ref is None:
                    self.stand_in_ref = self._run(self.default, stand_in=True)[0]
            stand = self._run(spec, stand_in=True, init=self.stand_in_ref.initial)
        except EngineError as exc:
            v.notes.append(f"no control: the stand-in control could not run ({str(exc).splitlines()[0]})")
            return v
        return controls.by_stand_in(v, self.stand_in_ref, stand, self.global_batch, self.rtol, self.atol,
                                        differential.judge_for(spec, self.versions))

    def engine_start(self, engine) -> float:
        """How long ``engine`` took to start, if it started for this check (0: it was running)."""
        return engine.start_seconds if engine.started_at >= self.created_at else 0.0

    @staticmethod
    def control_fits(ref) -> str | None:
        """None where the canonical-step control fits the workload (one model, one optimizer); else
        why there is no control (what the verdict says instead of a control's finding)."""
        models, optimizers = ref.facts.models or [""], ref.facts.optimizers or [""]
        if len(models) == 1 and len(optimizers) == 1:
            return None
        return (f"no control: the suite's canonical step trains one model with one optimizer, and this workload has "
                f"{len(models)} models ({', '.join(models)}) and {len(optimizers)} optimizers ({', '.join(optimizers)})")

    def control(self, spec, runs) -> controls.Control | None:
        """The suite's canonical step on the workload under ``spec`` and on one device (each once),
        judged against the loop's run (controls.control_of); None when it could not run."""
        with self._controls:
            if self.canonical_ref is None:
                try:
                    self.canonical_ref = self._run(self.default, canonical=True, init=self.ref.initial)[0]
                except EngineError:
                    return None
        try:
            control = self._run(spec, canonical=True, init=self.ref.initial)
        except EngineError:
            return None
        judge = differential.judge_for(spec, self.versions)
        judged = controls.control_of(self.ref, self.canonical_ref, control, runs, self.rtol, self.atol,
                                         self.global_batch, judge)
        if not judged.user_classes:
            return judged
        # it diverges as the loop does, but cannot speak for the user's classes: the stand-in can speak for
        # TensorFlow/Keras with the loop's optimizer (suite/engine/workloads/stand_in.py)
        try:
            with self._controls:
                if self.stand_in_ref is None:
                    self.stand_in_ref = self._run(self.default, stand_in=True)[0]
            stand = self._run(spec, stand_in=True, init=self.stand_in_ref.initial)
        except EngineError:
            return judged
        return controls.stand_in_of(judged, self.stand_in_ref, stand, self.rtol, self.atol, judge)


def default_jobs() -> int:
    """Specs checked at once by default: the processors this process may run on."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run(target: str, specs: list, pool: EnginePool, steps: int = 3, global_batch: int = 48,
        rtol: float = differential.RTOL, atol: float = differential.ATOL, seed: int = 0, progress=None,
        jobs: int | None = None) -> Report:
    """The check of ``target`` under ``specs``: the reference first, while every spec's engine starts,
    then up to ``jobs`` specs at a time (default: default_jobs(); 1: one after another, engines
    started as their specs come). The report lists the specs in the order given, whatever order they
    finish in; ``progress`` gets a line per finished spec, naming those still running."""
    jobs = max(jobs or default_jobs(), 1)
    began = time.monotonic()
    checker = Checker(pool, target, steps, global_batch, rtol, atol, seed)
    starter = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="engine-start") if jobs > 1 else None
    verdicts: list = [None] * len(specs)
    timings: dict = {}

    def report(**interrupted) -> Report:
        timings["wall"] = time.monotonic() - began
        return Report(target, checker.versions, global_batch, steps, rtol, atol, checker.notes,
                      [v for v in verdicts if v is not None], timings, **interrupted)

    try:
        if starter:  # engines start while the reference runs (a start that fails is remembered by the pool)
            for spec in specs:
                starter.submit(_start_quietly, pool, spec)
        reference_began = time.monotonic()
        checker.reference()
        reference_seconds = time.monotonic() - reference_began
        reference_start = checker.engine_start(pool.get(checker.default))
        # the reference waited for its engine's start (begun a moment earlier by a starter thread, if any)
        timings.update(reference=max(reference_seconds - reference_start, 0.0), reference_engine_start=reference_start)
        if progress:
            progress(f"reference (no strategy): repeats itself; {reference_seconds:.1f} s")
        _check_specs(checker, specs, jobs, progress, verdicts)
    except KeyboardInterrupt as exc:
        if timings:  # the reference ran: the specs that finished are a report (interrupts.Interrupted's signal)
            exc.partial = report(interrupted=getattr(exc, "signum", signal.SIGINT), skipped=[
                f"{spec.text}: not checked: interrupted" for spec, v in zip(specs, verdicts) if v is None])
        raise
    finally:
        if starter:
            starter.shutdown(wait=False, cancel_futures=True)
    return report()


def _start_quietly(pool: EnginePool, spec) -> None:
    with contextlib.suppress(EngineError):
        pool.get(spec)


def _check_specs(checker: Checker, specs: list, jobs: int, progress, verdicts: list | None = None) -> list:
    """Each spec's verdict (None: skipped, its hardware absent, or not finished), in ``specs``' order,
    filled into ``verdicts`` as each finishes (so a caller interrupted meanwhile has those that did)."""
    verdicts = [None] * len(specs) if verdicts is None else verdicts
    done = 0

    def check(i):
        try:
            return checker.check(specs[i])
        except EngineUnavailable as exc:
            return exc

    def finished(i, outcome, running):
        nonlocal done
        done += 1
        if isinstance(outcome, EngineUnavailable):
            line = f"{specs[i].text}: skipped ({outcome})"
        else:
            verdicts[i] = outcome
            cause = f": {outcome.diagnoses[0].title}" if outcome.diagnoses else ""
            line = (f"{specs[i].text}: {outcome.status}{cause} ({outcome.seconds:.1f} s; engine start "
                    f"{outcome.start_seconds:.1f} s)")
        if progress:
            still = f"; running: {', '.join(specs[j].text for j in sorted(running))}" if running else ""
            progress(f"[{done}/{len(specs)}] {line}{still}")

    if jobs == 1:
        for i in range(len(specs)):
            finished(i, check(i), ())
        return verdicts
    executor = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="spec")
    try:
        futures = {executor.submit(check, i): i for i in range(len(specs))}
        pending = set(futures)
        while pending:
            completed, pending = wait(pending, return_when=FIRST_COMPLETED)
            running = {futures[f] for f in pending if f.running()}
            for future in sorted(completed, key=futures.get):
                finished(futures[future], future.result(), running)
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
    return verdicts
