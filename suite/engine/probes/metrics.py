"""Metric probes: Keras metrics updated inside ``strategy.run``, read in both contexts."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ...common.results import MetricReads
from .. import compat, mutants
from .common import counted, failed, local, replica_slice, spec_of
from .registry import probe


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
                if mutants.on("metric_read_before_update"):  # the read no longer sees this batch
                    before = tf.identity(metric.result())
                    with tf.control_dependencies([before]):
                        metric.update_state(y, p) if kind not in ("mean", "sum") else metric.update_state(p)
                    return before
                metric.update_state(y, p) if kind not in ("mean", "sum") else metric.update_state(p)
                return tf.identity(metric.result())

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
    result = metric.result()
    if mutants.on("metric_first_replica") and ctx.num_replicas > 1:  # read one copy, not the SUM
        first = [compat.tf_variable(v).values[0] for v in metric.variables]  # (total, count) of replica 0
        result = first[0] if kind == "sum" else tf.math.divide_no_nan(first[0], first[1])
    return MetricReads(in_replica, result, [type(compat.tf_variable(v)).__name__ for v in metric.variables])
