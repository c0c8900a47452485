"""Known deviation keras2-activity-regularizer-nan-on-empty-replica-before-2.14 (see known_deviations.toml).

A layer with an activity regularizer on a replica that got no rows: Keras 2.12 and 2.13 divide the
layer's activity loss by its batch with `/` (0 / 0 = NaN in model.losses, and so in the guide's
scale_regularization_loss(add_n(model.losses)) and in every variable after the step); Keras 2.14
divides with tf.math.divide_no_nan (0). Expected model.losses: replica 0 (no rows) [0.0], replica 1
(x = [[1, 1]], kernel of ones, no bias: activation [2, 2]) [0.1 * 8 / 1 = 0.8]. Run with a Keras 2
(TF <= 2.15, or TF_USE_LEGACY_KERAS=1 with tf-keras): python this_file.py
"""

import importlib.metadata
import os

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    layer = tf.keras.layers.Dense(2, use_bias=False, kernel_initializer="ones",
                                  activity_regularizer=tf.keras.regularizers.L2(0.1))
    layer.build((None, 2))
x = tf.constant([[1.0, 1.0]])


@tf.function
def step():
    def replica_fn():
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        layer(x[: tf.cast(replica, tf.int32)])  # replica 0: no rows, replica 1: one
        return tf.add_n(layer.losses)
    return strategy.run(replica_fn)


keras = "tf-keras" if os.environ.get("TF_USE_LEGACY_KERAS") == "1" else "keras"
print("TensorFlow", tf.__version__, "Keras", importlib.metadata.version(keras), "expected [0.0, 0.8]")
print("model.losses per replica:", [float(v) for v in strategy.experimental_local_results(step())])
