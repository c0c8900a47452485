"""Known deviation keras3-loss-nan-on-empty-replica-before-3.7 (see known_deviations.toml).

A Keras loss with the default reduction "sum_over_batch_size" called inside strategy.run under
MirroredStrategy with two replicas, on a global batch of 2 rows split [2, 0] (a short last batch
leaves a replica none). The batch dimension is unknown while tracing, as in a loop over a
dataset. Keras 3.0-3.6 (keras/src/losses/loss.py reduce_values) divide the sum of the losses by
their count with `/`: the replica with no rows returns 0 / 0 = NaN, and so does the SUM over
replicas. Keras 3.7.0 divides with ops.divide_no_nan (keras-team/keras PR 20410): it returns 0.
Run: python this_file.py (prints each replica's loss; exit 1 where the empty replica's is not 0)
"""

import sys

import keras
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
loss_obj = keras.losses.MeanSquaredError()  # reduction="sum_over_batch_size"
y_true = tf.constant([[1.0], [2.0]])
y_pred = tf.constant([[2.0], [4.0]])  # squared errors 1 and 4


@tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])
def step(sizes):
    def replica_fn():
        r = tf.distribute.get_replica_context().replica_id_in_sync_group
        start = tf.reduce_sum(sizes[:r])
        mine = tf.range(start, start + sizes[r])  # this replica's rows: [0, 1] and []
        return loss_obj(tf.gather(y_true, mine), tf.gather(y_pred, mine))
    return strategy.run(replica_fn)


per_replica = [float(v.numpy()) for v in strategy.experimental_local_results(step(tf.constant([2, 0])))]
print(f"Keras {keras.__version__}: each replica's loss {per_replica}; the replica with no rows should give 0.0")
sys.exit(0 if per_replica[1] == 0.0 and not np.isnan(per_replica).any() else 1)
