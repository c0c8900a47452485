"""Check a training script as the user wrote it (``tf-distribute-check path/to/train.py [-- ARGS]``;
pytest side, no TensorFlow): the unchanged script runs in the engines under each one-process
synchronous spec and in a one-device reference told the spec's replica count
(suite/engine/script/, suite/engine/probes/script.py), and each spec's run is compared and
judged as a workload's is (suite/harness/loopcheck/differential.py), with the same statuses,
report, JSON and exit codes (usercheck.EXIT).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import signal
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...common import limits
from ...common.results import SCRIPT_RAISED
from ...common.specs import parse_spec
from ..pool import memo, versions
from ..pool.pool import EngineError, EnginePool, EngineUnavailable, ProbeError
from ..pool.versions import engine_versions
from . import controls, differential, evidence, render
from .runs import first_difference, first_non_finite, stitch
from .usercheck import CheckEngineError, CheckInputError, Report, _check_specs, _start_quietly, default_jobs, engine_failure

INSIDE = " (in the replica function)"  # a read of the replica count inside strategy.run (the engine's mark)
# the spec kinds whose strategy a script's constructors can be given here: synchronous ones, and parameter
# servers for a script that trains through a ClusterCoordinator
SCRIPT_KINDS = ("default", "one_device", "mirrored", "central_storage", "multi_worker", "parameter_server")
# the causes a script that trains with Keras' own Model.train_step can have made: its data, its model's layers and
# where it built them; every other cause is about the step's loss, gradients and optimizer, which is Keras' code there
FIT_SCRIPT_CAUSES = frozenset({"created_outside_scope", "per_replica_batch_norm", "identical_dropout_masks",
                               "per_replica_batch_size", "shuffled_per_worker_before_sharding",
                               "input_not_sharded_per_worker", "batch_not_distributed"})
# the specs whose FAIL is checked against the one-replica control (by_one_replica), by kind, and that control: one
# replica under a strategy of one process, or a multi-worker spec's under a cluster of one worker
ONE_REPLICA_CONTROLLED = {"mirrored": "mirrored:1", "central_storage": "mirrored:1", "multi_worker": "multi_worker:1x1"}
# the strategy the reference's one device runs under, by the spec's kind (others: "one_device"): a script's
# strategy constructors give a Reference over that engine's strategy. Keras builds and draws otherwise under any
# strategy than under none (Keras 3.5+'s fit draws its first batch from an iterator of its own, so a dataset that
# reshuffles each iteration trains in another order: known_deviations.toml keras3-fit-extra-draw-under-a-strategy):
# the default spec's reference has no strategy, as the default spec, and every other one a OneDeviceStrategy. A
# parameter-server spec's reference runs its closures one after another with no strategy (_Local) as before.
REFERENCE_UNDER = {"default": "default", "parameter_server": "default"}
# why a spec of the other kind than the script's is not checked (by the script's kind)
OTHER_KIND = {
    "synchronous": "a parameter-server cluster trains only what a ClusterCoordinator schedules, and the script steps "
                   "with strategy.run in lockstep (it builds a synchronous strategy)",
    "coordinated": "the script trains through a ClusterCoordinator (a ParameterServerStrategy's), which runs on "
                   "parameter_server specs only",
}


def is_script(target: str) -> bool:
    """A file to run (``train.py``, ``path/to/train``, an existing file) rather than
    ``package.module:attribute`` (what has neither is a workload target, judged as such)."""
    return target.endswith(".py") or os.sep in target or (":" not in target and os.path.isfile(target))


def is_entry(pool: EnginePool, target: str, cwd: str | None = None) -> bool:
    """Whether ``package.module:attribute`` names an entry function (one that takes no argument, run as
    a script) rather than a workload factory: asked of the default engine, which imports the module."""
    try:
        return pool.call(parse_spec("default"), "script.kind", target=target, path=cwd or os.getcwd())[0] == "entry"
    except EngineError:
        return False  # the workload check reports what is wrong with it


def not_checked(spec) -> str | None:
    """Why scripts are not checked under ``spec`` (None: they are)."""
    if spec.gpus:
        return "scripts are not checked on GPU specs yet (their replicas are the CPU's virtual devices)"
    if spec.kind in SCRIPT_KINDS:
        return None
    return f"scripts are not checked under {spec.kind} specs yet (only under {', '.join(SCRIPT_KINDS)})"


@dataclasses.dataclass
class Script:
    """Where the script is, as the engine needs it."""

    target: str  # as the user gave it
    path: str | None  # the file to run, or None for an entry function
    entry: str | None  # ``package.module:function``, or None for a file
    folder: str  # its files are the user's code (put first on sys.path for a file)
    root: str | None = None  # for an entry function: the folder its package is found from (first on sys.path)

    @classmethod
    def of(cls, target: str, cwd: str | None = None) -> Script:
        cwd = cwd or os.getcwd()
        if is_script(target):
            path = os.path.abspath(os.path.join(cwd, target))
            if not os.path.isfile(path):
                raise CheckInputError(f"script {target!r}: no such file")
            return cls(target, path, None, os.path.dirname(path))
        module, _, attr = target.partition(":")
        if not module or not attr.isidentifier():
            raise CheckInputError(f"script {target!r}: expected a file or 'package.module:function'")
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            found = None
        if found is None or not found.origin:
            raise CheckInputError(f"script {target!r}: no module named {module!r} (run from the folder that holds "
                                  "it, or put it on PYTHONPATH)")
        return cls(target, None, target, os.path.dirname(os.path.abspath(found.origin)), cwd)


# the remedies (known_deviations.toml ``remedy``) the script probe can apply (suite/engine/remedies.py)
SCRIPT_REMEDIES = ("scaled_keras_losses", "global_batch_loss")
# the remedies that change nothing where every compared step splits evenly among the replicas (tried only where one
# does not)
UNEVEN_REMEDIES = ("global_batch_loss",)


class ScriptChecker:
    """Runs a script's references (one per replica count) and any spec against them."""

    def __init__(self, pool: EnginePool, target: str, args: list | None = None, steps: int = 3,
                 rtol: float = differential.RTOL, atol: float = differential.ATOL, seed: int = 0,
                 cwd: str | None = None, env: str | None = None):
        if steps < 1:
            raise CheckInputError(f"script {target!r}: --steps must be positive")
        self.script = Script.of(target, cwd)
        self.pool, self.target, self.args, self.steps = pool, target, list(args or []), steps
        self.rtol, self.atol, self.seed = rtol, atol, seed
        # ``env``: every spec, the reference's included, runs on that tox env's or interpreter's TensorFlow
        self.env = env
        self.default = self.on(parse_spec("default"))
        self.versions = engine_versions(*versions.interpreter(env)) if env else engine_versions(pool.python)
        self.refs: dict = {}  # (replicas, workers, ps, under) -> the reference run told that many (_reference_key)
        self.replays: dict = {}  # (key, closure workers) -> the reference replaying a parameter-server run's order
        self.kind: str | None = None  # the script's: "synchronous" or "coordinated" (once a reference ran)
        self.stand_in_refs: dict = {}  # global batch -> the stand-in control on one device
        self._lock = threading.Lock()
        self._ref_locks: defaultdict = defaultdict(threading.Lock)
        self.notes: list[str] = []
        self.created_at = time.monotonic()
        self.first_key = None  # the reference computed first: its failure stops the check
        self.not_here: dict = {}  # spec text -> why it is not checked (its reference raised)

    def _run(self, spec, reference: bool = False, **kwargs) -> list:
        s = self.script
        kwargs = dict(target=s.target, folder=s.folder, path=s.path, entry=s.entry, root=s.root, args=self.args,
                      steps=self.steps, seed=self.seed, **kwargs)
        # one device's runs (the references, their replays): in a pytest session, computed once (memo.py)
        return memo.MEMO.one_device(self.pool, spec, "script.run", kwargs, reference=reference,
                                    content=lambda: memo.folder_digest(s.folder, s.path))

    def _run_against(self, spec, ref, **kwargs) -> list:
        """``spec``'s runs from the reference ``ref``'s initial values (``kwargs``: the probe's options)."""
        return self._run(spec, init=ref.initial, init_names=ref.names, init_trainable=ref.trainable,
                         late_init=ref.facts.late_values, **kwargs)

    def _input_error(self, exc: EngineError) -> CheckInputError | CheckEngineError:
        """What a failed reference run means: the script's own error (input the check cannot use), or
        an engine that hung or died (CheckEngineError)."""
        failure = engine_failure(f"script {self.target!r}", exc)
        if failure is not None:
            return failure
        if isinstance(exc, ProbeError) and exc.raised.type == "OtherKind":
            return OtherKindError(exc.raised.message)
        if isinstance(exc, ProbeError) and exc.raised.type == "ScriptError":
            return CheckInputError(exc.raised.message)
        return CheckInputError(f"script {self.target!r}: the reference run failed: {str(exc).splitlines()[0]}")

    def reference(self, replicas: int = 1, workers: int = 1, ps: int = 0, under: str = "default"):
        """The script on one device, told ``replicas`` replicas (and, for a multi-worker or a
        parameter-server spec, given a TF_CONFIG of ``workers`` workers and ``ps`` parameter servers),
        run twice: it must repeat itself. ``under``: the spec whose strategy that device is the
        reference's (REFERENCE_UNDER)."""
        key = (replicas, workers, ps, under)
        self.first_key = self.first_key or key
        with self._ref_locks[key]:  # specs checked at once share each replica count's reference
            if key not in self.refs:
                self.refs[key] = self._reference(replicas, workers, ps, under)
                self.kind = self.kind or ("coordinated" if ps else "synchronous")
        return self.refs[key]

    def replay(self, key: tuple, ref, order: list):
        """The reference of ``key`` with each closure run on the iterator of the worker ``order``
        names (a parameter-server run's: which worker ran each of its closures), from the same
        initial values; ``ref`` itself where its round robin was that order."""
        if list(order) == list(ref.facts.closure_workers or []):
            return ref
        with self._ref_locks[key]:
            if (key, tuple(order)) not in self.replays:
                try:
                    self.replays[key, tuple(order)] = self._run(
                        self.on(parse_spec(key[3])), reference=True, replicas=key[0], workers=key[1], ps=key[2],
                        order=list(order), init=ref.initial,
                        init_names=ref.names, init_trainable=ref.trainable, late_init=ref.facts.late_values)[0]
                except EngineError as exc:
                    raise self._input_error(exc) from None
        return self.replays[key, tuple(order)]

    def _reference(self, replicas: int, workers: int, ps: int = 0, under: str = "default"):
        cluster = ({"workers": workers} if workers > 1 else {}) | ({"ps": ps} if ps else {})
        engine = self.on(parse_spec(under))
        try:
            first = self._run(engine, reference=True, replicas=replicas, **cluster)[0]
            if first.raised is not None and under != "default":
                # what the script cannot run under a OneDeviceStrategy (a model made outside the scope, whose
                # optimizer slots TensorFlow refuses to colocate there) is compared with one device under none
                plain = self._run(self.default, reference=True, replicas=replicas, **cluster)[0]
                if plain.raised is None:
                    self.notes.append(
                        f"the reference told {replicas} replica(s) raised under a OneDeviceStrategy ({first.raised.type}: "
                        f"{render.short_error(first.raised.message, 160)}) and runs with no strategy instead: Keras' "
                        "fit then draws its dataset otherwise than under a strategy (keras3-fit-extra-draw-under-a-"
                        "strategy)")
                    first, engine = plain, self.default
            second = self._run(engine, reference=True, replicas=replicas, init=first.initial, init_names=first.names,
                               init_trainable=first.trainable, late_init=first.facts.late_values, **cluster)[0]
        except EngineError as exc:
            raise self._input_error(exc) from None
        told = f" (told {replicas} replicas" + (f" and given a TF_CONFIG of {workers} workers"
                                                 + (f" and {ps} parameter servers" if ps else "") + ")" if cluster else ")")
        told = told if replicas > 1 or cluster else ""
        if limits.out_of_memory(first.raised):  # the engine's limit, not the script's input: ERROR, naming memory
            raise CheckEngineError(f"script {self.target!r}: the reference run did not finish{told}: "
                                   + limits.said(first.raised, self.pool.memory_limit()))
        if first.raised is not None:
            raised = first.raised
            what = (f"it raised {raised.type} before its first step" if raised.where == SCRIPT_RAISED else
                    f"{raised.where} raised {raised.type}")
            raise CheckInputError(f"script {self.target!r}: on one device{told}, {what}{raised.said()}: "
                                  f"{render.short_error(first.raised.message, 200)}"
                                  + self._keras2_hint(first.raised.message))
        facts = first.facts
        if not facts.constructed:
            raise CheckInputError(f"script {self.target!r}: it constructed no tf.distribute strategy "
                                  "(MirroredStrategy, CentralStorageStrategy, OneDeviceStrategy, ...)")
        if not facts.draws or not (facts.distributed or facts.runs or facts.step_mode == "fit"):
            raise CheckInputError(f"script {self.target!r}: it drew no element from a distributed dataset "
                                  "(strategy.experimental_distribute_dataset or distribute_datasets_from_function) "
                                  "outside a tf.function" + ("" if facts.runs else ", nor called strategy.run")
                                  + " in a tf.function it calls, so it shows no step")
        if not first.steps:
            raise CheckInputError(f"script {self.target!r}: it ended before its first step ended")
        if not any(_moved(first)):
            raise CheckInputError(f"script {self.target!r}: no variable changed in {len(first.steps)} steps on one "
                                  "device: nothing to compare")
        blown = first_non_finite(first)
        if blown is not None:
            raise CheckInputError(f"script {self.target!r} goes non-finite on one device{told}: {blown}; the check "
                                  "compares finite runs (a smaller learning rate, finite inputs)")
        moved = first_difference(first, second)
        if moved is not None:
            raise CheckInputError(f"script {self.target!r} does not repeat itself on one device{told}: {moved} differs "
                                  "between two runs with the same seeds (an unseeded random op, a non-deterministic "
                                  "kernel); fix that before checking it under strategies")
        return first

    def _keras2_hint(self, message: str) -> str:
        """Where the engines run Keras 3 and the script meets what Keras 3 removed (legacy optimizers,
        ``reset_states``, tf_keras), the env to check it on instead."""
        if not str(self.versions.get("keras") or "").startswith("3.") or not any(
                m in message for m in ("Keras 3", "legacy", "tf_keras", "TF_USE_LEGACY_KERAS", "reset_states")):
            return ""
        return (f"; if it was written for Keras 2, check it on a legacy-Keras env's engines: TF_USE_LEGACY_KERAS=1 "
                f"tf-distribute-check {self.target} --engine-python .tox/tf221-legacy/bin/python (tox -e "
                "tf221-legacy --notest builds it)")

    def by_stand_in(self, spec, ref, v) -> differential.Verdict:
        """A script has no canonical-step control: a FAIL is judged by the stand-in control alone, the
        suite's own Keras model with the script's optimizer class and hyper-parameters on features of
        the script's shape (controls.by_stand_in)."""
        described, batch = ref.facts.stand_in, ref.facts.first_batch_rows or 0
        if not described or not batch:
            v.notes.append("no control: the script holds no single Keras optimizer the stand-in control could use")
            return v
        try:
            with self._lock:
                if batch not in self.stand_in_refs:
                    self.stand_in_refs[batch] = _stand_in_run(self, self.default, batch, described)[0]
            stand = _stand_in_run(self, spec, batch, described, self.stand_in_refs[batch].initial)
        except EngineError as exc:
            v.notes.append(f"no control: the stand-in control could not run ({str(exc).splitlines()[0]})")
            return v
        return controls.by_stand_in(v, self.stand_in_refs[batch], stand, batch, self.rtol, self.atol,
                                        differential.judge_for(spec, self.versions))

    def by_one_replica(self, spec, v) -> differential.Verdict:
        """A FAIL of a spec of several replicas is the script's only where the difference needs them:
        the same script under one replica of a strategy (ONE_REPLICA_CONTROLLED) against the
        reference told one replica. Where that run differs too (and did not raise), what differs comes
        with a strategy whatever its replicas (a script's or a library's path under a strategy class that the
        reference's OneDeviceStrategy does not take): INCOMPARABLE, the FAIL's evidence kept
        as notes. Where it agrees, or cannot run, the FAIL stands, with a note saying which."""
        one = ONE_REPLICA_CONTROLLED[spec.kind]
        control = self.on(parse_spec(one))
        try:
            ref = self.reference(*_reference_key(control))
            runs = self._run_against(control, ref)
        except (CheckInputError, CheckEngineError, EngineError) as exc:
            v.notes.append(f"no one-replica control: the script could not run under {one} "
                           f"({str(exc).splitlines()[0]})")
            return v
        if runs[0].raised is not None or _variables_apart(ref, runs[0]) is not None:
            v.notes.append(f"no one-replica control: under {one} the script raised or made other variables")
            return v
        c = differential.verdict_of(control.text, ref, runs, ref.facts.first_batch_rows or 0, self.rtol, self.atol,
                                    spec_obj=control, versions=self.versions)
        if not c.mismatches or c.error is not None:
            v.notes.append(f"the one-replica control: under {one} the script trains what one device trains "
                           f"({c.agreed}/{c.steps} steps): what differs here needs {spec.replicas} replicas")
            return v
        found = [d.title for d in v.diagnoses]
        v.notes = [f"{spec.text}'s own difference: step {v.first_step}: {v.mismatches[0].line()}"] + (
            [f"the evidence of {', '.join(found)} holds too, but the difference does not need {spec.replicas} "
             "replicas"] if found else []) + v.notes
        v.status, v.diagnoses = "INCOMPARABLE", []
        v.error = (f"under {one} (one replica under a strategy) the script already differs from one device "
                   f"(step {c.first_step}: {c.mismatches[0].line()}): what differs here does not need {spec.replicas} "
                   "replicas, so it is not distribution's, and the check cannot say whether the script is right; "
                   "it comes with a strategy whatever its replicas (a script's or a library's path under a strategy "
                   "class that the reference's OneDeviceStrategy does not take)")
        return v

    def by_remedy(self, spec, ref, v, runs) -> differential.Verdict:
        """A FAIL judged by the remedies of the known deviations in scope (controls.by_remedy): the
        script run once more under ``spec`` with each one's remedy applied in the engine; one of
        UNEVEN_REMEDIES only where a step up to the first diverging one gave the replicas different
        numbers of examples (``runs``: the spec's)."""
        uneven = any(len(set(step.rows)) > 1 for step in stitch(runs).steps[:v.first_step or None]
                     if step.rows)
        entries = [e for e in differential.ledger(spec, self.versions).entries
                   if e.remedy in SCRIPT_REMEDIES and (uneven or e.remedy not in UNEVEN_REMEDIES)]

        def rerun(remedy):
            return self._run_against(spec, ref, **{remedy: True})
        return controls.by_remedy(v, ref, entries, rerun, ref.facts.first_batch_rows or 0, self.rtol,
                                  self.atol, spec, self.versions)

    def on(self, spec):
        """``spec`` as this checker's engines run it (``mirrored:2@ENV`` for ``mirrored:2``)."""
        return parse_spec(f"{spec.text}@{self.env}") if self.env and not spec.python else spec

    @property
    def fits(self) -> bool:
        """Whether the script trains with Model.fit (its first reference stepped by fit's batches)."""
        return any(ref.facts.step_mode == "fit" for ref in self.refs.values())

    def first_reference(self, specs: list) -> list:
        """Run the first reference, of ``specs[0]``; where the script is of the other kind than that
        spec (a parameter-server script for a synchronous spec, or the other way round), the
        specs of the other kind are not checked (``not_here``) and the first of the script's kind
        gives the first reference. The specs that are checked, in order."""
        try:
            self.reference(*_reference_key(specs[0]))
        except OtherKindError:
            self.kind, self.first_key = _other(_kind(specs[0])), None
        mine = [spec for spec in specs if _kind(spec) == self.kind]
        self.not_here.update({spec.text: OTHER_KIND[self.kind] for spec in specs if _kind(spec) != self.kind})
        if not mine:
            raise CheckInputError(f"script {self.target!r}: not checked under {', '.join(s.text for s in specs)}: "
                                  f"{self.not_here[specs[0].text]}")
        self.reference(*_reference_key(mine[0]))
        return mine

    def check(self, spec) -> differential.Verdict:
        spec = self.on(spec)
        key = _reference_key(spec)
        if self.kind is not None and _kind(spec) != self.kind:
            self.not_here[spec.text] = OTHER_KIND[self.kind]
            raise NotCheckedHere(self.not_here[spec.text])
        try:
            ref = self.reference(*key)
        except OtherKindError:
            self.not_here[spec.text] = OTHER_KIND[_other(_kind(spec))]
            raise NotCheckedHere(self.not_here[spec.text]) from None
        except CheckEngineError as exc:
            if not self.refs or key == self.first_key:
                raise  # the first reference: the check cannot go on
            return differential.Verdict(spec.text, spec.replicas, "ERROR", seconds=0.0, error=str(exc))
        except CheckInputError as exc:
            if not self.refs or key == self.first_key:
                raise  # the first reference: input the check cannot use
            # another replica count the script cannot run on one device (a table of batch sizes): this spec
            # is not checked, the others are
            self.not_here[spec.text] = str(exc).partition(": ")[2]
            raise NotCheckedHere(self.not_here[spec.text]) from None
        began = time.monotonic()
        try:
            engine = self.pool.get(spec)
            started = time.monotonic()
            runs = self._run_against(spec, ref)
        except EngineUnavailable:
            raise
        except EngineError as exc:
            if isinstance(exc, ProbeError) and exc.raised.type == "ScriptError":
                raise CheckInputError(exc.raised.message) from None
            return differential.Verdict(spec.text, spec.replicas, "ERROR", seconds=time.monotonic() - began,
                                        error=str(exc).splitlines()[0])
        if key[2] and runs[0].raised is None:  # each closure on the iterator of the worker that ran it here
            try:
                ref = self.replay(key, ref, runs[0].facts.closure_workers or [])
            except (CheckInputError, CheckEngineError) as exc:
                return differential.Verdict(spec.text, spec.replicas, "ERROR", seconds=time.monotonic() - began,
                                            error=f"the reference in the cluster's order failed: {exc}")
        memory = next((r.raised for r in runs if limits.out_of_memory(r.raised)), None)
        if memory is not None:  # the engine's limit: no verdict on the script
            return differential.Verdict(spec.text, spec.replicas, "ERROR", seconds=time.monotonic() - started,
                                        error=limits.said(memory, self.pool.memory_limit()))
        apart = _variables_apart(ref, runs[0])
        if apart is not None:  # compared by creation order: another set of variables cannot be compared
            return differential.Verdict(spec.text, spec.replicas, "ERROR", seconds=time.monotonic() - started,
                                        error=f"the script created other variables here than on one device ({apart}): "
                                              "the runs cannot be compared variable by variable")
        v = differential.verdict_of(spec.text, ref, runs, ref.facts.first_batch_rows or 0, self.rtol, self.atol,
                                 seconds=time.monotonic() - started, spec_obj=spec, versions=self.versions)
        if self.fits and not ref.facts.fit_own_train_step:
            _keras_step_is_not_the_scripts(v)
        returned = [m.what.name for m in v.mismatches
                    if m.role == "metric" and evidence.returned_by_train_step(runs[0].facts, m.what.name)]
        if v.status == "FAIL" and returned and not any(d.cause == "fit_log_reduced_over_replicas" for d in v.diagnoses):
            # what Keras' fit does with them (read in its source): Keras 3 averages over the replicas, Keras 2 sums;
            # a cause of its own where the logs alone differ by exactly that (evidence.fit_log_reduced_over_replicas)
            keras2 = str(self.versions.get("keras") or "").startswith("2.")
            how = ("Keras 2: their sum, reduce_per_replica(..., 'auto') in keras/src/engine/training.py, so a value that "
                   "is the same on every replica is logged at replicas x one device's: return the replica's share (a "
                   "loss scaled by tf.nn.compute_average_loss)" if keras2 else
                   "Keras 3: their mean, reduce_per_replica(..., reduction='auto') in "
                   "keras/src/backend/tensorflow/trainer.py, so a replica's share of a global mean "
                   "(tf.nn.compute_average_loss) is logged at 1/replicas of one device's: return a value that is the "
                   "same on every replica for the log (a Keras metric's result, or the mean over the replica's examples)")
            v.notes.append(f"{', '.join(dict.fromkeys(returned))}: a value the script's train_step returns to fit, not a "
                           f"Keras metric it holds; fit reduces what train_step returns over the replicas by itself ({how})")
        if v.status == "FAIL" and v.mismatches and v.error is None:
            # first the remedies (the run itself with a later Keras' change), then the stand-in control
            v = self.by_remedy(spec, ref, v, runs)
        if v.status == "FAIL" and v.mismatches and v.error is None:
            v = self.by_stand_in(spec, ref, v)
        split = runs[0].facts.fit_first_split or []
        if (self.fits and not ref.facts.fit_own_train_step and v.status == "FAIL" and not v.diagnoses
                and len(set(split)) > 1):
            v.notes.append(f"fit's first batch splits unevenly among the replicas ({', '.join(map(str, split))} "
                           "examples): Keras' own train step scales each replica's mean loss by 1/replicas "
                           "(scale_loss_for_distribution), which weighs the examples of a smaller replica batch more "
                           "than one device's global mean does (known deviation fit-loss-mean-per-replica-on-uneven-split "
                           "on Keras 2 and 3.8+, whose remedy did not account for all of it here, or was not tried); "
                           "nothing says the script is the cause")
        if v.status == "FAIL" and v.mismatches and v.error is None and spec.replicas > 1 \
                and spec.kind in ONE_REPLICA_CONTROLLED:
            v = self.by_one_replica(spec, v)
        if (self.fits and not ref.facts.fit_own_train_step and not ref.facts.fit_script_code and v.status == "FAIL"
                and not v.diagnoses and v.mismatches and v.error is None
                and evidence.same_examples_through(ref, stitch(runs), v.first_step)):
            # the script wrote no step, no layer, loss or metric it runs, and its replicas got one device's very
            # examples: what differs is Keras' code
            v.status = "DEVIATION"
            v.deviations.append(["unrecorded", (
                f"Model.fit trains with Keras' own train step, layers, loss and metrics (the script defines none of "
                f"them), and in steps 1-{v.first_step} "
                f"the replicas together got exactly one device's examples (their digests), yet step {v.first_step} "
                f"differs ({v.mismatches[0].line()}): the code that computes something else is Keras'/TensorFlow's, and "
                "no known deviation records it")])
        inside = [w.removesuffix(INSIDE) for w in ref.facts.replica_reads if w.endswith(INSIDE)]
        if inside and v.status == "FAIL" and v.mismatches:
            # what the reference answered there is one device's count; a right script may mean the spec's
            v.notes.append(f"the script read strategy.num_replicas_in_sync inside the replica function "
                           f"({', '.join(inside)}); the one-device reference answered 1 there and {spec.replicas} "
                           "outside it, as TensorFlow does, which is not one device's training where the script combines "
                           "the two (a per-replica batch times the count): no cause is named; check those lines")
            v.diagnoses = []
        if (self.fits and not ref.facts.fit_own_train_step and v.status == "FAIL" and runs[0].raised is not None
                and not v.deviations):
            # fit raised here, in Keras' own step, and no entry explains it yet: what was seen, no verdict on the script
            what = "Model.fit" if runs[0].raised.call == "fit" else "the script"
            self.not_here[spec.text] = (f"{what} raised here and not on one device ({v.error}); no known deviation "
                                        "explains it yet, and nothing was compared")
            raise NotCheckedHere(self.not_here[spec.text])
        v.start_seconds = engine.start_seconds if engine.started_at >= self.created_at else 0.0
        return v


def _keras_step_is_not_the_scripts(v: differential.Verdict) -> None:
    """A script whose fit trains with Keras' own train_step wrote no loss, gradient or optimizer call of
    the step: a cause about those fits the evidence but names Keras' code, so it is not the script's
    (said as a note, and the verdict rests on the rest)."""
    keras_own = [d for d in v.diagnoses if d.cause not in FIT_SCRIPT_CAUSES]
    if keras_own:
        v.diagnoses = [d for d in v.diagnoses if d.cause in FIT_SCRIPT_CAUSES]
        v.notes.append(f"the evidence fits {', '.join(d.title for d in keras_own)}, but the step is Keras' own "
                       "Model.train_step (the script overrides none): Keras'/TensorFlow's code, not the script's")


class OtherKindError(CheckInputError):
    """The script is of the other kind than the spec it ran for (the engine's ``OtherKind``)."""


def _kind(spec) -> str:
    """The kind of script a spec runs: "coordinated" (a parameter-server cluster's) or "synchronous"."""
    return "coordinated" if spec.kind == "parameter_server" else "synchronous"


def _other(kind: str) -> str:
    return "synchronous" if kind == "coordinated" else "coordinated"


class NotCheckedHere(EngineUnavailable):
    """The script does not run on one device told this spec's replica count (it raised there before
    its first step), though it ran for the first spec checked: this spec is not checked."""


def _reference_key(spec) -> tuple:
    """The reference a spec is compared with: one device told its replica count and, for a
    multi-worker or a parameter-server spec, given a TF_CONFIG of its workers (and parameter servers),
    under the strategy REFERENCE_UNDER gives the spec's kind."""
    if spec.kind == "parameter_server":
        return 1, spec.workers, spec.ps, REFERENCE_UNDER.get(spec.kind, "one_device")
    return spec.replicas, spec.workers if spec.kind == "multi_worker" else 1, 0, REFERENCE_UNDER.get(spec.kind, "one_device")


def _stand_in_run(checker: ScriptChecker, spec, global_batch: int, described: dict, init=None) -> list:
    """The stand-in control (the suite's own model, the script's optimizer) under ``spec``: a function of
    its arguments alone, so computed once in a pytest session (memo.py) for every script it stands in for."""
    return memo.MEMO.call(checker.pool, spec, "workload.run", dict(
        target="stand-in", steps=checker.steps, global_batch=global_batch, seed=checker.seed, stand_in_of=described,
        init=init))


def _same_variable(a: str, b: str) -> bool:
    """Whether two builds' names of the variable at one place in creation order are the same variable's:
    equal, or equal but for a scope one build puts around it (tf-keras names a Sequential's layer
    ``sequential/dense/kernel`` in one build and ``dense/kernel`` in another, and its optimizer's slot
    ``Adam/m/sequential/dense/kernel`` and ``Adam/m/dense/kernel``: the same layer's kernel and slot)."""
    if a == b:
        return True
    longer, shorter = sorted((a.split("/"), b.split("/")), key=len, reverse=True)
    extra = len(longer) - len(shorter)
    return extra > 0 and any(longer[:i] + longer[i + extra:] == shorter for i in range(len(shorter)))


def _variables_apart(ref, run) -> str | None:
    """Where a spec's run created other variables than the reference, or None: compared in creation
    order, by count, by each one's shape (where both runs hold its value) and by its name less any outer
    scope one build prefixes (_same_variable); a run that raised before creating them all is judged by
    its raise instead."""
    if run.raised is not None:
        return None

    def shape(values, i):
        return np.shape(values[i]) if i < len(values or []) else None
    for kind, mine, theirs in (("model", run.names, ref.names), ("optimizer", run.optimizer_names, ref.optimizer_names)):
        apart = [i for i, (a, b) in enumerate(zip(mine, theirs)) if not _same_variable(a, b) or (
            kind == "model" and None not in (shape(run.initial, i), shape(ref.initial, i))
            and shape(run.initial, i) != shape(ref.initial, i))]
        if len(mine) != len(theirs) or apart:
            first = apart[0] if apart else min(len(mine), len(theirs))
            here, there = (names[first] if first < len(names) else "none" for names in (mine, theirs))
            return (f"{kind} variables: {len(mine)} here, {len(theirs)} there; the first apart is #{first + 1}: "
                    f"{here} here, {there} there")
    return None


def _moved(run):
    """Per model variable, whether it changed over the run (on replica 0)."""
    last = run.steps[-1].variables
    return [not np.array_equal(np.asarray(v[0]), np.asarray(init)) for v, init in zip(last, run.initial)]


def run(target: str, specs: list, pool: EnginePool, args: list | None = None, steps: int = 3,
        rtol: float = differential.RTOL, atol: float = differential.ATOL, seed: int = 0, progress=None,
        jobs: int | None = None) -> Report:
    """The check of the script ``target`` under ``specs``, as the workload check runs (usercheck.run):
    every checked spec's engine starts while the first reference runs, then up to ``jobs`` specs at a
    time, each against the reference of its replica count (computed once); specs of kinds scripts are
    not checked under are listed as such first."""
    jobs = max(jobs or default_jobs(), 1)
    began = time.monotonic()
    checker = ScriptChecker(pool, target, args, steps, rtol, atol, seed)
    checked = [spec for spec in specs if not_checked(spec) is None]
    skipped = [f"{spec.text}: not checked: {not_checked(spec)}" for spec in specs if not_checked(spec) is not None]
    for line in skipped if progress else ():
        progress(line)
    starter = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="engine-start") if jobs > 1 else None
    verdicts: list = []

    def report(**interrupted) -> Report:
        first = next(iter(checker.refs.values()), None)
        notes = list(checker.notes) + (_script_notes(checker) if first is not None else [])
        return Report(target, checker.versions, (first.facts.first_batch_rows or 0) if first else 0,
                      steps, rtol, atol, notes, [v for v in verdicts if v is not None],
                      {"wall": time.monotonic() - began}, kind="script", skipped=skipped, **interrupted)

    try:
        if starter:  # most scripts are synchronous: a parameter-server cluster starts once the script is known to be one
            for spec in checked:
                if _kind(spec) == "synchronous":
                    starter.submit(_start_quietly, pool, spec)
        if checked:  # the first reference: input the check cannot use stops it before any spec runs
            mine = checker.first_reference(checked)
            other = [spec for spec in checked if spec not in mine]
            checked = mine
            for line in [f"{spec.text}: not checked: {checker.not_here[spec.text]}" for spec in other]:
                skipped.append(line)
                if progress:
                    progress(line)
        verdicts[:] = [None] * len(checked)
        _check_specs(checker, checked, jobs, progress, verdicts)
    except KeyboardInterrupt as exc:
        if verdicts:  # the first reference ran: the specs that finished are a report
            skipped += [f"{spec.text}: not checked: interrupted" for spec, v in zip(checked, verdicts) if v is None]
            exc.partial = report(interrupted=getattr(exc, "signum", signal.SIGINT))
        raise
    finally:
        if starter:
            starter.shutdown(wait=False, cancel_futures=True)
    skipped += [f"{spec.text}: not checked: {checker.not_here[spec.text]}" if spec.text in checker.not_here
                else f"{spec.text}: skipped (its hardware is absent)" for spec, v in zip(checked, verdicts) if v is None]
    return report()


def _script_notes(checker: ScriptChecker) -> list:
    """What the reference saw of the script: the strategies it built, where it read the replica count."""
    out = []
    for (replicas, workers, ps, under), ref in sorted(checker.refs.items()):
        facts = ref.facts
        built = "; ".join(f"{name}({shown})" for name, shown in facts.constructed)
        reads = ", ".join(f"{where} ({n}x)" for where, n in facts.replica_reads.items())
        reads = f"it read num_replicas_in_sync at {reads}" if reads else "it never read num_replicas_in_sync"
        given = f" and a TF_CONFIG of {workers} workers" if workers > 1 else ""
        given += f" and {ps} parameter servers" if ps else ""
        stepped = {"calls": "steps by calls of a tf.function that runs strategy.run",
                   "schedules": "steps by the closures it schedules on its ClusterCoordinator (each joined before the "
                                "next: one order of the asynchronous updates, the same on both sides; the reference runs "
                                "each on the iterator of the worker that ran it on the cluster)",
                   "fit": "steps by the batches Model.fit trains (a boundary at the end of each, of each execution "
                          "with steps_per_execution), its logs compared as metrics"}.get(
            facts.step_mode, f"{facts.draws} elements drawn")
        device = "one device under a OneDeviceStrategy" if under == "one_device" else "one device, no strategy"
        out.append(f"reference ({device}) told {replicas} replica(s){given}: the script built {built}; {reads}; {stepped}")
        if facts.built_in_step:
            late = facts.built_in_step
            made = f"{len(late)} model variables ({', '.join(late[:3])}{' ...' if len(late) > 3 else ''}) were made "
            if facts.built_in_step_from_creation:
                out.append(made + "in the first step (a model with no Input, built by its first call): each spec's run "
                           "makes them with the reference's values at their creation (matched by name and shape), and "
                           "their change is measured from there")
            else:
                out.append(made + "in the first step (a model with no Input, built by its first call), and not all "
                           "could be read at their creation: those start from each run's own seeded initializers, "
                           "and their differences are measured against their values, a looser comparison")
        if facts.fits_skipped:
            out.append(f"the script also fit a model that trains with no strategy ({', '.join(facts.fits_skipped)}; made "
                       "outside every strategy's scope): not compared; the steps compared are those of the fit the "
                       "strategy runs")
        if facts.tf_config_set:
            out.append(f"the script set TF_CONFIG itself before building its strategy ({facts.tf_config_set}): its "
                       "strategy is the spec's, on the spec's cluster (each worker its own task), and what it reads from "
                       "its TF_CONFIG (its workers, its rank, whether it is the chief) is what it set, in every run")
        if facts.seeded_shuffles:
            out.append(f"the script's unseeded shuffles ({', '.join(facts.seeded_shuffles)}) were given a seed of their "
                       "own, the same on every worker and in the reference: parameter-server workers would each draw "
                       "another order, which no reference reproduces")
        if any("variable_partitioner=" in shown for _, shown in facts.constructed):
            out.append("the script's variable_partitioner shards the spec's strategy's variables, and the reference's "
                       "the same way (each a ShardedVariable of the same parts), compared whole")
        if facts.device_config:
            out.append(f"the script's device configuration was skipped (the engine set its devices up): "
                       f"{', '.join(facts.device_config)}")
    return out
