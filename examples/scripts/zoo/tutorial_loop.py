"""TensorFlow's "Custom training with tf.distribute.Strategy" tutorial loop, in shapes that look wrong.

Each ``--case`` is a right script but one (issue 62's zoo; tests/workloads/test_script_zoo.py holds
the verdict each must get and why):

- ``evaluate_between_epochs`` (default): the tutorial's metrics (made in the scope, reset each
  epoch) and its test step run with strategy.run after every epoch, between training steps.
- ``unseeded_shuffle``: the tutorial's ``.shuffle(BUFFER_SIZE)`` with no seed. Right on one worker;
  on several, each worker process shuffles its own way before the auto-sharding (a mistake there).
- ``generator_noise``, ``stateful_noise``, ``stateless_noise``: input noise of the script's own, from a
  tf.random.Generator made in the scope, from tf.random.normal, or from tf.random.stateless_normal
  keyed by the step (TensorFlow's "Random number generation" guide): every replica draws for its own
  batch, so no spec draws one device's numbers.
- ``demonstration_variable``: the distributed-training guide's cell on the default strategy,
  ``print(tf.Variable(1.))`` in its scope, a variable no training reads.
- ``accuracy_mean``: an accuracy computed by hand in the replica step, reduced with MEAN.
- ``accuracy_of_replica_0``: the same read as ``experimental_local_results(accuracy)[0]``, replica
  0's accuracy kept as the whole's: the mistake of this script.

    tf-distribute-check examples/scripts/zoo/tutorial_loop.py --strategies mirrored:2 -- --case unseeded_shuffle
"""
import argparse

import numpy as np
import tensorflow as tf

CASES = ("evaluate_between_epochs", "unseeded_shuffle", "generator_noise", "stateful_noise", "stateless_noise",
         "demonstration_variable", "accuracy_mean", "accuracy_of_replica_0")
parser = argparse.ArgumentParser()
parser.add_argument("--case", choices=CASES, default="evaluate_between_epochs")
case = parser.parse_args().case

rng = np.random.default_rng(3)
PER_REPLICA = 16
EPOCHS = 2  # 64 examples: 2 steps an epoch at 2 replicas x 16, the evaluation between steps 2 and 3

strategy = tf.distribute.MirroredStrategy()
GLOBAL = PER_REPLICA * strategy.num_replicas_in_sync

x_train = rng.normal(size=(64, 8)).astype("float32")
y_train = rng.integers(0, 3, size=64)
x_test = rng.normal(size=(32, 8)).astype("float32")
y_test = rng.integers(0, 3, size=32)

train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
if case == "unseeded_shuffle":
    train_dataset = train_dataset.shuffle(len(x_train))
train_dataset = train_dataset.batch(GLOBAL)
test_dataset = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(GLOBAL)
if case == "demonstration_variable":
    default_strategy = tf.distribute.get_strategy()  # the guide's cell on the default strategy
    with default_strategy.scope():
        print(tf.Variable(1.))
train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)

with strategy.scope():
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE)

    def compute_loss(labels, predictions):
        per_example_loss = loss_object(labels, predictions)
        return tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL)

    test_loss = tf.keras.metrics.Mean(name="test_loss")
    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
    test_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")

    model = tf.keras.Sequential([
        tf.keras.layers.Input((8,)),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(3),
    ])
    optimizer = tf.keras.optimizers.Adam(learning_rate=0.01)
    optimizer.build(model.trainable_variables)  # Keras 3 cannot make Adam's slots inside strategy.run
    generator = tf.random.Generator.from_seed(1)


def noisy(features):
    if case == "generator_noise":
        return features + 0.05 * generator.normal(tf.shape(features))
    if case == "stateful_noise":
        return features + 0.05 * tf.random.normal(tf.shape(features), seed=1)
    if case == "stateless_noise":
        step = tf.cast(optimizer.iterations, tf.int32)
        return features + 0.05 * tf.random.stateless_normal(tf.shape(features), seed=tf.stack([step, 0]))
    return features


def train_step(inputs):
    features, labels = inputs
    with tf.GradientTape() as tape:
        predictions = model(noisy(features), training=True)
        loss = compute_loss(labels, predictions)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    train_accuracy.update_state(labels, predictions)
    correct = tf.cast(tf.equal(tf.argmax(predictions, axis=1), tf.cast(labels, tf.int64)), tf.float32)
    return loss, tf.reduce_mean(correct)  # the replica's own accuracy, on its own examples


def test_step(inputs):
    features, labels = inputs
    predictions = model(features, training=False)
    test_loss.update_state(loss_object(labels, predictions))
    test_accuracy.update_state(labels, predictions)


@tf.function
def distributed_train_step(dataset_inputs):
    per_replica_losses, per_replica_accuracy = strategy.run(train_step, args=(dataset_inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None), per_replica_accuracy


@tf.function
def distributed_test_step(dataset_inputs):
    return strategy.run(test_step, args=(dataset_inputs,))


for epoch in range(EPOCHS):
    total_loss, num_batches, hand_accuracy = 0.0, 0, []
    for batch in train_dist_dataset:
        loss, accuracy = distributed_train_step(batch)
        total_loss += loss
        num_batches += 1
        if case == "accuracy_of_replica_0":
            hand_accuracy.append(float(strategy.experimental_local_results(accuracy)[0]))
        elif case == "accuracy_mean":
            hand_accuracy.append(float(strategy.reduce(tf.distribute.ReduceOp.MEAN, accuracy, axis=None)))
    train_loss = total_loss / num_batches

    for batch in test_dist_dataset:
        distributed_test_step(batch)

    print("Epoch {}, Loss: {}, Accuracy: {}, Test Loss: {}, Test Accuracy: {}".format(  # noqa: UP032
        epoch + 1, train_loss, train_accuracy.result() * 100, test_loss.result(), test_accuracy.result() * 100))
    if hand_accuracy:
        print("hand accuracy", np.mean(hand_accuracy))
    test_loss.reset_state()
    train_accuracy.reset_state()
    test_accuracy.reset_state()
