"""Known deviation compute-average-loss-empty-replica-before-2.13 (see known_deviations.toml).

tf.nn.compute_average_loss with its default denominator (replicas x local batch) on a replica
that got no rows: TF 2.12 asserts the denominator positive and divides with `/`, so the step
raises InvalidArgumentError "global_batch_size must be positive", and compiled with XLA (which
drops the assertion) gives 0/0 = NaN. TF 2.13 and later return 0 (div_no_nan; TF 2.15's docstring:
"If `global_batch_size` is zero, the result is zero."). Expected: replica 0 (no rows) 0.0, replica 1
(losses 1 and 2) 3 / (2 x 2) = 0.75. Run: python this_file.py
"""

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
losses = tf.constant([1.0, 2.0])


def replica_fn():
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    mine = losses[: 2 * tf.cast(replica, tf.int32)]  # replica 0: no rows, replica 1: both
    return tf.nn.compute_average_loss(mine)


print("TensorFlow", tf.__version__, "expected [0.0, 0.75]")
for jit in (None, True):
    try:
        result = tf.function(lambda: strategy.run(replica_fn), jit_compile=jit)()
        print(f"jit_compile={jit}:", [float(v) for v in strategy.experimental_local_results(result)])
    except tf.errors.InvalidArgumentError as exc:
        found = "global_batch_size must be positive" in exc.message
        print(f"jit_compile={jit}: InvalidArgumentError" + (": global_batch_size must be positive" if found else ""))
