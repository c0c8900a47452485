"""Fidelity of the benchmark method: the step time that pytest-benchmark reports (a round's
time over its K steps, measured around the engine call) agrees with the engine's own clock
around the same K steps within 5%, and an empty engine call (the harness floor) is under 1%
of a round. Checked for each process layout the harness times: one engine process (default),
a multi-worker cluster (the harness waits for every worker), and a parameter-server
coordinator. The workload is the linear model, whose steps are the shortest (the most steps per
round, so the most per-call work outside the engine's timer)."""

from __future__ import annotations

import pytest

from suite.harness import bench

LAYOUTS = ("default", "multi_worker", "parameter_server", "cluster")


@pytest.mark.specs(lambda s: s.kind in LAYOUTS or s.gpus)
def test_reported_step_time_agrees_with_the_engine_timer(benchmark, engines, any_spec):
    if benchmark.disabled:
        pytest.skip("--benchmark-disable: nothing is timed")
    bencher = bench.Bencher(engines, rounds=5, trace_rounds=1, smoke=False)
    workload = bench.WORKLOADS["linear"]
    global_batch, _ = workload.batches(bencher.replicas(any_spec), "weak")
    key, _ = bencher.traced_state(any_spec, workload.name, global_batch)
    measured = bencher.measure(benchmark, any_spec, key)
    assert len(measured["harness"]) == len(measured["engine"]) == 5  # the warm-up round is not counted
    result = bench.fidelity(measured["harness"], measured["engine"], bencher.floor(any_spec))
    bench.check_fidelity(result)
    # the floor check is not vacuous: the floor was measured, and rounds are long enough to time
    assert 0 < bencher.floor(any_spec) and min(measured["harness"]) >= bench.ROUND_SECONDS * 0.5
    benchmark.extra_info.update(kind="fidelity", spec=any_spec.text, **result)
