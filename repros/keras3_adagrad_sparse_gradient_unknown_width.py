"""Known deviation keras3-adagrad-summed-sparse-gradient-fails-3.5-to-3.9 (see known_deviations.toml).

An Embedding layer (table of zeros) and Adagrad under MirroredStrategy with two replicas, one
step of the custom-training guide: both replicas look up rows 0 and 1 and apply the gradient of
sum(rows), an IndexedSlices. From Keras 3.5 the TensorFlow optimizer sums the replicas'
gradients before the update (keras/src/backend/tensorflow/optimizer.py: _all_reduce_sum_gradients,
keras-team/keras PR 19969); the sum of IndexedSlices across replicas has values of static shape
(None, None), its row width no longer known. Adagrad's update_step divides the sparse gradient by
sqrt(accumulator + epsilon) with ops.divide, whose TensorFlow sparse path
(keras/src/backend/tensorflow/sparse.py: indexed_slices_union_indices_and_values, values_for_union)
builds tf.zeros((1,) + values.shape[1:]): ValueError "Cannot convert a partially known TensorShape
(1, None) to a Tensor", at the first step. keras-team/keras PR 21148 (for issue 21069) writes
tf.zeros_like(values[0:1]) instead, first tagged v3.10.0. Keras 3.0-3.4 did not sum the gradients
(a deviation of its own) and one replica sums nothing: neither raises.
Run: python this_file.py (exit 1 where the step raises; where it runs, prints rows 0 and 1 of each
replica's table, whose values are other entries' subject: keras3-gradients-not-summed-before-3.5
and keras3-sparse-second-moments-square-each-occurrence)
"""

import sys

import keras
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    layer = keras.layers.Embedding(4, 2, embeddings_initializer="zeros", dtype="float64")
    layer.build((None,))
    optimizer = keras.optimizers.Adagrad(learning_rate=0.1, initial_accumulator_value=0.1, epsilon=1e-7)
    optimizer.build(layer.trainable_variables)


@tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])
def step(indices):
    def replica():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(indices))
        grads = tape.gradient(loss, layer.trainable_variables)
        optimizer.apply_gradients(zip(grads, layer.trainable_variables))
    strategy.run(replica)


try:
    step(np.array([0, 1], np.int32))
except ValueError as exc:
    print(f"Keras {keras.__version__}: the step raised {str(exc).strip().splitlines()[-1].strip()}")
    sys.exit(1)
copies = [np.asarray(c) for c in strategy.experimental_local_results(layer.embeddings.value)]
rows = [c[:2].ravel().round(6).tolist() for c in copies]
print(f"Keras {keras.__version__}: the step ran; rows 0-1 on each replica {rows}")
