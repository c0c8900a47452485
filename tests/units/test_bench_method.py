"""The benchmark method without engines: how K is chosen, the fidelity check (and that it
catches a harness that adds time or a floor that is too large), the scaling-efficiency
definition, batches per scaling mode and the labels of shared-core results."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from suite.common.results import Raised
from suite.common.specs import parse_spec
from suite.harness.judging.judgment import Check, PropertyFailure
from suite.harness.tools import bench


@given(step=st.floats(1e-6, 5.0), floor=st.floats(1e-5, 0.05))
@example(step=0.010568842130350748, floor=0.010568842130350748)  # found by a dev run: the quotient is 100 + 1 ulp
def test_rounds_are_long_enough_and_the_floor_is_under_one_percent(step, floor):
    k = bench.steps_per_round(step, floor)
    assert 1 <= k <= bench.MAX_STEPS
    if k < bench.MAX_STEPS:  # not capped: the round is long enough and the floor small against it
        assert k * step >= bench.ROUND_SECONDS * (1 - 1e-9)
        assert floor / (k * step) <= bench.FLOOR_SHARE * (1 + 1e-9)
    if k > 1:  # not more steps than needed: one step fewer would be too short
        target = max(bench.ROUND_SECONDS, floor / bench.FLOOR_SHARE)
        assert (k - 1) * step < target or k == bench.MAX_STEPS


def test_fidelity_accepts_a_harness_that_adds_only_the_floor():
    engine = [0.500, 0.510, 0.495, 0.505, 0.502]
    harness = [e + 0.0002 for e in engine]  # one round trip of 0.2 ms per round
    result = bench.fidelity(harness, engine, floor_seconds=0.0002)
    assert result["ok"]
    bench.check_fidelity(result, Check("harness"))
    assert result["error"] == pytest.approx(0.0002 / 0.502, rel=1e-6)


@pytest.mark.parametrize("extra", [0.06, -0.06, 0.5])
def test_fidelity_catches_a_harness_whose_rounds_disagree_with_the_engine(extra):
    """Mutant: a harness that times something else than the K steps (6% or 50% too much or
    too little) is caught."""
    engine = [0.5, 0.5, 0.5]
    harness = [e * (1 + extra) for e in engine]
    result = bench.fidelity(harness, engine, floor_seconds=0.0001)
    assert not result["ok"]
    with pytest.raises(PropertyFailure, match="the harness's round vs the engine's timer: got"):
        bench.check_fidelity(result, Check("harness"))


def test_fidelity_catches_a_floor_that_is_not_small_against_a_round():
    """Mutant: rounds too short for the harness floor (2% of a round) are caught."""
    result = bench.fidelity([0.05, 0.05], [0.0499, 0.0499], floor_seconds=0.001)
    assert not result["ok"]
    with pytest.raises(PropertyFailure, match="floor's share of a round: got '2.00%'"):
        bench.check_fidelity(result, Check("harness"))


def test_scaling_efficiency_definitions():
    # weak scaling: 4 replicas, each on the plain step's batch of 32 taking 10 ms; ideal
    # throughput 4 * 3200/s; a step of 4 x 32 examples in 20 ms gives 6400/s: efficiency 0.5
    assert bench.scaling_efficiency(128 / 0.020, 4, 32 / 0.010) == pytest.approx(0.5)
    # strong scaling: global batch 96 takes 30 ms plain; ideal on 3 replicas 10 ms; 15 ms is 2/3
    assert bench.scaling_efficiency(96 / 0.015, 3, 96 / 0.030) == pytest.approx(2 / 3)
    # perfect: N replicas in the time of one plain step on one replica's batch
    assert bench.scaling_efficiency(8 * 16 / 0.004, 8, 16 / 0.004) == pytest.approx(1.0)
    assert bench.scaling_efficiency(1.0, 2, None) is None


def test_step_figures():
    f = bench.step_figures(0.01, global_batch=64, replicas=2)
    assert f["steps_per_s"] == pytest.approx(100)
    assert f["examples_per_s"] == pytest.approx(6400)
    assert f["examples_per_s_per_replica"] == pytest.approx(3200)


def test_batches_per_scaling_mode():
    cnn = bench.WORKLOADS["cnn"]
    assert cnn.batches(4, "weak") == (4 * cnn.per_replica_batch, cnn.per_replica_batch)
    assert cnn.batches(3, "strong") == (cnn.global_batch, cnn.global_batch // 3)
    with pytest.raises(ValueError, match="does not split"):
        bench.Workload("w", "", 8, 10).batches(4, "strong")
    for w in bench.WORKLOADS.values():  # every default spec's replica count divides the strong global batch
        for n in (1, 2, 3, 4):
            g, b = w.batches(n, "strong")
            assert g == n * b


@pytest.mark.parametrize("text, shares", [
    ("default", False), ("one_device", False), ("mirrored:1", False), ("mirrored:2", True),
    ("central_storage:2", True), ("multi_worker:2x1", True), ("parameter_server:2w1ps", True),
    ("mirrored:gpus", False)])
def test_results_on_shared_cores_are_labelled_overhead(text, shares):
    spec = parse_spec(text)
    assert bench.shares_cores(spec) is shares
    label = bench.scaling_label(spec, "weak", bench.shares_cores(spec))
    assert ("overhead, not scaling" in label) is shares
    assert ("asynchronous" in label) is (spec.kind == "parameter_server")


def test_missing_extra_info_names_each_absent_field():
    full = {k: 0 for k in bench.REQUIRED_EXTRA_INFO}
    assert bench.missing_extra_info(full) == []
    del full["overhead_ratio"]
    assert bench.missing_extra_info(full) == ["overhead_ratio"]


def test_round_summary_divides_rounds_by_k():
    s = bench.round_summary({"steps": 50, "harness": [1.0, 1.1, 0.9], "engine": [0.99, 1.09, 0.89], "loss": 0.5},
                            floor=0.001)
    assert s["step_time_s"] == pytest.approx(1.0 / 50)
    assert s["step_time_engine_s"] == pytest.approx(0.99 / 50)
    assert math.isclose(s["floor_share_of_round"], 0.001)


@pytest.mark.parametrize("block, message", [
    ("xla", "InvalidArgumentError ... Collectives are not yet implemented for CPU devices when compiling with XLA ..."),
    ("xla", "see https://www.tensorflow.org/xla/known_issues#tfvariable_on_a_different_device for details"),
    ("mixed_precision", "Mixed precision is not supported with the tf.distribute.Strategy: ParameterServerStrategyV2. "
                        "Either stop using mixed precision"),
    ("mixed_precision", "Loss scaling is not supported with the tf.distribute.Strategy: CentralStorageStrategy."),
    ("sync_batch_norm", "You must specify an aggregation method to update a AggregatingVariable in Replica Context."),
])
def test_a_block_tensorflow_does_not_support_is_recognised_by_its_error(block, message):
    found = bench.block_unsupported(block, Raised("ValueError", message, "bench.run"))
    assert found and found in message


@pytest.mark.parametrize("block, message", [
    ("clipping", "You must specify an aggregation method to update a AggregatingVariable in Replica Context."),
    ("xla", "Mixed precision is not supported with the tf.distribute.Strategy: CentralStorageStrategy"),
    ("sync_batch_norm", "Incompatible shapes: [32,64] vs. [16,64]"),
    ("mixed_precision", "Input 0 of layer dense is incompatible with the layer"),
])
def test_any_other_error_of_a_block_is_not_excused(block, message):
    """Only the block's own unsupported-error skips its benchmark: anything else fails it."""
    assert bench.block_unsupported(block, Raised("ValueError", message, "bench.run")) is None


def test_every_block_has_what_its_engine_must_report_built():
    assert set(bench.BLOCK_BUILT) == set(bench.BLOCKS)
    assert set(bench.BLOCK_WORKLOADS) <= set(bench.WORKLOADS)
