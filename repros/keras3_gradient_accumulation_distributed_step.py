"""Known deviation keras3-gradient-accumulation-fails-in-a-distributed-step (see known_deviations.toml).

The custom-training guide's step under MirroredStrategy with two replicas, the optimizer made with
gradient_accumulation_steps=2: the first apply_gradients inside strategy.run inside a tf.function
raises RuntimeError "merge_call called while defining a new graph or a tf.function".
_backend_apply_gradients chooses between updating and accumulating with ops.cond, and the update
branch synchronizes the replicas (a merge_call) inside that cond. The Keras frame that meets the
merge_call first: _backend_update_step's maybe_merge_call in Keras 3.0-3.4, the replica-context
all-reduce _all_reduce_sum_gradients (keras-team/keras PR 19969) from 3.5.
Run: python this_file.py (prints the outcome and the optimizer frames; exit 1 where the step raises)
"""

import sys
import traceback

import keras
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer="ones")])
    opt = keras.optimizers.SGD(0.5, gradient_accumulation_steps=2)
    opt.build(model.trainable_variables)
x = tf.constant([[1.0, 2.0], [3.0, -1.0]])
y = tf.constant([[1.0], [0.0]])


@tf.function
def step():
    def replica_fn():
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(keras.losses.mean_squared_error(y, model(x)), global_batch_size=4)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    strategy.run(replica_fn)


try:
    step()
    step()
except RuntimeError as exc:
    said = "merge_call` called while defining a new graph or a tf.function" in str(exc)
    print(f"Keras {keras.__version__}: RuntimeError{' (merge_call in a tf.function)' if said else ''}; frames:")
    for frame in traceback.extract_tb(exc.__traceback__):
        if "/optimizers/" in frame.filename or "/backend/tensorflow/optimizer" in frame.filename:
            print(f"  {frame.filename.split('site-packages/')[-1]}: {frame.name}")
    sys.exit(1)
print(f"Keras {keras.__version__}: two accumulated steps ran; kernel {model.trainable_variables[0].numpy().ravel()}")
sys.exit(0)
