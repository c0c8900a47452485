"""One training loop per mistake the check diagnoses, each a factory of the workload protocol
(suite/engine/workload.py). ``right`` is the loop done right; every other factory is ``right``
with one mistake a user makes in a custom loop under a strategy, named after the cause the check
reports (suite/harness/loopcheck/causes.py: CAUSES). On one device every one of them trains as
``right`` does (except where the mistake is about one device's batch); under a strategy each
trains something else.

    python -m suite.check examples.mistakes:loss_averaged_per_replica --strategies mirrored:2

The model is a small MLP classifier (8 inputs, 16 hidden units with an L2 penalty, 3 classes)
on deterministic data, trained with SGD, so a wrong factor shows in the weights at once.
"""

import numpy as np
import tensorflow as tf

from suite.engine.workload import Workload

keras = tf.keras
KERAS3 = int(getattr(keras, "__version__", "2").split(".")[0]) >= 3
EXAMPLES = 144  # three global batches of 48
SHORT = 119  # two of 48 and a short one of 23, split unevenly by 2, 3 and 4 replicas


def data(n: int = EXAMPLES, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = np.argmax(x @ rng.normal(size=(8, 3)), axis=1).astype(np.int64)
    return x, y


class FixedSeedDropout(keras.layers.Dropout):
    """A user's dropout with a fixed stateless seed: every replica (and every step) draws the
    same mask."""

    def call(self, inputs, training=False):
        if training and self.rate > 0:
            return tf.nn.experimental.stateless_dropout(inputs, rate=self.rate, seed=[7, 7])
        return inputs


class RunningCenter(keras.layers.Layer):
    """Subtracts a running mean of its inputs kept in an ON_READ variable: under a strategy each
    replica updates its own copy from its own batch and centers with it."""

    def build(self, shape):
        if KERAS3:
            self.center = keras.Variable(np.zeros(shape[-1], np.float32), trainable=False, name="center",
                                         synchronization="on_read", aggregation="mean")
        else:
            self.center = self.add_weight(name="center", shape=(shape[-1],), initializer="zeros", trainable=False,
                                          synchronization=tf.VariableSynchronization.ON_READ,
                                          aggregation=tf.VariableAggregation.MEAN)

    def call(self, x, training=False):
        if training:
            self.center.assign(0.5 * self.center + 0.5 * tf.reduce_mean(x, axis=0))
        return x - self.center


def _model(batch_norm=False, dropout=False, center=False, keras_dropout=False):
    layers = [keras.Input((8,))]
    if center:
        layers.append(RunningCenter())
    layers.append(keras.layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.L2(0.01)))
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    if dropout:
        layers.append(FixedSeedDropout(0.3))
    if keras_dropout:
        layers.append(keras.layers.Dropout(0.3, seed=1))
    layers.append(keras.layers.Dense(3))
    return keras.Sequential(layers)


OUTSIDE_OPTIMIZER = keras.optimizers.SGD(0.1)  # made at import: outside any strategy's scope


def _loop(ctx, mistake=None, n=EXAMPLES, keras_dropout=False, from_function=False):
    model = _model(batch_norm=mistake == "per_replica_batch_norm", dropout=mistake == "identical_dropout_masks",
                   center=mistake == "replicas_disagree", keras_dropout=keras_dropout)
    if mistake == "created_outside_scope":
        optimizer = OUTSIDE_OPTIMIZER
    elif mistake == "lazy_optimizer_build":
        optimizer = keras.optimizers.Adam(0.01)  # slots: made in the first apply_gradients, unless built here
    else:
        optimizer = keras.optimizers.SGD(0.1)
    if mistake != "lazy_optimizer_build":
        optimizer.build(model.trainable_variables)
    reduction = "sum_over_batch_size" if mistake == "keras_loss_reduction" else "none"
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
    mean_loss = keras.metrics.Mean(name="loss")
    # a counter of the user's own, made in the scope with the default aggregation (NONE)
    seen = tf.Variable(0.0, trainable=False, name="examples_seen") if mistake == "assign_add_without_aggregation" \
        else None
    x, y = data(n)
    batch = ctx.per_replica_batch_size if mistake == "per_replica_batch_size" else ctx.global_batch_size

    def dataset(global_batch_size, input_context):
        if from_function:  # distribute_datasets_from_function: this pipeline's share, per-replica batches
            ds = tf.data.Dataset.from_tensor_slices((x, y))
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
            return ds.batch(input_context.get_per_replica_batch_size(global_batch_size))
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)

    def step(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            if mistake == "loss_averaged_per_replica":
                loss = tf.reduce_mean(per_example)
            elif mistake == "keras_loss_reduction":
                loss = loss_object(labels, logits)  # the object's own reduction: one number per replica
            elif mistake == "short_batch_weighted_differently":
                loss = tf.nn.compute_average_loss(per_example)  # default: replicas x this replica's batch
            else:
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=ctx.global_batch_size)
            if mistake == "loss_divided_twice":
                loss = loss / ctx.num_replicas_in_sync
            if mistake == "loss_scaled_by_root_replicas":  # no catalogued cause: a stray sqrt(replicas)
                loss = loss * ctx.num_replicas_in_sync ** 0.5
            if mistake == "regularization_not_scaled":
                loss += tf.add_n(model.losses)
            else:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        gradients = tape.gradient(loss, model.trainable_variables)
        if mistake == "clipped_before_aggregation":
            gradients, _ = tf.clip_by_global_norm(gradients, 0.01)
        if mistake == "reduced_on_one_worker_only":  # a collective only the first worker enters: a deadlock
            context = tf.distribute.get_replica_context()
            resolver = getattr(ctx.strategy, "cluster_resolver", None)
            if resolver is not None and resolver.task_id == 0:
                gradients = [g / ctx.num_replicas_in_sync for g in context.all_reduce(tf.distribute.ReduceOp.SUM,
                                                                                        gradients)]
        if seen is not None:
            seen.assign_add(tf.cast(tf.shape(features)[0], tf.float32))
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        mean_loss.update_state(loss if mistake == "metric_fed_scaled_loss" else per_example)
        return loss

    return Workload(model, optimizer, loss_object, dataset, step=step, metrics={"loss": mean_loss},
                    loss_reduction="MEAN" if mistake == "reduce_mean_for_sum" else "SUM",
                    distribute="function" if from_function else "dataset")


def right(ctx):
    return _loop(ctx)


def right_from_function(ctx):
    """``right`` fed by ``distribute_datasets_from_function``: each input pipeline takes its shard
    of the examples and batches it with the per-replica size (one pipeline per worker)."""
    return _loop(ctx, from_function=True)


def right_with_dropout(ctx):
    """``right`` with Keras' own Dropout(0.3): no mistake. Where the installed Keras draws one mask
    for several replicas (known deviations keras3-dropout-mask-shared-by-replicas,
    keras2-dropout-mask-shared-across-workers) the check reports that deviation."""
    return _loop(ctx, keras_dropout=True)


def assign_add_without_aggregation(ctx):
    """``right`` that also counts its examples in a tf.Variable of its own, made in the scope with
    no aggregation: under CentralStorage its assign_add inside strategy.run raises (the loop's
    error: the same message Keras' own layers raise there, from another frame)."""
    return _loop(ctx, "assign_add_without_aggregation")


def reduced_on_one_worker_only(ctx):
    """``right`` whose step all-reduces its gradients on the first worker only: on two workers the
    first waits in a collective the other never enters (a deadlock of the loop's own)."""
    return _loop(ctx, "reduced_on_one_worker_only")


def dropout_and_loss_scaled_by_root_replicas(ctx):
    """``right_with_dropout`` with a stray factor sqrt(replicas) on the loss (1 on one device): a
    mistake no cause names, under specs where Keras' own Dropout draws one mask for several
    replicas (a known deviation)."""
    return _loop(ctx, "loss_scaled_by_root_replicas", keras_dropout=True)


MISTAKES = ("loss_averaged_per_replica", "loss_divided_twice", "regularization_not_scaled", "metric_fed_scaled_loss",
            "keras_loss_reduction", "created_outside_scope", "lazy_optimizer_build", "clipped_before_aggregation",
            "per_replica_batch_norm", "identical_dropout_masks", "per_replica_batch_size",
            "short_batch_weighted_differently", "reduce_mean_for_sum", "replicas_disagree")


def _factory(mistake):
    def factory(ctx):
        short = mistake in ("short_batch_weighted_differently", "keras_loss_reduction")
        return _loop(ctx, mistake, n=SHORT if short else EXAMPLES)

    factory.__name__ = factory.__qualname__ = mistake
    factory.__doc__ = f"``right`` with one mistake: {mistake.replace('_', ' ')}."
    return factory


for _mistake in MISTAKES:
    globals()[_mistake] = _factory(_mistake)
