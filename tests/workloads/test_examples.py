"""The check of a user's own loop (python -m suite.check; suite/harness/loopcheck/usercheck.py) on the
examples: the custom-training guide's loop trains under every selected spec what it trains with
no strategy, and each loop with one catalogued mistake is diagnosed with that cause and only
that cause (examples/mistakes.py has one factory per cause of CAUSES)."""

from __future__ import annotations

import pytest

from suite.common.specs import DEFAULT_SPECS, parse_spec
from suite.harness.judging import deviations
from suite.harness.judging.judgment import Check
from suite.harness.loopcheck import differential, render, usercheck
from suite.harness.loopcheck.causes import CAUSES
from tests.helpers import ROOT

GUIDE = "examples.guide:workload"
_CHECKERS: dict = {}


def checker(pool, target: str) -> usercheck.Checker:
    """One checker (one reference run) per workload in this process; without the canonical step's
    note, which these tests do not read (tests/workloads/test_entry_points.py runs the CLI with it)."""
    if target not in _CHECKERS:
        _CHECKERS[target] = usercheck.Checker(pool, target, path=str(ROOT), canonical=False)
    return _CHECKERS[target]


# Without --deep the guide's CNN runs on one default spec of every kind (.ci/run's README command runs it on
# every default spec); the other default specs differ only in counts
ONE_OF_EACH = ("default", "one_device", "mirrored:2", "central_storage:2", "multi_worker:2x1", "parameter_server:2w1ps")
ONE_PER_KIND = ("mirrored:2", "central_storage:2", "multi_worker:2x1")


def right(v) -> bool:
    """The verdict of a right loop: PASS, or DEVIATION where recorded known deviations (their
    signatures matched) explain every difference. An unrecorded deviation (the control, the
    suite's own step, diverges as the loop does) is TensorFlow's/Keras' finding, and fails here
    until it is recorded."""
    return v.status == "PASS" or (v.status == "DEVIATION" and all(i != "unrecorded" for i, _ in v.deviations))


def from_structure_alone(check, v, cause: str, named: list, what: str) -> None:
    """A mistake the check finds from how the run was built alone (differential.FROM_STRUCTURE: a model
    or optimizer made outside the scope): FAIL naming ``named`` (its cause, with its model) where a step
    differs or raised; where every step agreed (it trains alike under this spec), PASS, or DEVIATION
    where a known deviation predicts every difference, the cause said in a note with its fix, never a
    FAIL (issue 62)."""
    __tracebackhide__ = True
    if v.status in ("PASS", "DEVIATION"):
        title = CAUSES[cause].title
        check.that(right(v) and not v.diagnoses and any(title in n and "every step agreed" in n for n in v.notes),
                   what, (v.status, v.notes), f"PASS or DEVIATION with a note naming {title!r}", render.details(v))
    else:
        check.equal((v.status, [f"{d.model}: {d.cause}" if d.model else d.cause for d in v.diagnoses]),
                    ("FAIL", named), what, render.details(v))


def trimmed(keep: tuple[str, ...]):
    """The ``without_deep`` predicate of a test trimmed to the default specs ``keep``: a spec
    selected beyond the defaults (a deeper cluster, the real ``cluster`` spec) was asked for by
    name and always runs."""
    return lambda spec: spec.text in keep or spec.text not in DEFAULT_SPECS


@pytest.mark.specs(lambda spec: True, without_deep=trimmed(ONE_OF_EACH))
def test_the_guides_loop_trains_as_on_one_device(any_spec, pool):
    v = checker(pool, GUIDE).check(any_spec)
    Check(any_spec).that(right(v), "the guide's loop (examples/guide.py)", (v.status, v.deviations),
                         "PASS, or DEVIATION where a known deviation of TensorFlow predicts every difference",
                         render.details(v))
    Check(any_spec).equal(v.steps, 3, "steps compared")


@pytest.mark.specs(lambda spec: True, without_deep=trimmed(ONE_OF_EACH))
def test_a_loop_with_random_draws_of_its_own_is_random_never_fail(any_spec, pool):
    """Input noise from a tf.random.Generator made in the scope (examples/zoo.py): where the runs
    differ (every spec with two or more replicas) the verdict is RANDOM naming the generator's op,
    never FAIL; where one device and the spec draw alike, PASS."""
    v = checker(pool, "examples.zoo:right_input_noise_from_a_generator").check(any_spec)
    check = Check(any_spec)
    want = "RANDOM" if any_spec.replicas > 1 else v.status
    check.equal(v.status, want, "the verdict of a right loop with input noise of its own", render.details(v))
    check.that(v.status in ("PASS", "RANDOM"), "the verdict", v.status, "PASS or RANDOM", render.details(v))
    if v.status == "RANDOM":
        check.contains(v.error, ["RngReadAndSkip"], "the op the verdict names")


@pytest.mark.specs(lambda spec: True, without_deep=trimmed(ONE_PER_KIND))
def test_a_right_loop_fed_by_distribute_datasets_from_function_passes(spec, pool):
    """Workload.distribute="function": per-replica batches of each input pipeline's shard. On one
    worker the replicas take consecutive batches (rows 0-23 and 24-47 of the first 48); across
    two workers each takes every other example, so a step's rows are again the first 48, the
    examples one device's step sees."""
    v = checker(pool, "examples.mistakes:right_from_function").check(spec)
    Check(spec).that(right(v), "examples.mistakes:right_from_function", (v.status, v.deviations),
                     "PASS, or DEVIATION where a known deviation of TensorFlow predicts every difference",
                     render.details(v))


@pytest.mark.specs(lambda spec: True, without_deep=trimmed(ONE_OF_EACH))
def test_the_right_loop_of_the_mistakes_passes(any_spec, pool):
    v = checker(pool, "examples.mistakes:right").check(any_spec)
    Check(any_spec).that(right(v), "examples.mistakes:right", (v.status, v.deviations),
                         "PASS, or DEVIATION where a known deviation of TensorFlow predicts every difference",
                         render.details(v))


def _applies(deviation: str, test_id: str, versions: dict) -> bool:
    """Whether known deviation ``deviation`` applies to the installed versions and covers ``test_id``."""
    entry = next(d for d in deviations.load() if d.id == deviation)
    return entry.applies_to(versions["tensorflow"], versions["keras"]) and entry.matches(test_id)


def expected(mistake: str, spec, versions: dict) -> tuple[list[str], str | None]:
    """The causes the check must name and the known deviation it must report instead, where the
    installed TensorFlow makes the mistake harmless or invisible:

    - an optimizer built lazily in the first distributed step (as TensorFlow's tutorial builds it)
      is right: where deviation keras3-lazy-optimizer-slots-mirrored applies (Keras 3.5+,
      collectives over 2 or more local devices: its test patterns name the specs) it raises and the
      loop is BLOCKED by that entry (the cause's fix shown as the way around it); elsewhere its
      slots are made correctly;
    - Keras 3 BatchNormalization cannot train under CentralStorage at all (deviation
      keras3-central-storage-replica-context-updates), so whether it is synchronized is moot;
    - CentralStorage keeps a single copy of every variable, so replicas cannot disagree."""
    if mistake == "lazy_optimizer_build":
        return [], ("keras3-lazy-optimizer-slots-mirrored" if _applies(
            "keras3-lazy-optimizer-slots-mirrored",
            f"tests/properties/test_training.py::test_optimizer_variables_created_lazily_in_a_distributed_step"
            f"[{spec.text}-Adam]", versions) else None)
    if mistake == "per_replica_batch_norm" and _applies(
            "keras3-central-storage-replica-context-updates",
            f"tests/properties/test_blocks.py::test_unsynchronized_batch_norm_normalises_each_replica_by_itself"
            f"[{spec.text}]", versions):
        return [], "keras3-central-storage-replica-context-updates"
    if mistake == "replicas_disagree" and spec.strategy == "central_storage":
        return [], None
    return [mistake], None


# causes whose loops live in examples/zoo.py only (judged with --zoo, tests/workloads/test_zoo.py)
IN_THE_ZOO_ONLY = ("gradients_aggregated_by_hand", "optimizer_scaled_by_replicas", "input_not_sharded_per_worker",
                   "weighted_loss_normalized_per_replica", "gradient_of_per_replica_mean")


# causes of a training script's outer loop, whose mistakes live in examples/scripts/mistakes.py and
# multi_worker_mistakes.py (judged by tests/workloads/test_scripts.py and test_cluster_scripts.py), and of what a
# script's own train_step returns to fit (test_fit_scripts.py): a workload's loop is the suite's, which makes none
IN_SCRIPTS_ONLY = ("batch_not_distributed", "metric_from_one_replica", "shuffled_per_worker_before_sharding",
                   "fit_log_reduced_over_replicas")


@pytest.mark.specs(lambda spec: spec.replicas > 1, without_deep=trimmed(ONE_PER_KIND))
@pytest.mark.parametrize("mistake", sorted(set(CAUSES) - set(IN_THE_ZOO_ONLY) - set(IN_SCRIPTS_ONLY)))
def test_each_catalogued_mistake_is_diagnosed_with_its_cause_only(spec, mistake, pool, suite_state):
    """Under one spec of every synchronous kind with 2 replicas (every such selected spec with --deep)."""
    v = checker(pool, f"examples.mistakes:{mistake}").check(spec)
    want, deviation = expected(mistake, spec, suite_state.versions)
    check = Check(spec)
    if mistake in differential.FROM_STRUCTURE:
        from_structure_alone(check, v, mistake, [mistake], f"examples.mistakes:{mistake}")
        return
    check.equal([d.cause for d in v.diagnoses], want, f"causes diagnosed for examples.mistakes:{mistake}",
                render.details(v))
    if want:
        check.equal(v.status, "FAIL", f"verdict of examples.mistakes:{mistake}", render.details(v))
    elif deviation:
        check.equal((v.status in ("DEVIATION", "BLOCKED"), v.deviation[0] if v.deviation else None), (True, deviation),
                    f"verdict (the loop is right) and deviation reported for {mistake}", render.details(v))
    else:  # harmless here: what one device trains (CentralStorage's metrics may carry their deviation)
        check.that(right(v) and (v.status == "PASS" or spec.strategy == "central_storage"),
                   f"verdict of examples.mistakes:{mistake}", v.status, "PASS", render.details(v))


@pytest.mark.specs(lambda spec: True, without_deep=trimmed(("mirrored:2", "parameter_server:2w1ps")))
@pytest.mark.parametrize("name", ["linear", "mlp", "cnn"])
def test_the_builtin_workloads_train_as_on_one_device(any_spec, name, pool):
    """The benchmarks' workloads, written against the same protocol (suite/engine/workloads/builtin.py),
    trained by the suite's canonical step (mirrored:2 and the parameter-server spec without --deep)."""
    v = checker(pool, f"suite.engine.workloads.builtin:{name}").check(any_spec)
    Check(any_spec).that(v.status == "PASS", f"suite.engine.workloads.builtin:{name}", v.status, "PASS",
                         render.details(v))


@pytest.mark.specs(lambda spec: spec.replicas > 1, without_deep=trimmed(ONE_PER_KIND))
def test_keras_dropout_sharing_masks_is_reported_as_its_deviation(spec, pool, suite_state):
    """A right loop with Keras' own Dropout: where a known deviation in the loop check's scope
    (loop-check[SPEC]) makes Keras raise for its random layers, the loop is BLOCKED by it; where one
    makes Keras draw one mask for several replicas, the verdict is DEVIATION naming it; elsewhere
    each replica draws its own and it passes."""
    v = checker(pool, "examples.mistakes:right_with_dropout").check(spec)
    led = differential.ledger(spec, suite_state.versions)
    raises = [d.id for d, s in led.covering(differential.RAISED_IN[differential.RANDOM_LAYERS_RAISED]) if s.kind == "raises"]
    draws = [d.id for d, s in led.covering(differential.DRAWS_SHARED)]
    want = ("BLOCKED", raises[0]) if raises else ("DEVIATION", draws[0]) if draws else ("PASS", None)
    check = Check(spec)
    check.equal([d.cause for d in v.diagnoses], [], "causes diagnosed for a right loop with Keras' Dropout",
                render.details(v))
    check.equal((v.status, v.deviation[0] if v.deviation else None), want, "verdict and deviation",
                render.details(v))


def _exit(v) -> int:
    """The exit status python -m suite.check gives for this one verdict."""
    return usercheck.Report("", {}, 48, 3, 0.0, 0.0, [], [v]).exit_code()


@pytest.mark.specs(lambda spec: spec.strategy == "central_storage" and spec.replicas > 1)
def test_a_users_own_unaggregated_assign_add_is_the_loops_failure(spec, pool):
    """The ValueError Keras' own layers raise under CentralStorage, raised from the user's own
    assign_add: FAIL, exit 1 (no known deviation's origin is the user's frame)."""
    v = checker(pool, "examples.mistakes:assign_add_without_aggregation").check(spec)
    Check(spec).equal((v.status, v.deviations, _exit(v)), ("FAIL", [], 1),
                      "verdict, deviations named and exit status", render.details(v))


@pytest.mark.specs(lambda spec: spec.strategy in ("mirrored", "multi_worker") and spec.replicas > 1,
                   without_deep=trimmed(("mirrored:2",)))
def test_a_divergence_with_no_cause_beside_keras_dropouts_deviation_fails(spec, pool):
    """A stray factor sqrt(replicas) on the loss in a loop with Keras' Dropout, under a spec where Dropout's shared
    masks are a known deviation: the deviation does not excuse the divergence; FAIL, exit 1, and
    the control (the suite's step on the same model) trains right, so it is the loop's."""
    v = checker(pool, "examples.mistakes:dropout_and_loss_scaled_by_root_replicas").check(spec)
    check = Check(spec)
    check.equal((v.status, [d.cause for d in v.diagnoses], _exit(v)), ("FAIL", [], 1),
                "verdict, causes and exit status", render.details(v))
    check.that(any("trains here what it trains on one device" in n for n in v.notes), "the control's note",
               v.notes, "the control trains right here: the divergence is the loop's", render.details(v))


def test_a_users_deadlock_is_not_excused():
    """A step that all-reduces on the first worker only: the collective times out (or the workers'
    collectives pair wrongly and their variables differ); FAIL or ERROR, never a known deviation,
    exit status not 0. Its own pool, so the collective timeout is short (38 s)."""
    from suite.harness.pool.pool import EnginePool

    pool = EnginePool(call_timeout=45.0)
    try:
        v = usercheck.Checker(pool, "examples.mistakes:reduced_on_one_worker_only", path=str(ROOT),
                              canonical=False).check(parse_spec("multi_worker:2x1"))
    finally:
        pool.close()
    Check("multi_worker:2x1").that(v.status in ("FAIL", "ERROR") and not v.deviations and _exit(v) in (1, 3),
                                   "a user's deadlock", (v.status, v.deviations, _exit(v)),
                                   "FAIL or ERROR with no deviation named, exit 1 or 3", render.details(v))


# a workload whose loss reads the shape of its batch and none of its examples (as a GAN's generator fed noise does),
# averaged per replica (a mistake), its input sharded per worker (right)
READS_NO_EXAMPLE = '''
import numpy as np
import tensorflow as tf

from suite.engine.workload import Workload


def workload(ctx):
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    x = (np.arange(64 * 4, dtype=np.float32).reshape(64, 4) / 100)

    def dataset(global_batch_size, input_context):
        ds = tf.data.Dataset.from_tensor_slices(x)
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.batch(input_context.get_per_replica_batch_size(global_batch_size))

    def step(batch):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(tf.ones_like(batch))))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    mse = tf.keras.losses.MeanSquaredError(reduction="none")  # the protocol's loss; the step computes its own
    return Workload(model, optimizer, mse, dataset, step=step, distribute="function")
'''


def test_equal_losses_of_a_workload_that_reads_no_example_prove_no_sharding(pool, tmp_path):
    """Both workers' replicas return the same losses and gradients bit for bit, since the loss reads no
    example; each worker drew its own shard (the digests of the examples each replica got, which the
    workload probe records as the script's does): FAIL naming the loss averaged per replica, and not
    'input not sharded per worker' (issue 62, item 5: that cause was named from the equal losses)."""
    (tmp_path / "reads_no_example.py").write_text(READS_NO_EXAMPLE)
    spec = parse_spec("multi_worker:2x1")
    v = usercheck.Checker(pool, "reads_no_example:workload", path=str(tmp_path), canonical=False).check(spec)
    check = Check(spec)
    check.equal((v.status, [d.cause for d in v.diagnoses]), ("FAIL", ["loss_averaged_per_replica"]),
                "the verdict of a loss averaged per replica that reads no example", render.details(v))
