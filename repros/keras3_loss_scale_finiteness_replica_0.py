"""Known deviation keras3-loss-scale-finiteness-from-replica-0 (see known_deviations.toml).

The mixed-precision guide's custom loop under MirroredStrategy on 2 CPU replicas: Dense(1)
with the mixed_float16 policy, a dynamic LossScaleOptimizer over SGD(0.125), the loss times
inf on replica 1 only (its gradients non-finite). One device would skip the step and halve the
scale (as Keras 2.15 does here). Keras 3 judges finiteness on replica 0's own gradients: it
applies the step (every replica's kernel becomes -inf), keeps the scale and counts the step
as finite. With inf on replica 0 it skips. Run: python this_file.py
"""

import numpy as np
import tensorflow as tf

keras = tf.keras
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
K3 = hasattr(keras, "version") and keras.version().startswith("3")
for bad in (1, 0):
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, dtype="mixed_float16",
                                                                         kernel_initializer="ones")])
        opt = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.125))
        opt.build(model.trainable_variables)

    @tf.function
    def step():
        def fn():
            rid = tf.distribute.get_replica_context().replica_id_in_sync_group
            x = tf.constant([[0.5, 0.25]]) if bad else tf.constant([[0.125, 1.0]])
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.cast(model(x), tf.float32))
                loss *= tf.where(tf.equal(rid, bad), np.float32(np.inf), np.float32(1.0))
                scaled = opt.scale_loss(loss) if K3 else opt.get_scaled_loss(loss)
            grads = tape.gradient(scaled, model.trainable_variables)
            if not K3:
                grads = opt.get_unscaled_gradients(grads)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        strategy.run(fn)

    step()
    kernel = model.trainable_variables[0]
    kernel = kernel.value if K3 else kernel
    scale = opt.dynamic_scale if K3 else opt.loss_scale
    print(f"inf on replica {bad}: kernel copies",
          [np.asarray(tf.convert_to_tensor(c)).ravel().tolist() for c in strategy.experimental_local_results(kernel)],
          "scale", float(tf.convert_to_tensor(scale)), "(one device: kernel unchanged [1, 1], scale 16384)")
