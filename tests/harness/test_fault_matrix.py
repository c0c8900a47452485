"""A fault never changes a verdict it did not touch: a small property selection (pytest, two specs)
and a small check of a user's loop (``python -m suite.check``, five specs), each run fault-free and
then once with every fault, each in one engine call of its own test or spec (tests/harness/faults.py:
the engine SIGKILLed mid-call, SIGSTOPped past the call's deadline, the call interrupted by a raising
handler, a reply frame cut short, a garbled frame). Every test or spec no fault touched keeps its
outcome; each touched one is an error (the test fails or errors, the spec is ERROR), except that pytest
asks a call whose engine timed out or was killed again of a fresh engine (--engine-retries): the tests
struck by those two faults pass, each with a warning quoting its error; no engine process and no engine
folder is left. Ctrl-C and SIGTERM of both are tests/workloads/test_interrupts.py, a
results folder a killed run left is tests/units/test_matrix_report.py.
``PYTHONPATH=. python tests/harness/test_fault_matrix.py`` prints the table."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from suite.harness.judging.judgment import Check
from tests.harness.faults import ENV, FAULTS, LOG_ENV
from tests.helpers import ROOT
from tests.workloads.test_bad_input import marked

# the properties of strategy.reduce and of metrics on one device and two replicas, the worked examples
# first: per fault, the mirrored:2 test whose first call it strikes. "call interrupted" strikes a test
# hypothesis does not replay and the test after it is left alone (hypothesis replays a failed example in
# the same test, which would hide a stale reply from the tests after it)
SELECTION = [f"tests/properties/test_reduce.py::{name}" for name in (
    "test_reduce_docstrings_worked_examples", "test_experimental_local_results_are_in_replica_order",
    "test_reduce_sum_and_mean_over_uneven_replicas")] + [
    "tests/properties/test_metrics.py::test_metric_result_is_the_metric_of_the_global_data",
    "--strategies", "default,mirrored:2",
    "-k", "not metric_result or mean or sum or accuracy and not binary and not categorical"]  # 3 of its 6 metrics
PYTEST_FAULTS = {
    "call interrupted": "test_reduce_docstrings_worked_examples[mirrored:2]",
    "SIGKILL mid-call": "test_reduce_sum_and_mean_over_uneven_replicas[mirrored:2-float32]",
    "SIGSTOP past the deadline": "test_reduce_sum_and_mean_over_uneven_replicas[mirrored:2-float64]",
    "reply cut short": "test_metric_result_is_the_metric_of_the_global_data[mirrored:2-mean]",
    "garbled reply": "test_metric_result_is_the_metric_of_the_global_data[mirrored:2-accuracy]",
}
# the check of the guide's loop; per fault, the spec whose run of the loop (its first call) it strikes.
# A raising handler mid-call is a test's failure under pytest; the check's interruptions are Ctrl-C and
# SIGTERM, whose run ends with 130 / 143 (test_interrupts.py)
# the faults that end in a timeout or a dead engine: pytest's session asks the call again of a fresh
# engine, which the fault does not strike (the check reports them: ERROR). A reply cut short here is
# completed by the engine's own reply, a garbled message: an error at once (not retried: an engine
# whose replies are out of step is not a crash)
RETRIED = {"SIGSTOP past the deadline", "SIGKILL mid-call"}
CHECK_FAULTS = {"SIGKILL mid-call": "mirrored:2", "SIGSTOP past the deadline": "mirrored:1",
                "reply cut short": "one_device", "garbled reply": "central_storage:2"}
CHECK = ["examples.guide:workload", "--strategies", "default,mirrored:1,mirrored:2,one_device,central_storage:2",
         "--steps", "2"]
FAULTED = {"pytest": [{"fault": f, "spec": "mirrored:2", "test": t} for f, t in PYTEST_FAULTS.items()],
           "check": [{"fault": f, "spec": spec} for f, spec in CHECK_FAULTS.items()]}


def _run(kind: str, faulted: bool, scratch: Path) -> dict:
    """One run of the selection (``kind`` "pytest") or the check ("check"), fault-free or with its
    FAULTED: each test's or spec's outcome, what each fault struck, the exit status, and the engine
    processes and folders left."""
    scratch.mkdir(parents=True, exist_ok=True)
    tmp, log, mark = scratch / "tmp", scratch / "fault.log", uuid.uuid4().hex
    tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST_", "PYTEST_CURRENT"))}
    env.update(PYTHONPATH=str(ROOT), TFDS_CHECK_MARK=mark, TMPDIR=str(tmp), HYPOTHESIS_PROFILE="quick",
               **{LOG_ENV: str(log)})
    env.pop(ENV, None)
    if faulted:
        env[ENV] = json.dumps(FAULTED[kind])
    if kind == "pytest":
        junit = scratch / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-p", "tests.harness.faults", *SELECTION, "-n", "0", "-q",
               "-p", "no:cacheprovider", f"--junitxml={junit}"]
    else:
        report = scratch / "check.json"
        cmd = [sys.executable, "-m", "tests.harness.faults", *CHECK, "-q", "--accept-known", "--json", str(report)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if kind == "pytest":
        outcomes, retried = {}, {}
        for case in ET.parse(junit).getroot().iter("testcase") if junit.exists() else ():
            name = f"{case.get('classname')}::{case.get('name')}"
            kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
            outcomes[name] = kinds[0] if kinds else "passed"
            retried[name] = "\n".join(p.get("value") for p in case.iter("property") if p.get("name") == "tfds_retried")
    else:
        retried = {}
        outcomes = ({v["spec"]: v["status"] for v in json.loads(report.read_text())["specs"]}
                    if report.exists() else {})
    touched = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return {"outcomes": outcomes, "retried": retried, "touched": touched, "exit": proc.returncode,
            "output": proc.stdout + proc.stderr,
            "processes": marked(mark), "folders": sorted(p.name for p in tmp.iterdir())}


def _key(kind: str, struck: dict) -> str:
    """The test (as JUnit names it) or the spec a fault struck."""
    if kind == "check":
        return struck["spec"]
    path, _, name = struck["test"].partition("::")
    return f"{path[:-len('.py')].replace('/', '.')}::{name}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Per kind, its fault-free and its faulted run; the fault-free ones checked as such (exit 0, no
    test or spec in error, nothing left)."""
    out = {kind: {faulted: _run(kind, faulted, tmp_path_factory.mktemp(f"{kind}-{faulted}")) for faulted in (False, True)}
           for kind in ("pytest", "check")}
    Check("the fault matrix").equal(sorted(PYTEST_FAULTS), sorted(FAULTS), "the faults the selection gets")
    for kind in out:
        run = out[kind][False]
        check = Check(f"{kind}, fault-free")
        check.equal((run["exit"], run["processes"], run["folders"]), (0, [], []),
                    "exit status, processes and folders left", run["output"][-3000:])
        errors = {k: v for k, v in run["outcomes"].items() if v in ("failure", "error", "ERROR", "FAIL")}
        check.that(len(run["outcomes"]) > len(FAULTED[kind]) and not errors, "the outcomes", run["outcomes"],
                   f"more than {len(FAULTED[kind])}, none an error")
    return out


CASES = [("pytest", f) for f in sorted(PYTEST_FAULTS)] + [("check", f) for f in sorted(CHECK_FAULTS)]


@pytest.mark.parametrize(("kind", "fault"), CASES, ids=[f"{k}-{f.replace(' ', '-')}" for k, f in CASES])
def test_each_fault_is_an_error_of_the_test_or_spec_it_struck(runs, kind, fault):
    run = runs[kind][True]
    where = PYTEST_FAULTS[fault] if kind == "pytest" else CHECK_FAULTS[fault]
    check = Check(f"{kind} with {fault}", case={"struck": where})
    struck = [e for e in run["touched"] if e["fault"] == fault]
    check.that(len(struck) == 1 and where in _key(kind, struck[0]), "where the fault struck", struck,
               f"one call, of {where}")
    retried = kind == "pytest" and fault in RETRIED
    want = {"passed"} if retried else {"failure", "error"} if kind == "pytest" else {"ERROR"}
    got = run["outcomes"].get(_key(kind, struck[0])) if struck else None
    check.that(got in want, f"the struck {'test' if kind == 'pytest' else 'spec'}'s outcome", got,
               " or ".join(sorted(want)), run["output"][-3000:])
    if retried:  # pytest's warnings summary: the test's id, then the warning
        warned = re.search(re.escape(where) + r"\n\s+\S+: EngineCallRetried: engine 'mirrored:2' [^\n]*"
                           r"asked again of a fresh engine", run["output"])
        check.that(warned is not None, "the warning of the retried call", run["output"][-3000:],
                   f"EngineCallRetried under {where} in the warnings summary")
        summary = re.search(r"^retried: \S*" + re.escape(where) + r": engine 'mirrored:2' ", run["output"], re.MULTILINE)
        check.that(summary is not None, "the line of the retried call in the engines summary", run["output"][-3000:],
                   f"retried: ...{where}: engine 'mirrored:2' ...")
        check.contains(run["retried"].get(_key(kind, struck[0])) or "", ["engine 'mirrored:2'"],
                       "the retried call's error in the test's JUnit property tfds_retried")


@pytest.mark.parametrize("kind", ["pytest", "check"])
def test_what_no_fault_touched_keeps_its_outcome_and_nothing_is_left(runs, kind):
    base, run = runs[kind][False], runs[kind][True]
    struck = {_key(kind, e) for e in run["touched"]}
    check = Check(f"{kind} with {len(FAULTED[kind])} faults", case={"faults": FAULTED[kind]})
    changed = {k: (v, run["outcomes"].get(k)) for k, v in base["outcomes"].items()
               if k not in struck and run["outcomes"].get(k) != v}
    check.equal(changed, {}, "outcomes no fault touched that changed (fault-free, faulted)", run["output"][-3000:])
    check.equal(run["exit"], 1 if kind == "pytest" else 3, "exit status", run["output"][-3000:])
    check.equal(run["processes"], [], "engine processes left")
    check.equal(run["folders"], [], "engine folders left")


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        print("| run | fault | struck | its outcome | untouched outcomes changed | processes left | folders left |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for kind in ("pytest", "check"):
            base = _run(kind, False, Path(folder) / f"{kind}-base")["outcomes"]
            got = _run(kind, True, Path(folder) / f"{kind}-faulted")
            struck = {_key(kind, e) for e in got["touched"]}
            changed = sum(1 for k in base if k not in struck and got["outcomes"].get(k) != base[k])
            for e in got["touched"]:
                print(f"| {kind} | {e['fault']} | {_key(kind, e)} | {got['outcomes'].get(_key(kind, e))} | "
                      f"{changed} of {len(base) - len(struck)} | {len(got['processes'])} | {len(got['folders'])} |")
