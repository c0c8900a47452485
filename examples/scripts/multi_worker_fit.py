"""TensorFlow's "Multi-worker training with Keras" tutorial (multi_worker_with_keras), its
``main.py`` and ``mnist_setup.py`` in one file, as written: ``tf.keras``, the global batch from
TF_CONFIG's workers, a CNN compiled inside ``strategy.scope()`` and ``model.fit`` with
``steps_per_epoch``. MNIST is replaced by generated images of its shape and range (nothing is
downloaded). The tutorial shuffles without a seed before Keras shards the batches by worker, so each
worker takes its shard of its own order; ``--seed-shuffle`` gives the shuffle a seed (every worker one
order), the script's only change.

    tf-distribute-check examples/scripts/multi_worker_fit.py --strategies multi_worker:2x1
"""
# ruff: noqa: E111, E114, E117, E501, I001  (the tutorial's indentation and imports, kept)
import os
import json
import sys

import numpy as np
import tensorflow as tf

SEED = 7 if "--seed-shuffle" in sys.argv[1:] else None


def mnist_dataset(batch_size):
  # (x_train, y_train), _ = tf.keras.datasets.mnist.load_data(): generated (fewer examples)
  rng = np.random.default_rng(5)
  x_train = rng.integers(0, 256, size=(1024, 28, 28), dtype=np.uint8)
  y_train = rng.integers(0, 10, size=1024).astype(np.uint8)
  # The `x` arrays are in uint8 and have values in the [0, 255] range.
  # You need to convert them to float32 with values in the [0, 1] range.
  x_train = x_train / np.float32(255)
  y_train = y_train.astype(np.int64)
  train_dataset = tf.data.Dataset.from_tensor_slices(
      (x_train, y_train)).shuffle(60000, seed=SEED).repeat().batch(batch_size)
  return train_dataset


def build_and_compile_cnn_model():
  model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(28, 28)),
      tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
      tf.keras.layers.Conv2D(32, 3, activation='relu'),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(128, activation='relu'),
      tf.keras.layers.Dense(10)
  ])
  model.compile(
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
      metrics=['accuracy'])
  return model


per_worker_batch_size = 64
tf_config = json.loads(os.environ['TF_CONFIG'])
num_workers = len(tf_config['cluster']['worker'])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_dataset(global_batch_size)

with strategy.scope():
  # Model building/compiling need to be within `strategy.scope()`.
  multi_worker_model = build_and_compile_cnn_model()


multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=70)
