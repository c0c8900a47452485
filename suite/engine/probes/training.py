"""Training probes: custom-loop steps of the model family under the strategy, reading every
replica's copy of every variable after every step; optimizer variables created lazily."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from suite.common.catalog import OPTIMIZERS
from suite.engine import compat, mutants
from suite.engine.probes.common import counted, local, replica_slice
from suite.engine.probes.registry import probe

SUM = tf.distribute.ReduceOp.SUM


def _model_and_optimizer(ctx, arch, optimizer, dtype):
    """The model family member and the optimizer of ``OPTIMIZERS[optimizer]``, created under the
    strategy's scope and built eagerly (see known deviation keras3-lazy-optimizer-slots-mirrored)."""
    with ctx.strategy.scope():
        model = compat.build_model(arch, dtype)
        cls, cfg = OPTIMIZERS[optimizer]
        opt = compat.make_optimizer(cls, cfg)
        opt.build(model.trainable_variables)
    return model, opt


def _trainer(ctx, arch, optimizer, dtype, default_denominator, metrics=None):
    """Model, optimizer (built eagerly, its initial state snapshotted) and traced step.

    With ``metrics`` (a dict to fill), the step also updates, on each replica, a Mean of the
    per-example losses and an int64 Sum counting examples (sync-on-read state)."""
    strategy = ctx.strategy
    model, opt = _model_and_optimizer(ctx, arch, optimizer, dtype)
    if metrics is not None:
        with strategy.scope():
            metrics["loss"] = compat.make_metric("mean", dtype)
            metrics["examples"] = compat.make_metric("sum", "int64")
    initial = [np.array(v.numpy()) for v in compat.optimizer_variables(opt)]  # restored per call
    y_dtype = tf.int32 if arch["head"] == "softmax" else tf.as_dtype(dtype)
    y_shape = [None] if arch["head"] == "softmax" else [None, arch["outputs"]]

    @tf.function(input_signature=[tf.TensorSpec([None, arch["input_dim"]], dtype),
                                  tf.TensorSpec(y_shape, y_dtype), tf.TensorSpec([None], tf.int32),
                                  tf.TensorSpec([], tf.int64)])
    def step(x, y, sizes, gbs):
        counted(ctx, "training.train")

        def replica_fn():
            xs, ys = replica_slice(sizes, x, y)
            with tf.GradientTape() as tape:
                out = model(xs, training=True)
                per_example = compat.per_example_loss(arch["head"], ys, out)
                loss = tf.nn.compute_average_loss(
                    per_example, global_batch_size=None if default_denominator else gbs)
                if model.losses:
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            if metrics is not None:
                metrics["loss"].update_state(per_example)
                metrics["examples"].update_state(tf.shape(xs, out_type=tf.int64)[:1])
            grads = tape.gradient(loss, model.trainable_variables)
            if mutants.on("double_gradient_aggregation"):
                grads = tf.distribute.get_replica_context().all_reduce(SUM, grads)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.reduce(SUM, strategy.run(replica_fn), axis=None)

    return model, opt, initial, step


@probe
def train(ctx, arch, optimizer, dtype, params, steps, denominator="global"):
    """Set the model's parameters, reset the optimizer, run the steps ``(x, y, sizes)``;
    return per step the SUM-reduced loss and every local replica's copy of every variable,
    and at the end the optimizer's iteration count."""
    key = ("train", tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in arch.items())),
           optimizer, dtype, denominator)
    model, opt, initial, step = ctx.cached(
        key, lambda: _trainer(ctx, arch, optimizer, dtype, denominator == "default"))
    for var, value in zip(model.trainable_variables, params):
        var.assign(np.asarray(value, dtype))
    for var, value in zip(compat.optimizer_variables(opt), initial):
        var.assign(value)
    history = []
    for x, y, sizes in steps:
        loss = step(x, y, np.asarray(sizes, np.int32), np.int64(len(x)))
        history.append({"loss": loss,
                        "params": [compat.local_values(ctx.strategy, v) for v in model.trainable_variables]})
    return {"history": history, "iterations": int(compat.tf_variable(opt.iterations).numpy())}


@probe
def lazy_optimizer(ctx, name):
    """A fresh model and optimizer ``name`` (default arguments) created under the scope; the
    first ``apply_gradients`` runs inside a distributed tf.function step and so creates the
    optimizer's variables there. Returns what was created and whether copies agree."""
    strategy = ctx.strategy
    with strategy.scope():
        model = compat.build_model({"input_dim": 2, "hidden": [], "outputs": 1, "head": "linear", "l2": 0.0},
                                   "float32")
        opt = getattr(compat.keras.optimizers, name)()
    before = [v.numpy() for v in model.trainable_variables]
    x = tf.constant([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [-2.0, 1.0]])
    y = tf.constant([[1.0], [0.0], [2.0], [-1.0]])

    @tf.function
    def step():
        def replica_fn():
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(
                    compat.keras.losses.mse(y, model(x)), global_batch_size=4)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return strategy.run(replica_fn)

    try:
        step()
        step()
    except Exception as exc:
        if isinstance(exc, tf.errors.OpError):
            ctx.request_restart()  # a failed collective poisons a multi-worker cluster
        text = " ".join(str(exc).split())
        return {"raised": type(exc).__name__, "message": text if len(text) < 400 else text[:120] + " ... " + text[-280:]}
    variables = compat.optimizer_variables(opt)
    copies_agree = all(
        all(np.array_equal(c, local(strategy, compat.tf_variable(v))[0]) for c in local(strategy, compat.tf_variable(v)))
        for v in list(variables) + list(model.trainable_variables))
    return {"n_variables": len(variables),
            "iterations": int(compat.tf_variable(opt.iterations).numpy()),
            "distributed": sorted({type(compat.tf_variable(v)).__name__ for v in variables}),
            "copies_agree": copies_agree,
            "changed": any(not np.array_equal(b, v.numpy()) for b, v in zip(before, model.trainable_variables))}


@probe
def optimizer_names(ctx):
    return compat.builtin_optimizer_names()


@probe
def train_dataset(ctx, arch, optimizer, dtype, params, x, y, global_batch, epochs, denominator):
    """Train from ``experimental_distribute_dataset(from_tensor_slices((x, y)).batch(G))`` for
    ``epochs`` epochs, with ``compute_average_loss(global_batch_size=G)`` (``denominator="constant"``,
    the guide's GLOBAL_BATCH_SIZE) or its default; return every replica's copy of every
    variable after each epoch, and each step's replica batch sizes."""
    strategy = ctx.strategy
    model, opt = _model_and_optimizer(ctx, arch, optimizer, dtype)
    for var, value in zip(model.trainable_variables, params):
        var.assign(np.asarray(value, dtype))
    dist = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch))

    def replica_fn(xs, ys):
        with tf.GradientTape() as tape:
            per_example = compat.per_example_loss(arch["head"], ys, model(xs, training=True))
            loss = tf.nn.compute_average_loss(
                per_example, global_batch_size=global_batch if denominator == "constant" else None)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return tf.shape(xs)[0]

    @tf.function
    def step(batch):
        counted(ctx, "training.train_dataset")
        return strategy.run(replica_fn, args=batch)

    epochs_out = []
    for _ in range(epochs):
        sizes = [[int(n) for n in local(strategy, step(batch))] for batch in dist]
        epochs_out.append({"sizes": sizes,
                           "params": [compat.local_values(strategy, v) for v in model.trainable_variables]})
    return {"epochs": epochs_out}
