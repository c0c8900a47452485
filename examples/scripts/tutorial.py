"""TensorFlow's "Custom training with tf.distribute.Strategy" tutorial, in its own structure.

The tutorial's code as it stands (strategy, global batch from num_replicas_in_sync, distributed
datasets, a distributed_train_step with strategy.run and strategy.reduce(SUM), an epoch loop),
with Fashion-MNIST replaced by generated images of the same shape (nothing is downloaded). Like the
tutorial it creates Adam() without building it; ``--build-optimizer`` builds it in the scope.
``--model resnet50v2`` swaps its CNN for ``tf.keras.applications.ResNet50V2(weights=None)`` on 32x32
colour images (benchmarks/bench_check_size.py).

    tf-distribute-check examples/scripts/tutorial.py
    tf-distribute-check examples/scripts/tutorial.py -- --build-optimizer
    tf-distribute-check examples/scripts/tutorial.py -- --build-optimizer --model resnet50v2
"""

import argparse

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--build-optimizer", action="store_true")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--model", choices=("cnn", "resnet50v2"), default="cnn")
args = parser.parse_args()

# Fashion-MNIST's shape: 28x28 grey images, 10 classes (generated: no download); for ResNet50V2, 32x32 colour
rng = np.random.default_rng(7)
SHAPE = (28, 28, 1) if args.model == "cnn" else (32, 32, 3)
train_images = rng.random((768, *SHAPE), dtype=np.float32)
train_labels = rng.integers(0, 10, size=768)
test_images = rng.random((128, *SHAPE), dtype=np.float32)
test_labels = rng.integers(0, 10, size=128)

strategy = tf.distribute.MirroredStrategy()
print("Number of devices: {}".format(strategy.num_replicas_in_sync))  # noqa: UP032  (the tutorial's line)

BUFFER_SIZE = len(train_images)
BATCH_SIZE_PER_REPLICA = 16
GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
EPOCHS = args.epochs

train_dataset = tf.data.Dataset.from_tensor_slices((train_images, train_labels)).shuffle(
    BUFFER_SIZE, seed=1).batch(GLOBAL_BATCH_SIZE)
test_dataset = tf.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(GLOBAL_BATCH_SIZE)

train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)


def create_model():
    if args.model == "resnet50v2":  # the tutorial with a model of users' size (23.6M parameters)
        return tf.keras.applications.ResNet50V2(weights=None, input_shape=SHAPE, classes=10)
    regularizer = tf.keras.regularizers.L2(1e-5)
    return tf.keras.Sequential([
        tf.keras.layers.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3, activation="relu", kernel_regularizer=regularizer),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(64, 3, activation="relu", kernel_regularizer=regularizer),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu", kernel_regularizer=regularizer),
        tf.keras.layers.Dense(10, kernel_regularizer=regularizer),
    ])


with strategy.scope():
    # Set reduction to `NONE` so you can do the reduction yourself.
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE)

    def compute_loss(labels, predictions, model_losses):
        per_example_loss = loss_object(labels, predictions)
        loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH_SIZE)
        if model_losses:
            loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
        return loss

    test_loss = tf.keras.metrics.Mean(name="test_loss")
    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
    test_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")

    model = create_model()
    optimizer = tf.keras.optimizers.Adam(learning_rate=0.001)
    if args.build_optimizer:
        optimizer.build(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)


def train_step(inputs):
    images, labels = inputs
    with tf.GradientTape() as tape:
        predictions = model(images, training=True)
        loss = compute_loss(labels, predictions, model.losses)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    train_accuracy.update_state(labels, predictions)
    return loss


def test_step(inputs):
    images, labels = inputs
    predictions = model(images, training=False)
    t_loss = loss_object(labels, predictions)
    test_loss.update_state(t_loss)
    test_accuracy.update_state(labels, predictions)


@tf.function
def distributed_train_step(dataset_inputs):
    per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


@tf.function
def distributed_test_step(dataset_inputs):
    return strategy.run(test_step, args=(dataset_inputs,))


for epoch in range(EPOCHS):
    # TRAIN LOOP
    total_loss = 0.0
    num_batches = 0
    for x in train_dist_dataset:
        total_loss += distributed_train_step(x)
        num_batches += 1
    train_loss = total_loss / num_batches

    # TEST LOOP
    for x in test_dist_dataset:
        distributed_test_step(x)

    template = "Epoch {}, Loss: {}, Accuracy: {}, Test Loss: {}, Test Accuracy: {}"
    print(template.format(epoch + 1, train_loss, train_accuracy.result() * 100, test_loss.result(),
                          test_accuracy.result() * 100))
    test_loss.reset_state()
    train_accuracy.reset_state()
    test_accuracy.reset_state()
