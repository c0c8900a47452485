"""Keras building blocks inside ``strategy.run`` that need a step of their own (the optimizer
options go through training.train): BatchNormalization, synchronized or not, and the
mixed-precision guide's loop with loss scaling."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ...common import results
from ...common.catalog import OPTIMIZERS
from .. import compat
from ..steps import arch_key, load, optimizer_state
from .common import counted, failed, replica_slice
from .registry import probe


def _batch_norm_layer(ctx, synchronized, dtype, features, momentum, epsilon):
    strategy = ctx.strategy
    with strategy.scope():
        kwargs = {"axis": -1, "epsilon": epsilon, "dtype": dtype, "momentum": momentum}
        if synchronized:
            kwargs["synchronized"] = True  # Keras 2.15 has it too (SyncBatchNormalization is deprecated)
        layer = compat.keras.layers.BatchNormalization(**kwargs)
        layer.build((None, features))

    @tf.function(input_signature=[tf.TensorSpec([None, features], dtype), tf.TensorSpec([None], tf.int32)])
    def step(x, sizes):
        counted(ctx, "blocks.batch_norm")
        return strategy.run(lambda: layer(replica_slice(sizes, x)[0], training=True))

    return layer, step


@probe
def batch_norm(ctx, synchronized, dtype, batches, sizes, momentum, epsilon):
    """A BatchNormalization layer (gamma 1, beta 0, moving mean 0 and variance 1 at the start)
    called in training mode inside ``strategy.run`` on each step's global batch, split by
    ``sizes``; per step every local replica's output and copies of the moving statistics."""
    strategy = ctx.strategy
    features = np.asarray(batches[0]).shape[1]
    layer, step = ctx.cached(("batch_norm", bool(synchronized), dtype, features, momentum, epsilon),
                             lambda: _batch_norm_layer(ctx, synchronized, dtype, features, momentum, epsilon))
    layer.moving_mean.assign(np.zeros(features, dtype))
    layer.moving_variance.assign(np.ones(features, dtype))
    out = []
    for x, split in zip(batches, sizes):
        try:
            y = step(np.asarray(x, dtype), np.asarray(split, np.int32))
        except Exception as exc:
            return failed(ctx, exc, f"blocks.batch_norm(synchronized={synchronized}): step {len(out) + 1}")
        out.append(results.BatchNormStep([t.numpy() for t in strategy.experimental_local_results(y)],
                                 compat.local_values(strategy, layer.moving_mean),
                                 compat.local_values(strategy, layer.moving_variance)))
    return results.BatchNormRun(out, type(compat.tf_variable(layer.moving_mean)).__name__)


def _mixed_precision_trainer(ctx, policy, scale, arch, initial_scale, growth_steps, collective_timeout):
    strategy = ctx.strategy
    original = getattr(strategy.extended, "_communication_options", None)
    with strategy.scope():
        model = compat.keras.Sequential([compat.keras.Input((arch["input_dim"],)),
                                         compat.keras.layers.Dense(arch["outputs"], dtype=policy)])
        opt = compat.loss_scale_optimizer("SGD", {"learning_rate": 0.125}, scale, initial_scale, growth_steps)
        opt.build(model.trainable_variables)  # Keras 3 fails unbuilt inside the first traced step
    initial = optimizer_state(opt)
    seen = {}

    @tf.function(input_signature=[tf.TensorSpec([None, arch["input_dim"]], tf.float32),
                                  tf.TensorSpec([None, arch["outputs"]], tf.float32), tf.TensorSpec([None], tf.int32),
                                  tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.int64)])
    def step(x, y, sizes, poison, gbs):
        counted(ctx, "blocks.mixed_precision")

        def replica(xs, ys):
            rid = tf.distribute.get_replica_context().replica_id_in_sync_group
            with tf.GradientTape() as tape:
                out = model(xs, training=True)
                seen["output"] = out.dtype.name
                per_example = compat.keras.losses.mse(ys, tf.cast(out, tf.float32))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=gbs) * poison[rid]
                scaled = compat.scaled_loss(opt, loss)
            grads = compat.unscaled_gradients(opt, tape.gradient(scaled, model.trainable_variables))
            opt.apply_gradients(zip(grads, model.trainable_variables))

        strategy.run(lambda: replica(*replica_slice(sizes, x, y)))

    def traced(*args):
        """The step, its collectives traced to wait ``collective_timeout`` seconds at most (the
        strategy's CommunicationOptions are read when a collective is traced)."""
        if not collective_timeout or original is None:
            return step(*args)
        strategy.extended._communication_options = original.merge(
            tf.distribute.experimental.CommunicationOptions(timeout_seconds=collective_timeout))
        try:
            return step(*args)
        finally:
            strategy.extended._communication_options = original

    return model, opt, initial, traced, seen


@probe
def mixed_precision(ctx, policy, scale, arch, params, steps, poison, initial_scale, growth_steps,
                    collective_timeout=None):
    """The mixed-precision guide's custom loop: a Dense layer with the dtype policy ``policy``
    (float32 variables), MSE on its output cast to float32, ``compute_average_loss`` with the
    global batch, the loss scaled, the gradients unscaled (Keras 2; Keras 3's apply_gradients
    does it) and applied by a dynamic LossScaleOptimizer or a fixed scale over SGD(0.125). Each
    step's loss is multiplied on each replica by ``poison[step][replica]`` (1, or inf to make
    that replica's gradients non-finite). Per step: every replica's copy of every variable and
    the loss scale. ``collective_timeout``: seconds this step's collectives wait for the other
    workers (a step that deadlocks a cluster then fails sooner)."""
    strategy = ctx.strategy
    where = f"blocks.mixed_precision({policy}, {scale})"
    try:
        model, opt, initial, step, seen = ctx.cached(
            ("mixed_precision", policy, scale, arch_key(arch), initial_scale, growth_steps, collective_timeout),
            lambda: _mixed_precision_trainer(ctx, policy, scale, arch, initial_scale, growth_steps, collective_timeout))
    except Exception as exc:
        return results.Raised.of(exc, f"{where}: building the model and optimizer")
    load(model, params, "float32", opt, initial)
    out = []
    for (x, y, sizes), factors in zip(steps, poison):
        try:
            step(np.asarray(x, np.float32), np.asarray(y, np.float32), np.asarray(sizes, np.int32),
                 np.asarray(factors, np.float32), np.int64(len(x)))
        except Exception as exc:
            return failed(ctx, exc, f"{where}: step {len(out) + 1}")
        out.append(results.ScaledStep([compat.local_values(strategy, v) for v in model.trainable_variables],
                              compat.loss_scale_value(opt)))
    return results.ScaledTraining(out, [compat.tf_variable(v).dtype.name for v in model.trainable_variables],
                          seen.get("output", ""))


def _embedding_trainer(ctx, optimizer, dtype, vocab, dim):
    strategy = ctx.strategy
    with strategy.scope():
        layer = compat.keras.layers.Embedding(vocab, dim, dtype=dtype)
        layer.build((None,))
        cls, cfg = OPTIMIZERS[optimizer]
        opt = compat.make_optimizer(cls, cfg)
        opt.build(layer.trainable_variables)
    initial = optimizer_state(opt)
    seen = {}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32), tf.TensorSpec([None, dim], dtype),
                                  tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int64)])
    def step(indices, targets, sizes, gbs):
        counted(ctx, "blocks.embedding")

        def replica(idx, t):
            with tf.GradientTape() as tape:
                per_example = tf.reduce_sum(tf.square(layer(idx) - t), axis=1)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=gbs)
            grads = tape.gradient(loss, layer.trainable_variables)
            seen["gradient"] = type(grads[0]).__name__
            opt.apply_gradients(zip(grads, layer.trainable_variables))

        strategy.run(lambda: replica(*replica_slice(sizes, indices, targets)))

    return layer, opt, initial, step, seen


@probe
def embedding(ctx, optimizer, dtype, table, steps):
    """An Embedding layer (its table set to ``table``) and the optimizer ``OPTIMIZERS[optimizer]``
    under the scope; each step ``(indices, targets, sizes)`` looks up each replica's indices,
    takes ``compute_average_loss(||row - target||^2, global batch)`` and applies the (sparse)
    gradient. Per step every local replica's copy of the table, and the gradient's class."""
    strategy = ctx.strategy
    table = np.asarray(table, dtype)
    layer, opt, initial, step, seen = ctx.cached(("embedding", optimizer, dtype) + table.shape,
                                                 lambda: _embedding_trainer(ctx, optimizer, dtype, *table.shape))
    load(layer, [table], dtype, opt, initial)
    out = []
    for indices, targets, sizes in steps:
        step(np.asarray(indices, np.int32), np.asarray(targets, dtype), np.asarray(sizes, np.int32),
             np.int64(len(indices)))
        out.append(compat.local_values(strategy, layer.trainable_variables[0]))
    return results.EmbeddingTraining(out, seen.get("gradient", ""))


def _random_step(ctx, kind, seed, shape):
    """A fresh random object of ``kind`` and a traced step drawing from it inside strategy.run:
    a Dropout(0.5) mask of ones, a tf.random.Generator made under the scope, one Generator per
    replica (experimental_distribute_values_from_function, seeded seed + replica id), stateless
    uniforms with the step number and the replica id folded into the seed, or the step number
    only (the same seed on every replica)."""
    strategy = ctx.strategy
    rid = lambda: tf.distribute.get_replica_context().replica_id_in_sync_group  # noqa: E731
    if kind == "dropout":
        with strategy.scope():
            layer = compat.keras.layers.Dropout(0.5, seed=seed)
        fn = lambda: tf.cast(layer(tf.ones(shape), training=True) != 0, tf.int32)  # noqa: E731
    elif kind == "generator":
        with strategy.scope():
            gen = tf.random.Generator.from_seed(seed)
        fn = lambda: gen.normal(shape)  # noqa: E731
    elif kind == "values_from_function":
        gens = strategy.experimental_distribute_values_from_function(
            lambda c: tf.random.Generator.from_seed(seed + c.replica_id_in_sync_group))
        return tf.function(lambda step: strategy.run(lambda g: g.normal(shape), args=(gens,)))
    else:
        base = tf.constant([seed, 0], tf.int64)
        fold = kind == "stateless_fold_in"

        def fn(step):  # the step number folded in, as a loop that wants new numbers each step does
            per_step = tf.random.experimental.stateless_fold_in(base, step)
            return tf.random.stateless_uniform(shape, seed=tf.random.experimental.stateless_fold_in(
                per_step, tf.cast(rid(), tf.int64)) if fold else per_step)

        return tf.function(lambda step: strategy.run(fn, args=(step,)))
    return tf.function(lambda step: strategy.run(fn))


@probe
def random_draws(ctx, kind, seed, shape, steps):
    """Two runs, each with the random object built afresh (seed ``seed``): per step every local
    replica's draw."""
    strategy = ctx.strategy
    runs = []
    for _ in range(2):
        try:
            step = _random_step(ctx, kind, seed, tuple(shape))
            runs.append([[t.numpy() for t in strategy.experimental_local_results(step(tf.constant(s, tf.int64)))]
                         for s in range(steps)])
        except Exception as exc:
            return failed(ctx, exc, f"blocks.random_draws({kind}): run {len(runs) + 1}")
    return results.RandomDraws(runs)
