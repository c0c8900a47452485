"""Keras building blocks inside ``strategy.run`` that are layers rather than optimizer options
(the optimizer options go through training.train): BatchNormalization, synchronized or not."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from suite.common.results import BatchNormRun, BatchNormStep, Raised
from suite.engine import compat, mutants
from suite.engine.probes.common import counted, replica_slice
from suite.engine.probes.registry import probe


def _batch_norm_layer(ctx, synchronized, dtype, features, momentum, epsilon):
    strategy = ctx.strategy
    with strategy.scope():
        kwargs = {"axis": -1, "epsilon": epsilon, "dtype": dtype,
                  "momentum": 1 - momentum if mutants.on("bn_momentum_inverted") else momentum}
        if synchronized and not mutants.on("bn_not_synchronized"):
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
            if isinstance(exc, tf.errors.OpError):
                ctx.request_restart()  # a failed collective poisons a multi-worker cluster
            return Raised.of(exc, f"blocks.batch_norm(synchronized={synchronized}): step {len(out) + 1}")
        out.append(BatchNormStep([t.numpy() for t in strategy.experimental_local_results(y)],
                                 compat.local_values(strategy, layer.moving_mean),
                                 compat.local_values(strategy, layer.moving_variance)))
    return BatchNormRun(out, type(compat.tf_variable(layer.moving_mean)).__name__)
