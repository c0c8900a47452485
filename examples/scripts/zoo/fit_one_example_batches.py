"""A plain Model.fit whose every global batch is one example (``batch_size=1``), as a script from TensorFlow's
issue tracker fits it under MirroredStrategy.

Under 2 replicas each global batch splits 1 and 0 examples. The script writes no train step: what
differs from one device is Keras' own step, which scales each replica's mean loss by 1/replicas
(Keras 2 and tf-keras: half of one device's update; Keras 3.5+ raises on the uneven batch instead,
known deviation keras3-fit-uneven-replica-batches-raise). ``--case own_layer`` puts a layer of the
script's own in the model: then code of the script's runs in the step (issue 62, finding 6); right too,
DEVIATION where Keras trains (known deviation fit-loss-mean-per-replica-on-uneven-split). ``--case
batch_centering`` is a mistake no catalogued cause describes: global batches of 3 rows (split 2 and 1) through a
layer of the script's own that subtracts the mean over the batch it sees, which a replica sees only part of.
"""
import argparse

import numpy as np
import tensorflow as tf

CASES = ("keras_layers", "own_layer", "batch_centering")
parser = argparse.ArgumentParser()
parser.add_argument("--case", choices=CASES, default="keras_layers")
case = parser.parse_args().case


class Scale(tf.keras.layers.Layer):
    def call(self, inputs):
        return 0.5 * inputs


class Centre(tf.keras.layers.Layer):
    def call(self, inputs):
        return inputs - tf.reduce_mean(inputs, axis=0, keepdims=True)


rng = np.random.default_rng(7)
x = rng.normal(size=(9, 4)).astype(np.float32)
y = (x @ rng.normal(size=(4, 1))).astype(np.float32)
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    layers = {"own_layer": [Scale()], "batch_centering": [Centre()]}.get(case, [])
    model = tf.keras.Sequential([tf.keras.Input((4,)), *layers, tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
model.fit(x, y, batch_size=3 if case == "batch_centering" else 1, epochs=1, verbose=0)
