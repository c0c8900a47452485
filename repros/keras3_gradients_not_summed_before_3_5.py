"""Known deviation keras3-gradients-not-summed-before-3.5 (see known_deviations.toml).

The custom-training guide's step under MirroredStrategy with two replicas: each replica computes
its gradient of a loss scaled by the global batch size (tf.nn.compute_average_loss), and
optimizer.apply_gradients sums the replicas' gradients. With plain SGD, lr 1, and a weight w
(init 0) the loss of replica r is w * g_r / 2 (global batch 2, one example per replica), so
after one step the sum is w = -(g_0 + g_1) / 2 on both replicas. Keras 3.0-3.4 did not sum them
(3.3's summing ran inside a merge_call and reduced nothing; keras-team/keras PR 19969, in 3.5.0):
each replica's copy moves by its own gradient, and the copies differ.
Run: python this_file.py (prints each replica's w; exit 1 where the copies differ or are not the sum)
"""

import sys

import keras
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    w = keras.Variable(0.0, name="w")
    opt = keras.optimizers.SGD(learning_rate=1.0)
    opt.build([w])
g = tf.constant([1.0, 3.0])  # replica r's per-example coefficient


@tf.function
def step():
    def replica_fn():
        r = tf.distribute.get_replica_context().replica_id_in_sync_group
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(tf.reshape(w * tf.gather(g, r), [1]), global_batch_size=2)
        opt.apply_gradients([(tape.gradient(loss, w), w)])
    strategy.run(replica_fn)


step()
copies = [float(c.numpy()) for c in strategy.experimental_local_results(w.value)]
print(f"Keras {keras.__version__}: w on each replica {copies}; the guide's step gives -2.0 on both (-(1 + 3) / 2)")
sys.exit(0 if np.allclose(copies, -2.0) else 1)
