"""A custom training loop over an MLP of about --params parameters (TensorFlow's custom-training tutorial's loop:
a loss scaled by the global batch, strategy.run, strategy.reduce SUM, Adam), data generated."""

import argparse

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--params", type=float, default=1e6)
parser.add_argument("--steps", type=int, default=4)
args = parser.parse_args()

FEATURES, CLASSES, LAYERS = 64, 10, 3
# LAYERS hidden layers of width W: about FEATURES*W + (LAYERS-1)*W*W + W*CLASSES parameters
a, b = LAYERS - 1, FEATURES + CLASSES + LAYERS
WIDTH = max(1, int((-b + (b * b + 4 * a * args.params) ** 0.5) / (2 * a)))

strategy = tf.distribute.MirroredStrategy()
GLOBAL_BATCH = 16 * strategy.num_replicas_in_sync
rng = np.random.default_rng(0)
x = rng.standard_normal((GLOBAL_BATCH * args.steps, FEATURES)).astype(np.float32)
y = rng.integers(0, CLASSES, GLOBAL_BATCH * args.steps)
dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH))

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input((FEATURES,))]
                                + [tf.keras.layers.Dense(WIDTH, activation="relu") for _ in range(LAYERS)]
                                + [tf.keras.layers.Dense(CLASSES)])
    optimizer = tf.keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
print("parameters:", model.count_params())


def train_step(inputs):
    features, labels = inputs
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(loss_object(labels, model(features, training=True)),
                                          global_batch_size=GLOBAL_BATCH)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function
def distributed_train_step(inputs):
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(train_step, args=(inputs,)), axis=None)


for batch in dataset:
    print("loss", float(distributed_train_step(batch)))
