"""The check of a user's loop on the Keras releases whose deviations a right loop meets, with
engines of those tox envs (``SPEC@ENV``; .ci/run builds them): a right loop is never blamed.

- TF 2.21 with tf-keras (tf221-legacy): TensorFlow's tutorials, Keras 2 code, checked on the Keras
  they were written for train as on one device where Keras 3 blocks them; a plain fit on batches the
  replicas do not divide is the deviation its remedy removes.

- TF 2.17 / Keras 3.4 again, where no canonical-step control can speak (batches of (x, y,
  sample_weight), a training script run unchanged): the stand-in control alone turns the FAIL into
  DEVIATION naming keras3-gradients-not-summed-before-3.5, and a loop with a cause keeps it.

- TF 2.17 / Keras 3.4 (keras3-gradients-not-summed-before-3.5): a right loop whose model is a
  subclassed keras.Model diverges as the control does, but that control cannot speak for the
  user's classes; the stand-in control (the suite's own Keras model with the loop's optimizer)
  diverges as the entry predicts, so the verdict is DEVIATION naming it and says the user's
  classes were not verified. The same model with a mistake of its own keeps its cause.
- TF 2.18 / Keras 3.7.0 (keras3-seed-state-mean-aggregation-3.7): a right loop with Keras'
  Dropout cannot even be built under MirroredStrategy: BLOCKED naming the entry, exit 4, not an
  input error. On Keras 3.8.0 the same loop builds and trains, and no spec names the entry.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from suite.common.specs import parse_spec
from suite.harness.judging.judgment import Check
from suite.harness.loopcheck import differential, render, scriptcheck, usercheck
from suite.harness.pool import versions
from tests.helpers import ROOT
from tests.workloads.test_examples import right

NOT_SUMMED = "keras3-gradients-not-summed-before-3.5"
SEED_MEAN = "keras3-seed-state-mean-aggregation-3.7"


def _built(env: str) -> bool:
    return Path(versions.interpreter(env)[0]).exists()


def needs(env: str):
    return pytest.mark.skipif(not _built(env), reason=f"no {env} env: tox run --notest -e {env} (.ci/run builds it)")


_CHECKERS: dict = {}


def check_on(pool, env: str, target: str, spec: str = "mirrored:2") -> differential.Verdict:
    """The verdict of ``target`` under ``spec`` with the engines of ``env`` (one reference per loop and env)."""
    key = (env, target)
    if key not in _CHECKERS:
        _CHECKERS[key] = usercheck.Checker(pool, target, path=str(ROOT), canonical=False, env=env)
    return _CHECKERS[key].check(_CHECKERS[key].on(parse_spec(spec)))


@needs("tf217-keras34")
def test_on_keras34_a_right_subclassed_model_is_the_deviation_not_the_loop(pool):
    v = check_on(pool, "tf217-keras34", "examples.zoo:right_subclassed_model_plain_step")
    check = Check("mirrored:2@tf217-keras34")
    named = [i for i, _ in v.deviations]
    check.equal((v.status, NOT_SUMMED in named, "unrecorded" in named, [d.cause for d in v.diagnoses]),
                ("DEVIATION", True, False, []), "the verdict of a right loop with a subclassed model",
                render.details(v))
    check.that(any("classes of the user's own" in n for n in v.notes), "the verdict's notes", v.notes,
               "a note that the user's own classes were not verified")


@needs("tf217-keras34")
def test_on_keras34_a_wrong_subclassed_model_keeps_its_own_cause(pool):
    v = check_on(pool, "tf217-keras34", "examples.zoo:loss_averaged_per_replica_subclassed_plain_step")
    Check("mirrored:2@tf217-keras34").equal((v.status, [d.cause for d in v.diagnoses]),
                                            ("FAIL", ["loss_averaged_per_replica"]),
                                            "the verdict of a subclassed model's loop that averages per replica",
                                            render.details(v))


@needs("tf217-keras34")
def test_on_keras34_a_right_loop_no_canonical_step_can_train_is_the_deviation_by_the_stand_in(pool):
    """(x, y, sample_weight) batches: the canonical-step control cannot train them, so no control
    speaks; the stand-in (Keras' own model with the loop's optimizer) diverges as the entry predicts,
    at the same step, and the loop shows no cause the stand-in does not: DEVIATION, not FAIL."""
    v = check_on(pool, "tf217-keras34", "examples.zoo:right_weighted_triple")
    check = Check("mirrored:2@tf217-keras34")
    check.equal((v.status, [i for i, _ in v.deviations], [d.cause for d in v.diagnoses]),
                ("DEVIATION", [NOT_SUMMED], []), "the verdict of a right loop on weighted triples",
                render.details(v))
    check.contains(v.deviations[0][1], ["stand-in control"], "what the deviation rests on")


@needs("tf217-keras34")
def test_on_keras34_the_same_loop_averaging_per_replica_keeps_its_cause(pool):
    v = check_on(pool, "tf217-keras34", "examples.zoo:loss_averaged_per_replica_weighted_triple")
    Check("mirrored:2@tf217-keras34").equal((v.status, [d.cause for d in v.diagnoses]),
                                            ("FAIL", ["loss_averaged_per_replica"]),
                                            "the verdict of the weighted-triple loop that averages per replica",
                                            render.details(v))


@needs("tf217-keras34")
@pytest.mark.parametrize("args", [["--build-optimizer"], []], ids=["built", "as-written"])
def test_on_keras34_the_tutorial_script_is_the_deviation_by_the_stand_in(pool, args):
    """examples/scripts/tutorial.py run unchanged on TF 2.17 / Keras 3.4 engines under mirrored:2: the
    replicas' copies differ after the first step (Keras 3.4 does not sum the gradients); a script has
    no canonical-step control, and the stand-in diverges the same way as the entry predicts: DEVIATION
    naming it, whether Adam is built in the scope or, as written, lazily (which Keras 3.4 serves)."""
    key = ("script", tuple(args))
    if key not in _CHECKERS:
        _CHECKERS[key] = scriptcheck.ScriptChecker(pool, str(ROOT / "examples" / "scripts" / "tutorial.py"), args,
                                                   env="tf217-keras34")
    v = _CHECKERS[key].check(parse_spec("mirrored:2"))
    Check("mirrored:2@tf217-keras34").equal(
        (v.status, [i for i, _ in v.deviations], [d.cause for d in v.diagnoses]), ("DEVIATION", [NOT_SUMMED], []),
        f"the verdict of the tutorial script {' '.join(args)}", render.details(v))


@needs("tf218-keras37")
def test_on_keras37_a_dropout_loop_is_blocked_at_build_time_by_the_entry(pool):
    checker = usercheck.Checker(pool, "examples.mistakes:right_with_dropout", path=str(ROOT), canonical=False,
                                env="tf218-keras37")
    v = checker.check(checker.on(parse_spec("mirrored:2")))
    check = Check("mirrored:2@tf218-keras37")
    check.equal((v.status, v.deviation[0] if v.deviation else None, v.diagnoses), ("BLOCKED", SEED_MEAN, []),
                "the verdict of a right loop with Keras' Dropout", render.details(v))
    check.contains(v.error or "", ["the factory raised ValueError", "aggregation=MEAN and a non-floating dtype"],
                   "what raised")
    report = usercheck.Report("examples.mistakes:right_with_dropout", checker.versions, 48, 3, 1e-4, 1e-7, [], [v])
    check.equal(report.exit_code(), usercheck.EXIT["KNOWN"], "the check's exit status (4: known deviations only)")


@needs("tf218-keras38")
def test_on_keras38_the_dropout_loop_builds_and_no_spec_names_the_entry(pool):
    v = check_on(pool, "tf218-keras38", "examples.mistakes:right_with_dropout")
    Check("mirrored:2@tf218-keras38").equal((right(v), SEED_MEAN in [i for i, _ in v.deviations], v.steps),
                                            (True, False, 3), "the verdict of the Dropout loop on Keras 3.8.0",
                                            render.details(v))


def _verdict(pool, env: str, script, text: str, args=()) -> tuple:
    """The verdict of ``script`` under ``text`` with the engines of ``env``, and its checker."""
    c = scriptcheck.ScriptChecker(pool, str(script), list(args), env=env)
    try:
        return c.check(parse_spec(text)), c
    finally:  # engines no other test uses: their memory back (the session keeps an engine per spec)
        for spec in (c.on(parse_spec(text)), c.default):
            pool.release(spec)


@needs("tf221-legacy")
@pytest.mark.parametrize("script,text,causes", [("tutorial.py", "mirrored:2", []),
                                                ("keras_tutorial.py", "mirrored:2", []),
                                                ("multi_worker_ctl.py", "multi_worker:2x2",
                                                 ["shuffled_per_worker_before_sharding"]),
                                                ("parameter_server_tutorial.py", "parameter_server:2w1ps", [])])
def test_tensorflows_tutorials_train_on_the_keras_they_were_written_for(pool, script, text, causes):
    """TensorFlow's distribute tutorials are Keras 2 code: with the engines of a legacy-Keras env
    (tf221-legacy: TF 2.21 with tf-keras, TF_USE_LEGACY_KERAS=1), the custom-training tutorial as
    written (its Adam built lazily) trains what one device trains, and the multi-worker one on two
    workers of two replicas, which Keras 3 blocks (keras3-lazy-optimizer-slots-mirrored), runs and
    meets its own mistake: it shuffles without a seed before sharding, so each worker's shard is of
    its own order (FAIL naming that cause alone). The parameter-server tutorial's loop (its embedding
    table sharded in two by its partitioner, which it asserts on both sides) trains on the cluster what
    one device trains. The Keras tutorial's fit (with TensorBoard, ModelCheckpoint and its own callbacks) trains
    as one device does, and what follows it (load_weights of the latest checkpoint, which raised TypeError
    under MirroredStrategy and was reported as fit's, issue 63) never runs."""
    v, c = _verdict(pool, "tf221-legacy", ROOT / "examples" / "scripts" / script, text)
    check = Check(f"{text}@tf221-legacy", case={"script": script})
    check.equal(c.versions["keras"].split(".")[0], "2", "the engines' Keras generation")
    if causes:
        check.equal((v.status, [d.cause for d in v.diagnoses]), ("FAIL", causes), f"{script} on Keras 2",
                    render.details(v))
        return
    check.that(right(v) and not v.diagnoses, f"{script} on Keras 2", (v.status, v.deviations),
               "PASS, or DEVIATION where a known deviation predicts every difference", render.details(v))
    check.equal(v.steps, 3, "steps compared")


FIT_GUIDE = ROOT / "examples" / "scripts" / "fit_guide.py"
MULTI_WORKER_FIT = ROOT / "examples" / "scripts" / "multi_worker_fit.py"
LOGS_SUMMED = "keras2-fit-multi-worker-logs-summed-over-replicas"


@needs("tf221-legacy")
@pytest.mark.parametrize("args,status,causes", [(["--seed-shuffle"], "DEVIATION", []),
                                                ([], "FAIL", ["shuffled_per_worker_before_sharding"])],
                         ids=["seeded", "as-published"])
def test_the_multi_worker_fit_tutorial_trains_on_legacy_keras(pool, args, status, causes):
    """TensorFlow's multi_worker_with_keras tutorial (examples/scripts/multi_worker_fit.py), which Keras
    3.3+ cannot fit on several workers (keras3-fit-multi-worker-raises), on tf-keras (TF 2.21,
    TF_USE_LEGACY_KERAS=1) and two workers: with its shuffle seeded every weight trains as on one device
    and what differs is fit's logs, 2x one device's as keras2-fit-multi-worker-logs-summed-over-replicas
    predicts (DEVIATION naming it alone); as published, its unseeded shuffle before Keras shards the
    batches by worker is its own mistake (FAIL naming that cause alone)."""
    v, c = _verdict(pool, "tf221-legacy", MULTI_WORKER_FIT, "multi_worker:2x1", args)
    check = Check("multi_worker:2x1@tf221-legacy", case={"script": "multi_worker_fit.py", "args": args})
    check.equal(c.versions["keras"].split(".")[0], "2", "the engines' Keras generation")
    named = sorted({i for i, _ in v.deviations}) if status == "DEVIATION" else []
    check.equal((v.status, named, [d.cause for d in v.diagnoses]),
                (status, [LOGS_SUMMED] if status == "DEVIATION" else [], causes),
                "the tutorial's fit on Keras 2", render.details(v))
    check.equal(v.steps, 3, "steps compared")


@needs("tf221-legacy")
@pytest.mark.parametrize("case", ["load_weights", "allocates", "second_fit"])
def test_on_legacy_keras_no_code_of_the_script_runs_after_the_last_step_compared(pool, case):
    """tests/workloads/test_run_ends.py on tf-keras engines (TF 2.21, TF_USE_LEGACY_KERAS=1), where the Keras
    tutorial's load_weights of a checkpoint written under MirroredStrategy raised TypeError after its fit."""
    from tests.workloads.test_run_ends import FIT_THEN, judged

    v, c = _verdict(pool, "tf221-legacy", FIT_THEN, "mirrored:2", ["--case", case])
    check = Check("mirrored:2@tf221-legacy", case={"case": case})
    check.equal(c.versions["keras"].split(".")[0], "2", "the engines' Keras generation")
    judged(v, check, case)


SYNCHRONIZED_BN = ROOT / "examples" / "scripts" / "zoo" / "fit_synchronized_bn.py"


@needs("tf221-legacy")
def test_on_legacy_keras_layers_named_under_another_scope_are_the_same_variables(pool):
    """A Sequential with no input shape whose BatchNormalization is synchronized, fitted under mirrored:2 on
    tf-keras: its symbolic build fails under MirroredStrategy (the batch norm's all-reduce in a scratch graph), so
    the layers after it are named under the model's scope (sequential/dense/kernel, and the optimizer's slots
    Adam/m/sequential/dense/kernel) where one device names them dense/kernel: the same variables in the same
    order and shapes, compared as such (issue 62, finding 7: ERROR "the script created other variables here")."""
    v, c = _verdict(pool, "tf221-legacy", SYNCHRONIZED_BN, "mirrored:2")
    check = Check("mirrored:2@tf221-legacy", case={"script": "fit_synchronized_bn.py"})
    check.equal(c.versions["keras"].split(".")[0], "2", "the engines' Keras generation")
    check.that(right(v) and not v.diagnoses, "fit_synchronized_bn.py on Keras 2", (v.status, v.error, v.deviations),
               "PASS, or DEVIATION where a known deviation predicts every difference", render.details(v))
    check.equal(v.steps, 2, "steps compared (16 rows, batches of 8)")


UNEVEN = "fit-loss-mean-per-replica-on-uneven-split"
ONE_EXAMPLE_BATCHES = ROOT / "examples" / "scripts" / "zoo" / "fit_one_example_batches.py"


@needs("tf221-legacy")
@pytest.mark.parametrize("case,status,named", [("keras_layers", "DEVIATION", [UNEVEN]),
                                               ("batch_centering", "FAIL", [])])
def test_on_legacy_keras_fit_on_uneven_splits_is_the_deviation_its_remedy_removes(pool, case, status, named):
    """A plain fit of batch_size=1 (each global batch split 1 and 0 over mirrored:2) on tf-keras, which trains it
    (Keras 3.5+ raises there): Keras' step moves the weights half as far as one device, and with the remedy of
    fit-loss-mean-per-replica-on-uneven-split in the engine (the global batch's rows as every replica's divisor)
    it trains as one device: DEVIATION naming that entry alone (issue 62, finding 6). A layer of the script's own
    that centres the rows a replica sees still differs with the remedy: FAIL, no entry named, no cause."""
    v, c = _verdict(pool, "tf221-legacy", ONE_EXAMPLE_BATCHES, "mirrored:2", ["--case", case])
    check = Check("mirrored:2@tf221-legacy", case={"script": "fit_one_example_batches.py", "case": case})
    check.equal(c.versions["keras"].split(".")[0], "2", "the engines' Keras generation")
    check.equal((v.status, sorted({i for i, _ in v.deviations}), [d.cause for d in v.diagnoses]),
                (status, named, []), f"--case {case} on Keras 2", render.details(v))


@needs("tf217-keras34")
@pytest.mark.parametrize("text,status,entries", [
    ("mirrored:2", "DEVIATION", [NOT_SUMMED, "keras3-metric-state-per-replica-before-3.7"]),
    ("multi_worker:2x1", "BLOCKED", ["keras3-fit-multi-worker-raises"])])
def test_on_keras34_the_fit_guide_names_the_entry_it_meets(pool, text, status, entries):
    """The guide's fit with the engines of TF 2.17 / Keras 3.4: under mirrored:2 the replicas' copies
    part after the first batch as keras3-gradients-not-summed-before-3.5 predicts (the stand-in control
    diverges alike: DEVIATION naming it), and the first batch's metrics read the first replica's copy of
    their state (keras3-metric-state-per-replica-before-3.7); on two workers Keras 3.4 raises at fit's
    first batch ("Invalid reduction dimension 0", reduce_per_replica): BLOCKED naming
    keras3-fit-multi-worker-raises."""
    v, _ = _verdict(pool, "tf217-keras34", FIT_GUIDE, text)
    Check(f"{text}@tf217-keras34", case={"script": "fit_guide.py"}).equal(
        (v.status, sorted({i for i, _ in v.deviations}), [d.cause for d in v.diagnoses]), (status, sorted(entries), []),
        "the verdict of the guide's fit", render.details(v))


FIT_GAN = ROOT / "examples" / "scripts" / "fit_gan.py"


@needs("tf217-keras34")
@pytest.mark.parametrize("case,status,named", [
    ("right", "DEVIATION", [NOT_SUMMED, "keras3-metric-state-per-replica-before-3.7"]),
    ("generator_loss_averaged_per_replica", "FAIL", ["generator: loss_averaged_per_replica"]),
    ("discriminator_metric_fed_scaled_loss", "FAIL", ["metric_fed_scaled_loss"]),
    ("guide_losses", "FAIL", ["discriminator: keras_loss_reduction", "generator: keras_loss_reduction"]),
])
def test_on_keras34_the_fit_gan_tells_keras_deviation_from_its_mistakes(pool, case, status, named):
    """The GAN of Keras' guide to customizing fit (examples/scripts/fit_gan.py) under mirrored:2 with
    the engines of TF 2.17 / Keras 3.4, where each replica applies its own gradients
    (keras3-gradients-not-summed-before-3.5) and both models' copies part after the first batch: the
    right GAN is DEVIATION naming that entry (its two Adams of one configuration give the stand-in
    control its optimizer) and its trackers' per-replica copies; each mistake keeps its own cause
    alone, the replicas' disagreement, which the stand-in shows too, not named as the script's; the
    guide's own losses (a Keras loss, not scaled by the replicas before Keras 3.8) are each model's
    loss reduced by Keras over the replica's batch."""
    v, _ = _verdict(pool, "tf217-keras34", FIT_GAN, "mirrored:2", ["--case", case])
    got = sorted({i for i, _ in v.deviations}) if status == "DEVIATION" else sorted(
        f"{d.model}: {d.cause}" if d.model else d.cause for d in v.diagnoses)
    Check("mirrored:2@tf217-keras34", case={"script": "fit_gan.py", "case": case}).equal(
        (v.status, got, [] if status == "FAIL" else [d.cause for d in v.diagnoses]), (status, named, []),
        f"fit_gan.py --case {case}", render.details(v))


UNSCALED = "keras3-loss-unscaled-before-3.8"
PER_REPLICA_STATE = "keras3-metric-state-per-replica-before-3.7"


@needs("tf218-keras36")
@pytest.mark.parametrize("args", [[], ["--steps-per-execution", "2"]], ids=["plain", "steps_per_execution_2"])
def test_on_keras36_the_fit_guide_is_the_deviation_its_remedy_removes(pool, args):
    """The guide's fit with the engines of TF 2.18 / Keras 3.6 under mirrored:2: each replica's loss is not
    scaled by the replicas and the optimizer sums (every step too large from the first); the same run with
    Keras 3.8's scaling applied in the engine (the entry's remedy, suite/engine/remedies.py) trains what one
    device trains but for the loss tracker and metric copies each replica keeps (predicted from the run's
    copies): DEVIATION naming both entries, the remedy's first, no cause; with steps_per_execution=2 too (a
    compiled metric Keras builds in the first execution starts from zero; an evaluate's last execution
    reads its state at its end)."""
    v, _ = _verdict(pool, "tf218-keras36", FIT_GUIDE, "mirrored:2", args)
    check = Check("mirrored:2@tf218-keras36", case={"script": "fit_guide.py", "args": args})
    check.equal((v.status, list(dict.fromkeys(i for i, _ in v.deviations)), [d.cause for d in v.diagnoses]),
                ("DEVIATION", [UNSCALED, PER_REPLICA_STATE], []), "the verdict of the guide's fit",
                render.details(v))
    check.contains(v.deviations[0][1], ["Keras 3.8's loss scaling", "trains what it trains on one device"],
                   "the remedy's evidence")


@needs("tf218-keras36")
@pytest.mark.parametrize("case,status,named", [
    ("right", "DEVIATION", [PER_REPLICA_STATE]),
    ("generator_loss_averaged_per_replica", "FAIL", ["generator: loss_averaged_per_replica"]),
    ("discriminator_metric_fed_scaled_loss", "FAIL", ["metric_fed_scaled_loss"]),
])
def test_on_keras36_the_fit_gan_metric_copies_are_keras_and_its_mistakes_its_own(pool, case, status, named):
    """The GAN of Keras' guide to customizing fit (its own train_step: its losses by compute_average_loss,
    no Keras loss to scale) under mirrored:2 with the engines of TF 2.18 / Keras 3.6: right, its two
    trackers read the first replica's copy, which with the other copy holds one device's state
    (DEVIATION naming keras3-metric-state-per-replica-before-3.7 alone); each mistake keeps its own cause,
    and the remedy of keras3-loss-unscaled-before-3.8 removes neither."""
    v, _ = _verdict(pool, "tf218-keras36", FIT_GAN, "mirrored:2", ["--case", case])
    got = sorted({i for i, _ in v.deviations}) if status == "DEVIATION" else sorted(
        f"{d.model}: {d.cause}" if d.model else d.cause for d in v.diagnoses)
    Check("mirrored:2@tf218-keras36", case={"script": "fit_gan.py", "case": case}).equal(
        (v.status, got), (status, named), f"fit_gan.py --case {case}", render.details(v))
