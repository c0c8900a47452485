"""Known deviation keras2-synchronized-bn-float64-type-error (see known_deviations.toml).

Keras 2.12 BatchNormalization(synchronized=True) on float64 inputs inside strategy.run: the
synchronized moments divide the float64 sums by the batch count cast to float32, and the call
raises TypeError "`x` and `y` must have the same dtype, got tf.float64 != tf.float32". Keras 2.13
counts in the input's dtype. Expected: the normalised rows [[-1, -1], [1, 1]] (global batch
[[0, 0], [2, 2]] on two replicas, epsilon 0). Run with a Keras 2: python this_file.py
"""

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    layer = tf.keras.layers.BatchNormalization(synchronized=True, epsilon=0.0, dtype="float64")
    layer.build((None, 2))
x = tf.constant([[0.0, 0.0], [2.0, 2.0]], tf.float64)


@tf.function
def step():
    def replica_fn():
        replica = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int32)
        return layer(x[replica:replica + 1], training=True)
    return strategy.run(replica_fn)


print("TensorFlow", tf.__version__, "expected [[-1, -1]] and [[1, 1]]")
try:
    print([v.numpy().tolist() for v in strategy.experimental_local_results(step())])
except TypeError as exc:
    print("TypeError:", next((ln.strip() for ln in str(exc).splitlines() if "same dtype" in ln), str(exc)[-160:]))
