"""ParameterServerStrategy semantics, numpy only.

Sources (TF 2.15.1 and 2.21.0 read alike):
* ``num_replicas_in_sync`` is the GPUs per worker, or 1 (parameter_server_strategy_v2.py,
  ``_num_replicas_in_sync``: ``self._num_gpus_per_worker or 1``), so on CPU workers every
  step is one replica and ``compute_average_loss`` divides by the step's own batch.
* Variables are placed round-robin on the ps tasks (``_create_variable_round_robin``,
  ``/job:ps/task:{count % num_ps}``); a partitioned variable is cut along axis 0 with the
  "div" strategy, the first ``rows % n`` shards one row longer
  (``_create_variable``: "num_partitions=4, shape[0]=10, partitions: [3, 3, 2, 2]"), each
  shard a round-robin variable of its own.
* ``FixedShardsPartitioner(num_shards)`` asks for ``min(num_shards, rows)`` shards
  (sharded_variable.py); ``MinSizePartitioner(min_shard_bytes, max_shards)`` for
  ``max(1, min(rows, max_shards, ceil(total_bytes / min_shard_bytes)))``
  (partitioned_variables.py ``min_max_variable_partitioner``); one shard means no partition.
* ``ClusterCoordinator.schedule`` "guarantees that fn will be executed on a worker at least
  once; it could be more than once" (cluster_coordinator.py, schedule docstring): retried
  elsewhere when a worker fails. With no failures (these clusters), each scheduled step is
  applied once, and after ``join()`` all have been, whatever the order.
"""

from __future__ import annotations

import math

import numpy as np

from .rules import documented, helper, observed

NUM_REPLICAS_IN_SYNC_CPU = 1


@observed("sharded_variable.py FixedShardsPartitioner.__call__: min(num_shards, rows)")
def fixed_shards(rows: int, num_shards: int) -> int:
    return min(num_shards, rows)


@observed(
    'partitioned_variables.py min_max_variable_partitioner: max(1, min(rows, max_partitions, '
    'ceil(bytes / min_slice_size)))'
)
def min_size_shards(shape, itemsize: int, min_shard_bytes: int, max_shards: int) -> int:
    total = int(np.prod(shape)) * itemsize
    return max(1, min(shape[0], max_shards, math.ceil(total / min_shard_bytes)))


@documented(
    'ParameterServerStrategy docstring: ids assigned to shards contiguously, the first shards one '
    'more id each'
)
def shard_rows(rows: int, num_shards: int) -> list[int]:
    """Rows of each shard under the "div" strategy: the first ``rows % n`` get one more."""
    n = min(num_shards, rows)
    base, extra = divmod(rows, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


@documented(
    'ParameterServerStrategy docstring: ids assigned to shards contiguously, the first shards one '
    'more id each'
)
def shards(value: np.ndarray, num_shards: int) -> list[np.ndarray]:
    """The shards' values: consecutive row blocks of ``value``."""
    bounds = np.cumsum([0] + shard_rows(value.shape[0], num_shards))
    return [value[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


@helper
def weight_independent_steps(w0: np.ndarray, c: np.ndarray, lr: float, steps: int) -> np.ndarray:
    """SGD on ``loss = sum(w * c)``: the gradient is ``c`` whatever ``w`` is, so each step
    subtracts ``lr * c`` and the result does not depend on which worker ran which step or in
    what order; a step applied twice or lost shows as a multiple of ``lr * c``."""
    return np.asarray(w0, np.float64) - steps * lr * np.asarray(c, np.float64)
