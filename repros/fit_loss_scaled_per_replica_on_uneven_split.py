"""Known deviation fit-loss-mean-per-replica-on-uneven-split (see known_deviations.toml).

Model.fit under a strategy of several replicas reduces its compiled loss ("sum_over_batch_size", the
default) to the mean over each replica's own rows and scales it by 1/replicas (Keras 3.8+:
keras/src/losses/loss.py reduce_values, scale_loss_for_distribution; Keras 2 and tf-keras:
engine/compile_utils.py LossesContainer.__call__, losses_utils.scale_loss_for_distribution). The
gradients are summed over the replicas, so where a global batch splits unevenly each example weighs
1 / (replicas x its replica's rows) instead of one device's 1 / global rows: TensorFlow's
custom-training guide divides by the global batch (tf.nn.compute_average_loss) for that reason.

Here one weight w = 1, mse against label 0 on features x: one device's step moves w by
lr * 2 * mean(x^2). Global batch 3 (x = 1, 2, 3) splits [2, 1] on 2 replicas, global batch 1 (x = 3)
splits [1, 0]. Run: python this_file.py (TF_USE_LEGACY_KERAS=1 with tf-keras for Keras 2).
"""

import numpy as np
import tensorflow as tf

tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
keras = tf.keras
LR = 0.01
X = np.array([[1.0], [2.0], [3.0]], np.float32)


def step(strategy, x):
    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
        model.compile(keras.optimizers.SGD(LR), "mse")
    data = tf.data.Dataset.from_tensor_slices((x, np.zeros_like(x))).batch(len(x))
    try:
        model.fit(data, epochs=1, verbose=0)
    except Exception as exc:  # noqa: BLE001 - a repro reports what it saw
        return f"raised {type(exc).__name__}"
    return 1.0 - float(model.trainable_variables[0].numpy().reshape(()))


cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
print(f"Keras {getattr(keras, '__version__', '2 (tf.keras)')}, TF {tf.__version__}")
for x, split in ((X, "[2, 1]"), (X[2:], "[1, 0]")):
    one = step(tf.distribute.OneDeviceStrategy(cpus[0]), x)
    global_mean = LR * 2 * float(np.mean(x.astype(np.float64) ** 2))
    rows = [x[:2], x[2:]] if len(x) == 3 else [x, x[:0]]
    per_replica = LR * 2 * sum(float(np.mean(r.astype(np.float64) ** 2)) / 2 if len(r) else 0.0 for r in rows)
    print(f"global batch {len(x)}: one device moved w by {one:.6g} (global mean: {global_mean:.6g}; "
          f"each replica's mean / 2: {per_replica:.6g})")
    for name, strategy in (("MirroredStrategy", tf.distribute.MirroredStrategy(cpus)),
                           ("CentralStorageStrategy", tf.distribute.experimental.CentralStorageStrategy(cpus))):
        got = step(strategy, x)
        if isinstance(got, str):
            print(f"  {name} split {split}: {got}")
            continue
        which = ("one device's" if abs(got - global_mean) < 1e-6 else
                 "deviation: each replica's mean / 2" if abs(got - per_replica) < 1e-6 else "neither")
        print(f"  {name} split {split}: moved w by {got:.6g} ({which})")
