"""Loss probes: compute_average_loss, scale_regularization_loss, multi-dimensional labels and
Keras loss objects, each run inside ``strategy.run`` on every replica's slice of a batch."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ...common.results import Raised, ReplicaValues
from .. import compat
from .common import counted, failed, local, replica_slice, spec_of
from .registry import probe

SUM = tf.distribute.ReduceOp.SUM


@probe
def compute_average_loss(ctx, losses, sizes, weight_kind="none", weights=None,
                         global_batch_size=None, jit="none"):
    """Per-replica ``compute_average_loss`` of each replica's slice of ``losses``, the
    SUM-reduced total, and a ``Mean`` metric fed the scaled losses (the tracking pitfall).
    ``jit``: compiled with XLA (``tf.function(jit_compile=True)``) around the replica function
    (``replica``) or the whole step with strategy.run (``step``); a step that raises then comes
    back as the exception (Raised)."""
    strategy = ctx.strategy
    dtype = losses.dtype
    use_default = global_batch_size is None
    key = ("compute_average_loss", dtype.name, weight_kind, use_default, jit)

    def build():
        with strategy.scope():
            tracker = compat.make_metric("mean", dtype.name)
        w_spec = {"none": tf.TensorSpec([], dtype), "scalar": tf.TensorSpec([], dtype),
                  "per_example": tf.TensorSpec([None], dtype)}[weight_kind]

        @tf.function(input_signature=[spec_of(losses), tf.TensorSpec([None], tf.int32), w_spec,
                                      tf.TensorSpec([], tf.int64)], jit_compile=True if jit == "step" else None)
        def fn(losses, sizes, weights, gbs):
            counted(ctx, "losses.compute_average_loss")

            def replica_fn():
                (mine,) = replica_slice(sizes, losses)
                w = None
                if weight_kind == "scalar":
                    w = weights
                elif weight_kind == "per_example":
                    (w,) = replica_slice(sizes, weights)
                scaled = tf.nn.compute_average_loss(
                    mine, sample_weight=w, global_batch_size=None if use_default else gbs)
                tracker.update_state(scaled)
                return scaled

            per_replica = strategy.run(tf.function(replica_fn, jit_compile=True) if jit == "replica" else replica_fn)
            return per_replica, strategy.reduce(SUM, per_replica, axis=None)

        return fn, tracker

    fn, tracker = ctx.cached(key, build)
    tracker.reset_state()
    w = np.asarray(weights if weights is not None else 0, dtype=dtype)
    try:
        per_replica, total = fn(losses, np.asarray(sizes, np.int32), w, np.int64(global_batch_size or 0))
    except Exception as exc:
        if jit == "none":
            raise
        return failed(ctx, exc, f"losses.compute_average_loss(jit={jit})")
    return ReplicaValues(local(strategy, per_replica), total, tracker.result())


@probe
def scale_regularization_loss(ctx, reg_losses):
    """``scale_regularization_loss`` of the same regularization losses on every replica."""
    strategy = ctx.strategy
    key = ("scale_regularization_loss", reg_losses.dtype.name)

    def build():
        @tf.function(input_signature=[spec_of(reg_losses)])
        def fn(reg):
            counted(ctx, "losses.scale_regularization_loss")
            per_replica = strategy.run(lambda: tf.nn.scale_regularization_loss(reg))
            return per_replica, strategy.reduce(SUM, per_replica, axis=None)
        return fn

    per_replica, total = ctx.cached(key, build)(reg_losses)
    return ReplicaValues(local(strategy, per_replica), total)


def elements_per_example(labels):
    """How many elements one example's labels have (the guide's ``reduce_prod(shape(labels)[1:])``)."""
    return tf.reduce_prod(tf.shape(labels)[1:])


@probe
def multi_dim_loss(ctx, labels, logits, sizes, normalise, global_batch_size=None):
    """Per-element sparse softmax crossentropy on labels [B, ...] / logits [B, ..., C],
    optionally divided by the elements per example (the guide's
    ``per_example_loss /= reduce_prod(shape(labels)[1:])``), then compute_average_loss."""
    strategy = ctx.strategy
    use_default = global_batch_size is None
    key = ("multi_dim_loss", logits.dtype.name, logits.shape[1:], normalise, use_default)

    def build():
        @tf.function(input_signature=[spec_of(labels), spec_of(logits),
                                      tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int64)])
        def fn(labels, logits, sizes, gbs):
            counted(ctx, "losses.multi_dim_loss")

            def replica_fn():
                y, z = replica_slice(sizes, labels, logits)
                per_element = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=z)
                if normalise:
                    per_element /= tf.cast(elements_per_example(y), per_element.dtype)
                return tf.nn.compute_average_loss(
                    per_element, global_batch_size=None if use_default else gbs)

            per_replica = strategy.run(replica_fn)
            return per_replica, strategy.reduce(SUM, per_replica, axis=None)
        return fn

    per_replica, total = ctx.cached(key, build)(labels, logits, np.asarray(sizes, np.int32),
                                                np.int64(global_batch_size or 0))
    return ReplicaValues(local(strategy, per_replica), total)


@probe
def keras_loss(ctx, kind, reduction, y_true, y_pred, sizes):
    """A Keras loss object with ``reduction`` called inside ``strategy.run`` on each replica's
    slice; returns the per-replica values, or the exception it raised."""
    strategy = ctx.strategy
    key = ("keras_loss", kind, reduction, y_pred.dtype.name, y_true.shape[1:], y_pred.shape[1:])

    def build():
        loss_obj = compat.make_loss(kind, reduction, y_pred.dtype.name)

        @tf.function(input_signature=[spec_of(y_true), spec_of(y_pred),
                                      tf.TensorSpec([None], tf.int32)])
        def fn(y_true, y_pred, sizes):
            counted(ctx, "losses.keras_loss")

            def replica_fn():
                y, p = replica_slice(sizes, y_true, y_pred)
                return loss_obj(y, p)

            return strategy.run(replica_fn)
        return fn

    raised_key = ("keras_loss raised",) + key
    if raised_key in ctx.cache:  # it raised while tracing: it raises for every input of this key
        return ctx.cache[raised_key]
    try:
        fn = ctx.cached(key, build)
        per_replica = fn(y_true, y_pred, np.asarray(sizes, np.int32))
    except Exception as exc:  # the documented outcome may be an exception
        ctx.cache.pop(key, None)
        ctx.cache[raised_key] = Raised.of(exc, f"losses.keras_loss({kind}, {reduction})")
        return ctx.cache[raised_key]
    return ReplicaValues(local(strategy, per_replica))
