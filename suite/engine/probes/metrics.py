"""Metric probes: Keras metrics updated inside ``strategy.run``, read in both contexts."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ...common.results import MetricReads
from .. import compat
from .common import counted, failed, local, replica_slice, spec_of
from .registry import probe


def update_and_read(metric, kind, y_true, y_pred):
    """A replica's batch added to ``metric`` (a Mean or Sum takes the values alone), then its result
    read in that replica."""
    metric.update_state(y_true, y_pred) if kind not in ("mean", "sum") else metric.update_state(y_pred)
    return tf.identity(metric.result())


def read_metric(metric):
    """The metric's result read in cross-replica context (its replicas' states reduced)."""
    return metric.result()


@probe
def update(ctx, kind, batches, dtype, jit="none"):
    """Reset a metric, then for each ``(y_true, y_pred, sizes)`` batch update it on every
    replica's slice inside ``strategy.run`` and read ``result()`` there (replica context).
    Returns those in-replica reads per batch and ``result()`` read in cross-replica context.
    ``jit``: compiled with XLA around the replica function (``replica``) or the whole step
    (``step``); a step that raises then comes back as the exception (Raised)."""
    strategy = ctx.strategy
    y0, p0, _ = batches[0]
    key = ("metric", kind, dtype, y0.dtype.name, y0.shape[1:], p0.shape[1:], jit)

    def build():
        with strategy.scope():
            metric = compat.make_metric(kind, dtype)

        @tf.function(input_signature=[spec_of(y0), spec_of(p0), tf.TensorSpec([None], tf.int32)],
                     jit_compile=True if jit == "step" else None)
        def step(y_true, y_pred, sizes):
            counted(ctx, "metrics.update")

            def replica_fn():
                y, p = replica_slice(sizes, y_true, y_pred)
                return update_and_read(metric, kind, y, p)

            return strategy.run(tf.function(replica_fn, jit_compile=True) if jit == "replica" else replica_fn)

        return metric, step

    metric, step = ctx.cached(key, build)
    metric.reset_state()
    in_replica = []
    for y_true, y_pred, sizes in batches:
        try:
            in_replica.append(local(strategy, step(y_true, y_pred, np.asarray(sizes, np.int32))))
        except Exception as exc:
            if jit == "none":
                raise
            return failed(ctx, exc, f"metrics.update({kind}, jit={jit}): batch {len(in_replica) + 1}")
    return MetricReads(in_replica, read_metric(metric), [type(compat.tf_variable(v)).__name__ for v in metric.variables])
