"""Known deviation keras3-ps-optimizer-iterations-race (see known_deviations.toml).

Under ParameterServerStrategy with two workers, 200 steps scheduled at once through a
ClusterCoordinator all apply their gradient (the weights move 200 steps, a tf.Variable counter
reads 200) but a Keras 3 optimizer's ``iterations`` usually reads less: Keras 3 increments it
with ``assign(iterations + 1)``, a read then a write, so two workers' increments race.
Keras 2 (TF <= 2.15) reads 200. Run: python this_file.py (it starts its own worker and ps
server processes on loopback and stops them at the end).
"""

import json
import os
import socket
import subprocess
import sys
import time

if sys.argv[1:2] == ["serve"]:  # a worker or ps task: serve until killed
    import tensorflow as tf

    cluster, job, index = json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=index, protocol="grpc").join()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


cluster = {"chief": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}" for _ in range(2)],
           "ps": [f"127.0.0.1:{free_port()}"]}
servers = [subprocess.Popen([sys.executable, __file__, "serve", json.dumps(cluster), job, str(i)])
           for job in ("worker", "ps") for i in range(len(cluster[job]))]
try:
    import tensorflow as tf

    time.sleep(5)
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}})
    strategy = tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        w = tf.Variable([0.0, 0.0])
        count = tf.Variable(0, dtype=tf.int64)
        opt = tf.keras.optimizers.SGD(learning_rate=0.25)
        opt.build([w])

    @tf.function
    def step():
        def replica_fn():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w * tf.constant([1.0, 1.0]))
            opt.apply_gradients([(tape.gradient(loss, w), w)])
            count.assign_add(1)
        strategy.run(replica_fn)

    for _ in range(200):
        coordinator.schedule(step)
    coordinator.join()
    print(f"weights moved {-w.numpy()[0] / 0.25:g} steps, counter {count.numpy()}, "
          f"optimizer.iterations {opt.iterations.numpy()} (should be 200)", flush=True)
finally:
    for server in servers:
        server.kill()
    os._exit(0)  # the coordinator keeps gRPC threads alive
