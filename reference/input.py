"""How ``experimental_distribute_dataset`` cuts a batched dataset into replica batches.

Rules and evidence: docs/research/input_distribution.md (TF 2.15.1 and 2.21.0 agree).
Two split rules exist, and which one applies depends on the auto-shard policy even on a single
worker (tensorflow/python/distribute/input_lib.py ``_create_cloned_datasets_from_dataset``,
tensorflow/python/data/experimental/ops/distribute.py, grappler ``auto_shard.cc``):

* rule "L" (legacy ``RebatchDataset``): every input batch of b rows is cut into replicas
  chunks of ceil(b / replicas) rows; replica i gets rows [i*k, (i+1)*k), empty when i*k >= b.
  Used when the batch size is not known statically (``compute_batch_size == -1``), for the
  DATA policy, and for AUTO on a pipeline without a file reader (AUTO falls back to DATA,
  which rewrites RebatchDatasetV2 into the legacy op).
* rule "V2" (``RebatchDatasetV2``, ``batch_sizes_for_worker``): with f = B // N and
  c = B % N (N = replicas), replica sizes are [f+1]*c + [f]*(N-c); a full global batch is cut
  by those sizes, a short last batch greedily (replica i gets min(size_i, rows left)).
  Used for OFF (and FILE, a no-op on one worker) when the batch size is known.

Every step gives every replica a tensor (an empty one when it gets no rows); a step exists
while any replica has rows. ``drop_remainder`` only drops the short global batch.
With one replica the dataset's batches pass through unchanged.
"""

from __future__ import annotations

import math

POLICIES = ("AUTO", "DATA", "OFF")


def global_batches(length: int, batch: int, drop_remainder: bool) -> list[list[int]]:
    """Element ids of each batch of ``Dataset.range(length).batch(batch, drop_remainder)``."""
    out = [list(range(i, min(i + batch, length))) for i in range(0, length, batch)]
    if drop_remainder and out and len(out[-1]) < batch:
        out.pop()
    return out


def batch_size_known(map_after_batch: bool, drop_remainder: bool) -> bool:
    """Whether ``distribute.compute_batch_size`` finds the batch size: a static batch
    dimension (``drop_remainder=True``) is always found; otherwise the graph walk stops at an
    op it does not look through, such as a ``map`` after ``batch`` (-1, unknown)."""
    return drop_remainder or not map_after_batch


def split_rule(policy: str, batch_size_known: bool, has_reader: bool = False) -> str:
    """"L" or "V2" (see the module docstring) for a single-worker pipeline."""
    if not batch_size_known or policy == "DATA":
        return "L"
    if policy == "AUTO" and not has_reader:
        return "L"
    return "V2"


def _split_legacy(rows: list[int], replicas: int) -> list[list[int]]:
    k = math.ceil(len(rows) / replicas) if rows else 0
    return [rows[i * k:(i + 1) * k] for i in range(replicas)]


def _split_v2(rows: list[int], replicas: int, batch: int) -> list[list[int]]:
    f, c = divmod(batch, replicas)
    sizes = [f + 1] * c + [f] * (replicas - c)
    out, start = [], 0
    for size in sizes:
        take = min(size, len(rows) - start)
        out.append(rows[start:start + take])
        start += take
    return out


def distribute(length: int, batch: int, drop_remainder: bool, replicas: int, policy: str = "AUTO",
               batch_size_known: bool = True, workers: int = 1) -> list[list[list[int]]]:
    """Steps of a distributed ``Dataset.range(length).batch(batch, drop_remainder)``: for each
    step, each replica's element ids (replica-id order).

    Multi-worker (one replica per worker) under AUTO/DATA: every worker runs the pipeline, the
    legacy rebatch cuts each global batch into ``replicas`` pieces and worker w keeps piece w,
    which is rule L over all replicas. Multi-worker OFF (every worker reads everything) is not
    stated here yet (issue #4)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if workers > 1 and policy == "OFF":
        raise NotImplementedError("multi-worker OFF sharding is issue #4")
    steps = []
    rule = split_rule(policy, batch_size_known)
    for rows in global_batches(length, batch, drop_remainder):
        if replicas == 1:
            steps.append([rows])
        elif rule == "L":
            steps.append(_split_legacy(rows, replicas))
        else:
            steps.append(_split_v2(rows, replicas, batch))
    return steps


def per_replica_batch_size(global_batch: int, replicas: int) -> int:
    """``InputContext.get_per_replica_batch_size``: global // replicas; a global batch that does
    not divide raises ValueError ("The `global_batch_size` G is not divisible by
    `num_replicas_in_sync` R", distribute_lib.py InputContext)."""
    if global_batch % replicas:
        raise ValueError(f"The `global_batch_size` {global_batch} is not divisible by "
                         f"`num_replicas_in_sync` {replicas}")
    return global_batch // replicas


def datasets_from_function(length: int, global_batch: int, replicas: int, workers: int = 1):
    """Steps of ``distribute_datasets_from_function`` for the guide's input function
    ``range(length).shard(num_input_pipelines, input_pipeline_id).batch(per-replica batch)``.

    One input pipeline per worker (``InputContext(workers, w, replicas)``); its dataset is
    neither rebatched nor auto-sharded, and its elements go to the worker's replicas one
    whole element each, round-robin (input_lib.py ``DistributedDatasetsFromFunction``). A step
    exists while any replica in the cluster has data (workers agree on it), and replicas with
    nothing in it get empty batches. Returns, per worker, the list of steps of that worker's
    local replica batches (element ids)."""
    local = replicas // workers
    b = per_replica_batch_size(global_batch, replicas)
    out = []
    for w in range(workers):
        ids = list(range(length))[w::workers]
        elements = [ids[i:i + b] for i in range(0, len(ids), b)]
        steps = [elements[i:i + local] for i in range(0, len(elements), local)]
        out.append([step + [[]] * (local - len(step)) for step in steps])
    n_steps = max(len(steps) for steps in out)
    return [steps + [[[]] * local] * (n_steps - len(steps)) for steps in out]
