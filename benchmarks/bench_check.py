"""The check of a user's loop, end to end (``python -m suite.check``): the 9-spec check of the
guide's workload and of one mistake, from a new pool (its fork server and engines started, the
reference run, every default spec checked at the default ``--jobs``), timed once (one round: a
check is half a minute, and ``--benchmark-min-rounds`` is for the step benchmarks).

What a user waits for, so a regression in the check's speed shows in the benchmark history; the
parts go to ``extra_info``: the whole check, the reference's engine start (the fork server's
import of TensorFlow included), the reference's runs, and each spec's run and engine start. The
timed call returns its report, and its statuses are asserted: a fast wrong verdict is no result.
"""

from __future__ import annotations

import pytest

from suite.common.specs import DEFAULT_SPECS, parse_specs
from suite.harness.judging.judgment import Check
from suite.harness.loopcheck import usercheck
from suite.harness.pool.pool import EnginePool

# the workload and the exit statuses its check may end with on any TensorFlow/Keras: the guide's loop
# is right (PASS, or known deviations: exit 4), the mistake is the loop's own (FAIL: exit 1)
CASES = {"guide": ("examples.guide:workload", (usercheck.EXIT["PASS"], usercheck.EXIT["KNOWN"])),
         "mistake": ("examples.mistakes:loss_averaged_per_replica", (usercheck.EXIT["FAIL"],))}


@pytest.mark.parametrize("case", list(CASES))
def test_check(benchmark, case):
    target, statuses = CASES[case]
    specs = parse_specs(",".join(DEFAULT_SPECS))

    def check_once():
        pool = EnginePool(call_timeout=300.0)
        try:
            return usercheck.run(target, specs, pool)
        finally:
            pool.close()

    report = benchmark.pedantic(check_once, rounds=1, iterations=1)  # half a minute a round: one
    Check(",".join(DEFAULT_SPECS), case={"workload": target}).that(
        report.exit_code() in statuses, "the check's exit status", report.exit_code(),
        f"one of {statuses}", report.summary())
    benchmark.extra_info.update(
        kind="check", workload=target, specs=[s.text for s in specs], jobs=usercheck.default_jobs(),
        exit_code=report.exit_code(), tensorflow=report.versions.get("tensorflow"),
        keras=report.versions.get("keras"), check_s=report.timings["wall"], reference_s=report.timings["reference"],
        reference_engine_start_s=report.timings["reference_engine_start"],
        spec_seconds={v.spec: round(v.seconds, 2) for v in report.verdicts},
        spec_engine_start_seconds={v.spec: round(v.start_seconds, 2) for v in report.verdicts})
