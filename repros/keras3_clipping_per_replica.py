"""Known deviation keras3-clipping-per-replica-before-the-sum (see known_deviations.toml).

One SGD step (learning rate 1) of a scalar variable w = 0 under MirroredStrategy on 2 CPU
replicas, the optimizer built with clipnorm=1. Replica 0's gradient is 3 and replica 1's is
-1: their sum, the gradient one device computes on the global batch, is 2, which clipnorm
makes 1, so w should become -1. Keras 3 (>= 3.5) clips each replica's gradient first (3 -> 1,
-1 -> -1) and sums the clipped ones (0): w stays 0. Keras 2.15 gives -1. Run: python this_file.py
"""

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    w = tf.Variable(0.0)
    opt = tf.keras.optimizers.SGD(learning_rate=1.0, clipnorm=1.0)
    opt.build([w])


@tf.function
def step():
    def fn():
        rid = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)
        grad = 3.0 - 4.0 * rid  # replica 0: 3, replica 1: -1
        opt.apply_gradients([(grad, w)])
    strategy.run(fn)


step()
print("keras", tf.keras.__version__ if hasattr(tf.keras, "__version__") else "2.x",
      "w after one step:", [float(c) for c in strategy.experimental_local_results(w)],
      "(one device on the global batch: -1.0)")
