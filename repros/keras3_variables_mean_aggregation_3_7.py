"""Known deviation keras3-variables-mean-aggregation-3.7 (see known_deviations.toml).

An unsynchronized BatchNormalization layer under MirroredStrategy (two logical CPUs), called in
training mode inside strategy.run on a different batch per replica: each replica normalizes with
its own batch's moments and updates its copy of the moving mean with them, as on Keras 2.15 and
every Keras 3 but 3.7. Keras 3.7.0 gives model variables aggregation "mean"
(keras-team/keras#20695), so the replica-context assign averages the replicas' updates: both
copies hold the same mean value.
Run: python this_file.py (exit 1 where the copies are averaged)
"""

import importlib.metadata
import sys

import numpy as np
import tensorflow as tf

tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
import keras  # noqa: E402

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    layer = keras.layers.BatchNormalization(momentum=0.5)
    layer.build((None, 2))
batches = [np.array([[0.0, 0.0], [2.0, 2.0]], np.float32), np.array([[10.0, 10.0], [14.0, 14.0]], np.float32)]


def replica():
    index = tf.distribute.get_replica_context().replica_id_in_sync_group
    layer(tf.gather(tf.constant(np.stack(batches)), index), training=True)


tf.function(lambda: strategy.run(replica))()
variable = layer.moving_mean.value  # the tf.Variable behind the keras.Variable: a MirroredVariable
copies = [np.asarray(c) for c in strategy.experimental_local_results(variable)]
own = [0.5 * 0.0 + 0.5 * b.mean(axis=0) for b in batches]  # momentum 0.5, each replica's own batch mean
averaged = not np.allclose(copies[0], own[0]) and np.allclose(copies[0], copies[1])
print(f"Keras {importlib.metadata.version('keras')}: moving_mean copies {[c.tolist() for c in copies]}, each "
      f"replica's own update {[o.tolist() for o in own]}" + (": averaged over the replicas" if averaged else ""))
sys.exit(1 if averaged else 0)
