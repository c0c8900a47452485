"""Model.fit over a dataset that shuffles, in the orders users write it (issue 62's zoo).

Keras' "Multi-GPU distributed training with TensorFlow" guide's shape (compile in the scope, fit on a
tf.data.Dataset), with the pipelines of TensorFlow's "tf.data" guide. Each ``--case`` is right: the
global batches are made before Keras splits them over the replicas, in an order fixed by the seed.

- ``seeded_shuffle`` (default): ``.shuffle(256, seed=7).batch(GLOBAL).prefetch(AUTOTUNE)``, one epoch.
  Keras 3.5+ draws one iteration more under any strategy (known deviation
  keras3-fit-extra-draw-under-a-strategy), so a reshuffling dataset trains another order under a
  strategy than under none (issue 62, finding 1).
- ``repeat_then_shuffle``: ``.repeat().shuffle(256, seed=1)``, steps_per_epoch=4, two epochs: the
  buffer mixes epochs, batches straddle them.
- ``shuffle_then_repeat``: ``.shuffle(256, seed=1).repeat()``, the same fit.

    tf-distribute-check examples/scripts/zoo/fit_shuffles.py --strategies mirrored:2 -- --case repeat_then_shuffle
"""
import argparse

import numpy as np
import tensorflow as tf

CASES = ("seeded_shuffle", "repeat_then_shuffle", "shuffle_then_repeat")
parser = argparse.ArgumentParser()
parser.add_argument("--case", choices=CASES, default="seeded_shuffle")
case = parser.parse_args().case

rng = np.random.default_rng(3)
x = rng.normal(size=(512, 8)).astype(np.float32)
y = (x @ rng.normal(size=(8, 1))).astype(np.float32)
strategy = tf.distribute.MirroredStrategy()
GLOBAL = 32 * strategy.num_replicas_in_sync
data = tf.data.Dataset.from_tensor_slices((x, y))
if case == "seeded_shuffle":
    data = data.shuffle(256, seed=7).batch(GLOBAL).prefetch(tf.data.AUTOTUNE)
elif case == "repeat_then_shuffle":
    data = data.repeat().shuffle(256, seed=1).batch(GLOBAL)
else:
    data = data.shuffle(256, seed=1).repeat().batch(GLOBAL)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
if case == "seeded_shuffle":
    model.fit(data, epochs=1, verbose=0)
else:
    model.fit(data, steps_per_epoch=4, epochs=2, verbose=0)
