"""Known deviation keras3-fit-uneven-replica-batches-raise (see known_deviations.toml).

Keras 3's TensorFlow trainer builds a model symbolically before fit trains under a strategy
(keras/src/backend/tensorflow/trainer.py, _maybe_symbolic_build): it draws the first distributed
batch and reduces it with strategy.reduce("MEAN", batch, axis=None), an element-wise mean of the
replicas' tensors. Where the global batch does not divide evenly among the replicas (32 examples
over 3 replicas: 11, 11 and 10), the replicas' tensors differ in shape and the reduce raises
InvalidArgumentError "Inputs to operation AddN of type AddN must have the same size and shape"
before the first step. A global batch the replica count divides (33) trains. Measured: Keras 3.0.5
(TF 2.16.2) and 3.4.1 (TF 2.17.1) train both; 3.6.0, 3.7.0, 3.8.0 (TF 2.18.1), 3.9.2, 3.11.3,
3.13.2 and 3.15.1 raise on 32. The reduce came with keras-team/keras#19969 (Keras 3.5.0).
Run: python this_file.py
"""

import keras
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
x = np.arange(96 * 4, dtype=np.float32).reshape(96, 4) / 100.0
y = x.sum(axis=1, keepdims=True)
for batch in (33, 32):
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    try:
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch), epochs=1, steps_per_epoch=1, verbose=0)
        print(f"ok: fit trains a global batch of {batch} on 3 replicas")
    except Exception as exc:  # noqa: BLE001
        print(f"deviation: a global batch of {batch} on 3 replicas: {type(exc).__name__}: "
              f"{str(exc).strip().splitlines()[0][:160]}")
