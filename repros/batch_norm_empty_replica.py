"""Known deviations keras3-unsynchronized-bn-empty-replica-nan and
keras2-synchronized-bn-empty-replica-skips-update (see known_deviations.toml).

A BatchNormalization layer under MirroredStrategy on 2 replicas, one step in training mode on
x = [[1, 10], [3, 14], [5, 11], [9, 30]] split [0, 4] (replica 0 gets no rows), momentum 0.5.
One device on the global batch gives moving_mean [2.25, 8.125]. Keras 3, unsynchronized:
replica 0's copy becomes NaN (the moments of no rows), and the value a checkpoint saves is
replica 0's copy. Keras 2.15, synchronized: replica 0 skips the update (its copy stays [0, 0])
and the cross-replica (MEAN) value is [1.125, 4.0625]. Run: python this_file.py
"""

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
x = np.array([[1, 10], [3, 14], [5, 11], [9, 30]], np.float64)
parts = [x[:0], x[0:]]
for synchronized in (False, True):
    with strategy.scope():
        layer = tf.keras.layers.BatchNormalization(momentum=0.5, synchronized=synchronized, dtype="float64")
        layer.build((None, 2))
    xs = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(parts[ctx.replica_id_in_sync_group]))
    tf.function(lambda xs: strategy.run(lambda v: layer(v, training=True), args=(xs,)))(xs)
    var = layer.moving_mean if isinstance(layer.moving_mean, tf.Variable) else layer.moving_mean.value
    print(f"synchronized={synchronized}: moving_mean copies",
          [np.asarray(tf.convert_to_tensor(c)).tolist() for c in strategy.experimental_local_results(var)],
          "read:", np.asarray(tf.convert_to_tensor(var)).tolist(), "(one device: [2.25, 8.125])")
