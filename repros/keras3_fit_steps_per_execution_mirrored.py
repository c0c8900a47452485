"""Known deviation keras3-fit-steps-per-execution-mirrored (see known_deviations.toml).

Model.fit compiled with steps_per_execution=2 under MirroredStrategy on two replicas: Keras 3's
multi-step function (keras/src/backend/tensorflow/trainer.py, multi_step_on_iterator) runs
strategy.run inside a tf.cond on whether the iterator still has data, and the first execution
raises InvalidArgumentError "You must feed a value for placeholder tensor
'while/.../cond/Placeholder_1'". steps_per_execution=1 trains.
Run: python this_file.py
"""

import keras
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
x = np.arange(32 * 4, dtype=np.float32).reshape(32, 4) / 100.0
y = x.sum(axis=1, keepdims=True)
for steps_per_execution in (1, 2):
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse", steps_per_execution=steps_per_execution)
    try:
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=1, steps_per_epoch=4, verbose=0)
        print(f"ok: steps_per_execution={steps_per_execution} trains (Keras {keras.__version__})")
    except Exception as exc:  # noqa: BLE001
        lines = [line for line in str(exc).splitlines() if "You must feed" in line] or str(exc).strip().splitlines()
        print(f"deviation: steps_per_execution={steps_per_execution} (Keras {keras.__version__}): "
              f"{type(exc).__name__}: {lines[0].strip()[:160]}")
