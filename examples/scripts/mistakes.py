"""Training scripts in the custom-training tutorial's structure, each with one mistake of its outer
loop or step, and right scripts that look wrong: ``--case NAME`` picks one.

    tf-distribute-check examples/scripts/mistakes.py --strategies mirrored:2 -- --case reduce_mean_for_sum

Each mistake's case is named after the cause the check must give (docs/check.md lists them); the
cases starting ``right_`` train what one device trains. A small classifier on generated data
(nothing is downloaded), SGD, 16 examples per replica.
"""

import argparse

import numpy as np
import tensorflow as tf

CASES = ("right", "right_uneven_global_batch", "right_loss_summed_by_hand", "right_mean_over_replicas",
         "reduce_mean_for_sum", "batch_not_distributed", "metric_from_one_replica", "loss_averaged_per_replica",
         "loss_divided_twice", "regularization_not_scaled", "metric_fed_scaled_loss", "created_outside_scope",
         "gradients_aggregated_by_hand", "clipped_before_aggregation", "gradient_of_per_replica_mean")
parser = argparse.ArgumentParser()
parser.add_argument("--case", choices=CASES, default="right")
case = parser.parse_args().case

rng = np.random.default_rng(3)
features = rng.normal(size=(396, 8)).astype(np.float32)
labels = rng.integers(0, 4, size=396)


def create_model():
    regularizer = tf.keras.regularizers.L2(1e-3) if case == "regularization_not_scaled" else None
    return tf.keras.Sequential([tf.keras.layers.Input((8,)),
                                tf.keras.layers.Dense(16, activation="relu", kernel_regularizer=regularizer),
                                tf.keras.layers.Dense(4, kernel_regularizer=regularizer)])


strategy = tf.distribute.MirroredStrategy()
BATCH_SIZE_PER_REPLICA = 16
GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
if case == "right_uneven_global_batch":  # a fixed global batch: 33 does not split evenly over 2 replicas
    GLOBAL_BATCH_SIZE = 33

train_dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(GLOBAL_BATCH_SIZE, drop_remainder=True)
if case == "batch_not_distributed":  # the global batches go to strategy.run as they are
    train_dist_dataset = train_dataset
else:
    train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)

if case == "created_outside_scope":
    model = create_model()
with strategy.scope():
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    train_loss = tf.keras.metrics.Mean(name="train_loss")
    if case != "created_outside_scope":
        model = create_model()
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.1)
    optimizer.build(model.trainable_variables)


def compute_loss(labels, predictions):
    per_example_loss = loss_object(labels, predictions)
    if case == "loss_averaged_per_replica":
        loss = tf.reduce_mean(per_example_loss)
    elif case == "right_loss_summed_by_hand":
        loss = tf.reduce_sum(per_example_loss) / GLOBAL_BATCH_SIZE
    elif case == "right_mean_over_replicas":  # right where the replicas' batches are equal
        loss = tf.reduce_mean(per_example_loss) / strategy.num_replicas_in_sync
    else:
        loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH_SIZE)
    if case == "loss_divided_twice":
        loss = loss / tf.distribute.get_replica_context().num_replicas_in_sync
    if case == "regularization_not_scaled":
        loss += tf.add_n(model.losses)
    elif model.losses:
        loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
    return per_example_loss, loss


def train_step(inputs):
    x, y = inputs
    with tf.GradientTape() as tape:
        per_example_loss, loss = compute_loss(y, model(x, training=True))
        mean = tf.reduce_mean(per_example_loss)
    gradients = tape.gradient(mean if case == "gradient_of_per_replica_mean" else loss, model.trainable_variables)
    if case == "gradients_aggregated_by_hand":  # apply_gradients sums the replicas' gradients again
        gradients = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, gradients)
    if case == "clipped_before_aggregation":  # each replica's own gradients clipped, then summed
        gradients, _ = tf.clip_by_global_norm(gradients, 0.05)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    if case == "metric_fed_scaled_loss":
        train_loss.update_state(loss)
    elif case != "metric_from_one_replica":
        train_loss.update_state(per_example_loss)
    return loss


@tf.function
def distributed_train_step(dataset_inputs):
    per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
    if case == "metric_from_one_replica":
        train_loss.update_state(strategy.experimental_local_results(per_replica_losses)[0])
    op = tf.distribute.ReduceOp.MEAN if case == "reduce_mean_for_sum" else tf.distribute.ReduceOp.SUM
    return strategy.reduce(op, per_replica_losses, axis=None)


for epoch in range(2):
    total_loss, num_batches = 0.0, 0
    for x in train_dist_dataset:
        total_loss += distributed_train_step(x)
        num_batches += 1
    print(f"epoch {epoch + 1}: loss {float(total_loss / num_batches):.4f}, train_loss {float(train_loss.result()):.4f}")
    train_loss.reset_state()
