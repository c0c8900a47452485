"""Known deviation central-storage-drops-partial-step (see known_deviations.toml).

distribute_datasets_from_function: the per-worker dataset's elements go to the replicas one
whole element each. With 3 elements on 2 replicas MirroredStrategy delivers 2 steps, the
second padded with an empty batch; CentralStorageStrategy delivers only the first step, so
element [2] never reaches a replica. Run: python this_file.py
"""

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
for strategy in (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
                 tf.distribute.experimental.CentralStorageStrategy(["/cpu:0", "/cpu:1"], parameter_device="/cpu:0")):
    dist = strategy.distribute_datasets_from_function(lambda ctx: tf.data.Dataset.range(3).batch(1))
    steps = [[v.numpy().tolist() for v in strategy.experimental_local_results(x)] for x in dist]
    print(f"{type(strategy).__name__}: {steps}")
