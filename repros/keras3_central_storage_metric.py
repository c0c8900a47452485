"""Known deviation keras3-central-storage-metric-accumulation (see known_deviations.toml).

Under CentralStorageStrategy a metric's state variables are AggregatingVariables with SUM
aggregation. Keras 3 implements Variable.assign_add as ``assign(self + value)``
(keras/src/backend/common/variables.py), so in replica context every replica assigns
``old + its increment`` and the strategy sums those: new = replicas * old + sum(increments).
A Mean over two batches [0, 0] then [1, 1] on 2 replicas should be 0.5. Run: python this_file.py
"""

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.experimental.CentralStorageStrategy(["/cpu:0", "/cpu:1"], parameter_device="/cpu:0")
with strategy.scope():
    mean = tf.keras.metrics.Mean()


@tf.function
def update(value):
    strategy.run(lambda: mean.update_state([value]))


update(tf.constant(0.0))
update(tf.constant(1.0))
print(f"Mean after [0, 0] and [1, 1]: {mean.result().numpy()} (expected 0.5); "
      f"total={mean.total.numpy()}, count={mean.count.numpy()} (expected 2.0, 4.0)")
