"""The comparison and diagnoses of the check of a user's loop (suite/harness/differential.py) on
runs made up here: the norm-wise tolerance passes rounding and fails a whole-update mistake far
smaller than any catalogued one, the reference's repeatability names the variable that moved,
and the CentralStorage metric deviation is predicted from its documented formula."""

from __future__ import annotations

import numpy as np

from suite.common.results import WorkloadRun, WorkloadStep
from suite.common.specs import parse_spec
from suite.harness import differential
from suite.harness.check import Check

INITIAL = [np.linspace(-1.0, 1.0, 64).reshape(8, 8), np.zeros(8)]
UPDATE = [np.full((8, 8), 0.01), np.full(8, -0.02)]


def run(scale: float = 1.0, noise: float = 0.0, replicas: int = 1, metric: list | None = None, rows=(48,)) -> WorkloadRun:
    """Two steps of SGD-like updates: ``scale`` x the update per step, ``noise`` added per element."""
    rng = np.random.default_rng(1)
    steps, values = [], [v.copy() for v in INITIAL]
    for k in range(2):
        values = [v + scale * u + noise * rng.standard_normal(v.shape) for v, u in zip(values, UPDATE)]
        steps.append(WorkloadStep(1.0 - 0.1 * k, [(1.0 - 0.1 * k) / replicas] * replicas, list(rows),
                                  [[v.copy() for _ in range(replicas)] for v in values], [], None,
                                  {"m": metric[k]} if metric else {}))
    return WorkloadRun(replicas, list(range(replicas)), ["kernel", "bias"], [True, True], [],
                       [v.copy() for v in INITIAL], steps, {})


def test_rounding_passes_and_a_tenth_of_a_percent_of_an_update_fails():
    check = Check("differential.compare")
    ref = run()
    _, worst, found = differential.compare(ref, run(noise=1e-8, replicas=2))
    check.equal(found, [], "differences found for float32-sized noise")
    check.that(worst < 1e-4, "worst relative difference of the noise", worst, "below rtol 1e-4")
    agreed, _, found = differential.compare(ref, run(scale=1.001, replicas=2))
    check.equal((agreed, sorted({m.quantity for m in found})),
                (0, ["bias (replica 0)", "bias (replica 1)", "kernel (replica 0)", "kernel (replica 1)"]),
                "an update 0.1% too large: agreeing steps and the differences of step 1")
    check.that(all(abs(m.ratio - 1.001) < 1e-9 for m in found), "the ratios of the updates",
               [m.ratio for m in found], "1.001")


def test_a_replica_that_disagrees_is_a_difference():
    dist = run(replicas=2)
    dist.steps[0].variables[1][1] = dist.steps[0].variables[1][1] + 0.01
    _, _, found = differential.compare(run(), dist)
    Check("differential.compare").equal([m.quantity for m in found],
                                        ["bias (replica 1)", "bias: replica 1 against replica 0"],
                                        "differences when replica 1's bias moved")


def test_the_reference_that_does_not_repeat_itself_names_the_variable():
    moved = run(noise=1e-3)
    Check("differential.first_difference").equal(
        (differential.first_difference(run(), run()), differential.first_difference(run(), moved).split(" (")[0]),
        (None, "variable kernel after step 1"), "what moved between two runs")


def test_central_storage_metrics_follow_the_documented_formula():
    """new state = replicas x old + increment (keras3-central-storage-metric-accumulation): a mean
    of 0.5 over 4 examples, then 0.25 over all 8, under 2 replicas reads 0.5, then
    (2 x 2 + 0) / (2 x 4 + 4) = 1/3."""
    ref = run(metric=[0.5, 0.25], rows=(4,))
    got = differential.deviation_metrics(ref, parse_spec("central_storage:2"),
                                         {"tensorflow": "2.21.0", "keras": "3.15.1"})
    check = Check("differential.deviation_metrics")
    check.equal(got[0].id, differential.CENTRAL_STORAGE_METRICS, "the entry")
    check.close(np.array(got[1]["m"]), np.array([0.5, 1 / 3]), "predicted metric per step")
    check.equal(differential.deviation_metrics(ref, parse_spec("central_storage:2"),
                                               {"tensorflow": "2.15.1", "keras": "2.15.0"}), None,
                "the prediction on Keras 2, where the entry does not apply")
