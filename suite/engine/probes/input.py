"""Input-distribution probes: a batched ``Dataset.range`` distributed with
``experimental_distribute_dataset`` and read in one of four iteration styles."""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from ...common.results import Delivered, FromFunction, Raised, ReplicaValues
from .common import local
from .registry import probe

STYLES = ("for", "iter_next", "get_next_as_optional", "tf_function_for")


def _source(length, files, feature_shape, dtype, folder):
    """``Dataset.range(length)`` or, with ``files`` (lists of ids), a TextLineDataset over that
    many text files written to ``folder`` on this engine's host (a reader, so FILE sharding
    applies); element i becomes ``i`` broadcast to ``feature_shape``."""
    if files is None:
        ds = tf.data.Dataset.range(length)
    else:
        paths = []
        for j, ids in enumerate(files):
            path = os.path.join(folder, f"part-{j:02d}.txt")
            with open(path, "w") as f:
                f.write("".join(f"{i}\n" for i in ids))
            paths.append(path)
        ds = tf.data.TextLineDataset(paths).map(lambda line: tf.strings.to_number(line, tf.int64))
    return ds.map(lambda i: tf.fill(feature_shape, tf.cast(i, dtype)))


def _dataset(length, batch, drop_remainder, batch_size_known, policy, feature_shape, dtype, files=None,
             folder=None):
    """Element i is ``i`` broadcast to ``feature_shape`` (so every row names its element)."""
    ds = _source(length, files, feature_shape, dtype, folder)
    ds = ds.batch(batch, drop_remainder=drop_remainder)
    if not batch_size_known:
        ds = ds.map(lambda x: x)  # Map hides the batch node from compute_batch_size (unless static)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(tf.data.experimental.AutoShardPolicy, policy)
    return ds.with_options(options)


@probe
def distribute(ctx, length, batch, drop_remainder, policy, style, batch_size_known=True,
               feature_shape=(), dtype="float32", files=None):
    """Every step's local replica batches, read with ``style``, and what the iterator does
    once exhausted; or the error ``experimental_distribute_dataset`` raised (FILE sharding
    of a source without files). Errors while iterating propagate (in a cluster they leave
    peers blocked in a collective, so the pool must replace it)."""
    return distribute_styles(ctx, length, batch, drop_remainder, policy, [style], batch_size_known, feature_shape,
                             dtype, files)[0]


@probe
def distribute_styles(ctx, length, batch, drop_remainder, policy, styles, batch_size_known=True,
                      feature_shape=(), dtype="float32", files=None):
    """``distribute`` read in each of ``styles`` in turn: one dataset, distributed once, and a
    new iterator per style (a distributed dataset can be iterated again)."""
    folder = tempfile.mkdtemp(prefix="tfds-input-")
    try:
        ds = _dataset(length, batch, drop_remainder, batch_size_known, policy, list(feature_shape), dtype, files,
                      folder)
        try:
            dist = ctx.strategy.experimental_distribute_dataset(ds)
        except tf.errors.OpError as exc:
            return [Raised.of(exc, "input.distribute: experimental_distribute_dataset")] * len(styles)
        return [_iterate(ctx, dist, style, dtype, feature_shape) for style in styles]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _iterate(ctx, dist, style, dtype, feature_shape):
    strategy = ctx.strategy
    steps, after_end = [], None
    if style == "for":
        for x in dist:
            steps.append(local(strategy, x))
    elif style == "iter_next":
        it = iter(dist)
        while True:
            try:
                x = next(it)
            except StopIteration:
                break
            steps.append(local(strategy, x))
        try:
            next(it)
            after_end = "returned"
        except StopIteration:
            after_end = "StopIteration"
    elif style == "get_next_as_optional":
        it = iter(dist)
        while True:
            opt = it.get_next_as_optional()
            if not opt.has_value():
                break
            steps.append(local(strategy, opt.get_value()))
        after_end = "has_value=False" if not bool(it.get_next_as_optional().has_value()) else "has_value=True"
    elif style == "tf_function_for":
        steps = _collect_in_tf_function(ctx, dist, dtype, list(feature_shape))
    else:
        raise ValueError(f"style must be one of {STYLES}")
    return Delivered(steps, after_end)


def _collect_in_tf_function(ctx, dist, dtype, feature_shape):
    """A ``for`` loop over the distributed dataset inside a tf.function, writing each local
    replica's batch of each step into TensorArrays; rebuilt into steps afterwards."""
    strategy = ctx.strategy
    n_local = len(ctx.local_replica_ids)
    key = ("input.collect", dtype, tuple(feature_shape))
    if key in ctx.cache:  # one tf.function per element spec: datasets of the same spec reuse its trace
        return _rebuild(*ctx.cache[key](dist), n_local)

    @tf.function
    def collect(dist):
        ctx.traces["input.distribute(tf_function_for)"] += 1
        # loop state must be rebound names (autograph does not track item assignment)
        values = tuple(tf.TensorArray(dtype, size=0, dynamic_size=True, infer_shape=False,
                                      element_shape=tf.TensorShape([None] + feature_shape))
                       for _ in range(n_local))
        sizes = tuple(tf.TensorArray(tf.int32, size=0, dynamic_size=True, element_shape=[]) for _ in range(n_local))
        n = tf.constant(0)
        for x in dist:
            parts = strategy.experimental_local_results(x)
            values = tuple(v.write(n, p) for v, p in zip(values, parts))
            sizes = tuple(s.write(n, tf.shape(p)[0]) for s, p in zip(sizes, parts))
            n += 1
        return [v.concat() for v in values], [s.stack() for s in sizes], n

    ctx.cache[key] = collect
    return _rebuild(*collect(dist), n_local)


def _rebuild(values, sizes, n, n_local):
    n = int(n)
    steps = [[] for _ in range(n)]
    for i in range(n_local):
        flat = np.asarray(values[i]) if n else np.zeros((0,))
        bounds = np.concatenate([[0], np.cumsum(np.asarray(sizes[i])[:n])]).astype(int)
        for s in range(n):
            steps[s].append(flat[bounds[s]:bounds[s + 1]])
    return steps


@probe
def from_function(ctx, length, global_batch):
    """``distribute_datasets_from_function`` with the guide's input function; returns the
    InputContext(s) it was called with and every step's local replica batches (or the error
    ``get_per_replica_batch_size`` raised)."""
    strategy = ctx.strategy
    contexts = []

    def dataset_fn(input_context):
        contexts.append([input_context.num_input_pipelines, input_context.input_pipeline_id,
                         input_context.num_replicas_in_sync])
        b = input_context.get_per_replica_batch_size(global_batch)
        ds = tf.data.Dataset.range(length).shard(input_context.num_input_pipelines,
                                                 input_context.input_pipeline_id)
        return ds.batch(b)

    try:
        dist = strategy.distribute_datasets_from_function(dataset_fn)
    except ValueError as exc:
        return FromFunction(contexts, raised=Raised.of(exc, "input.from_function: get_per_replica_batch_size"))
    return FromFunction(contexts, [local(strategy, x) for x in dist])


@probe
def values_from_function(ctx):
    """``experimental_distribute_values_from_function``: each replica's ValueContext."""
    strategy = ctx.strategy
    def value_fn(c):
        rid = c.replica_id_in_sync_group
        return tf.constant([rid, c.num_replicas_in_sync])

    value = strategy.experimental_distribute_values_from_function(value_fn)
    return ReplicaValues(local(strategy, value))
