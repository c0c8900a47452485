"""Mutants that break a rule inside TensorFlow or Keras itself, applied from outside: each replaces
a function or method of TensorFlow's or Keras' API in this engine (every probe and user's loop that
calls it computes it wrongly) while it is on. ``PATCHES[name]()`` applies a mutant's patch and
returns the function that puts the original back."""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf
from tensorflow.python.data.ops import (
    iterator_ops,  # the iterator of a tf.data.Dataset (what the default strategy hands out)
)
from tensorflow.python.distribute import input_lib  # the iterator class behind tf.distribute.DistributedIterator
from tensorflow.python.distribute.parameter_server_strategy_v2 import ParameterServerStrategyV2Extended

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


def _first_element_dropped(original):
    """``Dataset.batch`` of a source that lost its first element."""
    @functools.wraps(original)
    def batch(self, batch_size, *args, **kwargs):
        return original(self.skip(1), batch_size, *args, **kwargs)
    return batch


def _half_batches(original):
    """``Dataset.batch`` with half the size it is asked (a per-replica size given for the global batch,
    the classic mistake)."""
    @functools.wraps(original)
    def batch(self, batch_size, *args, **kwargs):
        return original(self, max(1, batch_size // 2), *args, **kwargs)
    return batch


def _data_sharding(original):
    """``Dataset.with_options`` whose options shard by DATA whatever auto-shard policy they ask for."""
    @functools.wraps(original)
    def with_options(self, options, *args, **kwargs):
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        return original(self, options, *args, **kwargs)
    return with_options


def _first_optional_thrown_away(original):
    """A distributed iterator's first ``get_next_as_optional`` fetching an element and throwing it away."""
    def get_next_as_optional(self):
        if not getattr(self, "_first_thrown_away", False):
            self._first_thrown_away = True
            original(self)
        return original(self)
    return get_next_as_optional


def _scheduled_once_more():
    """``ClusterCoordinator.schedule``'s first call after a ``join`` (or the switch) scheduling its function
    twice: one step more than asked."""
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator
    joined = [True]

    def make_schedule(original):
        def schedule(self, fn, args=None, kwargs=None):
            if joined[0]:
                joined[0] = False
                original(self, fn, args=args, kwargs=kwargs)
            return original(self, fn, args=args, kwargs=kwargs)
        return schedule

    def make_join(original):
        def join(self):
            joined[0] = True
            return original(self)
        return join

    undo = [replace(coordinator, "schedule", make_schedule), replace(coordinator, "join", make_join)]
    return lambda: [u() for u in reversed(undo)]


def _one_shard_more(original):
    """A variable partitioner asking for one shard more than its rule along the first axis."""
    def __call__(self, shape, dtype, axis=0):
        shards = list(original(self, shape, dtype, axis))
        return [shards[0] + 1] + shards[1:]
    return __call__


def _partitioners_one_shard_more():
    parts = tf.distribute.experimental.partitioners
    undo = [replace(cls, "__call__", _one_shard_more) for cls in (parts.FixedShardsPartitioner, parts.MinSizePartitioner)]
    return lambda: [u() for u in reversed(undo)]


def _round_robin_reset(original):
    """ParameterServerStrategy's round-robin placement with its counter reset before every variable (and
    so every shard): all on ps task 0."""
    def _create_variable_round_robin(self, *args, **kwargs):
        self._variable_count = 0
        return original(self, *args, **kwargs)
    return _create_variable_round_robin


def _doubled(original):
    """compute_average_loss returning twice the average."""
    def compute_average_loss(per_example_loss, sample_weight=None, global_batch_size=None):
        return 2 * original(per_example_loss, sample_weight=sample_weight, global_batch_size=global_batch_size)
    return compute_average_loss


def _first_of_duplicates(original):
    """A Keras optimizer's ``apply_gradients`` keeping, of a sparse gradient's repeated indices, the first
    row only (the others' contributions dropped, not summed)."""
    def first_rows(g):
        if not isinstance(g, tf.IndexedSlices):
            return g
        unique, position = tf.unique(g.indices)
        first = tf.math.unsorted_segment_min(tf.range(tf.shape(g.indices)[0]), position, tf.size(unique))
        return tf.IndexedSlices(tf.gather(g.values, first), unique, g.dense_shape)

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        return original(self, [(first_rows(g), v) for g, v in grads_and_vars], *args, **kwargs)
    return apply_gradients


def _fresh_seed() -> int:
    return int(np.random.SeedSequence().entropy % 2 ** 30)


def _unseeded():
    """Random objects built as without a seed: a Dropout layer's seed, a Generator's ``from_seed`` and the
    seed of a stateless uniform draw each replaced by a fresh one for every build (every trace)."""
    def dropout(original):
        def __init__(self, rate, **kwargs):
            original(self, rate, **{**kwargs, "seed": _fresh_seed()})
        return __init__

    def from_seed(original):
        return classmethod(lambda cls, seed, *args, **kwargs: original.__func__(cls, _fresh_seed(), *args, **kwargs))

    def stateless_uniform(original):
        @functools.wraps(original)
        def uniform(shape, seed, *args, **kwargs):
            return original(shape, tf.random.experimental.stateless_fold_in(seed, _fresh_seed()), *args, **kwargs)
        return uniform

    undo = [replace(keras.layers.Dropout, "__init__", dropout), replace(tf.random.Generator, "from_seed", from_seed),
            replace(tf.random, "stateless_uniform", stateless_uniform)]
    return lambda: [u() for u in reversed(undo)]


def _replica_zero(original):
    return property(lambda self: 0)


def _replica_ids_shared():
    """Every replica's id in its sync group, in a replica context and a value context, reported as 0: the
    streams seeded or folded with it are one stream."""
    undo = [replace(tf.distribute.ReplicaContext, "replica_id_in_sync_group", _replica_zero),
            replace(tf.distribute.experimental.ValueContext, "replica_id_in_sync_group", _replica_zero)]
    return lambda: [u() for u in reversed(undo)]


def _optional_skips_first():
    undo = [replace(cls, "get_next_as_optional", _first_optional_thrown_away)
            for cls in (input_lib.DistributedIteratorBase, iterator_ops.OwnedIterator)]
    return lambda: [u() for u in reversed(undo)]


def _gradients_doubled(original):
    """``GradientTape.gradient`` returning twice each gradient (in Keras' own train step too)."""
    def gradient(self, target, sources, *args, **kwargs):
        return tf.nest.map_structure(lambda g: None if g is None else 2 * g,
                                     original(self, target, sources, *args, **kwargs))
    return gradient


def _fit_after_a_draw(original):
    """``Model.fit`` that begins an iteration of a dataset it is given and draws its first batch before
    training, as Keras 3.5+'s symbolic build does under a strategy: each epoch trains a later iteration."""
    def fit(self, x=None, *args, **kwargs):
        if isinstance(x, tf.data.Dataset):
            next(iter(x))
        return original(self, x, *args, **kwargs)
    return fit


def _global_batch_per_replica(original):
    """``InputContext.get_per_replica_batch_size`` returning the global batch size it is given."""
    return lambda self, global_batch_size: global_batch_size


PATCHES = {
    "local_batch_denominator": lambda: replace(tf.nn, "compute_average_loss", _local_mean),
    "scale_reg_not_divided": lambda: replace(tf.nn, "scale_regularization_loss", _not_divided),
    "keras_loss_times_replicas": lambda: replace(keras.losses.Loss, "__call__", _times_replicas),
    "reversed_local_results": lambda: replace(tf.distribute.ReplicaContext, "replica_id_in_sync_group", _mirror_ids),
    "reduce_mean_of_means": lambda: replace(tf.distribute.Strategy, "reduce", _mean_of_means),
    "bn_momentum_inverted": lambda: replace(keras.layers.BatchNormalization, "__init__", _momentum_inverted),
    "bn_not_synchronized": lambda: replace(keras.layers.BatchNormalization, "__init__", _not_synchronized),
    "short_batch_dropped": lambda: replace(tf.data.Dataset, "batch", _remainder_dropped),
    "fit_gradients_doubled": lambda: replace(tf.GradientTape, "gradient", _gradients_doubled),
    "fit_draws_an_iteration_first": lambda: replace(keras.Model, "fit", _fit_after_a_draw),
    "ps_step_scheduled_twice": _scheduled_once_more,
    "ps_shards_reversed": _partitioners_one_shard_more,
    "ps_shards_on_one_task": lambda: replace(ParameterServerStrategyV2Extended, "_create_variable_round_robin",
                                             _round_robin_reset),
    "ps_loss_times_two": lambda: replace(tf.nn, "compute_average_loss", _doubled),
    "sparse_duplicates_dropped": lambda: replace(keras.optimizers.Optimizer, "apply_gradients", _first_of_duplicates),
    "random_unseeded": _unseeded,
    "random_replica_streams_shared": _replica_ids_shared,
    "input_dropped_element": lambda: replace(tf.data.Dataset, "batch", _first_element_dropped),
    "input_rows_to_first_replica": lambda: replace(tf.data.Dataset, "batch", _half_batches),
    "input_policy_data": lambda: replace(tf.data.Dataset, "with_options", _data_sharding),
    "optional_iteration_skips_first": _optional_skips_first,
    "input_fn_global_batch": lambda: replace(tf.distribute.InputContext, "get_per_replica_batch_size",
                                             _global_batch_per_replica),
    "values_fn_mirror_ids": lambda: replace(tf.distribute.experimental.ValueContext, "replica_id_in_sync_group",
                                            _mirror_ids),
    "checkpoint_without_optimizer": lambda: replace(tf.train.Checkpoint, "__init__", _without_optimizer),
    "counters_not_restored": lambda: replace(tf.train.Checkpoint, "restore", _reads_nothing),
    "tutorial_restore_skipped": lambda: replace(tf.train.Checkpoint, "restore", _reads_nothing),
}
