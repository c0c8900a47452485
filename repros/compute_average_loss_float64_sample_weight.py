"""Known deviation compute-average-loss-float64-sample-weight (see known_deviations.toml).

tf.nn.compute_average_loss returns float64 for float64 losses, but with a sample_weight it
multiplies them in float32 (tensorflow/python/ops/losses/util.py,
scale_losses_by_sample_weight casts losses and weights to float32), so the result carries
float32 rounding. Expected (numpy float64): 1.0571962173557348. Run: python this_file.py
"""

import numpy as np
import tensorflow as tf

losses = tf.constant([1.0], tf.float64)
weight = tf.constant(1.0571962173557348, tf.float64)
got = tf.nn.compute_average_loss(losses, sample_weight=weight).numpy()
expected = float(np.float64(1.0) * np.float64(1.0571962173557348))
print(f"got {got!r} ({tf.nn.compute_average_loss(losses, sample_weight=weight).dtype.name}), "
      f"expected {expected!r}, difference {got - expected:.3g}")
