"""Helpers shared by probes (engine side): slicing a replica's batch, reading local results."""

from __future__ import annotations

import tensorflow as tf

from ...common.results import Raised


def replica_slice(sizes, *tensors):
    """This replica's consecutive slice of each global tensor; ``sizes`` holds every
    replica's batch size in replica-id order. The sliced batch dimension is unknown to the
    trace, so one traced function serves every split."""
    rid = tf.distribute.get_replica_context().replica_id_in_sync_group
    offsets = tf.concat([tf.zeros([1], sizes.dtype), tf.cumsum(sizes)], axis=0)
    start, stop = offsets[rid], offsets[rid + 1]
    return tuple(t[start:stop] for t in tensors)


def local(strategy, value) -> list:
    """``experimental_local_results`` as a list of numpy arrays, in replica order."""
    return [tf.convert_to_tensor(v).numpy() for v in strategy.experimental_local_results(value)]


def spec_of(array, batch_dims: int = 1) -> tf.TensorSpec:
    """A TensorSpec with unknown leading (batch) dimension(s) for a numpy array."""
    shape = [None] * batch_dims + list(array.shape[batch_dims:])
    return tf.TensorSpec(shape, tf.as_dtype(array.dtype))


def counted(ctx, name: str):
    """Count one trace of ``name`` (call inside the Python body of a tf.function)."""
    ctx.traces[name] += 1


def failed(ctx, exc: BaseException, where: str) -> Raised:
    """A probe's step that raised, as its outcome; a failed TensorFlow op (a collective among
    them) poisons a multi-worker cluster, so the engine restarts before its next call."""
    if isinstance(exc, tf.errors.OpError):
        ctx.request_restart()
    return Raised.of(exc, where)
