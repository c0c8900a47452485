"""Scripts that train with ``Model.fit``, checked unchanged (suite/harness/loopcheck/scriptcheck.py):
a step boundary at the end of each batch fit trains (of each execution with ``steps_per_execution``),
the model's compiled optimizer and metrics attributed to it, fit's logs compared as metrics. Keras'
distributed-training guide in its shape (examples/scripts/fit_guide.py); the GAN of Keras' guide to
customizing fit, a custom ``train_step`` with two models and two optimizers (examples/scripts/fit_gan.py),
each mistake named with its model."""

from __future__ import annotations

import dataclasses

import pytest

from suite.common.specs import parse_spec
from suite.harness.judging import deviations
from suite.harness.judging.judgment import Check
from suite.harness.loopcheck import differential, render, scriptcheck
from tests.helpers import ROOT
from tests.workloads.test_cluster_scripts import checker
from tests.workloads.test_examples import _applies, right, trimmed
from tests.workloads.test_scripts import _cases

GUIDE = ROOT / "examples" / "scripts" / "fit_guide.py"
GAN = ROOT / "examples" / "scripts" / "fit_gan.py"
LAZY = "keras3-lazy-optimizer-slots-mirrored"
BATCH = 32  # the guide's global batch
MULTI_WORKER = "keras3-fit-multi-worker-raises"
STEPS_PER_EXECUTION = "keras3-fit-steps-per-execution-mirrored-raises"
UNEVEN = "keras3-fit-uneven-replica-batches-raise"


def applies(entry_id: str, versions: dict) -> bool:
    """Whether the known deviation ``entry_id`` applies to the engines' versions (its measured range)."""
    entry = next(d for d in deviations.load() if d.id == entry_id)
    return entry.applies_to(versions.get("tensorflow"), versions.get("keras"))


def blocked_or_right(check, v, entry_id: str, versions: dict, what: str) -> None:
    """BLOCKED naming ``entry_id`` alone, with no cause, where the entry applies to the engines'
    versions; PASS (or DEVIATION, every difference predicted) where it does not."""
    __tracebackhide__ = True
    if applies(entry_id, versions):
        check.equal((v.status, [i for i, _ in v.deviations], [d.cause for d in v.diagnoses]),
                    ("BLOCKED", [entry_id], []), what, render.details(v))
    else:
        check.that(right(v) and not v.diagnoses, what, (v.status, v.deviations),
                   "PASS, or DEVIATION where a known deviation predicts every difference", render.details(v))


@pytest.mark.specs(lambda spec: spec.kind in ("default", "one_device", "mirrored", "central_storage") and not spec.gpus
                   and BATCH % spec.replicas == 0, without_deep=trimmed(("default", "mirrored:2", "central_storage:2")))
def test_the_fit_guide_trains_as_on_one_device(spec, pool):
    """The guide's model.fit under MirroredStrategy, CentralStorageStrategy and the one-device
    strategies where the replicas divide its global batch: every variable, the optimizer's slots and
    fit's logged loss and accuracy after each of 3 batches, and its evaluate's results, equal one
    device's on the same global batch, or differ only as a known deviation predicts from the
    reference's own metric states (Keras 3.7+ under CentralStorage: every replica assigns the metric's
    state, keras3-central-storage-metric-accumulation); the report says it stepped by fit's batches."""
    c = checker(pool, GUIDE)
    v = c.check(spec)
    check = Check(spec, case={"script": "fit_guide.py"})
    check.that(right(v) and not v.diagnoses, "the guide's fit", (v.status, v.deviations),
               "PASS, or DEVIATION where a known deviation predicts every difference", render.details(v))
    check.equal(v.steps, 3, "steps compared")
    ref = c.reference(*scriptcheck._reference_key(spec))
    metrics = sorted(ref.facts.metric_states)  # (Keras 3's container of the compiled metrics: each of them)
    check.equal((ref.facts.step_mode, ref.facts.optimizers, len(metrics), "model.metrics[loss]" in metrics),
                ("fit", ["model.optimizer"], 2, True),
                "how the steps were told apart, the optimizer and the metrics (the loss tracker's and the accuracy's) "
                "fit's model holds", str(metrics))
    check.contains(" ".join(scriptcheck._script_notes(c)), ["steps by the batches Model.fit trains"], "the report's note")
    check.equal(sorted(k for k in ref.steps[-1].metrics if k.startswith("evaluate ")),
                ["evaluate loss", "evaluate sparse_categorical_accuracy"],
                "the results of the guide's model.evaluate after fit, kept at the last step", str(ref.steps[-1].metrics))


def test_evaluates_results_are_compared(pool):
    """The guide's ``model.evaluate(test_dataset)`` after its fit runs (on as many batches as steps are
    compared) and its results are compared as the last step's metrics: a run whose evaluate loss alone
    is half of one device's, every weight agreeing, is FAIL there, naming it."""
    c = checker(pool, GUIDE)
    ref = c.reference(1)
    check = Check("the guide's reference")
    last = ref.steps[-1]
    halved = dataclasses.replace(last, metrics={**last.metrics, "evaluate loss": last.metrics["evaluate loss"] / 2})
    v = differential.verdict_of("default", ref, [dataclasses.replace(ref, steps=[*ref.steps[:-1], halved])],
                             ref.facts.first_batch_rows)
    check.equal((v.status, v.first_step), ("FAIL", len(ref.steps)), "a run whose evaluate loss is halved",
                render.details(v))
    check.contains(render.details(v), ["metric evaluate loss"], "what differs")


@pytest.mark.specs(lambda spec: spec.kind == "mirrored" and spec.replicas == 1)
def test_steps_per_execution_compares_every_kth_batch_on_both_sides(spec, pool):
    """compile(steps_per_execution=2): fit calls the batch callbacks once per execution of 2 batches
    (Keras' documentation of steps_per_execution), so the boundary after step k is after 2k batches:
    the optimizer's iteration counter reads 2, 4, 6 in the reference and in the spec's run, and the
    runs agree."""
    c = checker(pool, GUIDE, ["--steps-per-execution", "2"])
    v = c.check(spec)
    check = Check(spec, case={"steps_per_execution": 2})
    check.that(right(v) and not v.diagnoses, "the guide's fit, 2 batches an execution", (v.status, v.deviations),
               "PASS, or DEVIATION where a known deviation predicts every difference", render.details(v))
    ref = c.reference(*scriptcheck._reference_key(spec))
    run = c._run(c.on(spec), init=ref.initial, init_names=ref.names, init_trainable=ref.trainable,
                 late_init=ref.facts.late_values)[0]
    for name, r in (("the reference", ref), (spec.text, run)):
        i = next(i for i, n in enumerate(r.optimizer_names) if n.rsplit("/", 1)[-1] in ("iteration", "iterations"))
        check.equal([int(step.optimizer[i][0]) for step in r.steps], [2, 4, 6],
                    f"{name}: the optimizer's iterations at each boundary")


@pytest.mark.specs(lambda spec: spec.kind == "mirrored" and BATCH % spec.replicas != 0 and not spec.gpus)
def test_a_fit_whose_first_batch_splits_unevenly_is_blocked_where_keras_raises(spec, pool):
    """Where the replicas do not divide the guide's global batch (32 over 3: 11, 11, 10), Keras 3.5+
    raises before fit's first step: its symbolic build reduces the first batch with
    strategy.reduce("MEAN"), which needs every replica's batch of one shape (keras3-fit-uneven-replica-
    batches-raise, under the condition that fit's first batch splits unevenly, which the engine reads
    from the batch fit is given): BLOCKED naming the entry. Keras 2.15 and 3.0-3.4 train it (measured);
    there the verdict is whatever the run shows, and this test asks nothing of it."""
    c = checker(pool, GUIDE)
    check = Check(spec, case={"script": "fit_guide.py", "keras": c.versions["keras"]})
    if not applies(UNEVEN, c.versions):
        pytest.skip(f"Keras {c.versions['keras']} does not raise here (keras3-fit-uneven-replica-batches-raise)")
    v = c.check(spec)
    blocked_or_right(check, v, UNEVEN, c.versions, "the guide's fit on an uneven split")
    check.contains(v.error or "", ["InvalidArgumentError", "Inputs to operation AddN of type AddN must have the same "
                                   "size and shape"], "what raised")


@pytest.mark.specs(lambda spec: spec.kind == "multi_worker" and not spec.gpus,
                   without_deep=trimmed(("multi_worker:2x1",)))
def test_the_fit_guide_on_several_workers_is_blocked_where_keras_raises(spec, pool):
    """The guide's fit on a multi-worker cluster (the script's MirroredStrategy is the spec's
    MultiWorkerMirroredStrategy): Keras 3.3+ raises at fit's first batch (keras-team/keras#20585), so
    the verdict is BLOCKED naming that entry, not ERROR, not FAIL; where the entry does not apply
    (Keras 2, Keras 3.0-3.2) fit trains what one device trains."""
    c = checker(pool, GUIDE)
    v = c.check(spec)
    check = Check(spec, case={"script": "fit_guide.py", "keras": c.versions["keras"]})
    blocked_or_right(check, v, MULTI_WORKER, c.versions, "the guide's fit on several workers")
    if v.status == "BLOCKED":
        check.contains(v.error or "", ["raised ValueError", "PerReplica"], "what raised")


@pytest.mark.specs(lambda spec: spec.kind == "mirrored" and spec.replicas == 2 and not spec.gpus)
def test_steps_per_execution_under_mirrored_is_blocked_where_keras_raises(spec, pool):
    """compile(steps_per_execution=2) under MirroredStrategy on two replicas: Keras 3.7+ raises in
    its first execution ("You must feed a value for placeholder tensor"), which the entry records
    under the condition that fit runs several steps an execution: BLOCKED naming it; the same script
    with 1 step an execution is not blocked (test_the_fit_guide_trains_as_on_one_device)."""
    c = checker(pool, GUIDE, ["--steps-per-execution", "2"])
    v = c.check(spec)
    check = Check(spec, case={"steps_per_execution": 2, "keras": c.versions["keras"]})
    blocked_or_right(check, v, STEPS_PER_EXECUTION, c.versions, "the guide's fit, 2 batches an execution")
    ref = c.reference(*scriptcheck._reference_key(spec))
    check.equal(ref.facts.steps_per_execution, 2, "the steps an execution the engine saw")


def _keras3(c) -> None:
    """fit_gan.py is written for Keras 3 (the guide's ``optimizer.apply``): skipped on a Keras 2 engine."""
    if not str(c.versions.get("keras", "")).startswith("3."):
        pytest.skip(f"fit_gan.py is a Keras 3 script; the engines run Keras {c.versions.get('keras')}")


def gan_expected(case: str, spec, versions: dict) -> tuple | None:
    """(status, ["model: cause" or "cause"]) the check must give fit_gan.py's ``case`` under ``spec``;
    None: right (PASS, or DEVIATION where a known deviation predicts every difference)."""
    if case == "optimizers_built_in_the_step":  # the Keras guide's way: BLOCKED where Keras 3.5+ raises
        return ("BLOCKED", []) if _applies(LAZY, f"loop-check[{spec.text}]", versions) else None
    if case == "generator_loss_averaged_per_replica":
        return "FAIL", ["generator: loss_averaged_per_replica"]
    if case == "discriminator_metric_fed_scaled_loss":
        return "FAIL", ["metric_fed_scaled_loss"]
    if case == "guide_losses":  # Keras 3.8+ scales a Keras loss by the replicas: both trackers fed 1/R of it
        return "FAIL", ["metric_fed_scaled_loss"]
    return None


@pytest.mark.specs(lambda spec: spec.kind in ("mirrored", "central_storage") and spec.replicas == 2 and not spec.gpus,
                   without_deep=trimmed(("mirrored:2", "central_storage:2")))
@pytest.mark.parametrize("case", _cases("fit_gan.py"))
def test_the_fit_gan_trains_as_on_one_device_and_its_mistakes_are_named(spec, case, pool):
    """examples/scripts/fit_gan.py -- --case CASE under two replicas: the right GAN (its optimizers built
    in the scope, each example's loss scaled by the global batch, the trackers fed the examples' losses)
    trains and logs what one device does; each mistake is FAIL naming the model it was made in (a metric
    is no model's: the cause alone) and its cause, and nothing else; the guide's losses and trackers log
    1/R of one device's loss (Keras 3.8+ scales a Keras loss under a strategy, and the trackers are fed
    it); its optimizers left to build in fit's first batch are BLOCKED where
    keras3-lazy-optimizer-slots-mirrored applies. Each optimizer is attributed to the model whose
    variables it is handed (through Keras 3's ``optimizer.apply``), the GAN model around the two left out."""
    c = checker(pool, GAN, ["--case", case])
    _keras3(c)
    if case == "guide_losses" and applies("keras3-loss-unscaled-before-3.8", c.versions):
        pytest.skip(f"Keras {c.versions['keras']} does not scale a Keras loss by the replicas (3.8+ does)")
    v = c.check(spec)
    named = [f"{d.model}: {d.cause}" if d.model else d.cause for d in v.diagnoses]
    check = Check(spec, case={"script": "fit_gan.py", "case": case, "keras": c.versions["keras"]})
    want = gan_expected(case, spec, c.versions)
    if want is None:
        check.that(right(v) and not v.diagnoses, f"fit_gan.py --case {case}", (v.status, v.deviations, named),
                   "PASS, or DEVIATION where a known deviation predicts every difference", render.details(v))
    elif want[0] == "BLOCKED":
        check.equal((v.status, [i for i, _ in v.deviations], named), ("BLOCKED", [LAZY], []),
                    f"fit_gan.py --case {case}", render.details(v))
    else:
        check.equal((v.status, named), want, f"fit_gan.py --case {case}", render.details(v))
    if case == "right":
        ref = c.reference(*scriptcheck._reference_key(spec))
        check.equal((ref.facts.fit_own_train_step, ref.facts.trains, ref.facts.models),
                    (["GAN"], {"gan.d_optimizer": "discriminator", "gan.g_optimizer": "generator"},
                     ["discriminator", "generator"]),
                    "the custom step's class, which model each optimizer trains, the models compared")
        check.equal(sorted(ref.steps[0].named or {}), ["discriminator", "generator"], "the losses told apart per model")


@pytest.mark.specs(lambda spec: spec.kind == "multi_worker" and not spec.gpus,
                   without_deep=trimmed(("multi_worker:2x1",)))
def test_the_fit_gan_on_several_workers_is_blocked_where_keras_raises(spec, pool):
    """The right GAN's fit on a multi-worker cluster: its batches are dicts of tensors, which Keras
    3.5+'s symbolic build cannot reduce there either (the message names the dict whole): BLOCKED naming
    keras3-fit-multi-worker-raises, not FAIL; where the entry does not apply, right."""
    c = checker(pool, GAN, ["--case", "right"])
    _keras3(c)
    v = c.check(spec)
    check = Check(spec, case={"script": "fit_gan.py", "keras": c.versions["keras"]})
    blocked_or_right(check, v, MULTI_WORKER, c.versions, "the GAN's fit on several workers")


# a fit script whose dataset reshuffles each iteration from a seed (issue 62, finding 1): right code, it was FAIL "no
# catalogued cause" under every spec but default; what differed was the reference's order: Keras 3.5+'s fit draws its
# first batch from an iterator of its own under any strategy (_maybe_symbolic_build), and the reference ran none
ZOO = ROOT / "examples" / "scripts" / "zoo"


@pytest.mark.specs(lambda spec: spec.kind in ("default", "one_device", "mirrored", "central_storage") and not spec.gpus,
                   without_deep=trimmed(("one_device", "mirrored:2", "central_storage:2")))
def test_a_seeded_shuffle_fit_is_compared_on_the_order_the_spec_trains(spec, pool):
    """A fit over a dataset that reshuffles each iteration from a seed trains on the order the spec's run
    trains: the reference runs under a strategy wherever the spec has one (a OneDeviceStrategy, told the
    spec's replicas), since Keras 3.5+'s fit draws one batch more under any strategy; so it is PASS, or
    DEVIATION where a known deviation predicts every difference, never FAIL or INCOMPARABLE."""
    v = checker(pool, ZOO / "fit_shuffles.py", ["--case", "seeded_shuffle"]).check(spec)
    Check(spec).that(right(v) and not v.diagnoses, "the verdict of a right fit over a seeded reshuffling dataset",
                     (v.status, v.deviations), "PASS, or DEVIATION where a known deviation predicts every difference",
                     render.details(v))


# a custom loop that trains otherwise under the strategy classes it names, whatever their replicas: its loss's weight
# is picked by isinstance, and the reference's strategy (one device's, told the spec's replicas) is of none of them (a
# learning rate picked so differs on Keras 3 only: Keras 2's is an optimizer variable the run loads from the reference)
BY_CLASS = """
import numpy as np
import tensorflow as tf

rng = np.random.default_rng(5)
x = rng.normal(size=(256, 4)).astype(np.float32)
y = (x @ rng.normal(size=(4, 1))).astype(np.float32)
strategy = tf.distribute.MirroredStrategy()
WEIGHT = 3.0 if isinstance(strategy, (tf.distribute.MirroredStrategy, tf.distribute.experimental.CentralStorageStrategy,
                                      tf.distribute.MultiWorkerMirroredStrategy)) else 1.0
GLOBAL = 16
data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL))
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.05)


@tf.function
def step(batch):
    def replica(features, labels):
        with tf.GradientTape() as tape:
            loss = WEIGHT * tf.nn.compute_average_loss(tf.reduce_mean(tf.square(model(features) - labels), axis=1),
                                                       global_batch_size=GLOBAL)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica, args=batch), axis=None)


for batch in data:
    step(batch)
"""


@pytest.mark.specs(lambda spec: spec.kind in ("mirrored", "central_storage", "multi_worker") and spec.replicas > 1,
                   without_deep=trimmed(("mirrored:2", "central_storage:2", "multi_worker:2x1")))
def test_a_difference_one_replica_shows_too_is_not_blamed_on_the_script(spec, pool, tmp_path):
    """The one-replica control: where the script's run differs under a spec of several replicas and the
    same script under one replica (mirrored:1; multi_worker:1x1, a cluster of one worker, for a
    multi-worker spec) differs from its one-device reference as well, the difference does not need the
    replicas: INCOMPARABLE (never FAIL), saying what differed there. The vehicle weighs its loss otherwise
    under the strategy classes it names whatever their replicas."""
    (tmp_path / "by_class.py").write_text(BY_CLASS)
    script = checker(pool, tmp_path / "by_class.py")  # one checker: the references are run once
    v = script.check(spec)
    check = Check(spec)
    check.equal(script.check(parse_spec("mirrored:1")).status, "FAIL",
                "mirrored:1's own verdict (one replica, the weight of the class)", "")
    check.equal(v.status, "INCOMPARABLE", "the verdict of a script whose mirrored:1 run differs too",
                render.details(v))
    one = "multi_worker:1x1" if spec.kind == "multi_worker" else "mirrored:1"
    check.contains(v.error, [f"under {one}", "does not need"], "what the verdict says")


# a fit whose own train_step returns the replica's scaled loss as its log (issue 62, finding 4): it trains as one
# device; the log is what Keras' fit reduces over the replicas by itself, not a Mean metric of the script's
# (examples/scripts/zoo/fit_train_step_logs.py --case scaled_loss; --case mean_result is the cause's fix)
@pytest.mark.specs(lambda spec: spec.kind == "mirrored" and spec.replicas == 2)
def test_a_log_fit_reduces_is_not_called_a_mean_metric_fed_scaled_losses(spec, pool):
    """The script holds no Mean metric: "a Mean metric fed scaled losses" (and its fix, update_state with the
    per-example losses) is not its cause. Keras 3's fit averages what train_step returns over the replicas (its
    log is 1/replicas of one device's): FAIL naming that cause of its own, with Keras' reduce_per_replica as
    the evidence; Keras 2's sums it, which keeps the replicas' shares whole (PASS)."""
    v = checker(pool, ZOO / "fit_train_step_logs.py", ["--case", "scaled_loss"]).check(spec)
    check = Check(spec)
    if v.status == "FAIL":
        check.equal([d.cause for d in v.diagnoses], ["fit_log_reduced_over_replicas"], "the causes named",
                    render.details(v))
        check.equal([m.what.name for m in v.mismatches], ["fit mse"], "what differs: the log alone", render.details(v))
        check.contains(" ".join(line for d in v.diagnoses for line in d.evidence),
                       ["0.5 of one device's (1/2 for 2 replicas)", "averages it over the replicas",
                        "reduce_per_replica"], "the evidence")
    else:
        check.equal((v.status, v.diagnoses), ("PASS", []), "the verdict where fit's reduction keeps the log whole",
                    render.details(v))
    if v.status == "FAIL":  # the fix the cause names
        fixed = checker(pool, ZOO / "fit_train_step_logs.py", ["--case", "mean_result"]).check(spec)
        check.that(right(fixed) and not fixed.diagnoses, "the verdict of the fix: a Mean's result() returned",
                   (fixed.status, [d.cause for d in fixed.diagnoses]), "PASS, or DEVIATION where a known deviation "
                   "predicts every difference", render.details(fixed))


# a plain fit (Keras' own train step) whose every global batch is one example, split 1 and 0 over two replicas (issue
# 62, finding 6: on Keras 2, FAIL "the loop is wrong" though the script wrote no step)
# (examples/scripts/zoo/fit_one_example_batches.py; --case own_layer: a layer of the script's own in the model)


PER_REPLICA_MEAN = "fit-loss-mean-per-replica-on-uneven-split"


@pytest.mark.parametrize("remedy", ["tried", "not tried"])
@pytest.mark.parametrize("layers", ["keras'", "one of the script's"])
def test_keras_own_fit_is_never_called_the_scripts_loop(pool, monkeypatch, layers, remedy):
    """A plain model.fit whose global batch of one example splits 1 and 0 over the replicas of
    mirrored:2. Where Keras trains it (Keras 2 scales each replica's mean loss by 1/replicas: half of one
    device's update), the run with the remedy of fit-loss-mean-per-replica-on-uneven-split (each replica's
    loss divided by the global batch's rows) trains as one device, so the verdict is DEVIATION naming that
    entry alone, with a layer of the script's own in the model too. Without the remedy (taken out of the
    check here), what is left is the evidence: the replicas got exactly one device's examples and the
    script wrote no step, layer, loss or metric, so DEVIATION naming an unrecorded deviation of Keras',
    never FAIL; with the script's own layer, FAIL (its code runs in the step). Where Keras 3.5+ raises on
    the uneven batch, BLOCKED by keras3-fit-uneven-replica-batches-raise."""
    spec = parse_spec("mirrored:2")
    if remedy == "not tried":
        monkeypatch.setattr(scriptcheck, "SCRIPT_REMEDIES",
                            tuple(r for r in scriptcheck.SCRIPT_REMEDIES if r not in scriptcheck.UNEVEN_REMEDIES))
    c = checker(pool, ZOO / "fit_one_example_batches.py", ["--case", "keras_layers" if layers == "keras'" else "own_layer"])
    v = c.check(spec)
    check = Check(spec, case={"script": "fit, global batch 1", "layers": layers, "keras": c.versions["keras"],
                              "remedy": remedy})
    if applies(UNEVEN, c.versions):
        check.equal((v.status, [i for i, _ in v.deviations]), ("BLOCKED", [UNEVEN]), "the verdict", render.details(v))
        return
    if remedy == "tried":
        check.equal((v.status, sorted({i for i, _ in v.deviations}), v.diagnoses), ("DEVIATION", [PER_REPLICA_MEAN], []),
                    "the verdict of Keras' fit that the remedy makes train as one device", render.details(v))
        check.contains(v.deviations[0][1], ["the remedy of known deviation", "trains what it trains on one device"],
                       "its evidence")
        return
    if layers != "keras'":
        check.equal((v.status, v.deviations), ("FAIL", []), "the verdict with a layer of the script's", render.details(v))
        return
    check.equal((v.status, [i for i, _ in v.deviations], v.diagnoses), ("DEVIATION", ["unrecorded"], []),
                "the verdict of Keras' own fit that trains otherwise than one device", render.details(v))
    check.contains(v.deviations[0][1], ["Keras' own train step", "exactly one device's examples"], "its evidence")


# a script from TensorFlow's issue tracker in shape: it fits a model with no strategy first, to compare, then one under
# MirroredStrategy (issue 62, finding 3: the check compared the first fit and blamed its model as made outside the scope)
# (examples/scripts/zoo/fit_both.py)


@pytest.mark.specs(lambda spec: spec.kind in ("one_device", "mirrored", "central_storage") and not spec.gpus,
                   without_deep=trimmed(("one_device", "mirrored:2")))
def test_a_fit_with_no_strategy_beside_the_distributed_one_is_not_compared(spec, pool):
    """A script that fits a model made outside every strategy's scope (to compare) and then one under
    its strategy: the steps compared are the distributed fit's (its global batch, 32 per replica), the
    first fit is said to be skipped, and the verdict is the distributed training's (PASS, or DEVIATION
    where a known deviation predicts every difference), with no cause from the first model."""
    c = checker(pool, ZOO / "fit_both.py")
    v = c.check(spec)
    check = Check(spec)
    check.that(right(v) and not v.diagnoses, "the verdict", (v.status, v.deviations, v.notes),
               "PASS, or DEVIATION where a known deviation predicts every difference", render.details(v))
    ref = c.reference(*scriptcheck._reference_key(spec))
    check.equal((ref.facts.first_batch_rows, len(ref.facts.fits_skipped or [])), (32 * spec.replicas, 1),
                "the global batch of the fit compared, and the fits skipped")
    source = (ZOO / "fit_both.py").read_text()
    line = next(n for n, text in enumerate(source.splitlines(), 1) if text.startswith("plain.fit"))
    check.contains(" ".join(scriptcheck._script_notes(c)), [f"fit_both.py:{line} (Sequential)", "not compared"],
                   "the report's note")
