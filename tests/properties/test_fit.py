"""Model.fit under each strategy: one epoch of a model compiled inside ``strategy.scope()``
equals the reference's steps on the global batches Keras distributes, on every replica's copy
of every variable at each of fit's batch boundaries (every ``steps_per_execution`` steps), and
fit's logged loss is the mean loss of the examples trained so far."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from reference import input as ref_input
from reference import model as ref_model
from reference.rules import Rule
from suite.common.given import Given
from suite.harness.drawing import cases
from suite.harness.drawing.cases import ARCHS, arch_dict, floats, magnitudes
from suite.harness.judging.judgment import Check
from suite.harness.judging.quantity import Quantity
from tests.helpers import RETRACES
from tests.properties.test_training import check_history

# Model.fit under a strategy trains as one device on each global batch (Keras' distributed-training guide:
# "Synchronicity keeps the model convergence behavior identical to what you would see for single-device
# training"): each example weighs 1/global batch, as tf.nn.compute_average_loss has it in a custom loop; the loss
# metric fit logs is the mean loss of every example trained so far (plus the regularization). On a global batch
# the replicas do not divide Keras weighs each replica's examples 1/(replicas x its batch) instead, the
# reference's "default" denominator: known deviation fit-loss-mean-per-replica-on-uneven-split.
FIT = Rule("one device's steps on the global batches", "https://keras.io/guides/distributed_training_with_tensorflow/ "
           "(synchronous data parallelism: convergence identical to single-device training); Keras' fit logs the mean "
           "of its loss tracker, updated with each replica's unscaled loss weighted by its batch size "
           "(keras/src/backend/tensorflow/trainer.py train_step; tf_keras/src/engine/compile_utils.py LossesContainer)")


@st.composite
def fit_cases(draw, spec, steps_per_execution: int, split: str):
    """(arch name, parameters, x, y, global batch, reference steps): fit's epoch of ``steps``
    full global batches, each split as ``experimental_distribute_dataset`` splits it
    (reference/input.py): on an uneven split the last replicas may get no rows ([2, 2, 0] for 4 on
    3 replicas); ``split``: a global batch the replica count divides ("even") or one it does not
    ("uneven", two replicas or more)."""
    arch_name = draw(st.sampled_from(sorted(ARCHS)), label="arch")
    arch = ARCHS[arch_name]
    dtype = "float32"
    params = [draw(magnitudes(dtype, shape, 1 / 16, 1.0), label=f"param {i}") for i, shape in enumerate(arch.shapes())]
    r = spec.replicas
    if split == "even":
        batch = r * draw(st.integers(1, 3), label="rows per replica")
    else:
        batch = r * draw(st.integers(1, 2), label="rows per replica") + draw(st.integers(1, r - 1), label="more rows")
    n = draw(st.sampled_from([2, 4]) if steps_per_execution == 2 else st.integers(2, 4), label="steps")
    x = draw(magnitudes(dtype, (n * batch, arch.input_dim), 1 / 16, 2.0), label="x")
    if arch.head == "softmax":
        y = draw(hnp.arrays(np.int32, n * batch, elements=st.integers(0, arch.outputs - 1)), label="labels")
    else:
        y = draw(floats(dtype, (n * batch, arch.outputs), -2.0, 2.0), label="y")
    steps = []
    for parts in ref_input.distribute(n * batch, batch, False, spec.replicas, workers=spec.workers):
        ids = [i for part in parts for i in part]
        steps.append((x[ids], y[ids], [len(part) for part in parts]))
    return arch_name, params, x, y, batch, steps


def loss_increments(arch, params, history) -> list[tuple[float, int]]:
    """Per step, what it adds to fit's loss metric (a Mean): the sum over its examples of their
    loss at the parameters before the step plus the regularization there, and their count."""
    out, before = [], [np.asarray(p, np.float64) for p in params]
    for step in history:
        per_example = step["trace"].per_example_loss
        out.append((float(np.sum(per_example)) + len(per_example) * ref_model.regularization(arch, before),
                    len(per_example)))
        before = step["params"]
    return out


def replica_logs(arch, params, replica_losses, replica_params) -> list[list[float]]:
    """After each step, each replica's own running mean of its examples' losses, each at its copy
    of the parameters before the step, plus the regularization of that copy: what a replica's own
    loss tracker reads (Keras 3.0-3.6). ``replica_losses``: per step, per replica, (the sum of its
    examples' losses, their count); ``replica_params``: per step, per replica, its parameters after it."""
    totals = [0.0] * len(replica_losses[0])
    counts = [0] * len(totals)
    before = [[np.asarray(p, np.float64) for p in params] for _ in totals]
    out = []
    for losses, after in zip(replica_losses, replica_params):
        for r, (total, count) in enumerate(losses):
            totals[r] += total + count * ref_model.regularization(arch, before[r])
            counts[r] += count
        out.append([t / c if c else 0.0 for t, c in zip(totals, counts)])
        before = after
    return out


def replica_step_means(arch, params, replica_losses, replica_params) -> list[list[float]]:
    """Per step, each replica's own loss: the mean of its examples' losses at its copy of the
    parameters before the step plus the regularization of that copy, NaN for a replica with no
    rows (``0 / 0``): what a replica's loss tracker is updated with (Keras 3.0-3.1 count each such
    update as one). Arguments as replica_logs."""
    before = [[np.asarray(p, np.float64) for p in params] for _ in replica_losses[0]]
    out = []
    for losses, after in zip(replica_losses, replica_params):
        out.append([total / count + ref_model.regularization(arch, before[r]) if count else float("nan")
                    for r, (total, count) in enumerate(losses)])
        before = after
    return out


def split_losses(history, steps) -> list[list[tuple[float, int]]]:
    """Per step of ``history`` (one set of parameters for every replica), per replica, the sum of
    its examples' losses and their count."""
    out = []
    for step, (_, _, sizes) in zip(history, steps):
        ends = np.cumsum([0, *sizes])
        per_example = step["trace"].per_example_loss
        out.append([(float(np.sum(per_example[a:b])), int(b - a)) for a, b in zip(ends[:-1], ends[1:])])
    return out


def logged_losses(increments) -> list[float]:
    """After each step, the mean loss of every example trained so far (fit's loss metric)."""
    totals = np.cumsum([total for total, _ in increments])
    counts = np.cumsum([count for _, count in increments])
    return list(totals / counts)


@RETRACES
@pytest.mark.parametrize("split", ["even", "uneven"])
@pytest.mark.parametrize("steps_per_execution", [1, 2])
@given(data=st.data())
def test_fit_trains_as_the_reference_on_the_global_batches(engines, spec, steps_per_execution, split, data):
    """An epoch of Model.fit under the strategy: at every boundary of its batches (every
    steps_per_execution steps) every replica's copy of every variable equals the reference's
    after that many steps, fit's logged loss is the mean loss of the examples so far, and the
    optimizer counted every step; on even splits and on global batches the replicas do not divide."""
    if split == "uneven" and spec.replicas == 1:
        pytest.skip("one replica: every global batch splits evenly")
    arch_name, params, x, y, batch, steps = data.draw(fit_cases(spec, steps_per_execution, split), label="case")
    arch = ARCHS[arch_name]
    history = ref_model.train(arch, params, "sgd", steps, "global")
    # what Keras trains (each replica's mean loss scaled by 1/replicas), equal to it on even splits: the model of
    # fit-loss-mean-per-replica-on-uneven-split, and the weights the deviations' models of fit's logs read
    per_replica = ref_model.train(arch, params, "sgd", steps, "default")
    uneven = len(set(steps[0][2])) > 1
    assume(cases.well_conditioned(history, "float32", False) and cases.well_conditioned(per_replica, "float32", False))
    results = engines.call(spec, "training.fit", arch=arch_dict(arch), optimizer="sgd", dtype="float32",
                           params=params, x=x, y=y, batch=batch, steps_per_execution=steps_per_execution)
    case = {"arch": arch_name, "global batch": batch, "steps": len(steps), "split": steps[0][2]}
    check = Check(spec, "float32", case, rule=FIT)
    boundaries = list(range(steps_per_execution, len(steps) + 1, steps_per_execution))
    # what the conditions of the entries whose fit raises read (suite/harness/judging/signatures.py)
    seen = Given(fit_first_split=steps[0][2], steps_per_execution=steps_per_execution)
    whose = [f" (worker {w})" if len(results) > 1 else "" for w in range(len(results))]
    steps_run = [Quantity.of("step", "the step").at(**({"worker": w} if len(results) > 1 else {}))
                 for w in range(len(results))]
    returned = [check.returned(result, step, given=seen) for result, step in zip(results, steps_run)]
    if not all(returned):
        return  # fit raised as a known deviation predicts: nothing trained to compare
    increments = loss_increments(arch, params, per_replica)
    # the model of keras3-gradients-not-summed-before-3.5 (Keras 3.0-3.4), whose fit also leaves each replica's
    # loss unscaled (keras3-loss-unscaled-before-3.8, 3.0-3.7): each replica applies the gradient of its own
    # batch's mean to its own copy
    unsummed = (arch, params, "sgd", steps, {"denominator": "default", "unscaled": True})
    own_steps = ref_model.train_unsummed(*unsummed[:4], **unsummed[4])
    # the model of keras3-loss-unscaled-before-3.8 on Keras 3.5-3.7, whose optimizer sums: each replica's loss its
    # own batch's mean plus the whole regularization, the gradients summed
    unscaled = ref_model.train(arch, params, "sgd", steps, "default", unscaled=True)
    # what the deviations' models of fit's logs read: the loss metric's increments, and each replica's own
    # running mean, on its own copy (unsummed) and on the weights of the unscaled steps
    own = replica_logs(arch, params, [st["replica_losses"] for st in own_steps], [st["params"] for st in own_steps])
    unscaled_own = replica_logs(arch, params, split_losses(unscaled, steps),
                                [[st["params"]] * spec.replicas for st in unscaled])
    own_means = replica_step_means(arch, params, [st["replica_losses"] for st in own_steps],
                                   [st["params"] for st in own_steps])
    unscaled_increments = loss_increments(arch, params, unscaled)
    keras_logged = logged_losses(increments)
    check_history(results, history, check, initial=params, at=boundaries,
                  logged=logged_losses(loss_increments(arch, params, history)),
                  logged_given=[Given(kind="mean", increments=increments[:s + 1], step_mode="fit",
                                      replica_logs=own[s], replica_step_means=own_means[:s + 1],
                                      unscaled_increments=unscaled_increments[:s + 1],
                                      unscaled_replica_logs=unscaled_own[s], fit_first_split=seen.fit_first_split,
                                      alternative=keras_logged[s] if uneven else None)
                                for s in range(len(increments))],
                  unsummed=unsummed, unscaled=unscaled, alternative=per_replica if uneven else None, facts=seen)
    # after the values (which a deviation's signature is asked of first)
    for result, who in zip(results, whose):
        check.equal(result.steps, boundaries, f"the steps fit had run at its batch boundaries{who}")


@RETRACES
@pytest.mark.specs(lambda spec: spec.kind in ("default", "one_device", "mirrored", "central_storage"))
@given(kernel=st.sampled_from([0.5, 1.0, 2.0]), learning_rate=st.sampled_from([1 / 128, 1 / 64]),
       per_replica=st.integers(1, 3), epochs=st.integers(1, 3))
def test_each_epoch_of_fit_trains_that_iteration_of_the_dataset(engines, spec, kernel, learning_rate, per_replica,
                                                                epochs):
    """Model.fit's epoch e trains the e-th iteration of its dataset (reference/input.py
    fit_epoch_iterations), so a dataset that reshuffles each iteration trains the same order under a
    strategy as with none: here iteration k of the dataset (a generator it calls again each time it is
    iterated) is one batch with the feature k + 1, so the weight after each epoch says which iteration
    it trained, and fit begins as many iterations as it has epochs. On the local strategies (fit under
    MultiWorkerMirroredStrategy raises on Keras 3.3+: keras3-fit-multi-worker-raises)."""
    iterations = ref_input.fit_epoch_iterations(epochs)
    expected = ref_model.one_weight_sgd(kernel, learning_rate, [k + 1 for k in iterations])
    # keras3-fit-extra-draw-under-a-strategy (Keras 3.5+, under any strategy): the symbolic build draws the first
    # batch from an iteration of its own, so each epoch trains the next iteration and fit begins one more
    under = spec.kind != "default"
    later = ref_model.one_weight_sgd(kernel, learning_rate, [k + 2 for k in iterations]) if under else None
    # and keras3-loss-unscaled-before-3.8 with it on Keras 3.5-3.7 (mirrored, central_storage): each replica's
    # loss its own batch's mean, the replicas' gradients summed, so every step is replicas x the step (all the
    # examples of a batch alike), on the next iteration too
    unscaled = (ref_model.one_weight_sgd(kernel, spec.replicas * learning_rate, [k + 2 for k in iterations])
                if under and spec.replicas > 1 else None)
    # where the optimizer does not sum the replicas' gradients (keras3-gradients-not-summed-before-3.5, Keras
    # 3.0-3.4, before the extra draw) each replica applies its own unscaled mean's gradient: the global step here
    unsummed = expected if spec.kind == "mirrored" and spec.replicas > 1 else None
    results = engines.call(spec, "training.fit_epochs", kernel=kernel, learning_rate=learning_rate,
                           rows=per_replica * spec.replicas, epochs=epochs)
    check = Check(spec, "float32", {"kernel": kernel, "learning rate": learning_rate, "rows": per_replica * spec.replicas,
                                    "epochs": epochs}, rule=ref_input.fit_epoch_iterations)
    for w, result in enumerate(results):
        where = {"worker": w} if len(results) > 1 else {}
        if not check.returned(result, Quantity.of("step", "fit").at(**where)):
            continue
        check.equal(result.iterations, epochs, Quantity.of("fit dataset iterations", "iterations of the dataset fit "
                                                           "began").at(**where),
                    given=Given(alternative=epochs + 1 if under else None))
        check.equal(len(result.kernels), epochs, "epochs fit ended")
        for e, copies in enumerate(result.kernels):
            for r, value in enumerate(copies):
                check.equal(np.float64(value), expected[e],
                            Quantity.of("fit epoch variable", f"the weight after epoch {e + 1}", epoch=e + 1).at(
                                replica=r, **where), given=Given(alternative=None if later is None else later[e],
                                           unscaled=None if unscaled is None else unscaled[e],
                                           unsummed=None if unsummed is None else unsummed[e]))
