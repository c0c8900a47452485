"""tf.train.Checkpoint across strategies: save under one spec, restore under another or with no
strategy; every variable and the optimizer's slots and iteration count equal the reference, the
metric states (a float Mean and an int64 Sum, sync-on-read) equal the reference's state of the
steps run, one more step equals the step of an uninterrupted run, and a SavedModel reloads
without a strategy and predicts the same."""

from __future__ import annotations

import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from reference import distribute as ref
from reference import metrics as ref_metrics
from reference import model as ref_model
from reference.rules import Rule
from suite.common.catalog import ADAPTIVE
from suite.common.given import Given
from suite.common.specs import parse_spec
from suite.harness.drawing import cases
from suite.harness.drawing.cases import ARCHS, arch_dict, training_cases, training_steps
from suite.harness.judging.judgment import Check
from suite.harness.judging.quantity import Quantity
from tests.helpers import COSTLY

OPTIMIZERS = ["sgd", "sgd_momentum", "adam", "rmsprop", "adagrad"]
# a SavedModel exported under a strategy, loaded without one
RELOADED = Rule("documented", "https://www.tensorflow.org/tutorials/distribute/save_and_load: a model saved under a "
                              "strategy is restored 'without tf.distribute.Strategy'; tf.saved_model.load returns an "
                              "object with 'functions that can be used to do inference'")


@pytest.fixture(scope="session")
def restore_specs(suite_state):
    """Where a checkpoint may be restored: no strategy, and every selected spec."""
    specs = {s.text: s for s in suite_state.specs}
    specs.setdefault("default", parse_spec("default"))
    return [specs[k] for k in sorted(specs)]


def _increments(history) -> list[tuple[float, int]]:
    """What each step adds to the step's metrics: the loss Mean's total (every example's loss at
    the parameters of its step) and count, which the int64 Sum counts too."""
    losses = [np.asarray(step["trace"].per_example_loss, np.float64) for step in history]
    return [(float(v.sum()), int(v.shape[0])) for v in losses]


def _replica_increments(history, steps) -> list[list[tuple[float, int]]]:
    """The same per replica: each step's (total, count) of each replica's slice (``steps``: the
    ``(x, y, sizes)`` of every step of ``history``)."""
    return [[(float(part.sum()), int(part.shape[0]))
             for part in ref.split(np.asarray(step["trace"].per_example_loss, np.float64), sizes)]
            for step, (_, _, sizes) in zip(history, steps)]


def _unsummed(params: list, slots: list, replica_losses: list) -> dict:
    """What the model of keras3-gradients-not-summed-before-3.5 (reference/model.py
    train_unsummed) says a state holds: every replica's parameters (global replica order), the
    read copy's optimizer slots, and each step's (loss total, count) on each replica's copy."""
    return {"params": params, "slots": slots, "replica_losses": replica_losses}


def _by_value(arrays: list) -> np.ndarray:
    """The arrays (of one shape) stacked in the order of their values (flattened, compared
    element by element)."""
    return np.stack(sorted((np.asarray(a, np.float64) for a in arrays), key=lambda a: tuple(a.ravel())))


def _check_state(got, history, under, check, what, state, worker, counted=False, steps=(), restored_after=None,
                 replica=0, unsummed=None):
    """``got`` against the reference state after ``history``, whose steps ran under the specs
    ``under`` (one per step: deviation models read where each metric update happened). The
    int64 Sum is compared where ``counted`` (the saved state; its restore is the property of
    test_integer_metric_state_survives_restore). Deviation models also read each replica's
    increments (``steps``: the ``(x, y, sizes)`` of every step), the steps before a restore
    (``restored_after``), the replica whose copy the worker reads (``replica``) and the state
    under the not-summed model (``unsummed``: _unsummed's). ``what`` heads each quantity's text; its
    fields say which ``state`` it is (saved, restored, after restore) and on which ``worker``."""
    __tracebackhide__ = True
    last = history[-1]

    def of(kind: str, text: str, **fields) -> Quantity:
        return Quantity.of(kind, f"{what}: {text}", state=state, worker=worker, **fields)
    for v, (copies, expected) in enumerate(zip(got.params, last["params"])):
        for r, copy in enumerate(copies):
            check.close(copy, expected, of("variable", f"variable {v} on replica {r}", name=v, replica=r), kind="trained",
                        n_terms=4,
                        given=Given(unsummed=unsummed["params"][replica + r][v]) if unsummed else None)
    check.equal(got.iterations, last["iterations"], of("optimizer iterations", "optimizer iterations"))
    # slots matched by shape and value (optimizer variable names and order differ across Keras
    # versions): the optimizer's variables of each slot shape, in order of their values, against
    # the reference's slots of that shape in the same order
    pool = [np.asarray(v, np.float64) for v in got.optimizer if np.asarray(v).ndim > 0]
    for shape in dict.fromkeys(slot.shape for slot in last["slots"]):
        mine = [p for p in pool if p.shape == shape]
        theirs = [slot for slot in last["slots"] if slot.shape == shape]
        check.equal(len(mine), len(theirs), of("optimizer variables", f"optimizer variables of shape {shape}",
                                               shape=str(shape)))
        check.close(_by_value(mine), _by_value(theirs),
                    of("optimizer slots", f"optimizer slots of shape {shape}, in order of their values", shape=str(shape)),
                    kind="trained", n_terms=4,
                    given=Given(unsummed=_by_value([s for s in unsummed["slots"] if s.shape == shape]))
                    if unsummed else None)
    increments = _increments(history)
    total, count = sum(t for t, _ in increments), sum(n for _, n in increments)
    per_replica = _replica_increments(history, steps)
    copies = {"restored_after": restored_after, "replica": replica}
    own = {"unsummed_replica_increments": [[[t, n] for t, n in step] for step in unsummed["replica_losses"]]} \
        if unsummed else {}
    # the metric states read in cross-replica context: each replica's SUM-aggregated (sync-on-read)
    check.close(got.metrics["loss"], [total, count], of("loss Mean state", "loss Mean state (total, count)"), kind="trained",
                n_terms=16, given=Given(start=[0.0, 0.0], increments=[[t, n] for t, n in increments], under=under,
                                    replica_increments=[[[t, n] for t, n in step] for step in per_replica],
                                    **copies, **own), rule=ref_metrics.cross_replica_result)
    if counted:
        check.equal([int(v) for v in got.metrics["examples"]], [count],
                    of("examples seen", "int64 Sum of the examples seen"),
                    given=Given(start=[0], increments=[[n] for _, n in increments], under=under,
                                replica_increments=[[[n] for _, n in step] for step in per_replica], **copies),
                    rule=ref_metrics.cross_replica_result)


@COSTLY
@given(data=st.data())
def test_checkpoint_restores_under_another_strategy(engines, spec, restore_specs, data):
    target = data.draw(st.sampled_from(restore_specs), label="restore under")
    optimizer = data.draw(st.sampled_from(OPTIMIZERS), label="optimizer")
    dtype = "float64"
    arch_name, params, steps = data.draw(training_cases(spec.replicas, dtype, max_steps=3), label="before")
    more = data.draw(training_steps(arch_name, target.replicas, dtype, max_steps=1), label="after")
    arch = ARCHS[arch_name]
    before = ref_model.train(arch, params, optimizer, steps)
    uninterrupted = ref_model.train(arch, params, optimizer, steps + more)
    assume(cases.well_conditioned(uninterrupted, dtype, optimizer in ADAPTIVE))
    # the model of keras3-gradients-not-summed-before-3.5: each replica trains its own copy, and the
    # restore gives every copy the saved primary's (replica 0's) parameters and optimizer state
    own = ref_model.train_unsummed(arch, params, optimizer, steps)
    own_more = ref_model.train_unsummed(arch, params, optimizer, more, restored=own[-1])
    losses = [e["replica_losses"] for e in own]
    directory = tempfile.mkdtemp(prefix="tfds-ckpt-")
    try:
        saved = engines.call(spec, "checkpoint.save", arch=arch_dict(arch), optimizer=optimizer, dtype=dtype,
                             params=params, steps=steps, directory=directory)
        case = {"arch": arch_name, "optimizer": optimizer, "restored under": target.text}
        for w, state in enumerate(saved):
            first = w * spec.replicas // len(saved)
            _check_state(state, before, [spec] * len(steps), Check(spec, dtype, case, rule=ref_model.train),
                         f"saved state (worker {w})", "saved", w,
                         counted=True, steps=steps, replica=first,
                         unsummed=_unsummed(own[-1]["params"], own[-1]["slots"][first], losses))
        out = engines.call(target, "checkpoint.restore", arch=arch_dict(arch), optimizer=optimizer, dtype=dtype,
                           path=saved[0].path, steps=more)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    where = f"saved under {spec}, restored under {target}"
    check = Check(target, dtype, case, rule=ref_model.train)
    for w, r in enumerate(out):
        first = w * target.replicas // len(out)  # the worker's first replica
        _check_state(r.restored, before, [spec] * len(steps), check, f"{where}: restored (worker {w})", "restored", w,
                     steps=steps, restored_after=len(steps), replica=first,
                     unsummed=_unsummed([own[-1]["params"][0]] * target.replicas, own[-1]["slots"][0], losses))
        _check_state(r.after, uninterrupted, [spec] * len(steps) + [target] * len(more), check,
                     f"{where}: one step after restore vs uninterrupted run (worker {w})", "one step after restore", w,
                     steps=steps + more, restored_after=len(steps), replica=first,
                     unsummed=_unsummed(own_more[-1]["params"], own_more[-1]["slots"][first],
                                        losses + [e["replica_losses"] for e in own_more]))


def test_integer_metric_state_survives_restore(engines, spec):
    """int64 sync-on-read SUM metrics holding 1..9, saved with no strategy and restored under the
    spec, read the same counts: a restore must keep the sum across the replicas' copies."""
    values = list(range(1, 10))  # every remainder modulo replicas <= 8 occurs
    directory = tempfile.mkdtemp(prefix="tfds-ckpt-")
    try:
        saved = engines.call(parse_spec("default"), "checkpoint.counters_save", values=values, directory=directory)[0]
        out = engines.call(spec, "checkpoint.counters_restore", n=len(values), path=saved.path)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    check = Check(spec, case={"saved with no strategy": values}, rule=ref_metrics.cross_replica_result)
    for w, r in enumerate(out):
        check.equal(r.values, values, Quantity.of("int64 Sum metrics after a restore").at(worker=w))


@COSTLY
@given(data=st.data())
def test_saved_model_exported_under_a_strategy_predicts_identically_without_one(engines, spec, data):
    arch_name, params, steps = data.draw(training_cases(spec.replicas, "float32", max_steps=1), label="model")
    arch = ARCHS[arch_name]
    x = steps[0][0]
    directory = tempfile.mkdtemp(prefix="tfds-savedmodel-")
    try:
        under = engines.call(spec, "checkpoint.export", arch=arch_dict(arch), dtype="float32", params=params,
                             x=x, directory=directory)
        reloaded = engines.call(parse_spec("default"), "checkpoint.reload_predict", directory=directory, x=x)[0]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    out, _, _ = ref_model.forward(arch, params, x)
    expected = ref_model.losses.softmax(out) if arch.head == "softmax" else out
    check = Check(spec, "float32", {"arch": arch_name, "x": x}, rule=ref_model.forward)
    check.close(under[0].prediction, expected, "prediction under the strategy", n_terms=8)
    check.exact(reloaded.prediction, under[0].prediction, "prediction of the reloaded SavedModel vs under the strategy",
                rule=RELOADED)
