"""Known deviation keras3-central-storage-updates-raise-before-3.7 (see known_deviations.toml).

Under CentralStorageStrategy, an optimizer's apply_gradients and a metric's update_state inside
strategy.run, as the custom-training guide's step does. Keras 3.0-3.6's TensorFlow backend made
every Keras variable a tf.Variable with no aggregation (keras-team/keras PR 20541 passed it in
3.7.0); CentralStorageStrategy makes it an AggregatingVariable, which refuses an assignment in
replica context without an aggregation: ValueError "You must specify an aggregation method to
update a AggregatingVariable in Replica Context". Keras 3.7.0 and later train here.
Run: python this_file.py (prints what each update did; exit 1 where one raised)
"""

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras  # noqa: E402  (after the virtual devices are made)

strategy = tf.distribute.experimental.CentralStorageStrategy(["/cpu:0", "/cpu:1"], parameter_device="/cpu:0")
with strategy.scope():
    weight = keras.Variable(np.ones(2, "float32"))
    optimizer = keras.optimizers.SGD(0.1)
    mean = keras.metrics.Mean()


def apply():
    optimizer.apply_gradients([(tf.ones(2), weight)])


def update():
    mean.update_state(tf.ones(2))


status = 0
for name, fn in (("SGD.apply_gradients", apply), ("Mean.update_state", update)):
    try:
        tf.function(lambda fn=fn: strategy.run(fn))()
        print(f"Keras {keras.__version__} {name}: ran")
    except ValueError as exc:
        status = 1
        print(f"Keras {keras.__version__} {name}: ValueError: {str(exc).strip().splitlines()[-1][:120]}")
raise SystemExit(status)
