"""A custom training loop over a 12-layer transformer encoder (BERT-base's shape: 768 wide, 12 heads, 3072 in
the feed-forward, a 30522-token embedding: about 110M parameters) predicting a class from generated token ids;
the loop of TensorFlow's custom-training tutorial (loss scaled by the global batch, strategy.run, reduce SUM,
Adam). --layers/--width make it smaller."""

import argparse

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--layers", type=int, default=12)
parser.add_argument("--width", type=int, default=768)
parser.add_argument("--vocab", type=int, default=30522)
parser.add_argument("--length", type=int, default=32)
parser.add_argument("--steps", type=int, default=4)
args = parser.parse_args()
HEADS, CLASSES = max(1, args.width // 64), 4

strategy = tf.distribute.MirroredStrategy()
GLOBAL_BATCH = 4 * strategy.num_replicas_in_sync
rng = np.random.default_rng(0)
tokens = rng.integers(0, args.vocab, (GLOBAL_BATCH * args.steps, args.length))
labels = rng.integers(0, CLASSES, GLOBAL_BATCH * args.steps)
dataset = strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensor_slices((tokens, labels)).batch(GLOBAL_BATCH))


def encoder_block(x):
    attended = tf.keras.layers.MultiHeadAttention(HEADS, args.width // HEADS)(x, x)
    x = tf.keras.layers.LayerNormalization(epsilon=1e-12)(x + attended)
    hidden = tf.keras.layers.Dense(4 * args.width, activation="gelu")(x)
    return tf.keras.layers.LayerNormalization(epsilon=1e-12)(x + tf.keras.layers.Dense(args.width)(hidden))


with strategy.scope():
    ids = tf.keras.Input((args.length,), dtype="int32")
    x = tf.keras.layers.Embedding(args.vocab, args.width)(ids)
    for _ in range(args.layers):
        x = encoder_block(x)
    logits = tf.keras.layers.Dense(CLASSES)(tf.keras.layers.GlobalAveragePooling1D()(x))
    model = tf.keras.Model(ids, logits)
    optimizer = tf.keras.optimizers.Adam(1e-4)
    optimizer.build(model.trainable_variables)
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
print("parameters:", model.count_params())


def train_step(inputs):
    ids, labels = inputs
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(loss_object(labels, model(ids, training=True)), global_batch_size=GLOBAL_BATCH)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function
def distributed_train_step(inputs):
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(train_step, args=(inputs,)), axis=None)


for batch in dataset:
    print("loss", float(distributed_train_step(batch)))
