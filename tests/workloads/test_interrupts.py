"""Ctrl-C and SIGTERM of ``python -m suite.check`` while its engine is busy (the script's step
hangs): one line, exit 130 (143 for SIGTERM) within seconds, no engine process and no temporary
folder left; interrupted in its reference run it writes no report, interrupted once a spec has
finished its report holds that spec. Before, Ctrl-C waited on the busy engine and exited 2, the
status of bad input. The same for a pytest session with two pytest-xdist workers: Ctrl-C (SIGINT
to its process group) and SIGTERM (to the controller alone) end it with 130 and 143, once its
workers have collected and again once a test has finished, its JUnit written with the tests that
finished; before, SIGTERM killed it with no JUnit and left the engines' folders."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from suite.harness.judging.judgment import Check
from tests.helpers import ROOT
from tests.workloads.test_bad_input import marked
from tests.workloads.test_hangs import HANGS


def _check(tmp_path, *args: str) -> tuple[subprocess.Popen, Path, str]:
    """``python -m suite.check train.py ARGS`` (train.py: HANGS) started in ``tmp_path``, its TMPDIR
    a folder of its own (its engines' folder is made there) and its processes marked; the process,
    that folder and the mark."""
    (tmp_path / "train.py").write_text(HANGS)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    mark = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env.update(PYTHONPATH=str(ROOT), TFDS_CHECK_MARK=mark, TMPDIR=str(scratch))
    proc = subprocess.Popen([sys.executable, "-m", "suite.check", "train.py", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, scratch, mark


def _nothing_left(check, scratch: Path, mark: str):
    __tracebackhide__ = True
    time.sleep(1)
    check.equal(marked(mark), [], "engine processes left running")
    check.equal(sorted(p.name for p in scratch.iterdir()), [], "temporary folders left behind")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_check_kills_its_engines_and_exits_128_plus_the_signal(tmp_path, signum):
    check = Check(f"suite.check interrupted by {signal.Signals(signum).name}")
    proc, scratch, mark = _check(tmp_path, "--strategies", "mirrored:2", "-q", "--engine-timeout", "300", "--",
                                 "--hang", "always")
    try:
        # the reference run hangs in the script: wait until an engine has started and runs it (mirrored:2's
        # reference runs in the one_device engine, scriptcheck.REFERENCE_UNDER)
        deadline = time.monotonic() + 120
        while not list(scratch.glob("tfds-engines-*/*one_device*.log")) and time.monotonic() < deadline:
            time.sleep(0.2)
        check.that(bool(list(scratch.glob("tfds-engines-*/*one_device*.log"))), "the reference's engine",
                   "not started in 120 s", "started")
        time.sleep(5)
        busy = marked(mark)
        sent = time.monotonic()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    check.that(len(busy) > 0, "engine processes before the signal", busy, "some (the engine was busy)")
    check.equal(proc.returncode, 128 + signum, "exit status", err[-2000:])
    check.that(elapsed < 10, "seconds from the signal to the exit", elapsed, "under 10 (the engine is killed, "
               "not waited for)")
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    check.equal(lines, [f"error: interrupted ({signal.Signals(signum).name}): engines killed, no report written"],
                "what the check said", err[-2000:])
    _nothing_left(check, scratch, mark)


def test_a_check_interrupted_after_a_spec_finished_reports_that_spec(tmp_path):
    """Ctrl-C once mirrored:2 has its verdict while multi_worker:2x1 hangs on worker 1: exit 130
    within seconds, the report (stdout and ``--json``) holds mirrored:2's verdict, says the check
    was interrupted and lists the spec not checked; nothing is left behind. Before, an interrupted
    check wrote no report at all, whatever had finished."""
    check = Check("suite.check interrupted after one spec finished")
    proc, scratch, mark = _check(tmp_path, "--strategies", "mirrored:2,multi_worker:2x1", "--json", "out.json",
                                 "--engine-timeout", "300", "--", "--hang", "worker1")
    progress = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # until mirrored:2's progress line (the cluster hangs meanwhile)
            line = proc.stderr.readline()
            if not line:
                break
            progress.append(line)
            if line.startswith("[1/2] "):
                break
        check.that(progress and progress[-1].startswith("[1/2] mirrored:2: "), "the check's progress",
                   "".join(progress)[-2000:], "mirrored:2 finished first")
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    check.equal(proc.returncode, 130, "exit status", err[-2000:])
    check.that(elapsed < 10, "seconds from the signal to the exit", elapsed, "under 10")
    check.equal([line for line in err.splitlines() if line.startswith("error:")],
                ["error: interrupted (SIGINT): engines killed; the report holds the 1 spec(s) that finished"],
                "what the check said", err[-2000:])
    check.contains(out, ["multi_worker:2x1: not checked: interrupted", "INTERRUPTED (SIGINT): 1 spec(s) finished"],
                   "the report")
    report = json.loads((tmp_path / "out.json").read_text())
    check.equal(([(v["spec"], v["status"]) for v in report["specs"]], report["not_checked"], report["interrupted"],
                 report["exit_code"]),
                ([("mirrored:2", "PASS")], ["multi_worker:2x1: not checked: interrupted"], "SIGINT", 130),
                "the --json report (specs, not checked, interrupted, exit code)")
    _nothing_left(check, scratch, mark)


# when the signal comes: once the workers have collected (their engines starting, no test finished), or
# once a test has finished on a worker (its JUnit must hold it)
POINTS = {"engines starting": re.compile(r"^\d+ workers \[\d+ items\]"),
          "a test finished": re.compile(r"^\[gw\d\] .*(PASSED|XFAIL)")}


@pytest.mark.parametrize("point", sorted(POINTS))
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_pytest_session_kills_its_engines_writes_its_junit_and_exits_128_plus_the_signal(
        tmp_path, signum, point):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    junit = tmp_path / "junit.xml"
    mark = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env.update(TFDS_CHECK_MARK=mark, TMPDIR=str(scratch), HYPOTHESIS_PROFILE="ci")
    check = Check(f"pytest interrupted by {signal.Signals(signum).name}")
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "tests/properties/test_losses.py", "--strategies",
                             "default,mirrored:2", "-n", "2", "-v", "-p", "no:cacheprovider", f"--junitxml={junit}"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # until the point's line
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if POINTS[point].search(line):
                break
        time.sleep(2 if point == "a test finished" else 0.5)
        busy = [p for p in marked(mark) if p != proc.pid]
        sent = time.monotonic()
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)  # Ctrl-C: the terminal's whole process group
        else:
            proc.send_signal(signum)  # SIGTERM: the controller alone
        out, _ = proc.communicate(timeout=120)
        elapsed = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    out = "".join(lines) + out
    check.that(len(busy) > 0, "the session's processes besides the controller", busy, "some (its workers)")
    check.equal(proc.returncode, 128 + signum, "exit status", out[-2000:])
    check.that(elapsed < 60, "seconds from the signal to the exit", elapsed, "under 60")
    time.sleep(1)
    check.equal(marked(mark), [], "processes left running")
    check.equal(sorted(p.name for p in scratch.glob("tfds-engines-*")), [], "engine folders left behind")
    check.that(junit.exists(), "the JUnit file", "not written", "written whole (XML that parses)")
    cases = sum(1 for _ in ET.parse(junit).getroot().iter("testcase"))
    if point == "a test finished":
        check.that(cases > 0, "test cases in the JUnit", cases, "the tests that finished")
