"""The plain-TensorFlow snippets attached to failures run (in a separate interpreter: the
pytest process never imports TensorFlow) and compute what the property compares."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from reference import distribute as ref
from suite.common.catalog import OPTIMIZERS
from suite.common.specs import parse_spec
from suite.harness.judging import repro
from suite.harness.judging.judgment import Check


def _run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})
    Check("repro snippet").equal(proc.returncode, 0, "the snippet's exit code", proc.stderr[-3000:])
    return proc.stdout


@pytest.mark.parametrize("spec_text", ["mirrored:2", "central_storage:2"])
def test_compute_average_loss_snippet_prints_the_reference_values(spec_text):
    losses, sizes = np.array([2.0, 3.0, 4.0, 5.0]), [3, 1]
    # weights None: the snippet of a case drawn without sample_weight (the properties hand it so)
    code = repro.replica_run(parse_spec(spec_text), {"losses": losses, "sizes": sizes, "weights": None},
                             "return tf.nn.compute_average_loss(my_slice(losses)[0], sample_weight=weights, "
                             "global_batch_size=4)")
    out = _run(code)
    expected = [ref.compute_average_loss(part, global_batch_size=4) for part in ref.split(losses, sizes)]
    Check(spec_text).contains(out, [f"{e}" for e in expected], "what the snippet printed")


def test_training_snippet_runs():
    arch = {"input_dim": 2, "hidden": [3], "outputs": 1, "head": "linear", "l2": 0.125}
    rng = np.random.default_rng(0)
    params = [rng.uniform(-1, 1, s) for s in [(2, 3), (3,), (3, 1), (1,)]]
    steps = [(rng.uniform(-1, 1, (3, 2)), rng.uniform(-1, 1, (3, 1)), [2, 1])]
    out = _run(repro.training(parse_spec("mirrored:2"), arch, OPTIMIZERS["sgd"], "float64", params, steps))
    Check("mirrored:2").equal(out.count("[array("), 4, "variables the snippet printed", out)
