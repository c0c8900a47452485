"""Known deviation sync-on-read-integer-sum-restore-truncates (see known_deviations.toml).

An int64 SUM sync-on-read variable (a Keras Sum metric's state) holding 3, saved without a
strategy and restored under a 2-replica MirroredStrategy, reads 2: each replica's copy gets
cast(3 / 2, int64) = 1. Run: python this_file.py
"""

import os
import tempfile

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
counter = tf.Variable(3, dtype=tf.int64, synchronization=tf.VariableSynchronization.ON_READ,
                      aggregation=tf.VariableAggregation.SUM)
path = tf.train.Checkpoint(counter=counter).save(os.path.join(tempfile.mkdtemp(), "ckpt"))
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    restored = tf.Variable(0, dtype=tf.int64, synchronization=tf.VariableSynchronization.ON_READ,
                           aggregation=tf.VariableAggregation.SUM)
tf.train.Checkpoint(counter=restored).restore(path).assert_existing_objects_matched()
print(f"saved 3, restored on 2 replicas: {restored.numpy()}")
