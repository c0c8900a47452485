"""The version matrix on many machines (.github/workflows/matrix.yml; docs/running.md, "The matrix on
many machines"): the workflow runs exactly tox.ini's envlist, one job per env, and actionlint finds
nothing in it (and does find a broken copy, so a silent linter cannot pass it)."""

from __future__ import annotations

import configparser
import itertools
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suite.harness.judging.judgment import Check
from tests.helpers import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "matrix.yml"


def _tool(name: str) -> str | None:
    """An executable of this interpreter's environment (pyproject's [tf] extra installs actionlint and
    shellcheck there), else of PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


def expand_envlist(text: str) -> list[str]:
    """tox's generative envlist: comma- or line-separated names, each ``a{x,y}-b{z}`` the product of
    its braces' alternatives, in tox's order (``tox -l``)."""
    out: list[str] = []
    for item in re.split(r",(?![^{]*\})|\n", text):
        item = item.strip()
        if not item:
            continue
        parts = re.split(r"(\{[^}]*\})", item)
        choices = [p[1:-1].split(",") if p.startswith("{") else [p] for p in parts]
        out += ["".join(c.strip() for c in combo) for combo in itertools.product(*choices)]
    return out


def tox_envlist() -> list[str]:
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(ROOT / "tox.ini")
    return expand_envlist(ini["tox"].get("env_list") or ini["tox"]["envlist"])


def workflow_envs(text: str) -> list[str]:
    """The workflow's ``strategy.matrix.env`` list (a block sequence, one env a line)."""
    block = re.search(r"^( +)matrix:\n\1  env:[^\n]*\n((?:\1    - [^\n]+\n)+)", text, re.M)
    assert block is not None  # a strategy.matrix.env block sequence, one env a line
    return [ln.split("- ", 1)[1].split("#")[0].strip() for ln in block.group(2).splitlines()]


def test_the_workflow_runs_every_env_of_tox_ini_once():
    check = Check("the matrix workflow", case={"workflow": str(WORKFLOW.relative_to(ROOT))})
    want = tox_envlist()
    check.equal(workflow_envs(WORKFLOW.read_text()), want, "the workflow's matrix envs (tox.ini's envlist, in order)")
    check.that(len(want) == len(set(want)) >= 22, "tox.ini's envlist", want, "22 or more distinct envs")
    if _tool("tox"):  # where tox is installed (.ci/run's venv), its own reading of tox.ini agrees
        proc = subprocess.run([_tool("tox"), "-l"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        check.equal(proc.stdout.split(), want, "tox -l", proc.stderr[-1000:])


def test_expand_envlist_takes_tox_ini_braces():
    check = Check("expand_envlist")
    check.equal(expand_envlist("tf{212,213}\n  tf{216}-legacy\n  tf216-keras30, tf217-keras34"),
                ["tf212", "tf213", "tf216-legacy", "tf216-keras30", "tf217-keras34"], "an envlist like tox.ini's")
    check.equal(expand_envlist("py{311,312}-a{1,2}"), ["py311-a1", "py311-a2", "py312-a1", "py312-a2"],
                "two factors' product")


def actionlint(path: Path) -> subprocess.CompletedProcess:
    """actionlint on ``path``, with shellcheck on the ``run:`` scripts where it is installed (without it
    actionlint skips them)."""
    tool = _tool("actionlint")
    if tool is None:
        pytest.skip("actionlint is not installed (pyproject's [tf] extra installs it: pip install -e '.[tf]')")
    shellcheck = _tool("shellcheck")
    return subprocess.run([tool, "-no-color", f"-shellcheck={shellcheck or ''}", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_actionlint_finds_nothing_in_the_workflow():
    proc = actionlint(WORKFLOW)
    check = Check("actionlint", case={"workflow": str(WORKFLOW.relative_to(ROOT))})
    check.equal(proc.stdout + proc.stderr, "", "actionlint's output")
    check.equal(proc.returncode, 0, "actionlint's exit status")


@pytest.mark.parametrize("what, old, new, found", [
    pytest.param("an invalid key", "    timeout-minutes: 360\n", "    timeout-minutes: 360\n    run-on: ubuntu-latest\n",
                 'unexpected key "run-on" for "job" section', id="invalid-key"),
    pytest.param("a matrix value that does not exist", "ENV_NAME: ${{ matrix.env }}", "ENV_NAME: ${{ matrix.envs }}",
                 'property "envs" is not defined', id="undefined-matrix-value"),
    pytest.param("an input the action does not have", "merge-multiple: true", "merge-multiples: true",
                 'input "merge-multiples" is not defined', id="unknown-input"),
])
def test_actionlint_catches_a_broken_copy(tmp_path, what, old, new, found):
    text = WORKFLOW.read_text()
    assert (old, text.count(old)) == (old, 1)  # the text the broken copy replaces, once in the workflow
    broken = tmp_path / "matrix.yml"
    broken.write_text(text.replace(old, new))
    proc = actionlint(broken)
    check = Check("actionlint on a broken workflow", case={"broken by": what})
    check.equal(proc.returncode, 1, "actionlint's exit status", proc.stdout[-2000:])
    check.contains(proc.stdout, [found], "actionlint's output")
