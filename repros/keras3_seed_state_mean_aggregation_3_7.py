"""Known deviation keras3-seed-state-mean-aggregation-3.7 (see known_deviations.toml).

A Keras Dropout layer created under MirroredStrategy (two logical CPUs), as a model with Dropout
in the custom-training guide is, and under CentralStorageStrategy, then called in training mode
inside strategy.run. Keras 3.7.0 passes every keras.Variable's aggregation on to tf.Variable
(keras/src/backend/tensorflow/core.py: _map_aggregation), and the SeedGenerator of a Dropout
layer makes its integer state with the default "mean". TensorFlow refuses a distributed
variable with MEAN aggregation and a non-floating dtype (tensorflow/python/distribute/values.py:
DistributedVariable.__init__): ValueError "creating distributed tf.Variable with
aggregation=MEAN and a non-floating dtype is not supported" when the layer is made under
MirroredStrategy (keras-team/keras#20611). Under CentralStorageStrategy the state is an
AggregatingVariable: the first draw's assign of the next seed averages the replicas' int64
values into a float64, which it refuses ("Tensor conversion requested dtype int64 for Tensor
with dtype float64"). Keras 3.8.0 makes the seed state with aggregation "none"
(keras-team/keras#20612).
Run: python this_file.py (exit 1 where either strategy raised this deviation's error)
"""

import importlib.metadata
import sys

import tensorflow as tf

tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
import keras  # noqa: E402

version = importlib.metadata.version("keras")
failed = False
for name, strategy in [("MirroredStrategy", tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])),
                       ("CentralStorageStrategy",
                        tf.distribute.experimental.CentralStorageStrategy(["/cpu:0", "/cpu:1"]))]:
    try:
        with strategy.scope():
            layer = keras.layers.Dropout(0.5, seed=1)
    except ValueError as exc:
        print(f"Keras {version}, {name}: creating Dropout raised ValueError: {str(exc).splitlines()[0]}")
        failed = True
        continue
    try:
        out = tf.function(lambda: strategy.run(lambda: layer(tf.ones([4, 8]), training=True)))()  # noqa: B023
    except ValueError as exc:
        if "You must specify an aggregation method" in str(exc):  # Keras 3.0-3.6 and 3.8+: another deviation
            print(f"Keras {version}, {name}: Dropout in training mode raised keras3-central-storage-replica-"
                  "context-updates' error (another known deviation)")
            continue
        print(f"Keras {version}, {name}: Dropout in training mode raised ValueError: {str(exc).splitlines()[0][:160]}")
        failed = True
        continue
    kept = [int(tf.math.count_nonzero(m)) for m in strategy.experimental_local_results(out)]
    print(f"Keras {version}, {name}: Dropout built and ran in strategy.run ({kept} of 32 units kept)")
sys.exit(1 if failed else 0)
