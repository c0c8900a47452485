"""A fit under MirroredStrategy followed by what scripts do next, each of which must never run in the check
(issue 63): the check compares the first steps of the fit, and the run ends at the last one compared.

TensorFlow's Keras tutorial (``distribute/keras``) fits with a ModelCheckpoint and then restores the latest
checkpoint with ``model.load_weights``; scripts on TensorFlow's issue tracker go on to a second training, to
a large allocation, or to work that takes long. ``--case``:

- ``load_weights``: the tutorial's next cell, ``model.load_weights(tf.train.latest_checkpoint(...))``;
- ``raises``: code that raises;
- ``allocates``: 40 GB of ones;
- ``hangs``: a wait of an hour;
- ``second_fit``: a second training, of another model;
- ``epoch_end``: a callback of the script's own whose ``on_epoch_end`` raises (fit's epoch is longer than the
  steps compared);
- ``sequence``: the inputs a ``keras.utils.Sequence``, then code that raises.

Every case is right as far as the compared steps go (the batches split evenly): PASS, or DEVIATION where a
known deviation says so; never ERROR or "not checked".
"""
import argparse
import os
import tempfile
import time

import numpy as np
import tensorflow as tf

CASES = ("load_weights", "raises", "allocates", "hangs", "second_fit", "epoch_end", "sequence")
parser = argparse.ArgumentParser()
parser.add_argument("--case", choices=CASES, default="load_weights")
case = parser.parse_args().case

rng = np.random.default_rng(3)
x = rng.normal(size=(64, 6)).astype(np.float32)
y = (x @ rng.normal(size=(6, 1))).astype(np.float32)
strategy = tf.distribute.MirroredStrategy()
GLOBAL_BATCH = 8 * strategy.num_replicas_in_sync


class RaisesAtEpochEnd(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        raise RuntimeError("on_epoch_end ran after the steps the check compares")


class Rows(tf.keras.utils.Sequence):
    def __len__(self):
        return len(x) // GLOBAL_BATCH

    def __getitem__(self, i):
        return x[i * GLOBAL_BATCH:(i + 1) * GLOBAL_BATCH], y[i * GLOBAL_BATCH:(i + 1) * GLOBAL_BATCH]


with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(4, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")

checkpoints = tempfile.mkdtemp()
KERAS3 = getattr(tf.keras, "__version__", "2").startswith("3")  # Keras 3 saves weights as .weights.h5 only
callbacks = []
if case == "load_weights":
    name = "ckpt_{epoch}.weights.h5" if KERAS3 else "ckpt_{epoch}"
    callbacks = [tf.keras.callbacks.ModelCheckpoint(os.path.join(checkpoints, name), save_weights_only=True)]
elif case == "epoch_end":
    callbacks = [RaisesAtEpochEnd()]
data = Rows() if case == "sequence" else tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
model.fit(data, epochs=2, callbacks=callbacks, verbose=0)

if case == "load_weights":
    model.load_weights(os.path.join(checkpoints, "ckpt_2.weights.h5") if KERAS3
                       else tf.train.latest_checkpoint(checkpoints))
elif case in ("raises", "sequence"):
    raise RuntimeError("the script's code after fit ran")
elif case == "allocates":
    ones = np.ones((5, 1024 ** 3), np.float64)
elif case == "hangs":
    time.sleep(3600)
elif case == "second_fit":
    with strategy.scope():
        other = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(1)])
        other.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="mae")
    other.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, verbose=0)
    raise RuntimeError("a second training ran")
