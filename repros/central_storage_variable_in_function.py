"""Known deviation central-storage-variable-created-in-function (see known_deviations.toml).

TensorFlow's custom-training tutorial builds its Keras model lazily: the model has no Input, so
its variables are created by its first call, inside strategy.run inside the tf.function step.
Under CentralStorageStrategy with 2 compute devices the second variable created there raises
OperatorNotAllowedInGraphError ("Using a symbolic `tf.Tensor` as a Python `bool`"):
ParameterServerStrategyExtended's variable creator (parameter_server_strategy.py, var_creator)
tests `if v in l:` against the graph's TRAINABLE_VARIABLES collection, and a variable compared
with `==` in a graph gives a symbolic tensor. With an Input (built in the scope) it trains.
Run: python this_file.py
"""

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.experimental.CentralStorageStrategy(["/cpu:0", "/cpu:1"], parameter_device="/cpu:0")
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(4, activation="relu"), tf.keras.layers.Dense(1)])  # no Input
    optimizer = tf.keras.optimizers.SGD(0.1)
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
    print("ok: the model's variables created in the distributed step")
except Exception as exc:  # noqa: BLE001
    print(f"deviation: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
