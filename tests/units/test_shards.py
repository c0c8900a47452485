"""The version matrix on many machines (docs/running.md, "The matrix on many machines"): each env a job
writing its own results folder, the folders merged by copying them into one, gives the report of one
machine that ran both envs into one results folder, byte for byte.

For real but cheap: the suite's plugin in child pytest sessions (``-p``, outside the repository's test
tree) runs a small test file whose outcomes depend on the engines' versions, with ``--results-dir``;
the two envs are two engine interpreters that report different TensorFlow and Keras versions (this
venv's Python with package metadata of those versions first on its path: the results folder is named
by what the engine interpreter reports, and no test here starts an engine). Nothing is normalized:
what is run-specific (the JUnit files' timestamps, durations and host name, the command line recorded
in versions.json) does not reach report.md, and the report names the results folder as given, so
both reports are made from a folder called ``results``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from suite.harness.judging.judgment import Check
from suite.harness.reporting import results_dir
from tests.helpers import ROOT

# two envs of the matrix, as their engines report them (tf220-keras311, tf221-keras313)
ENVS = {"tf220-keras311": ("2.20.0", "3.11.3"), "tf221-keras313": ("2.21.0", "3.13.2")}

TESTS = '''
import pytest


def test_everywhere():
    pass


def test_regresses_on_2_21(suite_state):
    assert suite_state.versions["tensorflow"] != "2.21.0", "a synthetic regression of TF 2.21"


def test_deviates_before_2_21(suite_state):
    if suite_state.versions["tensorflow"] != "2.21.0":
        pytest.xfail("known deviation shard-demo (signature matched 1x): what it computes instead")


def test_runs_on_2_21_only(suite_state):
    if suite_state.versions["tensorflow"] != "2.21.0":
        pytest.skip("TF 2.21 only")
'''


def fake_engine_python(root: Path, tensorflow: str, keras: str) -> Path:
    """An interpreter whose package metadata says TensorFlow ``tensorflow`` (tensorflow-cpu) and
    Keras ``keras``: this venv's Python with those dist-infos first on its path."""
    site = root / "site"
    for name, version in (("tensorflow_cpu", tensorflow), ("keras", keras)):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
    python = root / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return python


def run_env(tmp_path: Path, env: str, results: Path) -> subprocess.CompletedProcess:
    """The test file under ``env``'s engines, its results written under ``results``."""
    python = tmp_path / "envs" / env / "bin" / "python"
    if not python.exists():
        fake_engine_python(tmp_path / "envs" / env, *ENVS[env])
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-p", "suite.harness.plugin.suite_plugin", "-p", "no:cacheprovider",
         "-q", "test_shard_demo.py", "--engine-python", str(python), "--results-dir", str(results)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env=dict(base, PYTHONPATH=str(ROOT), HYPOTHESIS_PROFILE="quick"))


def report(folder: Path) -> str:
    """``python -m suite.report results -o report`` in ``folder``: report.md, and every file written."""
    proc = subprocess.run([sys.executable, "-m", "suite.report", "results", "-o", "report"], cwd=folder,
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert (proc.returncode, proc.stderr) == (0, "")
    assert sorted(p.name for p in (folder / "report").iterdir()) == ["report.md"]
    return (folder / "report" / "report.md").read_text()


def test_shards_merged_give_the_report_of_one_run_over_both_envs(tmp_path):
    (tmp_path / "test_shard_demo.py").write_text(TESTS)
    check = Check("shard and merge")
    # one machine, both envs into one results folder (tox -e tf220-keras311,tf221-keras313)
    for env in ENVS:
        proc = run_env(tmp_path, env, tmp_path / "one" / "results")
        check.equal(proc.returncode, 1 if env == "tf221-keras313" else 0, f"{env}'s exit status", proc.stdout[-2000:])
    # a machine per env, each its own results folder (one job of the workflow each)
    for env in ENVS:
        run_env(tmp_path, env, tmp_path / "shards" / env / "results")
    shards = {env: sorted(p.name for p in (tmp_path / "shards" / env / "results").iterdir()) for env in ENVS}
    check.equal(shards, {env: [results_dir.folder_name({"tensorflow": tf, "keras": k})]
                         for env, (tf, k) in ENVS.items()}, "each shard's results folder: one folder, of its versions")
    # merged: every shard's folders copied into one results folder (the workflow's download-artifact)
    for env in ENVS:
        shutil.copytree(tmp_path / "shards" / env / "results", tmp_path / "merged" / "results", dirs_exist_ok=True)

    one, merged = report(tmp_path / "one"), report(tmp_path / "merged")
    check.equal(merged.splitlines(), one.splitlines(), "report.md of the merged shards, line by line (one run's)")
    # and the report is not empty of what the shards differ in
    check.contains(one, ["`2.20.0 / 3.11.3 as shipped (quick)`", "`2.21.0 / 3.13.2 as shipped (quick)`",
                         "| `test_shard_demo::test_regresses_on_2_21` | ✓ | **FAIL** 1/1 |",
                         "| `test_shard_demo::test_deviates_before_2_21` | dev [1] | ✓ |", "[1] `shard-demo`"],
                   "the report of both envs")
