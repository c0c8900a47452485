"""A fit with no strategy beside the distributed one, as scripts on TensorFlow's issue tracker compare them.

The script fits a model made outside every strategy's scope first (a baseline on one device), then the
same model made and compiled in ``strategy.scope()``. Looks wrong to a checker: its first model and
optimizer are created outside the strategy's scope, and the first steps it trains are theirs. It is
right: the baseline never runs under the strategy; the distributed fit is the training to compare
(issue 62, finding 3: the check compared the baseline's steps and blamed its model).
"""
import numpy as np
import tensorflow as tf

rng = np.random.default_rng(8)
x = rng.normal(size=(256, 8)).astype(np.float32)
y = (x @ rng.normal(size=(8, 1))).astype(np.float32)
plain = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
plain.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
plain.fit(x, y, batch_size=8, epochs=1, verbose=0)
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
model.fit(x, y, batch_size=32 * strategy.num_replicas_in_sync, epochs=1, verbose=0)
