"""The custom-training guide's loop, done right: the guide's CNN on Fashion-MNIST-shaped data
(a deterministic stand-in: nothing is downloaded), Adam, a per-example
SparseCategoricalCrossentropy scaled by ``tf.nn.compute_average_loss`` with the global batch
size, a training-accuracy metric, the loss SUM-reduced for reporting.

    python -m suite.check examples.guide:workload
"""

import numpy as np
import tensorflow as tf

from suite.engine.workload import Workload
from suite.engine.workloads import fashion

keras = tf.keras


def fashion_like(n: int = 256):
    """The suite's deterministic Fashion-MNIST stand-in (suite/engine/workloads/fashion.py), scaled
    to [0, 1] as the guide scales the real images."""
    (images, labels), _ = fashion.load_data(n, 1)
    return (images[..., None] / np.float32(255)).astype(np.float32), labels.astype(np.int64)


def create_model():
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])


def workload(ctx):
    model = create_model()
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)  # its slots made here, in the scope, not in the first step
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    accuracy = keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
    images, labels = fashion_like()

    def dataset(global_batch_size, input_context):
        return tf.data.Dataset.from_tensor_slices((images, labels)).batch(global_batch_size)

    def train_step(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss = tf.nn.compute_average_loss(loss_object(labels, predictions),
                                              global_batch_size=ctx.global_batch_size)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        accuracy.update_state(labels, predictions)
        return loss

    return Workload(model, optimizer, loss_object, dataset, step=train_step, metrics={"train_accuracy": accuracy})
