"""``python -m suite.harness.tools.outcomes_diff``: two JUnit runs compared id by id (synthetic
files, no engines)."""

from __future__ import annotations

import subprocess
import sys

from suite.harness.judging.judgment import Check
from suite.harness.tools import outcomes_diff
from tests.helpers import ROOT

XFAIL = '<skipped type="pytest.xfail" message="known deviation d (signature matched 1x)" />'
SKIP = '<skipped type="pytest.skip" message="no GPU" />'


def _junit(path, cases: dict[str, str]):
    body = "".join(f'<testcase classname="tests.properties.test_x" name="{name}">{inner}</testcase>'
                   for name, inner in cases.items())
    path.write_text(f'<testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')
    return path


def test_a_changed_outcome_a_rename_and_new_ids(tmp_path):
    before = _junit(tmp_path / "before.xml", {"test_a[default]": "", "test_b[mirrored:2]": XFAIL,
                                              "test_old[default]": SKIP, "test_gone[default]": ""})
    after = _junit(tmp_path / "after.xml", {"test_a[default]": "<failure message='x'/>", "test_b[mirrored:2]": XFAIL,
                                            "test_new[default]": SKIP, "test_added[default]": ""})
    got = outcomes_diff.compare(outcomes_diff.outcomes(before), outcomes_diff.outcomes(after),
                                {"tests/properties/test_x.py::test_old[default]":
                                 "tests/properties/test_x.py::test_new[default]"})
    check = Check("outcomes_diff")
    check.equal(got["changed"], ["tests/properties/test_x.py::test_a[default]: pass -> fail"], "changed outcomes")
    check.equal(got["removed"], ["tests/properties/test_x.py::test_gone[default]"], "ids the second run lost")
    check.equal(got["added"], ["tests/properties/test_x.py::test_added[default]"], "ids the second run gained")
    check.equal(got["missing"], [], "mapped ids missing")
    proc = subprocess.run([sys.executable, "-m", "suite.harness.tools.outcomes_diff", str(before), str(after)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    check.equal(proc.returncode, 1, "exit status with a changed outcome", proc.stderr)
    same = subprocess.run([sys.executable, "-m", "suite.harness.tools.outcomes_diff", str(before), str(before)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    check.equal(same.returncode, 0, "exit status of a run against itself", same.stdout)
