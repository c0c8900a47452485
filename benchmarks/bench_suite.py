"""The suite's own cost (``pytest benchmarks --bench-suite slowest:3``, ``--bench-suite tests``):
each target run as the README runs its tests (``HYPOTHESIS_PROFILE=ci pytest TARGET``, its own
pytest and engines), timed once (a round is minutes), its cost table in ``extra_info``
(suite/harness/tools/suite_bench.py). Collected only with ``--bench-suite``: the default selection
times training steps, and a whole profile is a quarter of an hour.

So the suite's history shows a regression: with ``--benchmark-autosave`` each run is kept under
``.benchmarks``, and ``pytest-benchmark compare`` sets a target's runs side by side; ``extra_info``
says where its time went (per file: tests, wall seconds, TensorFlow imports, engine starts, probe
calls and their seconds, waits that ended at their deadline) and which files took twice their time
in the committed table. The timed run must pass: a fast failing suite is no result.
"""

from __future__ import annotations

from suite.harness.judging.judgment import Check
from suite.harness.tools import suite_bench

TIMEOUT_FACTOR = 3.0  # a target may take this many times its estimate (a loaded machine) before it is stopped
TIMEOUT_FLOOR_S = 600.0


def test_suite(benchmark, suite_target, request, tmp_path):
    root = request.config.rootpath
    timeout = max(TIMEOUT_FLOOR_S, TIMEOUT_FACTOR * suite_target.estimate_s)
    sub = benchmark.pedantic(suite_bench.run, args=(suite_target, root, tmp_path, timeout), rounds=1, iterations=1)
    benchmark.extra_info.update(suite_bench.extra_info(suite_target, sub, suite_bench.committed_table(root)))
    check = Check("suite", case={"target": suite_target.path})
    check.that(sub.code == 0, "the exit status of the suite's run", sub.code, "0 (a fast failing run is no result)",
               sub.tail)
    check.that(sub.table["tests"] > 0, "tests in the run's JUnit", sub.table["tests"], "at least one", sub.tail)
