"""Keras' "Multi-GPU distributed training with TensorFlow" guide, its first part in the guide's shape:
a functional model compiled inside ``strategy.scope()`` with Adam, a sparse categorical loss and an
accuracy metric, ``model.fit`` on a batched ``tf.data.Dataset`` with validation data, then
``model.evaluate``. Its MNIST download is replaced by generated arrays of MNIST's shapes and dtypes
(fewer of them: the check compares the first steps). ``--steps-per-execution K`` compiles with
``steps_per_execution=K``.

    tf-distribute-check examples/scripts/fit_guide.py --strategies default,mirrored:2
"""
import argparse
import os

os.environ["KERAS_BACKEND"] = "tensorflow"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps-per-execution", type=int, default=1)
ARGS = parser.parse_args()


def get_compiled_model():
    # Make a simple 2-layer densely-connected neural network.
    inputs = keras.Input(shape=(784,))
    x = keras.layers.Dense(256, activation="relu")(inputs)
    x = keras.layers.Dense(256, activation="relu")(x)
    outputs = keras.layers.Dense(10)(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
        steps_per_execution=ARGS.steps_per_execution,
    )
    return model


def get_dataset():
    batch_size = 32
    num_val_samples = 512

    # Return the MNIST dataset in the form of a `tf.data.Dataset` (generated here, nothing downloaded).
    rng = np.random.default_rng(0)
    x_train = rng.integers(0, 256, (2048, 28, 28), dtype=np.uint8)
    y_train = rng.integers(0, 10, 2048, dtype=np.uint8)
    x_test = rng.integers(0, 256, (512, 28, 28), dtype=np.uint8)
    y_test = rng.integers(0, 10, 512, dtype=np.uint8)

    # Preprocess the data (these are Numpy arrays)
    x_train = x_train.reshape(-1, 784).astype("float32") / 255
    x_test = x_test.reshape(-1, 784).astype("float32") / 255
    y_train = y_train.astype("float32")
    y_test = y_test.astype("float32")

    # Reserve num_val_samples samples for validation
    x_val = x_train[-num_val_samples:]
    y_val = y_train[-num_val_samples:]
    x_train = x_train[:-num_val_samples]
    y_train = y_train[:-num_val_samples]
    return (
        tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(batch_size),
        tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(batch_size),
        tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(batch_size),
    )


# Create a MirroredStrategy.
strategy = tf.distribute.MirroredStrategy()
print(f"Number of devices: {strategy.num_replicas_in_sync}")

# Open a strategy scope.
with strategy.scope():
    # Everything that creates variables should be under the strategy scope.
    # In general this is only model construction & `compile()`.
    model = get_compiled_model()

    # Train the model on all available devices.
    train_dataset, val_dataset, test_dataset = get_dataset()
    model.fit(train_dataset, epochs=2, validation_data=val_dataset)

    # Test the model on all available devices.
    model.evaluate(test_dataset)
