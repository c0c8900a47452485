"""Known deviation keras3-sparse-second-moments-square-each-occurrence (see known_deviations.toml).

An Embedding(5, 2) table under MirroredStrategy on 2 CPU replicas, replica 0 looking up
[1, 1, 3] and replica 1 [3, 4]; loss compute_average_loss(sum of the looked-up rows, global
batch 5), so every occurrence's gradient is 0.2 and rows 1 and 3 get 0.4 in total. Adam must
put 0.4^2 = 0.16 into their second moment (the square of the gradient); Keras 3 puts the sum of
each occurrence's square, 0.08 (row 4, looked up once, agrees), and moves rows 1 and 3 by
0.0259 more. Keras 2.15 sums duplicates first. The same happens on one device whenever an index
repeats. Run: python this_file.py
"""

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
table0 = np.arange(10, dtype=np.float32).reshape(5, 2) / 8
with strategy.scope():
    layer = tf.keras.layers.Embedding(5, 2)
    layer.build((None,))
    layer.embeddings.assign(table0)
    opt = tf.keras.optimizers.Adam(0.0625, beta_1=0.875, beta_2=0.9921875, epsilon=1e-7)
    opt.build(layer.trainable_variables)
ids = [tf.constant([1, 1, 3]), tf.constant([3, 4])]
dist = strategy.experimental_distribute_values_from_function(lambda ctx: ids[ctx.replica_id_in_sync_group])


@tf.function
def step(idx):
    def fn(i):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(tf.reduce_sum(layer(i), axis=1), global_batch_size=5)
        opt.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))
    strategy.run(fn, args=(idx,))


step(dist)
g = np.zeros((5, 2))
np.add.at(g, [1, 1, 3, 3, 4], 0.2)
m, v = 0.125 * g, (1 - 0.9921875) * g * g
dense = table0 - 0.0625 * np.sqrt(1 - 0.9921875) / 0.125 * m / (np.sqrt(v) + 1e-7)
table = np.asarray(tf.convert_to_tensor(strategy.experimental_local_results(
    layer.embeddings if isinstance(layer.embeddings, tf.Variable) else layer.embeddings.value)[0]))
print("rows 1, 3, 4 column 0 after one step:", table[[1, 3, 4], 0].tolist(), "dense Adam:", dense[[1, 3, 4], 0].tolist())
