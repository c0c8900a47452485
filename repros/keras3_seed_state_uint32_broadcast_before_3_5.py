"""Known deviation keras3-seed-state-uint32-not-broadcast-before-3.5 (see known_deviations.toml).

A Keras Dropout layer built under MultiWorkerMirroredStrategy with two workers, then called in
training mode inside strategy.run, as a model with Dropout in the custom-training guide's step
is. MultiWorkerMirroredStrategy broadcasts every variable's initial value from worker 0
(collective_all_reduce_strategy._create_variable: CollectiveBcastSend/Recv), and those ops take
bool, float, half, double, int32 and int64 only. Keras 3.0-3.4's SeedGenerator (every Dropout
has one) keeps its state in a uint32 variable: creating it fails with InvalidArgumentError
"Value for attr 'T' of uint32 is not in the list of allowed values ... CollectiveBcastSend".
Keras 3.5.0 keeps the TensorFlow backend's seed state in int64 (backend.random_seed_dtype,
keras-team/keras PR 19928). One worker (MirroredStrategy) broadcasts nothing and is not affected.
Run: python this_file.py (it starts its two workers on loopback; prints what each saw; exit 1
where a worker raised)
"""

import importlib.metadata
import json
import os
import socket
import subprocess
import sys

if sys.argv[1:2] == ["worker"]:
    cluster, index = json.loads(sys.argv[2]), int(sys.argv[3])
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(timeout_seconds=60))
    try:
        with strategy.scope():
            layer = keras.layers.Dropout(0.5, seed=1)
        mask = tf.function(lambda: strategy.run(lambda: layer(tf.ones([4, 8]), training=True)))()
        kept = [int(tf.math.count_nonzero(m)) for m in strategy.experimental_local_results(mask)]
        print(f"worker {index}: dropout ran, {kept} of 32 units kept", flush=True)
        os._exit(0)
    except Exception as exc:  # noqa: BLE001  (what a user would see)
        print(f"worker {index}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}", flush=True)
        os._exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


cluster = {"worker": [f"127.0.0.1:{free_port()}" for _ in range(2)]}
workers = [subprocess.Popen([sys.executable, __file__, "worker", json.dumps(cluster), str(i)]) for i in range(2)]
try:
    codes = [worker.wait(timeout=180) for worker in workers]
finally:
    for worker in workers:
        worker.kill()
print(f"Keras {importlib.metadata.version('keras')}: expected both workers to run the dropout; exit codes {codes}")
sys.exit(0 if codes == [0, 0] else 1)
