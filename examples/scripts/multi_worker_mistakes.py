"""Multi-worker training scripts in the shape of TensorFlow's multi-worker custom-loop tutorial (TF_CONFIG
read for the workers and this worker's rank, datasets made per input pipeline, the chief writing
checkpoints), each right or with one mistake only a cluster can make: ``--case NAME`` picks one.

    tf-distribute-check examples/scripts/multi_worker_mistakes.py --strategies multi_worker:2x1 \
        -- --case input_not_sharded_per_worker

A case named after a cause is a mistake the check must name so on a multi-worker spec. On a spec of
one process the cluster's mistakes change nothing (one input pipeline, one rank), so they train what
one device trains there. The cases in SAME_ON_ONE_DEVICE are mistakes that train alike on one device
and on N workers, so the check cannot tell them apart (docs/check.md). Without TF_CONFIG the script
is a cluster of one worker. A small classifier on generated data (nothing is downloaded).
"""

import argparse
import json
import os
import tempfile

import numpy as np
import tensorflow as tf

CASES = ("right", "right_chief_writes_checkpoints", "global_batch_not_scaled_by_workers",
         "input_not_sharded_per_worker", "replicas_disagree", "loss_averaged_per_replica",
         "shuffled_per_worker_before_sharding", "dataset_sharded_twice")
# mistakes that train the same on one device told the workers as on the workers: not seen by the check
SAME_ON_ONE_DEVICE = ("global_batch_not_scaled_by_workers",)
parser = argparse.ArgumentParser()
parser.add_argument("--case", choices=CASES, default="right")
case = parser.parse_args().case

per_worker_batch_size = 16
tf_config = json.loads(os.environ.get("TF_CONFIG") or '{"cluster": {"worker": ["localhost:0"]}, "task": {"index": 0}}')
num_workers = len(tf_config["cluster"]["worker"])
task_index = tf_config["task"]["index"]
global_batch_size = per_worker_batch_size * (1 if case == "global_batch_not_scaled_by_workers" else num_workers)

rng = np.random.default_rng(13)
features = rng.normal(size=(512, 10)).astype(np.float32)
labels = rng.integers(0, 4, size=512)


def dataset_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    if case == "shuffled_per_worker_before_sharding":  # no seed: each worker, a process, shuffles its own way
        dataset = dataset.shuffle(512)
    else:
        dataset = dataset.shuffle(512, seed=1)
    if case == "dataset_sharded_twice":  # by TF_CONFIG's rank here, and by the input pipeline below
        dataset = dataset.shard(num_workers, task_index)
    if case != "input_not_sharded_per_worker":  # every worker reads all of it: the same examples on each
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.batch(batch_size)


strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input((10,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(4)])
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.1)
    optimizer.build(model.trainable_variables)
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
dist_dataset = strategy.distribute_datasets_from_function(dataset_fn)
is_chief = task_index == 0
checkpoint = tf.train.Checkpoint(model=model)
checkpoint_dir = "ckpt" if is_chief else os.path.join(tempfile.gettempdir(), f"workertemp_{task_index}")


@tf.function
def train_step(iterator):
    def step_fn(inputs):
        x, y = inputs
        with tf.GradientTape() as tape:
            per_example_loss = loss_object(y, model(x, training=True))
            if case == "loss_averaged_per_replica":
                loss = tf.reduce_mean(per_example_loss)
            else:
                loss = tf.nn.compute_average_loss(per_example_loss)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=(next(iterator),)), axis=None)


iterator = iter(dist_dataset)
for step in range(8):
    loss = train_step(iterator)
    if case == "replicas_disagree" and is_chief:  # the learning rate decayed by the chief alone
        optimizer.learning_rate.assign(optimizer.learning_rate * 0.5)
    if case == "right_chief_writes_checkpoints":  # every worker saves (a collective); the others' copies go away
        checkpoint.write(os.path.join(checkpoint_dir, "model"))
        if not is_chief:
            tf.io.gfile.rmtree(checkpoint_dir)
    print(f"step {step + 1}: loss {float(loss):.4f}")
