"""Known deviations keras3-metric-state-per-replica-before-3.7 and
keras3-metric-state-mirrored-sum-before-3.10 (see known_deviations.toml).

A Keras Mean created under MirroredStrategy with two replicas, updated inside strategy.run with
one value per replica: [1, 3] then [10, 30]. Metric state should be sync-on-read SUM (each
replica accumulates its own copy, a cross-replica read sums them): result() 2.0 after the
first batch and 11.0 after the second, and read inside strategy.run each replica's own mean
(1.0 and 3.0, then 5.5 and 16.5). Keras 3.10.0 does this (keras-team/keras PR 21072).
- Keras 3.0-3.6: MirroredVariables with aggregation NONE: each replica writes its own copy and
  result() reads replica 0's: 1.0, then 5.5.
- Keras 3.7-3.9: MirroredVariables with aggregation SUM (keras-team/keras PR 20541), written as
  assign(self + v): new = replicas * old + sum of the increments on every copy: 2.0, then
  (2 * 4 + 40) / (2 * 2 + 2) = 8.0, and every replica reads that.
Run: python this_file.py (prints what it sees; exit 1 where the state is not sync-on-read or a
read differs from the sync-on-read values)
"""

import sys

import keras
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    mean = keras.metrics.Mean(dtype="float64")
state = [v.value if not isinstance(v, tf.Variable) else v for v in mean.variables]


@tf.function
def step(values):
    def replica_fn():
        r = tf.distribute.get_replica_context().replica_id_in_sync_group
        mean.update_state(tf.gather(values, r)[None])
        return tf.identity(mean.result())
    return strategy.run(replica_fn)


types = sorted({type(v).__name__ for v in state})
print(f"Keras {keras.__version__}: state variables {types}, aggregation {state[0].aggregation.name}, "
      f"synchronization {state[0].synchronization.name}")
ok = types == ["SyncOnReadVariable"]
for values, expected, in_replica_expected in (([1.0, 3.0], 2.0, [1.0, 3.0]), ([10.0, 30.0], 11.0, [5.5, 16.5])):
    in_replica = [float(x) for x in strategy.experimental_local_results(step(tf.constant(values, tf.float64)))]
    result = float(mean.result())
    print(f"after {values}: result() {result} (sync-on-read: {expected}); inside strategy.run {in_replica} "
          f"(sync-on-read: {in_replica_expected}); copies of total "
          f"{[float(c) for c in strategy.experimental_local_results(state[0])]}")
    ok = ok and result == expected and in_replica == in_replica_expected
sys.exit(0 if ok else 1)
