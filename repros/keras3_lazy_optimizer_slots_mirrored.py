"""Known deviations keras3-lazy-optimizer-slots-mirrored and
keras3-central-storage-replica-context-updates (see known_deviations.toml).

The custom-training guide's loop: model and optimizer created under the strategy scope, the
first apply_gradients inside strategy.run inside a tf.function. With Keras 3.5 or later and a
MirroredStrategy of 2 replicas, Adam (any optimizer with slots) fails there (Keras 3.0-3.4 print
"ok": they never all-reduce the gradients, keras3-gradients-not-summed-before-3.5); with
STRATEGY=central_storage OPTIMIZER=Nadam it fails differently. Run: python this_file.py
"""

import os

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
if os.environ.get("STRATEGY") == "central_storage":
    strategy = tf.distribute.experimental.CentralStorageStrategy(["/cpu:0", "/cpu:1"], parameter_device="/cpu:0")
else:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    optimizer = getattr(tf.keras.optimizers, os.environ.get("OPTIMIZER", "Adam"))()
x = tf.constant([[1.0, 2.0], [3.0, -1.0]])
y = tf.constant([[1.0], [0.0]])


@tf.function
def step():
    def replica_fn():
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(tf.keras.losses.mse(y, model(x)), global_batch_size=2)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss
    return strategy.run(replica_fn)


try:
    step()
    print("ok: optimizer variables created lazily in the distributed step")
except Exception as exc:  # the deviation
    lines = [ln.strip() for ln in str(exc).splitlines() if "You must" in ln] or [str(exc)[:300]]
    print(f"{type(exc).__name__}: {lines[0][:300]}")
