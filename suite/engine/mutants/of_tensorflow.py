"""Mutants that break a rule inside TensorFlow or Keras itself, applied from outside: each replaces
a function or method of TensorFlow's or Keras' API in this engine (every probe and user's loop that
calls it computes it wrongly) while it is on. ``PATCHES[name]()`` applies a mutant's patch and
returns the function that puts the original back."""

from __future__ import annotations

import functools

import tensorflow as tf

from ..compat import keras
from . import replace
from .of_the_step import local_mean


def _local_mean(original):
    """compute_average_loss replaced by each replica's own mean (of_the_step.local_mean)."""
    def compute_average_loss(per_example_loss, sample_weight=None, global_batch_size=None):
        return local_mean(per_example_loss, sample_weight)
    return compute_average_loss


def _not_divided(original):
    """scale_regularization_loss returning the sum of the losses, not the sum over the replica count."""
    return lambda regularization_loss: tf.reduce_sum(regularization_loss)


def _times_replicas(original):
    """A Keras loss object's value multiplied by the replica count of the strategy it is called under."""
    def __call__(self, *args, **kwargs):
        return original(self, *args, **kwargs) * tf.distribute.get_strategy().num_replicas_in_sync
    return __call__


def _mirror_ids(original):
    """Each replica's id in its sync group replaced by its mirror image's (R - 1 - id)."""
    def replica_id_in_sync_group(self):
        return self.num_replicas_in_sync - 1 - original.fget(self)
    return property(replica_id_in_sync_group)


def _mean_of_means(original):
    """``reduce(MEAN, value, axis)`` over an axis taken as the mean of the replicas' own means."""
    def reduce(self, reduce_op, value, axis):
        if reduce_op == tf.distribute.ReduceOp.MEAN and axis is not None:
            value = self.run(lambda m: tf.math.divide_no_nan(tf.reduce_sum(m, axis), tf.cast(tf.shape(m)[axis],
                                                                                              m.dtype)), args=(value,))
            axis = None
        return original(self, reduce_op, value, axis)
    return reduce


# a layer's __init__ patch takes keyword arguments only: Keras 3 reads the signature of a layer class's
# __init__ for its config (keras/src/ops/operation.py, Operation.__new__) and fails on a *args it is not given


def _momentum_inverted(original):
    """A BatchNormalization layer built with momentum 1 - momentum."""
    def __init__(self, **kwargs):
        original(self, **{**kwargs, "momentum": 1 - kwargs.get("momentum", 0.99)})
    return __init__


def _not_synchronized(original):
    """A BatchNormalization layer asked for synchronized=True built unsynchronized."""
    def __init__(self, **kwargs):
        original(self, **{k: v for k, v in kwargs.items() if k != "synchronized"})
    return __init__


def _remainder_dropped(original):
    """``Dataset.batch`` dropping the short last batch whatever it is asked."""
    @functools.wraps(original)
    def batch(self, batch_size, drop_remainder=False, *args, **kwargs):
        return original(self, batch_size, True, *args, **kwargs)
    return batch


def _without_optimizer(original):
    """A ``tf.train.Checkpoint`` built without the ``optimizer`` it is given: its slots and iterations are
    neither saved nor restored, the model and the metrics are."""
    def __init__(self, *args, **kwargs):
        original(self, *args, **{k: v for k, v in kwargs.items() if k != "optimizer"})
    return __init__


class _NothingRestored:
    """The status of a restore that read nothing: every check of it passes."""

    def _self(self, *args, **kwargs):
        return self

    assert_consumed = assert_existing_objects_matched = assert_nontrivial_match = expect_partial = _self
    run_restore_ops = initialize_or_restore = _self


def _reads_nothing(original):
    """``tf.train.Checkpoint.restore`` that restores nothing (the objects keep the values they have) and
    reports success."""
    return lambda self, save_path, options=None: _NothingRestored()


PATCHES = {
    "local_batch_denominator": lambda: replace(tf.nn, "compute_average_loss", _local_mean),
    "scale_reg_not_divided": lambda: replace(tf.nn, "scale_regularization_loss", _not_divided),
    "keras_loss_times_replicas": lambda: replace(keras.losses.Loss, "__call__", _times_replicas),
    "reversed_local_results": lambda: replace(tf.distribute.ReplicaContext, "replica_id_in_sync_group", _mirror_ids),
    "reduce_mean_of_means": lambda: replace(tf.distribute.Strategy, "reduce", _mean_of_means),
    "bn_momentum_inverted": lambda: replace(keras.layers.BatchNormalization, "__init__", _momentum_inverted),
    "bn_not_synchronized": lambda: replace(keras.layers.BatchNormalization, "__init__", _not_synchronized),
    "short_batch_dropped": lambda: replace(tf.data.Dataset, "batch", _remainder_dropped),
    "checkpoint_without_optimizer": lambda: replace(tf.train.Checkpoint, "__init__", _without_optimizer),
    "counters_not_restored": lambda: replace(tf.train.Checkpoint, "restore", _reads_nothing),
    "tutorial_restore_skipped": lambda: replace(tf.train.Checkpoint, "restore", _reads_nothing),
}
