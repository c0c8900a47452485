"""The distribution as a user gets it: ``pip install`` of the project into a fresh environment
outside the checkout gives one top-level package of the project's own name (tf_distribute_suite),
the two console commands and the ``distribution_check`` fixture, which runs engines from the
installed copy; and the package list in pyproject.toml is the tree of suite/."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
from pathlib import Path

import pytest

from suite.harness.judging.judgment import Check
from tests.helpers import ROOT

SOURCES = ["suite", "reference", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "known_deviations.toml"]

USER_LOOP = '''
import numpy as np
import tensorflow as tf

from tf_distribute_suite.engine.workload import Workload


def workload(ctx):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 8)).astype("float32")
    y = rng.integers(0, 3, size=96)
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(3)])
    optimizer = tf.keras.optimizers.SGD(0.1)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def dataset(global_batch_size, input_context):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size)

    def step(batch):
        features, labels = batch
        with tf.GradientTape() as tape:
            scaled = tf.nn.compute_average_loss(loss(labels, model(features, training=True)),
                                                global_batch_size=ctx.global_batch_size)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return scaled

    return Workload(model, optimizer, loss, dataset, step=step)
'''

USER_TEST = '''
def test_my_loop_is_distribution_correct(distribution_check):
    report = distribution_check("userloop:workload", strategies="mirrored:2", steps=2)
    assert [v.status for v in report.verdicts] == ["PASS"]
'''


def test_the_package_list_is_the_tree():
    """pyproject.toml lists every package of suite/ (as tf_distribute_suite.*) and reference/."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    tree = sorted(["tf_distribute_suite"] + [
        "tf_distribute_suite." + ".".join(p.parent.relative_to(ROOT / "suite").parts)
        for p in (ROOT / "suite").rglob("__init__.py") if p.parent != ROOT / "suite"] + ["tf_distribute_suite.reference"])
    check = Check("pyproject.toml")
    check.equal(sorted(config["packages"]), tree, "packages")
    check.equal(config["package-dir"], {"tf_distribute_suite": "suite", "tf_distribute_suite.reference": "reference"},
                "package-dir")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv outside the checkout with the project pip-installed (not editable). Its
    dependencies (TensorFlow, pytest, hypothesis...) are this environment's, seen through a .pth
    file, so that nothing is downloaded; the project itself is only the installed copy."""
    base = tmp_path_factory.mktemp("install")
    src = base / "src"
    for name in SOURCES:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copyfile)(
            ROOT / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if (ROOT / name).is_dir() else {}))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # this environment's packages, after the venv's own (a plain path line: its .pth files, such as
    # an editable install of the checkout, are not run)
    (Path(site) / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                           "-q", str(src)], capture_output=True, text=True, timeout=600, cwd=base)
    if proc.returncode:
        pytest.fail(f"pip install failed: {proc.stderr[-2000:]}")
    return venv, base


def _env():
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH", "TFDS_", "VIRTUAL_ENV"))}


def test_pip_show_lists_one_top_level_package(installed):
    venv, base = installed
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "show", "-f", "tf-distribute-suite"],
                          capture_output=True, text=True, timeout=120, env=_env(), cwd=base)
    files = proc.stdout.split("Files:", 1)[1].split()
    top = sorted({f.split("/")[0] for f in files if not f.startswith("..") and ".dist-info" not in f.split("/")[0]})
    check = Check("pip show -f")
    check.equal(top, ["tf_distribute_suite"], "top-level names installed")
    check.that("tf_distribute_suite/known_deviations.toml" in files, "the known-deviations file installed", files[:5],
               "tf_distribute_suite/known_deviations.toml")
    check.that(any(f.endswith("bin/tf-distribute-check") for f in files)
               and any(f.endswith("bin/tf-distribute-report") for f in files), "console commands", files[-6:],
               "bin/tf-distribute-check and bin/tf-distribute-report")


def test_a_users_test_with_distribution_check_passes_from_the_installed_copy(installed):
    venv, base = installed
    project = base / "userproject"
    project.mkdir()
    (project / "userloop.py").write_text(USER_LOOP)
    (project / "test_userloop.py").write_text(USER_TEST)
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", "test_userloop.py"], cwd=project, env=_env(), capture_output=True,
                          text=True, timeout=900)
    check = Check("installed distribution_check")
    check.equal(proc.returncode, 0, "the user's pytest exit status", proc.stdout[-3000:] + proc.stderr[-2000:])
    check.contains(proc.stdout, ["1 passed"], "the user's test")


def test_console_commands_run_from_the_installed_copy(installed):
    venv, base = installed
    check = Check("console commands")
    out = subprocess.run([str(venv / "bin" / "tf-distribute-check"), "--help"], capture_output=True, text=True,
                         timeout=120, env=_env(), cwd=base)
    check.equal(out.returncode, 0, "tf-distribute-check --help exit status", out.stderr[-1000:])
    bad = subprocess.run([str(venv / "bin" / "tf-distribute-report"), str(base / "nowhere.json"), "-o", str(base / "r")],
                         capture_output=True, text=True, timeout=120, env=_env(), cwd=base)
    check.equal(bad.returncode, 2, "tf-distribute-report on a missing file: exit status", bad.stderr)
    check.equal(len(bad.stderr.strip().splitlines()), 1, "lines of its error", bad.stderr)
    where = subprocess.run([str(venv / "bin" / "python"), "-c", textwrap.dedent("""
        import tf_distribute_suite.layout as l, tf_distribute_suite.harness.judging.deviations as d
        print(l.PACKAGE, l.REPO_ROOT, l.REFERENCE, len(d.load()) > 0)""")], capture_output=True, text=True, timeout=120,
                           env=_env(), cwd=base)
    check.equal(where.stdout.split(), ["tf_distribute_suite", "None", "tf_distribute_suite.reference", "True"],
                "the installed layout (package, checkout, reference, deviations file)", where.stderr[-1000:])
