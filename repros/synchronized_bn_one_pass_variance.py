"""Known deviation synchronized-bn-one-pass-variance (see known_deviations.toml).

BatchNormalization(synchronized=True) all-reduces sum(x) and sum(x^2) and takes the variance
as E[x^2] - E[x]^2, in one pass: for a feature with a large mean and a small spread that
difference cancels. Column 0 below is 1e4 + [0.1, 0.2, 0.3, 0.4] in float32 on 2 replicas
split [3, 1]: the exact variance is 0.0125489; Keras 2.15 computes -8 (outputs NaN), Keras 3
clamps it to 0 (outputs about 4x too large). Unsynchronized layers (two passes) are accurate.
In float64 the same cancellation leaves relative errors of 1e-6..1e-3 (the suite's property).
Run: python this_file.py
"""

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
x = np.stack([1e4 + np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.1, 0.2, 0.3, 0.4])], axis=1).astype(np.float32)
with strategy.scope():
    layer = tf.keras.layers.BatchNormalization(momentum=0.5, epsilon=1e-3, synchronized=True)
    layer.build((None, 2))
parts = [x[:3], x[3:]]
xs = strategy.experimental_distribute_values_from_function(lambda ctx: tf.constant(parts[ctx.replica_id_in_sync_group]))
y = tf.function(lambda xs: strategy.run(lambda v: layer(v, training=True), args=(xs,)))(xs)
exact = (x.astype(np.float64) - x.astype(np.float64).mean(0)) / np.sqrt(x.astype(np.float64).var(0) + 1e-3)
print("outputs:", np.concatenate([t.numpy() for t in strategy.experimental_local_results(y)]).tolist())
print("exact:  ", exact.tolist())
mv = [np.asarray(tf.convert_to_tensor(c)) for c in strategy.experimental_local_results(
    layer.moving_variance.value if hasattr(layer.moving_variance, "value") and not isinstance(
        layer.moving_variance, tf.Variable) else layer.moving_variance)]
print("implied batch variance (moving_variance - 0.5) / 0.5:", [((m - 0.5) / 0.5).tolist() for m in mv],
      "exact:", x.astype(np.float64).var(0).tolist())
