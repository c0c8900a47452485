"""Known deviation keras3-loss-unscaled-before-3.8 (see known_deviations.toml).

A Keras loss with the default reduction "sum_over_batch_size" called inside strategy.run under
MirroredStrategy with two replicas, one row each, and the replicas' values summed as the
custom-training guide sums per-replica losses (strategy.reduce SUM). Keras 3.8.0 divides each
replica's mean by the replica count (keras/src/losses/loss.py scale_loss_for_distribution,
keras-team/keras PR 20609), so the sum is the mean over the global batch, 2.5. Keras 3.0-3.7
return each replica's own mean unscaled: the sum is 2 x the mean, 5.0.
Run: python this_file.py (prints each replica's loss and their sum; exit 1 where the sum is not 2.5)
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
y_pred = tf.constant([[2.0], [4.0]])  # squared errors 1 and 4: the global mean 2.5


@tf.function
def step():
    def replica_fn():
        r = tf.distribute.get_replica_context().replica_id_in_sync_group
        return loss_obj(y_true[r:r + 1], y_pred[r:r + 1])
    per_replica = strategy.run(replica_fn)
    return per_replica, strategy.reduce("SUM", per_replica, axis=None)


per_replica, total = step()
values = [float(v.numpy()) for v in strategy.experimental_local_results(per_replica)]
print(f"Keras {keras.__version__}: each replica's loss {values}, their SUM {float(total)}; "
      "the guide's SUM should be the global mean 2.5")
sys.exit(0 if np.isclose(float(total), 2.5) else 1)
