"""Scripts that train with ``Model.fit``, checked unchanged (suite/harness/loopcheck/scriptcheck.py):
a step boundary at the end of each batch fit trains (of each execution with ``steps_per_execution``),
the model's compiled optimizer and metrics attributed to it, fit's logs compared as metrics. Keras'
distributed-training guide in its shape (examples/scripts/fit_guide.py)."""

from __future__ import annotations

import pytest

from suite.harness.loopcheck import differential, scriptcheck
from suite.harness.verdict.judgment import Check
from tests.helpers import ROOT
from tests.workloads.test_cluster_scripts import checker
from tests.workloads.test_examples import right, trimmed

GUIDE = ROOT / "examples" / "scripts" / "fit_guide.py"
BATCH = 32  # the guide's global batch


@pytest.mark.specs(lambda spec: spec.kind in ("default", "one_device", "mirrored") and not spec.gpus
                   and BATCH % spec.replicas == 0, without_deep=trimmed(("default", "mirrored:2")))
def test_the_fit_guide_trains_as_on_one_device(spec, pool):
    """The guide's model.fit under MirroredStrategy (and the one-device strategies) where the replicas
    divide its global batch: every variable, the optimizer's slots and fit's logged loss and accuracy
    after each of 3 batches equal one device's on the same global batch; the report says it stepped by
    fit's batches."""
    c = checker(pool, GUIDE)
    v = c.check(spec)
    check = Check(spec, case={"script": "fit_guide.py"})
    check.that(right(v) and not v.diagnoses, "the guide's fit", (v.status, v.deviations),
               "PASS, or DEVIATION where a known deviation predicts every difference", differential.details(v))
    check.equal(v.steps, 3, "steps compared")
    ref = c.reference(*scriptcheck._reference_key(spec))
    metrics = sorted(ref.facts["metric_states"])  # Keras 3 holds the compiled metrics in one, Keras 2 each apart
    check.equal((ref.facts["step_mode"], ref.facts["optimizers"], len(metrics), "model.metrics[loss]" in metrics),
                ("fit", ["model.optimizer"], 2, True),
                "how the steps were told apart, the optimizer and the metrics (the loss tracker's and the accuracy's) "
                "fit's model holds", metrics)
    check.contains(" ".join(scriptcheck._script_notes(c)), ["steps by the batches Model.fit trains"], "the report's note")


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
               "PASS, or DEVIATION where a known deviation predicts every difference", differential.details(v))
    ref = c.reference(*scriptcheck._reference_key(spec))
    run = c._run(c.on(spec), init=ref.initial, init_names=ref.names, init_trainable=ref.trainable,
                 late_init=ref.facts.get("late_values"))[0]
    for name, r in (("the reference", ref), (spec.text, run)):
        i = next(i for i, n in enumerate(r.optimizer_names) if n.rsplit("/", 1)[-1] in ("iteration", "iterations"))
        check.equal([int(step.optimizer[i][0]) for step in r.steps], [2, 4, 6],
                    f"{name}: the optimizer's iterations at each boundary")


@pytest.mark.specs(lambda spec: spec.kind == "mirrored" and BATCH % spec.replicas != 0 and not spec.gpus)
def test_a_fit_that_raises_where_no_entry_explains_it_is_not_checked(spec, pool):
    """Where the replicas do not divide the guide's global batch (32 over 3), Keras 3.5+ raises before
    fit's first step: its symbolic build reduces the first batch with strategy.reduce("MEAN"), which
    needs every replica's batch of one shape (keras/src/backend/tensorflow/trainer.py,
    _maybe_symbolic_build, from keras-team/keras#19969). No entry records it yet: the spec is not
    checked, and the line says what was raised, rather than a verdict on the script."""
    c = checker(pool, GUIDE)
    check = Check(spec, case={"script": "fit_guide.py", "keras": c.versions["keras"]})
    major, minor = (int(p) for p in c.versions["keras"].split(".")[:2])
    if (major, minor) < (3, 5):  # measured: Keras 3.0.5 and 3.4.1 train it; Keras 2.15 trains it weighting each
        # replica's mean loss alike (11, 11, 10 examples), unlike one device: a FAIL of its own, not this path
        pytest.skip(f"Keras {c.versions['keras']} does not raise here (from 3.5.0)")
    with pytest.raises(scriptcheck.NotCheckedHere) as info:
        c.check(spec)
    check.contains(str(info.value), ["Model.fit raised here and not on one device", "InvalidArgumentError",
                                     "Inputs to operation AddN of type AddN must have the same size and shape",
                                     "nothing was compared"], "why the spec is not checked")
