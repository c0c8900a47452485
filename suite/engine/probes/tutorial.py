"""The custom-training tutorial, end to end: the guide's CNN trained on Fashion-MNIST-shaped data
under the strategy with a checkpoint every 2 epochs, then the latest checkpoint restored into a
fresh model with no strategy and evaluated."""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from ...common.results import Evaluation, TutorialEpoch, TutorialRun
from .. import compat
from ..workloads import builtin, fashion
from .registry import probe

keras = compat.keras


create_model = builtin.cnn_model  # the guide's model, one definition for the tutorial and the workloads


def _data(n_train, n_test):
    (x_train, y_train), (x_test, y_test) = fashion.load_data(n_train, n_test)
    prep = lambda x: (x[..., None] / np.float32(255)).astype(np.float32)  # noqa: E731
    return prep(x_train), y_train.astype(np.int64), prep(x_test), y_test.astype(np.int64)


@probe
def load_data(ctx, n_train, n_test):
    """The stand-in data as ``fashion_mnist.load_data()`` returns it."""
    return fashion.load_data(n_train, n_test)


@probe
def train(ctx, directory, epochs=4, batch_per_replica=32, n_train=2048, n_test=512, seed=0):
    """Train as the guide does; return per-epoch train loss/accuracy, the test accuracy
    measured under the strategy and the latest checkpoint."""
    strategy = ctx.strategy
    tf.keras.utils.set_random_seed(seed)
    x_train, y_train, x_test, y_test = _data(n_train, n_test)
    global_batch = batch_per_replica * strategy.num_replicas_in_sync
    train_ds = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(n_train, seed=seed).batch(global_batch)
    test_ds = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(global_batch)
    train_dist = strategy.experimental_distribute_dataset(train_ds)
    test_dist = strategy.experimental_distribute_dataset(test_ds)
    with strategy.scope():
        model = create_model()
        optimizer = keras.optimizers.Adam()
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
        train_accuracy = keras.metrics.SparseCategoricalAccuracy()
        test_accuracy = keras.metrics.SparseCategoricalAccuracy()
        optimizer.build(model.trainable_variables)  # see known deviation keras3-lazy-optimizer-slots-mirrored
    checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)

    def train_step(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss = tf.nn.compute_average_loss(loss_object(labels, predictions), global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        train_accuracy.update_state(labels, predictions)
        return loss

    def test_step(inputs):
        images, labels = inputs
        test_accuracy.update_state(labels, model(images, training=False))

    @tf.function
    def distributed_train_step(inputs):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(train_step, args=(inputs,)), axis=None)

    @tf.function
    def distributed_test_step(inputs):
        strategy.run(test_step, args=(inputs,))

    history = []
    prefix = os.path.join(directory if ctx.worker_index == 0 else os.path.join(directory, f"w{ctx.worker_index}"),
                          "ckpt")
    for epoch in range(epochs):
        total, batches = 0.0, 0
        for batch in train_dist:
            total += float(distributed_train_step(batch))
            batches += 1
        if epoch % 2 == 1:
            checkpoint.save(prefix)
        history.append(TutorialEpoch(total / batches, float(train_accuracy.result())))
        train_accuracy.reset_state()
    for batch in test_dist:
        distributed_test_step(batch)
    return TutorialRun(history, float(test_accuracy.result()), tf.train.latest_checkpoint(os.path.dirname(prefix)))


@probe
def restore_and_evaluate(ctx, directory, n_train=2048, n_test=512):
    """A fresh model with no strategy, the latest checkpoint restored, evaluated on the test set."""
    _, _, x_test, y_test = _data(n_train, n_test)
    model = create_model()
    optimizer = keras.optimizers.Adam()
    checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)
    latest = tf.train.latest_checkpoint(directory)
    checkpoint.restore(latest).expect_partial()
    accuracy = keras.metrics.SparseCategoricalAccuracy()
    correct = []
    for images, labels in tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(64):
        predictions = model(images, training=False)
        accuracy.update_state(labels, predictions)
        correct.extend((np.argmax(predictions.numpy(), axis=-1) == labels.numpy()).tolist())
    return Evaluation(float(accuracy.result()), latest, correct)
