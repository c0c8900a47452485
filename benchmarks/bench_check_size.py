"""The check's cost by model size: the check of a training script on ``mirrored:2`` (its reference on one
device, run twice, and the spec's run, 3 steps each), timed once per size, from a new pool.

The sizes (``SIZES``; ``--bench-sizes`` picks them): a custom loop over an MLP of about 1e4, 1e6, 1e7 and
1e8 parameters (examples/scripts/size/mlp_ladder.py), a 12-layer transformer encoder of BERT-base's shape
(about 110M parameters, examples/scripts/size/transformer.py) and TensorFlow's custom-training tutorial with
ResNet50V2 as its model (23.6M parameters, 32x32 inputs, examples/scripts/tutorial.py --model resnet50v2); every one
builds its Adam in the scope (``--build-optimizer`` for the tutorial), so on Keras 3 each trains under
mirrored:2 and the check compares every step. Data are generated.

``extra_info`` holds what the check cost a user: its wall time, each engine's peak resident memory and its
memory once started (TensorFlow's own: ``engine.ping`` is its first call), the model's float32 bytes, and
the bytes each engine's pipes carried (requests sent, replies read) and that the check mapped from the
engines' snapshot files (suite/common/snapshots.py), with the bytes read off the pipes per step. The check
must give each size's verdict (``SIZES``): a fast wrong verdict is no result.
"""

from __future__ import annotations

import time
from pathlib import Path

from suite.common.specs import parse_spec
from suite.harness.judging.judgment import Check
from suite.harness.loopcheck import scriptcheck
from suite.harness.pool.pool import EnginePool

SCRIPTS = Path(__file__).resolve().parent.parent / "examples" / "scripts"
SPEC = "mirrored:2"
STEPS = 3
# name -> (script, its arguments, its parameters as Keras 3.15 counts them (count_params), the verdict the check
# must give and the cause it must name). ResNet50V2's BatchNormalization layers are not synchronized: Keras
# documents that in training each normalizes with the statistics of the batch it is given, so under
# mirrored:2 each replica's half of the global batch, where one device uses the whole (the check's evidence
# agrees: after step 1 the two replicas' moving means differ, each about 0.3% from one device's, and meet it
# on average); its FAIL, naming that cause, is the right verdict
SIZES = {
    "mlp-1e4": ("size/mlp_ladder.py", ["--params", "1e4"], 10_000, "PASS", None),
    "mlp-1e6": ("size/mlp_ladder.py", ["--params", "1e6"], 999_674, "PASS", None),
    "mlp-1e7": ("size/mlp_ladder.py", ["--params", "1e7"], 9_991_954, "PASS", None),
    "mlp-1e8": ("size/mlp_ladder.py", ["--params", "1e8"], 99_976_139, "PASS", None),
    "resnet50v2": ("tutorial.py", ["--build-optimizer", "--model", "resnet50v2"], 23_585_290, "FAIL",
                   "per_replica_batch_norm"),
    "transformer-110m": ("size/transformer.py", [], 108_498_436, "PASS", None),
}
DEFAULT_SIZES = ("mlp-1e4", "mlp-1e6", "mlp-1e7")  # the default selection (about a minute on 2 cores)
SMOKE_SIZES = ("mlp-1e4",)  # smoke mode (--benchmark-disable, CI): that it runs


def test_check_size(benchmark, size):
    script, args, params, verdict, cause = SIZES[size]
    pool = EnginePool(call_timeout=1800.0)
    spec, reference = parse_spec(SPEC), parse_spec("one_device")
    try:
        pool.call(spec, "engine.ping")  # started: TensorFlow's own memory, before the check
        pool.call(reference, "engine.ping")
        started = {s.text: pool.usage[s.text]["peak_rss"] for s in (spec, reference)}
        began = time.monotonic()
        report = benchmark.pedantic(lambda: scriptcheck.run(str(SCRIPTS / script), [spec], pool, args=args,
                                                             steps=STEPS), rounds=1, iterations=1)
        wall = time.monotonic() - began
        usage = {k: dict(v) for k, v in pool.usage.items()}
    finally:
        pool.close()
    got = [(v.status, [d.cause for d in v.diagnoses]) for v in report.verdicts]
    Check(SPEC, case={"size": size}).equal(got, [(verdict, [cause] if cause else [])], "the check's verdict and causes",
                                          report.summary())
    runs = {SPEC: STEPS, "one_device": 2 * STEPS}  # the reference runs twice (it must repeat itself)
    benchmark.extra_info.update(
        kind="check_size", size=size, script=script, args=args, spec=SPEC, steps=STEPS, params=params,
        model_float32_bytes=4 * params, check_s=round(wall, 2),
        engines={k: {**v, "started_rss": started.get(k), "received_per_step": v["received"] // runs.get(k, STEPS),
                     "mapped_per_step": v["mapped"] // runs.get(k, STEPS)} for k, v in usage.items()})
