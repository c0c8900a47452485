"""Known deviation keras3-fit-multi-worker-per-replica (see known_deviations.toml).

Model.fit under MultiWorkerMirroredStrategy, two workers of one replica each on loopback, as
TensorFlow's multi_worker_with_keras tutorial trains: Keras 3's fit raises at its first step
ValueError "Attempt to convert a value (PerReplica:{...}) with an unsupported type (<class
'tensorflow.python.distribute.values.PerReplica'>) to a Tensor" (keras-team/keras#20585,
tensorflow/tensorflow#72388). The same script with tf-keras (TF_USE_LEGACY_KERAS=1) trains.
Run: python this_file.py (it starts its two workers on loopback; each prints what fit did).
"""

import json
import os
import re
import socket
import subprocess
import sys
from importlib.metadata import version

if sys.argv[1:2] == ["worker"]:
    cluster, index = json.loads(sys.argv[2]), int(sys.argv[3])
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
    import numpy as np
    import tensorflow as tf

    keras = tf.keras  # Keras 3 on TF 2.16+, tf-keras where TF_USE_LEGACY_KERAS=1, Keras 2 before 2.16
    legacy = os.environ.get("TF_USE_LEGACY_KERAS") == "1" and tf.__version__ >= "2.16"
    named = f"{'tf-keras' if legacy else 'Keras'} {version('tf-keras' if legacy else 'keras')}"
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x = np.arange(32 * 4, dtype=np.float32).reshape(32, 4) / 100.0
    y = x.sum(axis=1, keepdims=True)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
    try:
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=1, steps_per_epoch=2, verbose=0)
        print(f"worker {index}: ok, fit trains ({named})", flush=True)
    except Exception as exc:  # noqa: BLE001
        said = " ".join(str(exc).split())
        said = re.sub(r"\(PerReplica:\{.*?\}\)", "(PerReplica:{...})", said)
        print(f"worker {index}: deviation ({named}): {type(exc).__name__}: {said[:200]}", flush=True)
    os._exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


cluster = {"worker": [f"127.0.0.1:{free_port()}" for _ in range(2)]}
workers = [subprocess.Popen([sys.executable, __file__, "worker", json.dumps(cluster), str(i)]) for i in range(2)]
try:
    for worker in workers:
        worker.wait(timeout=180)
finally:
    for worker in workers:
        worker.kill()
