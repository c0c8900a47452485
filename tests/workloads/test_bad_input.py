"""Bad input to ``python -m suite.check`` gets one line on stderr naming the workload and what is
wrong, exit status 2, and no engine left running: a spec that does not parse, a module that is
not there or does not import, a factory that raises or returns something else, a dataset smaller
than one global batch, a workload that does not repeat itself with no strategy. The workloads are
written into a temporary folder (the pytest process never imports them: they import TensorFlow)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from suite.harness.judging.judgment import Check
from tests.helpers import ROOT

USERLOOP = textwrap.dedent('''
    import numpy as np
    import tensorflow as tf

    from suite.engine.workload import Workload

    keras = tf.keras


    def _parts(n=96, noise=False):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
        x = np.arange(n * 4, dtype=np.float32).reshape(n, 4) / (n * 4)
        y = np.arange(n * 2, dtype=np.float32).reshape(n, 2) / (n * 2)
        if noise:  # an unseeded random stream: every run draws other values
            x = x + np.random.default_rng().normal(size=x.shape).astype(np.float32)
        return model, optimizer, keras.losses.MeanSquaredError(reduction="none"), (
            lambda g, ic: tf.data.Dataset.from_tensor_slices((x, y)).batch(g))


    def raises(ctx):
        raise RuntimeError("the data folder /data/train is missing")


    def not_a_workload(ctx):
        model, optimizer, loss, dataset = _parts()
        return model, optimizer, loss, dataset


    def too_small(ctx):
        return Workload(*_parts(n=10))


    def unrepeatable(ctx):
        return Workload(*_parts(noise=True))


    def non_finite(ctx):  # a NaN in the data: the first step makes the weights NaN
        model, optimizer, loss, dataset = _parts()
        return Workload(model, optimizer, loss, lambda g, ic: dataset(g, ic).map(lambda x, y: (x * np.nan, y)))


    NOT_CALLABLE = 3
''')
BROKEN = "import tensorflow as tf\nraise ImportError('cannot import name \"Trainer\" from \"mylib\"')\n"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("userloops")
    (path / "userloop.py").write_text(USERLOOP)
    (path / "broken.py").write_text(BROKEN)
    return path


def check_cli(folder: Path, *args: str, quiet: bool = True, env: dict | None = None,
              ) -> tuple[subprocess.CompletedProcess, list[int]]:
    """Run ``python -m suite.check ARGS`` (with ``-q`` unless not ``quiet``; ``env`` added to this process's
    environment) from ``folder``; its result and the processes still alive afterwards that carry its marker in
    their environment (its engines)."""
    mark = uuid.uuid4().hex
    env = dict(os.environ, **(env or {}), PYTHONPATH=str(ROOT), TFDS_CHECK_MARK=mark)
    env = {k: v for k, v in env.items() if not k.startswith("PYTEST_XDIST_")}
    if quiet:  # -q before a script's own arguments (after --)
        args = [*args[:args.index("--")], "-q", *args[args.index("--"):]] if "--" in args else [*args, "-q"]
    done = subprocess.run([sys.executable, "-m", "suite.check", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)
    return done, marked(mark)


def marked(mark: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"TFDS_CHECK_MARK={mark}".encode() in (entry / "environ").read_bytes():
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


CASES = {
    "unknown spec": (["userloop:too_small", "--strategies", "mirrored:two"], "--strategies: "),
    "no colon": (["userloop"], "workload 'userloop': expected 'package.module:factory'"),
    "no module": (["nowhere.loop:workload"], "workload 'nowhere.loop:workload': no module named 'nowhere'"),
    "module does not import": (["broken:workload"],
                               "workload 'broken:workload': module 'broken' does not import (ImportError: cannot "
                               "import name \"Trainer\" from \"mylib\")"),
    "no such factory": (["userloop:workload"], "workload 'userloop:workload': module 'userloop' has no attribute "
                                               "'workload'"),
    "not callable": (["userloop:NOT_CALLABLE"], "workload 'userloop:NOT_CALLABLE': 'NOT_CALLABLE' is a int, not a "
                                                "callable factory"),
    "factory raises": (["userloop:raises"], "workload 'userloop:raises': the factory raised RuntimeError: the data "
                                            "folder /data/train is missing"),
    "wrong return": (["userloop:not_a_workload"], "workload 'userloop:not_a_workload': the factory returned a tuple, "
                                                  "not a tf_distribute_suite.engine.workload.Workload"),
    "dataset too small": (["userloop:too_small"], "workload 'userloop:too_small': its dataset gave 10 examples, fewer "
                                                  "than one global batch of 48"),
    "non-finite": (["userloop:non_finite"], ["workload 'userloop:non_finite' goes non-finite with no strategy: "
                                             "variable ", "is NaN after step 1", "the check compares finite runs"]),
    "not repeatable": (["userloop:unrepeatable"], ["workload 'userloop:unrepeatable' does not repeat itself with no "
                                                   "strategy: variable ", "dense/kernel after step 1"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_exit_2_and_leaves_no_engine(folder, case):
    args, phrase = CASES[case]
    done, left = check_cli(folder, *args, "--strategies", "mirrored:2") if "--strategies" not in args \
        else check_cli(folder, *args)
    check = Check("python -m suite.check")
    check.equal(done.returncode, 2, f"exit status for {case}", done.stderr[-600:])
    lines = done.stderr.strip().splitlines()
    check.equal(len(lines), 1, f"stderr lines for {case}", done.stderr[-600:])
    check.contains(lines[0], phrase if isinstance(phrase, list) else [phrase], f"the error for {case}")
    check.equal(left, [], f"engine processes alive after {case}")
