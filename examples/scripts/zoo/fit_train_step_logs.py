"""Model.fit with a train_step of the script's own, and what it returns for fit's logs (issue 62's zoo).

- ``keras_io_guide`` (default): keras.io's "Customizing what happens in fit() with TensorFlow", its
  first example as written: ``loss = self.compute_loss(y=y, y_pred=y_pred)``, the loss tracker
  updated with that loss, ``{m.name: m.result() for m in self.metrics}`` returned. It trains as one
  device, but under a strategy Keras' compute_loss returns the replica's share of the loss (scaled by
  1/replicas for the sum of gradients), and the tracker averages the shares: the logged loss is
  1/replicas of one device's. Keras' own train_step unscales it first.
- ``scaled_loss``: returns ``{"mse": tf.nn.compute_average_loss(per_example)}``, the replica's share,
  which Keras 3's fit averages over the replicas (1/replicas of one device's; Keras 2 sums it: whole).
  Trains as one device (issue 62, finding 4).
- ``mean_result``: the fix: a keras.metrics.Mean of its own updated with the per-example losses, its
  ``result()`` returned.

    tf-distribute-check examples/scripts/zoo/fit_train_step_logs.py --strategies mirrored:2 -- --case scaled_loss
"""
import argparse

import numpy as np
import tensorflow as tf
from tensorflow import keras

CASES = ("keras_io_guide", "scaled_loss", "mean_result")
parser = argparse.ArgumentParser()
parser.add_argument("--case", choices=CASES, default="keras_io_guide")
case = parser.parse_args().case


class GuideModel(keras.Model):
    """keras.io's CustomModel, as written."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        self.optimizer.apply(gradients, trainable_vars)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


class OwnLogModel(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)
        # a metric of its own only where it is one: fit logs a metric's result() in place of a value returned
        # under its name (Keras 3's _get_metrics_result_or_logs)
        self.tracker = keras.metrics.Mean(name="mse") if case == "mean_result" else None

    @property
    def metrics(self):
        return [self.tracker] if self.tracker is not None else []

    def call(self, inputs):
        return self.dense(inputs)

    def train_step(self, data):
        features, labels = data
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(labels - self(features, training=True)), axis=-1)
            loss = tf.nn.compute_average_loss(per_example)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        if case == "scaled_loss":
            return {"mse": loss}
        self.tracker.update_state(per_example)
        return {"mse": self.tracker.result()}


strategy = tf.distribute.MirroredStrategy()
GLOBAL = 16 * strategy.num_replicas_in_sync
rng = np.random.default_rng(4)
x = rng.normal(size=(128, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")

with strategy.scope():
    if case == "keras_io_guide":
        inputs = keras.Input(shape=(8,))
        model = GuideModel(inputs, keras.layers.Dense(1)(inputs))
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    else:
        model = OwnLogModel()
        model.build((None, 8))
        model.compile(optimizer=keras.optimizers.SGD(0.05))
model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL), epochs=1, verbose=0)
