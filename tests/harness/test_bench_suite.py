"""The suite's own cost as a benchmark (``pytest benchmarks --bench-suite``: benchmarks/bench_suite.py,
suite/harness/tools/suite_bench.py): what it runs, that it times the run it reports, and that a
failing run fails it. The runs timed here are two small test files of this test's own, no engines."""

from __future__ import annotations

import json

import pytest

from suite.harness.judging.judgment import Check
from suite.harness.tools import suite_bench
from tests.helpers import ROOT, run_pytest

PASSING = '''import time

import pytest


@pytest.mark.parametrize("i", range(3))
def test_sleeps(i):
    time.sleep(0.3)


@pytest.mark.xfail(strict=True)
def test_known():
    assert False
'''
FAILING = "def test_wrong():\n    assert 1 == 2\n"


def test_targets_are_paths_or_the_costliest_files_of_the_committed_table():
    table = suite_bench.committed_table(ROOT)
    costliest = [r["file"] for r in table["files"][:2]]
    check = Check("--bench-suite", case={"value": "slowest:2,tests/units/test_specs.py,slowest:1"})
    got = suite_bench.targets("slowest:2,tests/units/test_specs.py,slowest:1", ROOT)
    check.equal([t.path for t in got], [*costliest, "tests/units/test_specs.py"], "the targets, each once, in order")
    check.equal(got[0].estimate_s, table["files"][0]["wall_s"] / suite_bench.WORKERS + suite_bench.START_S,
                "the estimate of the costliest file (its committed seconds over the workers, and the start)")
    whole = suite_bench.targets("tests", ROOT)[0].estimate_s
    check.equal(round(whole, 1), round(sum(r["wall_s"] for r in table["files"] if r["file"].startswith("tests/"))
                                       / suite_bench.WORKERS + suite_bench.START_S, 1), "the estimate of 'tests'")
    for bad, message in (("nowhere/test_x.py", "no such test file or folder"), ("slowest:0", "positive integer"),
                         ("slowest:x", "positive integer"), (" , ", "names no tests")):
        with pytest.raises(suite_bench.SuiteBenchError) as info:
            suite_bench.targets(bad, ROOT)
        check.contains(str(info.value), [f"--bench-suite {bad!r}", message], f"the error for {bad!r}")


def test_the_benchmark_times_the_suites_run_and_a_failing_run_fails_it(tmp_path):
    (tmp_path / "test_passing.py").write_text(PASSING)
    (tmp_path / "test_failing.py").write_text(FAILING)
    out = tmp_path / "out.json"
    done = run_pytest(["benchmarks", "--bench-suite", f"{tmp_path / 'test_passing.py'},{tmp_path / 'test_failing.py'}",
                       "--benchmark-json", str(out)], timeout=300)
    check = Check("pytest benchmarks --bench-suite", case={"targets": ["test_passing.py", "test_failing.py"]})
    check.equal(done.returncode, 1, "the exit status (one benchmark fails)", done.stdout[-2000:] + done.stderr[-1000:])
    check.contains(done.stdout, ["the exit status of the suite's run: got 1", "1 failed, 1 passed"],
                   "the failing run's benchmark")
    results = {b["name"].split("[", 1)[1].rstrip("]").rsplit("/", 1)[-1]: b
               for b in json.loads(out.read_text())["benchmarks"]}
    check.equal(sorted(results), ["test_failing.py", "test_passing.py"], "the benchmarks run (the suite's alone)")
    passing = results["test_passing.py"]
    info = passing["extra_info"]
    check.equal((info["kind"], info["exit_code"], info["tests"], [f["tests"] for f in info["files"]]),
                ("suite", 0, 4, [4]), "the passing run's kind, exit status and tests (3 passed, 1 xfailed)")
    check.that(info["tests_s"] >= 0.9, "the passing run's summed test seconds", info["tests_s"],
               "at least its three sleeps of 0.3 s")
    check.that(passing["stats"]["min"] >= info["tests_s"], "the time the benchmark reports", passing["stats"]["min"],
               f"at least the run's summed test seconds ({info['tests_s']}): it times the run")
    check.equal(results["test_failing.py"]["extra_info"]["exit_code"], 1, "the failing run's exit status")
