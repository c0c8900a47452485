"""Cross-replica reduction probes: ``strategy.reduce`` and ``experimental_local_results``."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ...common.results import Reductions
from .common import counted, local, replica_slice, spec_of
from .registry import probe

SUM, MEAN = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN


@probe
def reduce(ctx, rows, sizes):
    """Each replica holds its slice of ``rows`` [N, D] (uneven, possibly empty) and its row sum
    [D]; returns SUM/MEAN with axis=0 over the slices, axis=None over the row sums, and the
    local results of (replica id, row sum) in their order."""
    strategy = ctx.strategy
    key = ("reduce", rows.dtype.name, rows.shape[1:])

    def build():
        @tf.function(input_signature=[spec_of(rows), tf.TensorSpec([None], tf.int32)])
        def fn(rows, sizes):
            counted(ctx, "reduce.reduce")

            def replica_fn():
                (mine,) = replica_slice(sizes, rows)
                rid = tf.distribute.get_replica_context().replica_id_in_sync_group
                return mine, tf.reduce_sum(mine, axis=0), tf.constant(1, tf.int32) * rid

            mine, row_sum, rid = strategy.run(replica_fn)
            return {"sum_axis0": strategy.reduce(SUM, mine, axis=0),
                    "mean_axis0": strategy.reduce(MEAN, mine, axis=0),
                    "sum_none": strategy.reduce(SUM, row_sum, axis=None),
                    "mean_none": strategy.reduce(MEAN, row_sum, axis=None),
                    "row_sum": row_sum, "rid": rid}
        return fn

    out = ctx.cached(key, build)(rows, np.asarray(sizes, np.int32))
    row_sums, replica_ids = local(strategy, out["row_sum"]), local(strategy, out["rid"])
    return Reductions(out["sum_axis0"], out["mean_axis0"], out["sum_none"], out["mean_none"], row_sums, replica_ids)
