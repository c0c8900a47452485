"""A Sequential with no input shape whose BatchNormalization is synchronized across replicas, fitted under
MirroredStrategy: the shape of the example in that layer's docstring, and of scripts on TensorFlow's issue
tracker (issue 62, finding 7).

Right, and it looks wrong to a checker on Keras 2 (tf-keras): the model builds on its first call inside
``strategy.run``, where tf-keras' symbolic build of a Sequential calls the synchronized batch norm's
all-reduce while tracing a scratch graph, which MirroredStrategy refuses (``merge_call`` while defining a new
graph); the Sequential falls back to building each layer at its first real call, so the layers after the
batch norm are named under the model's scope (``sequential/dense/kernel``) under MirroredStrategy and not on
one device (``dense/kernel``): the same variables in the same order, named under another scope prefix.
"""
import numpy as np
import tensorflow as tf

rng = np.random.default_rng(5)
x = rng.random((16, 12, 12, 1)).astype("float32")
y = rng.integers(0, 3, size=(16,))
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.Conv2D(16, 3, use_bias=False),
        tf.keras.layers.BatchNormalization(synchronized=True),
        tf.keras.layers.ReLU(),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(3, activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, batch_size=8, epochs=1, verbose=0)
