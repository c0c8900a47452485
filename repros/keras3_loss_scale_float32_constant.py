"""Known deviation keras3-loss-replica-scale-rounded-to-float32 (see known_deviations.toml).

Keras 3's scale_loss_for_distribution computes ``value * ops.cast(1.0 / num_replicas,
value.dtype)``; ops.cast of a Python float goes through a float32 constant, so for float64
losses under 3 replicas the factor is 0.3333333432674408, not 1/3. Run: python this_file.py
"""

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
loss = tf.keras.losses.MeanSquaredError(dtype="float64")
y_true = tf.zeros([1, 1], tf.float64)
y_pred = tf.ones([1, 1], tf.float64)
per_replica = strategy.run(tf.function(lambda: loss(y_true, y_pred)))
got = strategy.experimental_local_results(per_replica)[0].numpy()
print(f"got {got!r}, expected {1 / 3!r} (mean 1.0 / 3 replicas), relative error {(got - 1 / 3) * 3:.3g}")
