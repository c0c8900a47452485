"""A fault never changes a verdict it did not touch: a small property selection (pytest, two specs)
and a small check of a user's loop (``python -m suite.check``, two specs), each run fault-free and
then with one fault in one engine call (tests/harness/faults.py: the engine SIGKILLed mid-call,
SIGSTOPped past the call's deadline, the call interrupted by a raising handler, a reply frame cut
short, a garbled frame). Every test or spec the fault did not touch keeps its outcome; the touched
one is an error (the test fails or errors, the spec is ERROR and the check exits 3); no engine
process and no engine folder is left. Ctrl-C and SIGTERM of both are tests/workloads/test_interrupts.py,
a results folder a killed run left is tests/meta/test_matrix_report.py.
``PYTHONPATH=. python tests/harness/test_fault_matrix.py`` prints the table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from suite.harness.verdict.judgment import Check
from tests.harness.faults import ENV, FAULTS, LOG_ENV
from tests.helpers import ROOT
from tests.workloads.test_bad_input import marked

TIMEOUT = "8"  # --engine-timeout: a SIGSTOPped engine's call waits this long
# the properties of strategy.reduce on one device and two replicas, the worked examples first: the fault
# hits mirrored:2's first call, theirs (a call a test of hypothesis' makes is replayed by hypothesis in
# the same test, which would hide a stale reply from the tests after it); the check's hits the spec's
# run of the loop
SELECTION = [f"tests/properties/test_reduce.py::{name}" for name in (
    "test_reduce_docstrings_worked_examples", "test_experimental_local_results_are_in_replica_order",
    "test_reduce_sum_and_mean_over_uneven_replicas")] + ["--strategies", "default,mirrored:2"]
SELECTION_CALL = "mirrored:2#1"
CHECK = ["examples.guide:workload", "--strategies", "default,mirrored:2", "--steps", "2"]
CHECK_CALL = "mirrored:2#1"
# a raising handler mid-call is a test's failure under pytest; the check's interruptions are Ctrl-C and
# SIGTERM, whose run ends with 130 / 143 (test_interrupts.py)
CHECK_FAULTS = sorted(f for f in FAULTS if f != "call interrupted")


def _run(kind: str, fault: str | None, scratch: Path) -> dict:
    """One run of the selection (``kind`` "pytest") or the check ("check") with ``fault`` (None:
    fault-free): each test's or spec's outcome, what the fault touched, the exit status, and the
    engine processes and folders left."""
    scratch.mkdir(parents=True, exist_ok=True)
    tmp, log, mark = scratch / "tmp", scratch / "fault.log", uuid.uuid4().hex
    tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST_", "PYTEST_CURRENT"))}
    env.update(PYTHONPATH=str(ROOT), TFDS_CHECK_MARK=mark, TMPDIR=str(tmp), HYPOTHESIS_PROFILE="quick",
               TFDS_ENGINE_TIMEOUT=TIMEOUT, **{LOG_ENV: str(log)})
    env.pop(ENV, None)
    if fault:
        env[ENV] = f"{fault}@{SELECTION_CALL if kind == 'pytest' else CHECK_CALL}"
    if kind == "pytest":
        junit = scratch / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-p", "tests.harness.faults", *SELECTION, "-n", "0", "-q",
               "-p", "no:cacheprovider", f"--junitxml={junit}"]
    else:
        report = scratch / "check.json"
        cmd = [sys.executable, "-m", "tests.harness.faults", *CHECK, "-q", "--engine-timeout", TIMEOUT,
               "--json", str(report)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if kind == "pytest":
        outcomes = {}
        for case in ET.parse(junit).getroot().iter("testcase") if junit.exists() else ():
            name = f"{case.get('classname')}::{case.get('name')}"
            kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
            outcomes[name] = kinds[0] if kinds else "passed"
    else:
        outcomes = ({v["spec"]: v["status"] for v in json.loads(report.read_text())["specs"]}
                    if report.exists() else {})
    touched = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return {"outcomes": outcomes, "touched": touched, "exit": proc.returncode, "output": proc.stdout + proc.stderr,
            "processes": marked(mark), "folders": sorted(p.name for p in tmp.iterdir())}


def _touched_key(kind: str, run: dict) -> str | None:
    """The test (as JUnit names it) or the spec the fault struck."""
    if not run["touched"]:
        return None
    if kind == "check":
        return run["touched"][0]["spec"]
    path, _, name = run["touched"][0]["test"].partition("::")
    return f"{path[:-len('.py')].replace('/', '.')}::{name}"


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory):
    """The fault-free runs, each checked as such: every test passes, every spec PASSes."""
    runs = {kind: _run(kind, None, tmp_path_factory.mktemp(f"{kind}-fault-free")) for kind in ("pytest", "check")}
    for kind, run in runs.items():
        check = Check(f"{kind}, fault-free")
        check.equal((run["exit"], run["processes"], run["folders"]), (0, [], []),
                    "exit status, processes and folders left", run["output"][-3000:])
        check.that(len(run["outcomes"]) >= 2 and set(run["outcomes"].values()) <= {"passed", "PASS"},
                   "the outcomes", run["outcomes"], "at least two, every one passed")
    return runs


CASES = [("pytest", f) for f in sorted(FAULTS)] + [("check", f) for f in CHECK_FAULTS]


@pytest.mark.parametrize(("kind", "fault"), CASES, ids=[f"{k}-{f.replace(' ', '-')}" for k, f in CASES])
def test_a_fault_changes_only_what_it_touched_and_leaves_nothing(fault_free, tmp_path, kind, fault):
    run = _run(kind, fault, tmp_path)
    base = fault_free[kind]["outcomes"]
    check = Check(f"{kind} with {fault}", case={"call": SELECTION_CALL if kind == "pytest" else CHECK_CALL})
    touched = _touched_key(kind, run)
    check.that(touched in base, "what the fault touched", run["touched"], "a test or spec of the fault-free run")
    changed = {k: (base[k], run["outcomes"].get(k)) for k in base if k != touched and run["outcomes"].get(k) != base[k]}
    check.equal(changed, {}, "outcomes the fault did not touch that changed (fault-free, faulted)",
                run["output"][-3000:])
    want = {"failure", "error"} if kind == "pytest" else {"ERROR"}
    check.that(run["outcomes"].get(touched) in want, f"the touched {'test' if kind == 'pytest' else 'spec'}'s outcome",
               run["outcomes"].get(touched), " or ".join(sorted(want)))
    check.equal(run["exit"], 1 if kind == "pytest" else 3, "exit status", run["output"][-3000:])
    check.equal(run["processes"], [], "engine processes left")
    check.equal(run["folders"], [], "engine folders left")


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        print("| run | fault | touched | its outcome | other outcomes changed | processes left | folders left |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for kind in ("pytest", "check"):
            base = _run(kind, None, Path(folder) / f"{kind}-base")["outcomes"]
            for fault in sorted(FAULTS) if kind == "pytest" else CHECK_FAULTS:
                got = _run(kind, fault, Path(folder) / f"{kind}-{len(fault)}")
                key = _touched_key(kind, got)
                changed = sum(1 for k in base if k != key and got["outcomes"].get(k) != base[k])
                print(f"| {kind} | {fault} | {key} | {got['outcomes'].get(key)} | {changed} of {len(base) - 1} | "
                      f"{len(got['processes'])} | {len(got['folders'])} |")
