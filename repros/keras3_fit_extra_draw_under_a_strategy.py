"""Known deviation keras3-fit-extra-draw-under-a-strategy (see known_deviations.toml).

Keras documents an epoch of Model.fit as "an iteration over the entire x and y data provided", and a
tf.data dataset begins a new iteration each time it is iterated (a generator dataset calls its
generator again; a shuffle with reshuffle_each_iteration draws a new order). Under a
tf.distribute strategy, Keras 3's TensorFlow trainer builds the model symbolically before the first
epoch (keras/src/backend/tensorflow/trainer.py, _maybe_symbolic_build, from keras-team/keras#19969,
Keras 3.5.0): it draws the first batch from an iteration of its own, so the first epoch trains the
dataset's second iteration, and a reshuffling dataset trains in another order than with no strategy.
Here iteration k of the dataset yields features k + 1: one epoch of SGD on mse with label 0 moves
the one weight w to w * (1 - 2 * lr * x^2), x = 1 for the first iteration.
Run: python this_file.py
"""

import keras
import numpy as np
import tensorflow as tf

began = []


def generate():
    began.append(len(began))
    for _ in range(4):
        yield np.array([len(began)], np.float32), np.array([0.0], np.float32)


signature = (tf.TensorSpec((1,), tf.float32), tf.TensorSpec((1,), tf.float32))
for name, strategy in (("no strategy", None), ("OneDeviceStrategy", tf.distribute.OneDeviceStrategy("/cpu:0")),
                       ("MirroredStrategy", tf.distribute.MirroredStrategy(["/cpu:0"]))):
    began.clear()
    data = tf.data.Dataset.from_generator(generate, output_signature=signature).batch(4)
    scope = strategy.scope() if strategy else tf.distribute.get_strategy().scope()
    with scope:
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
        model.compile(keras.optimizers.SGD(0.125), "mse")
    model.fit(data, epochs=1, verbose=0)
    w = float(model.trainable_variables[0].numpy().reshape(()))
    trained = {1.0 - 2 * 0.125 * x * x: x for x in (1.0, 2.0, 3.0)}.get(w)
    print(f"{name}: {len(began)} iterations begun; the epoch trained features {trained} "
          f"({'the first iteration, as documented' if trained == 1.0 else 'deviation: not the first iteration'})")
