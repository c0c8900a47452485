"""Known deviation keras3-schedule-free-adamw-replica-copies-diverge (see known_deviations.toml).

Keras 3 ScheduleFreeAdamW, created under a MirroredStrategy scope (4 virtual CPUs,
ReductionToOneDevice) and first applied inside a distributed tf.function step: the lazy
build() copies each model variable into its `momentum` slot with optimizer.assign() in
replica context, and only replica 0 runs build(), so only replica 0's copy of each momentum
is set; the others keep the zero initializer. The first update then sets every replica's
kernel to its own momentum, so after step 1 the kernel (and momentum) copies differ
(bias is unaffected: its initial value is zero). With the default cross-device ops
(CollectiveAllReduce) the step fails instead (deviation keras3-lazy-optimizer-slots-mirrored).
Run: python this_file.py  [REPLICAS=2] [CROSS_DEVICE_OPS=default] [BUILD=eager: build()
under the scope first, which keeps the copies equal]
"""

import os

import keras
import numpy as np
import tensorflow as tf

n = int(os.environ.get("REPLICAS", "4"))
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
devices = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(n)]
ops = None if os.environ.get("CROSS_DEVICE_OPS") == "default" else tf.distribute.ReductionToOneDevice()
strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
with strategy.scope():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.ScheduleFreeAdamW()
    if os.environ.get("BUILD") == "eager":
        optimizer.build(model.trainable_variables)
x = tf.constant([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [-2.0, 1.0]])
y = tf.constant([[1.0], [0.0], [2.0], [-1.0]])
used = strategy.extended._cross_device_ops or strategy.extended._inferred_cross_device_ops
print(f"keras {keras.__version__}, tf {tf.__version__}, {n} replicas, {type(used).__name__}")


@tf.function
def step():
    def replica_fn():
        with tf.GradientTape() as tape:
            per_example = keras.losses.mean_squared_error(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=4)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss
    return strategy.run(replica_fn)


for s in (1, 2):
    try:
        step()
    except Exception as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if "You must" in ln] or [str(exc)[:300]]
        print(f"step {s}: {type(exc).__name__}: {lines[0][:200]}")
        break
    differ = []
    for v in list(optimizer.variables) + list(model.trainable_variables):
        copies = [tf.convert_to_tensor(c).numpy() for c in strategy.experimental_local_results(v.value)]
        diff = max(float(np.max(np.abs(c - copies[0]))) for c in copies)
        if diff:
            differ.append(f"  {v.path}: max |copy_i - copy_0| = {diff:.4g}; copies "
                          + " | ".join(np.array2string(c.ravel(), precision=4) for c in copies))
    print(f"after step {s}: {len(differ)} of {len(optimizer.variables) + len(model.trainable_variables)} "
          f"variables have differing replica copies (iterations = {int(optimizer.iterations.numpy())})")
    print("\n".join(differ)) if differ else None
