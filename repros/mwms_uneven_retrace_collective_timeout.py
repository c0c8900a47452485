"""Known deviation mwms-uneven-retrace-collective-timeout-2.13 (see known_deviations.toml).

MultiWorkerMirroredStrategy, two workers of one replica each, a dataset of 3 rows batched by 2
(experimental_distribute_dataset): step 2 gives worker 0 one row and worker 1 none, so worker 1's
tf.function retraces for the empty batch and worker 0's does not. TensorFlow assigns a collective's
instance key at call time (cross_device_utils.CollectiveReplicaLauncher._next_instance_key:
"different workers may retrace the function at different times"), so workers that trace
differently must still agree. TF 2.12.1 and 2.14+ train both steps (sizes [1, 1] and [1, 0]). TF
2.13.1 keeps call-time captures among a function's by-ref captures (FuncGraph.capture_call_time_value:
2.12 kept them apart, in _deferred_captures), and its TracingCompiler._maybe_define_function calls
every by-ref capture for the cache lookup (get_by_ref_snapshot) and again after a new trace: each
call draws an extra instance key, a call that retraces one more, so the workers' instance keys part
and step 2's all-reduce waits until its timeout: DeadlineExceededError "Collective has timed out".
The second part shows the count directly: a call-time capture read on three calls, the third
a retrace, gives 1, 2, 3 on 2.12.1 / 2.14.1 and 2, 4, 7 on 2.13.1.
Run: python this_file.py (it starts its two workers on loopback; 20 s collective timeout).
"""

import json
import os
import socket
import subprocess
import sys

if sys.argv[1:2] == ["worker"]:
    cluster, index = json.loads(sys.argv[2]), int(sys.argv[3])
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(timeout_seconds=20))
    with strategy.scope():
        w = tf.Variable(tf.ones([2, 1], tf.float64))
    traces = []

    @tf.function
    def step(batch):
        traces.append(1)

        def replica(xs, ys):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(tf.reduce_sum((xs @ w - ys) ** 2, axis=1), global_batch_size=2)
            w.assign_sub(0.1 * tf.distribute.get_replica_context().all_reduce("sum", tape.gradient(loss, w)))
            return tf.shape(xs)[0]
        return strategy.run(replica, args=batch)

    x, y = np.full((3, 2), 0.0625), np.zeros((3, 1))
    dist = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(2))
    try:
        sizes = [int(step(batch)) for batch in dist]
        print(f"worker {index}: trained, batch sizes {sizes}, {len(traces)} trace(s)", flush=True)
    except tf.errors.DeadlineExceededError as exc:
        timed_out = "Collective has timed out" in exc.message
        print(f"worker {index}: DeadlineExceededError{': Collective has timed out' * timed_out}, "
              f"{len(traces)} trace(s)", flush=True)
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

import tensorflow as tf  # noqa: E402  (after the workers: this process is not one of them)
from tensorflow.python.framework import ops  # noqa: E402

reads = [0]


def read():
    reads[0] += 1
    return reads[0]


@tf.function(reduce_retracing=True)
def f(x):
    return ops.get_default_graph().capture_call_time_value(read, tf.TensorSpec([], tf.int32))


values = [int(f(tf.zeros([1]))), int(f(tf.zeros([1]))), int(f(tf.zeros([0])))]
print("TensorFlow", tf.__version__, "expected: both workers trained; call-time capture read once per call [1, 2, 3];",
      f"got {values}")
