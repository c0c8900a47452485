"""Fidelity of the benchmark method: the step time that pytest-benchmark reports (a round's
time over its K steps, measured around the engine call) agrees with the engine's own clock
around the same K steps within 5%, and an empty engine call (the harness floor) is under 1%
of a round. Checked for each process layout the harness times: one engine process (default),
a multi-worker cluster (the harness waits for every worker), and a parameter-server
coordinator. The workload is the linear model, whose steps are the shortest (the most steps per
round, so the most per-call work outside the engine's timer)."""

from __future__ import annotations

import os

import pytest

from suite.harness.judging.judgment import Check
from suite.harness.tools import bench
from tests.helpers import run_pytest

LAYOUTS = ("default", "multi_worker", "parameter_server", "cluster")


@pytest.mark.specs(lambda s: s.kind in LAYOUTS or s.gpus)
@pytest.mark.filterwarnings("ignore:Benchmark fixture was not used")  # the child pytest uses it
def test_reported_step_time_agrees_with_the_engine_timer(benchmark, engines, any_spec, request):
    if benchmark.disabled and os.environ.get("PYTEST_XDIST_WORKER") and not request.config.getoption("benchmark_disable"):
        # pytest-benchmark times nothing in a pytest-xdist worker: this test id runs in a child
        # pytest of its own (-n 0), which must pass
        args = [f"{request.node.nodeid}", "--strategies", any_spec.text]
        for option in ("--engine-python", "--cluster-agents"):
            if request.config.getoption(option):
                args += [option, request.config.getoption(option)]
        r = run_pytest(args, timeout=900)
        Check(any_spec, case={"output": r.stdout[-3000:]}).equal(
            (r.returncode, "1 passed" in r.stdout), (0, True), "the test run alone (-n 0): exit status, passed")
        return
    if benchmark.disabled:
        pytest.skip("--benchmark-disable: nothing is timed")
    bencher = bench.Bencher(engines, rounds=5, trace_rounds=1, smoke=False)
    workload = bench.WORKLOADS["linear"]
    global_batch, _ = workload.batches(bencher.replicas(any_spec), "weak")
    key, _ = bencher.traced_state(any_spec, workload.name, global_batch)
    measured = bencher.measure(benchmark, any_spec, key)
    check = Check(any_spec, case={"workload": "linear", "global batch": global_batch})
    # the warm-up round is not counted
    check.equal((len(measured["harness"]), len(measured["engine"])), (5, 5), "rounds timed (harness, engine)")
    result = bench.fidelity(measured["harness"], measured["engine"], bencher.floor(any_spec))
    bench.check_fidelity(result, check)
    # the floor check is not vacuous: the floor was measured, and rounds are long enough to time
    check.that(bencher.floor(any_spec) > 0, "the harness floor (s)", bencher.floor(any_spec), "measured, above 0")
    check.that(min(measured["harness"]) >= bench.ROUND_SECONDS * 0.5, "the shortest round (s)",
               min(measured["harness"]), f"at least {bench.ROUND_SECONDS * 0.5:g}")
    benchmark.extra_info.update(kind="fidelity", spec=any_spec.text, **result)
