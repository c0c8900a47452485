"""Loops whose behaviour across an upgrade is known from the deviations file: the upgrade check's
known answers (tests/workloads/test_upgrade.py; docs/check.md, 'Across versions'). Each runs on
Keras 2 (``tf.keras`` of TF 2.15) and Keras 3 alike, on deterministic numpy data.

    python -m suite.check examples.upgrade:embedding_adam --from tf215 --strategies mirrored:2

What each shows moving from TF 2.15 / Keras 2.15 to TF 2.21 / Keras 3.15:
  unchanged       nothing: SGD on an MLP trains the same on both, on one device and under a strategy
  clipnorm        keras3-clipping-per-replica-before-the-sum appears under a multi-replica spec
                  (Keras 2 sums the replicas' gradients, then clips; Keras 3 clips each replica's)
  dropout         keras3-dropout-mask-shared-by-replicas appears (Keras' own Dropout: one mask for
                  every replica in Keras 3)
  embedding_adam  keras3-sparse-second-moments-square-each-occurrence appears on one device already
                  (an embedding row looked up more than once: Keras 3's Adam squares each
                  occurrence's gradient); under a strategy the same difference, nothing more
  regularized     the suite's canonical step (no step of its own) with an L2 penalty: a mutant that
                  leaves the penalty out on one version only changes that version's math
"""

import numpy as np
import tensorflow as tf

from examples import mistakes, zoo
from suite.engine.workload import Workload

keras = tf.keras


def unchanged(ctx):
    """SGD on the zoo's functional MLP, the loss summed and divided by the global batch."""
    return zoo.right_sum_over_global_batch(ctx)


def clipnorm(ctx):
    """global_clipnorm on the optimizer (examples/zoo.py: right_clipnorm_in_optimizer)."""
    return zoo.right_clipnorm_in_optimizer(ctx)


def dropout(ctx):
    """Keras' own Dropout(0.3) in a right loop (examples/mistakes.py: right_with_dropout)."""
    return mistakes.right_with_dropout(ctx)


def _tokens(n: int = 144, length: int = 3, vocabulary: int = 12, seed: int = 5):
    """Integer sequences over a small vocabulary (rows repeat within every batch) and a target."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocabulary, size=(n, length)).astype(np.int32)
    return tokens, rng.normal(size=(n, 1)).astype(np.float32)


def embedding_adam(ctx):
    """An Embedding (its gradient a tf.IndexedSlices with repeated rows), averaged, into a Dense,
    trained by Adam on the mean squared error."""
    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(12, 4),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam(0.05)
    optimizer.build(model.trainable_variables)
    mse = keras.losses.MeanSquaredError(reduction="none")
    x, y = _tokens()

    def dataset(global_batch_size, input_context):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size)

    def step(batch):
        tokens, target = batch
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(mse(target, model(tokens, training=True)),
                                              global_batch_size=ctx.global_batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return Workload(model, optimizer, mse, dataset, step=step)


def regularized(ctx):
    """An MLP with an L2 kernel penalty and no step of its own: the suite's canonical step trains it
    (compute_average_loss of the loss plus scale_regularization_loss of model.losses)."""
    model = keras.Sequential([keras.Input((8,)),
                              keras.layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.L2(0.05)),
                              keras.layers.Dense(3)])
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    x, y, _ = zoo.classification()

    def dataset(global_batch_size, input_context):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size)

    return Workload(model, optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
                    dataset)
