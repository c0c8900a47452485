"""Metric probes: Keras metrics updated inside ``strategy.run``, read in both contexts."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from suite.common.results import MetricReads
from suite.engine import compat, mutants
from suite.engine.probes.common import counted, local, replica_slice, spec_of
from suite.engine.probes.registry import probe


@probe
def update(ctx, kind, batches, dtype):
    """Reset a metric, then for each ``(y_true, y_pred, sizes)`` batch update it on every
    replica's slice inside ``strategy.run`` and read ``result()`` there (replica context).
    Returns those in-replica reads per batch and ``result()`` read in cross-replica context."""
    strategy = ctx.strategy
    y0, p0, _ = batches[0]
    key = ("metric", kind, dtype, y0.dtype.name, y0.shape[1:], p0.shape[1:])

    def build():
        with strategy.scope():
            metric = compat.make_metric(kind, dtype)

        @tf.function(input_signature=[spec_of(y0), spec_of(p0), tf.TensorSpec([None], tf.int32)])
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

            return strategy.run(replica_fn)

        return metric, step

    metric, step = ctx.cached(key, build)
    metric.reset_state()
    in_replica = []
    for y_true, y_pred, sizes in batches:
        in_replica.append(local(strategy, step(y_true, y_pred, np.asarray(sizes, np.int32))))
    result = metric.result()
    if mutants.on("metric_first_replica") and ctx.num_replicas > 1:  # read one copy, not the SUM
        first = [compat.tf_variable(v).values[0] for v in metric.variables]  # (total, count) of replica 0
        result = first[0] if kind == "sum" else tf.math.divide_no_nan(first[0], first[1])
    return MetricReads(in_replica, result, [type(compat.tf_variable(v)).__name__ for v in metric.variables])
