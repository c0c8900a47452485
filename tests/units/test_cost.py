"""The engines' cost accounting (suite/harness/pool/cost.py) and the cost table made of it
(suite/harness/tools/cost_table.py): no TensorFlow, no engine. What a real session files under its
tests is checked in tests/units/test_parallel.py, whose child session starts real engines."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from suite.harness.judging.judgment import Check
from suite.harness.pool import cost
from suite.harness.tools import cost_table
from tests.helpers import ROOT


def test_a_cost_reads_back_from_its_junit_text():
    c = cost.Cost()
    c.imports = 1
    c.started(2.25, processes=3)
    c.started(1.0, processes=1)
    c.called("reduce.sum", 0.5)
    c.called("engine.sleep", 4.0, timed_out=True)
    back = cost.parse_text(c.text())
    Check("tfds_cost").equal((back.imports, back.engine_starts, back.cluster_starts, back.start_s, back.calls,
                              back.call_s, back.timeout_s), (1, 2, 1, 3.2, 2, 4.5, 4.0), f"{c.text()!r} read back")


def test_a_cost_text_with_a_field_it_does_not_know_is_refused():
    with pytest.raises(ValueError, match=r"unknown fields \['engines'\]"):
        cost.parse_text("engine_starts=1 engines=2")


def test_what_a_child_process_counted_is_absorbed_once():
    cost.adopt()
    cost.absorb()
    before = cost.COUNTED.snapshot()
    script = ("from suite.harness.pool import cost; cost.COUNTED.started(1.5, 2); "
              "cost.COUNTED.called('x.y', 0.25); cost.COUNTED.traced({'x.y': 3})")
    for _ in range(2):
        subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=60)
    subprocess.run([sys.executable, "-c", "from suite.harness.pool import cost"], cwd=ROOT, check=True, timeout=60)
    got = cost.absorb()
    spent = cost.COUNTED.minus(before)
    check = Check("cost.absorb")
    check.equal((got.engine_starts, got.cluster_starts, got.calls, got.probes.get("x.y")), (2, 2, 2, [2, 0.5, 6]),
                "what two children that counted appended")
    check.that(got.harness_cpu_s > 0, "the children's own CPU seconds", got.harness_cpu_s,
               "more than 0 (each of the three reports its own as it exits)")
    # (start_s is a sum of floats less the session's earlier sum: its rounding, not a count, beyond 1e-9)
    check.equal((spent.engine_starts, round(spent.start_s, 9)), (2, 3.0), "COUNTED grew by it")
    check.equal(cost.absorb(), cost.Cost(), "a second absorb with no new line")


def _junit(tmp_path, cases: list[tuple[str, str, float, str | None]], probes: dict | None = None):
    props = (f'<properties><property name="tfds_probes" value=\'{json.dumps(probes)}\'/></properties>'
             if probes else "")
    body = "".join(f'<testcase classname="{cls}" name="{name}" time="{t}">'
                   + (f'<properties><property name="tfds_cost" value="{c}"/></properties>' if c else "")
                   + "</testcase>" for cls, name, t, c in cases)
    path = tmp_path / "run.xml"
    path.write_text(f'<testsuites><testsuite name="pytest" time="100.0">{props}{body}</testsuite></testsuites>')
    return path


def test_the_table_sums_tests_by_file_and_sorts_by_wall_time(tmp_path):
    path = _junit(tmp_path, [
        ("tests.a.test_x", "test_one[default]", 10.0, "imports=1 engine_starts=1 cluster_starts=0 start_s=2.0 calls=4 "
                                                     "call_s=6.0 timeout_s=0.0"),
        ("tests.a.test_x", "test_two", 5.0, None),
        ("tests.b.test_y", "test_three[multi_worker:2x1]", 30.0, "engine_starts=1 cluster_starts=1 start_s=9.0 "
                                                                 "calls=1 call_s=20.0 timeout_s=20.0"),
    ], probes={"reduce.sum": [4, 6.0, 2], "engine.sleep": [1, 20.0, 0]})
    table = cost_table.read([path])
    check = Check("cost_table.read")
    check.equal([(r["file"], r["tests"], r["wall_s"], r["engine_starts"], r["cluster_starts"], r["timeout_s"])
                 for r in table["files"]],
                [("tests/b/test_y.py", 1, 30.0, 1, 1, 20.0), ("tests/a/test_x.py", 2, 15.0, 1, 0, 0.0)],
                "the files, slowest first")
    check.equal([r["test"] for r in table["slowest_tests"]],
                ["tests/b/test_y.py::test_three[multi_worker:2x1]", "tests/a/test_x.py::test_one[default]",
                 "tests/a/test_x.py::test_two"], "the tests, slowest first")
    check.equal([(r["probe"], r["calls"], r["traces"]) for r in table["probes"]],
                [("engine.sleep", 1, 0), ("reduce.sum", 4, 2)], "the probes, costliest first")
    check.equal((table["tests"], table["tests_s"], table["wall_s"]), (3, 45.0, 100.0), "the totals")
    rows = cost_table.lines(table, top=1)
    check.equal(len(rows), 3, "a head, its rule and one row", rows)
    check.contains(rows[2], ["`tests/b/test_y.py`", "| 30.0 |"], "the first row")


def test_a_file_that_doubled_against_the_committed_table_is_warned_about(tmp_path):
    table = cost_table.read([_junit(tmp_path, [("tests.a.test_x", "t", 41.0, None), ("tests.b.test_y", "t", 39.0, None),
                                               ("tests.c.test_z", "t", 19.0, None)])])
    committed = {"files": [{"file": "tests/a/test_x.py", "wall_s": 20.5}, {"file": "tests/b/test_y.py", "wall_s": 20.0},
                           {"file": "tests/c/test_z.py", "wall_s": 5.0}]}
    Check("cost_table.doubled").equal(
        cost_table.doubled(table, committed),
        ["warning: tests/a/test_x.py took 41 s, 2.0x its 20 s in the committed cost table"],
        "the warnings (tests/b is under twice; tests/c under the floor)")


def test_an_unreadable_junit_file_is_a_one_line_error(tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text("<testsuites")
    done = subprocess.run([sys.executable, "-m", "suite.harness.tools.cost_table", str(bad)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    check = Check("cost_table")
    check.equal(done.returncode, 2, "the exit code", done.stderr)
    check.contains(done.stderr, ["not a readable JUnit XML file"], "the error")
    check.equal(done.stderr.strip().count("\n"), 0, "line breaks in the error")


def test_the_committed_table_is_one_the_tool_reads():
    committed = json.loads((ROOT / "docs" / "cost_table.json").read_text())
    check = Check("docs/cost_table.json")
    check.that(committed["files"] and committed["slowest_tests"], "its files and tests", len(committed["files"]),
               "some of each")
    check.equal(sorted(committed["files"][0]), sorted(["file", *cost_table.COLUMNS]), "a file row's columns")
