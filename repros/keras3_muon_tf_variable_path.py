"""Known deviation keras3-muon-update-step-reads-keras-path (see known_deviations.toml).

Keras 3.10-3.12's Muon optimizer reads ``variable.path`` in ``update_step``; with the TensorFlow
backend the optimizer's distributed update hands ``update_step`` the underlying tf.Variable,
which has no ``path``, so the guide's custom step (apply_gradients inside strategy.run, the
optimizer built under the scope first) fails with AttributeError "'ResourceVariable' object has
no attribute 'path'" (keras-team/keras#21793; keras-team/keras#21924 keys the state by
_get_variable_index, first released in 3.13.0).
Run: python this_file.py (prints what one step did; exit 1 where it raised)
"""

import sys

import keras
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    opt = keras.optimizers.Muon(learning_rate=0.1)
    opt.build(model.trainable_variables)


@tf.function
def step(x):
    def replica_fn(x):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(tf.reduce_sum(model(x) ** 2, axis=1), global_batch_size=4)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
    strategy.run(replica_fn, args=(x,))


try:
    step(tf.ones([2, 4]))
except AttributeError as exc:
    print(f"Keras {keras.__version__}: the step raised AttributeError: {str(exc).strip().splitlines()[-1].strip()}")
    sys.exit(1)
print(f"Keras {keras.__version__}: the step ran; iterations = {int(opt.iterations.numpy())}")
