"""How ``experimental_distribute_dataset`` cuts a batched dataset into replica batches, on one
worker or on a multi-worker cluster, for each auto-shard policy.

Rules and evidence: docs/research/input_distribution.md (TF 2.15.1 and 2.21.0 agree; the
multi-worker rules were measured on local MultiWorkerMirrored clusters, W in {2, 3} workers of
R in {1, 2} CPUs, 1216 observations). ``TF/`` is ``tensorflow/python``, lines from 2.21.

N = W * R replicas. For each worker w (``input_lib.py`` ``_create_cloned_datasets_from_dataset``
:880-922, then ``input_ops.auto_shard_dataset`` and the grappler pass ``auto_shard.cc``):

A. Source. FILE (and AUTO when the pipeline has a file reader) makes worker w read files
   w, w+W, ... (``ShardByFile``); with fewer files than workers, workers w < K raise
   InvalidArgumentError "Could not apply FILE based sharding" at their first step and the
   others block in the cross-worker all-reduce (``shard_dataset_op.cc``, require_non_empty).
   FILE on a source without a reader (``range``) raises NotFoundError "Found an unshardable
   source dataset" on every worker. With one worker FILE is a no-op (``OptimizeGraph``).
   DATA, OFF and AUTO without a reader: every worker reads the whole source.
B. ``batch(B, drop_remainder)`` on that stream (``drop_remainder`` drops a short batch only).
C. Rebatch when N > 1 (:893-899): the legacy rule "L" (every batch of b rows cut into N pieces
   of ceil(b / N) rows, empty ones at the end; ``_LegacyRebatchDataset``) when the batch size
   is unknown (``compute_batch_size == -1``, e.g. a ``map`` after a batch without
   ``drop_remainder``) or the shard is by DATA (``RewriteRebatchV2ToV1``); otherwise rule "V2"
   (``RebatchDatasetV2``): pieces cut from the flattened stream with the cyclic sizes
   ``batch_sizes_for_worker(B, W, R, w)`` (worker 0's list [f+1]*c + [f]*(N-c), f, c =
   divmod(B, N), rotated left by w*R; a size 0 gives an empty piece).
D. DATA (and AUTO without a reader): the shard comes after the rebatch, worker w keeps pieces
   w, w+W, w+2W, ... (``ShardByData``), so replicas do not see contiguous slices when R > 1.
E. Piece k of a worker goes to its local replica k % R at step k // R (MultiDeviceIterator,
   round robin).
F. Steps are aligned across the cluster: every step all-reduces how many replicas have data
   (:188-201, 331-349), so every worker runs max_w ceil(pieces_w / R) steps and replicas without
   data get empty batches. OFF has no shard: every worker reads everything, so every element
   arrives W times (once per worker).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .rules import Rule, documented, observed

POLICIES = ("AUTO", "DATA", "OFF")  # for a Dataset.range source (FILE needs files)
FILE_POLICIES = ("AUTO", "DATA", "FILE", "OFF")  # for a source of text files


class InputError(ValueError):
    """The documented outcome is an error: ``raised[w]`` is (type, message prefix) for the
    workers that raise, ``blocked`` the workers left waiting in the cross-worker all-reduce."""

    def __init__(self, raised: dict, blocked: list):
        super().__init__(f"raises {raised}, blocked {blocked}")
        self.raised = raised
        self.blocked = blocked


@documented("tf.data.Dataset.batch: the last element has N % batch_size rows unless drop_remainder")
def global_batches(length: int, batch: int, drop_remainder: bool) -> list[list[int]]:
    """Element ids of each batch of ``Dataset.range(length).batch(batch, drop_remainder)``."""
    return _batch(list(range(length)), batch, drop_remainder)


def _batch(stream: list, batch: int, drop_remainder: bool) -> list[list]:
    out = [stream[i:i + batch] for i in range(0, len(stream), batch)]
    if drop_remainder and out and len(out[-1]) < batch:
        out.pop()
    return out


@observed(
    'tensorflow/python/data/experimental/ops/distribute.py: compute_batch_size (-1 when a later op '
    'may change the batch size)'
)
def batch_size_known(map_after_batch: bool, drop_remainder: bool) -> bool:
    """Whether ``distribute.compute_batch_size`` finds the batch size: a static batch
    dimension (``drop_remainder=True``) is always found; otherwise the graph walk stops at an
    op it does not look through, such as a ``map`` after ``batch`` (-1, unknown)."""
    return drop_remainder or not map_after_batch


@observed(
    'AutoShardPolicy docstring (AUTO: FILE, falling back to DATA); FILE with one worker a no-op: '
    'grappler auto_shard.cc OptimizeGraph'
)
def shard_policy(policy: str, has_reader: bool, workers: int) -> str:
    """What the auto-shard pass does: "FILE", "DATA" or "OFF". FILE on one worker is skipped
    (``auto_shard.cc`` ``OptimizeGraph``), reader or not, and counts as OFF."""
    shard = {"AUTO": "FILE" if has_reader else "DATA"}.get(policy, policy)
    return "OFF" if shard == "FILE" and workers == 1 else shard


@observed(
    'input_lib.py rebatch_fn: legacy rebatch when compute_batch_size == -1; DATA rewrites V2 to '
    'legacy (distribute.py _AutoShardDataset)'
)
def split_rule(policy: str, batch_size_known: bool, has_reader: bool = False, workers: int = 1) -> str:
    """"L" or "V2" (see the module docstring)."""
    if not batch_size_known or shard_policy(policy, has_reader, workers) == "DATA":
        return "L"
    return "V2"


@observed(
    'tensorflow/python/data/experimental/ops/distribute.py: batch_sizes_for_worker (internal; the '
    'input guide only says global batch / replicas)'
)
def batch_sizes_for_worker(batch: int, workers: int, replicas_per_worker: int, worker: int) -> list[int]:
    n = workers * replicas_per_worker
    f, c = divmod(batch, n)
    sizes = [f + 1] * c + [f] * (n - c)
    off = worker * replicas_per_worker
    return sizes[off:] + sizes[:off]


def _rebatch_v2(batches: list[list], sizes: list[int]) -> list[list]:
    """RebatchDatasetV2: pieces of the cyclic ``sizes`` cut from the flattened stream; a size 0
    gives an empty piece, and the stream ends at the first positive size it cannot start."""
    stream = [e for b in batches for e in b]
    out, pos, k = [], 0, 0
    while True:
        want = sizes[k % len(sizes)]
        k += 1
        if want and pos >= len(stream):
            return out
        out.append(stream[pos:pos + want])
        pos += want


def _rebatch_legacy(batches: list[list], n: int) -> list[list]:
    out = []
    for b in batches:
        k = math.ceil(len(b) / n)
        out += [b[i * k:(i + 1) * k] for i in range(n)]
    return out


@observed(
    'Dataset.rebatch (documented: unbatch().batch(N)); empty pieces, round-robin to replicas and step'
    ' alignment: input_lib.py, MultiDeviceIterator'
)
def distribute_workers(source, batch: int, drop_remainder: bool, workers: int, replicas_per_worker: int,
                       policy: str = "AUTO", batch_size_known: bool = True) -> list[list[list[list[int]]]]:
    """Per worker, per step, per local replica: the element ids ``experimental_distribute_dataset``
    delivers. ``source`` is a length (``Dataset.range``, no reader) or a list of files, each the
    list of ids it holds (``TextLineDataset``, a reader). Raises InputError where TF raises."""
    if policy not in FILE_POLICIES:
        raise ValueError(f"policy must be one of {FILE_POLICIES}, got {policy!r}")
    w_, r_ = workers, replicas_per_worker
    has_reader = not isinstance(source, int)
    everything = [e for f in source for e in f] if has_reader else list(range(source))
    shard = shard_policy(policy, has_reader, w_)
    if shard == "FILE" and not has_reader:
        raise InputError({w: ("NotFoundError", "Found an unshardable source dataset") for w in range(w_)}, [])
    if shard == "FILE" and len(source) < w_:
        raise InputError({w: ("InvalidArgumentError", "Could not apply FILE based sharding")
                          for w in range(len(source))}, list(range(len(source), w_)))
    pieces = _pieces(source, everything, batch, drop_remainder, w_, r_, policy, batch_size_known)
    n_steps = max([math.ceil(len(p) / r_) for p in pieces] + [0])
    return [[[p[s * r_ + r] if s * r_ + r < len(p) else [] for r in range(r_)] for s in range(n_steps)]
            for p in pieces]


@documented(
    "https://www.tensorflow.org/tutorials/distribute/input: 'tf.distribute returns dummy batches of "
    "batch size 0 on replicas that do not have any more data to process'"
)
def needs_dummies(source, batch: int, drop_remainder: bool, workers: int, replicas_per_worker: int,
                  policy: str = "AUTO", batch_size_known: bool = True) -> bool:
    """Whether some worker's stream ends part-way through a step, so that the strategy must
    hand the remaining replicas empty "dummy" batches (partial-batch handling,
    ``input_lib.py`` ``_get_value_or_dummy``). The rebatch kernels' own empty pieces do not
    count: they are real elements."""
    w_, r_ = workers, replicas_per_worker
    has_reader = not isinstance(source, int)
    everything = [e for f in source for e in f] if has_reader else list(range(source))
    pieces = _pieces(source, everything, batch, drop_remainder, w_, r_, policy, batch_size_known)
    n_steps = max([math.ceil(len(p) / r_) for p in pieces] + [0])
    return any(len(p) != n_steps * r_ for p in pieces)


def _pieces(source, everything, batch, drop_remainder, w_, r_, policy, batch_size_known) -> list[list[list]]:
    """Each worker's rebatched (and DATA-sharded) pieces, in order (rules A-D)."""
    n = w_ * r_
    has_reader = not isinstance(source, int)
    shard = shard_policy(policy, has_reader, w_)
    rule = split_rule(policy, batch_size_known, has_reader, w_)
    pieces = []
    for w in range(w_):
        stream = [e for f in source[w::w_] for e in f] if shard == "FILE" else everything
        batches = _batch(stream, batch, drop_remainder)
        if n == 1:
            mine = batches
        elif rule == "L":
            mine = _rebatch_legacy(batches, n)
        else:
            mine = _rebatch_v2(batches, batch_sizes_for_worker(batch, w_, r_, w))
        pieces.append(mine[w::w_] if shard == "DATA" else mine)
    return pieces


@observed(
    "the input guide's three examples (AUTO, one worker) are documented; OFF/FILE and rule V2 are "
    'input_lib.py behaviour'
)
def distribute(length: int, batch: int, drop_remainder: bool, replicas: int, policy: str = "AUTO",
               batch_size_known: bool = True, workers: int = 1) -> list[list[list[int]]]:
    """Steps of a distributed ``Dataset.range(length).batch(batch, drop_remainder)``: for each
    step, each replica's element ids in global replica-id order (worker-major)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    per_worker = distribute_workers(length, batch, drop_remainder, workers, replicas // workers, policy,
                                    batch_size_known)
    n_steps = len(per_worker[0]) if per_worker else 0
    return [[part for w in range(workers) for part in per_worker[w][s]] for s in range(n_steps)]


@documented(
    'InputContext.get_per_replica_batch_size: ValueError if global_batch_size is not divisible by '
    'num_replicas_in_sync'
)
def per_replica_batch_size(global_batch: int, replicas: int) -> int:
    """``InputContext.get_per_replica_batch_size``: global // replicas; a global batch that does
    not divide raises ValueError ("The `global_batch_size` G is not divisible by
    `num_replicas_in_sync` R", distribute_lib.py InputContext)."""
    if global_batch % replicas:
        raise ValueError(f"The `global_batch_size` {global_batch} is not divisible by "
                         f"`num_replicas_in_sync` {replicas}")
    return global_batch // replicas


@observed(
    "distribute_datasets_from_function: 'every replica on that worker will dequeue one batch of "
    "inputs' (documented); round-robin order and padding: input_lib.py "
    'DistributedDatasetsFromFunction'
)
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


@dataclass(frozen=True)
class GuideExample:
    """One worked example of the distributed input guide
    (https://www.tensorflow.org/tutorials/distribute/input, "Batching" and "Sharding"):
    ``Dataset.range(source)`` or text files (``source`` a list of files, each its ids) batched
    by ``batch``, distributed on ``workers`` x ``replicas_per_worker`` with ``policy``.
    ``steps``: per worker, per step, per local replica, the ids as the guide lists them.
    ``exact``: whether the guide's step boundaries are the contract; where not (``note`` says
    why), what it documents is each worker's elements in order."""

    name: str
    source: object
    batch: int
    workers: int
    replicas_per_worker: int
    policy: str
    steps: list
    exact: bool = True
    note: str = ""

    @property
    def replicas(self) -> int:
        return self.workers * self.replicas_per_worker

    @property
    def rule(self) -> Rule:
        what = "its step boundaries" if self.exact else "each worker's elements in order"
        return Rule("documented", f"{GUIDE}, worked example {self.name}: {what}")

    def elements(self, per_worker_steps) -> list[list[int]]:
        """Each worker's ids in the order its replicas receive them."""
        return [[i for step in steps for part in step for i in part] for steps in per_worker_steps]


GUIDE = "https://www.tensorflow.org/tutorials/distribute/input"
_TWELVE = [list(range(12))]  # the DATA and OFF examples' one file (global batch 4, as in the FILE one)
GUIDE_EXAMPLES = (
    GuideExample("range6_batch4_on_2", 6, 4, 1, 2, "AUTO", [[[[0, 1], [2, 3]], [[4], [5]]]]),
    GuideExample("range4_batch4_on_5", 4, 4, 1, 5, "AUTO", [[[[0], [1], [2], [3], []]]]),
    GuideExample("range8_batch4_on_3", 8, 4, 1, 3, "AUTO", [[[[0, 1], [2, 3], []], [[4, 5], [6, 7], []]]]),
    GuideExample("file_2files_on_2x1", [list(range(6)), list(range(6, 12))], 4, 2, 1, "FILE",
                 [[[[0, 1]], [[2, 3]], [[4]], [[5]]], [[[6, 7]], [[8, 9]], [[10]], [[11]]]], exact=False,
                 note="the guide's FILE example ends each worker with [4] and [5] ([10] and [11]), which "
                      "contradicts its own batching rule (per-replica batches of global / replicas = 2); "
                      "TF 2.15.1 and 2.21.0 deliver [4, 5] and [10, 11] in one step (rule V2 cuts each "
                      "worker's stream into the worker's share, docs/research/multi_worker_input.md). The "
                      "file assignment it illustrates, worker w reads file w, holds"),
    GuideExample("data_1file_on_2x1", _TWELVE, 4, 2, 1, "DATA",
                 [[[[0, 1]], [[4, 5]], [[8, 9]]], [[[2, 3]], [[6, 7]], [[10, 11]]]]),
    GuideExample("off_1file_on_2x1", _TWELVE, 4, 2, 1, "OFF",
                 [[[[0, 1]], [[2, 3]], [[4, 5]], [[6, 7]], [[8, 9]], [[10, 11]]]] * 2),
)


@documented("keras.Model.fit, epochs: 'An epoch is an iteration over the entire x and y data provided'; "
            "tf.data.Dataset.from_generator calls its generator again for each iteration, and shuffle's "
            "reshuffle_each_iteration draws 'a different order for each epoch'")
def fit_epoch_iterations(epochs: int) -> list[int]:
    """The iteration of a dataset (from 0) each of ``Model.fit``'s ``epochs`` epochs trains: epoch e
    trains the dataset's e-th iteration, the first epoch its first."""
    return list(range(epochs))
