"""The mutants of the canonical train step (suite/engine/steps.py), applied from outside: each
replaces one part of ``TrainStep`` (``scaled_loss``, ``regularization``, ``apply_gradients``) or
``optimizer_options`` with a wrong one while it is on. ``PATCHES[name]()`` applies a mutant's
patches and returns the function that puts the originals back."""

from __future__ import annotations

import tensorflow as tf

from .. import steps
from . import replace

SUM = tf.distribute.ReduceOp.SUM
CLIP_OPTIONS = ("clipnorm", "clipvalue", "global_clipnorm")


def _gradients(change):
    """A patch of ``TrainStep.apply_gradients`` that hands the optimizer ``change(step, grads)``."""
    def make(original):
        def apply_gradients(self, grads):
            return original(self, change(self, grads))
        return apply_gradients
    return lambda: replace(steps.TrainStep, "apply_gradients", make)


def _options(change):
    """A patch of ``steps.optimizer_options`` that changes the options in place: ``change(strategy, options)``."""
    def make(original):
        def optimizer_options(strategy, options):
            options = original(strategy, options)
            change(strategy, options)
            return options
        return optimizer_options
    return lambda: replace(steps, "optimizer_options", make)


def local_mean(per_example_loss, sample_weight=None):
    """A replica's own mean: its per-example losses (weighted) summed and divided by its local batch,
    not the global one (the step's mutant and compute_average_loss's alike)."""
    loss = tf.convert_to_tensor(per_example_loss)
    weighted = loss if sample_weight is None else loss * sample_weight
    return tf.math.divide_no_nan(tf.reduce_sum(weighted), tf.cast(tf.size(loss), loss.dtype))


def _local_batch_denominator(original):
    return lambda self, per_example, global_batch_size: local_mean(per_example)


def _default_denominator_is_global(original):
    def scaled_loss(self, per_example, global_batch_size):
        if global_batch_size is None:  # the default (replicas x local batch) replaced by the all-reduced global batch
            global_batch_size = tf.distribute.get_replica_context().all_reduce(SUM, tf.shape(per_example)[0])
        return original(self, per_example, global_batch_size)
    return scaled_loss


def _not_scaled(original):
    return lambda self, losses: tf.add_n(losses)  # counted once per replica


def _left_out(original):
    return lambda self, losses: tf.zeros_like(tf.add_n(losses))


def _one_replica_dropped(step, grads):  # replica 1's gradients never reach the sum
    keep = tf.not_equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 1)
    return [g * tf.cast(keep, g.dtype) for g in grads]


def clip_in_replica(grads, clip: dict):
    """Each replica's own gradients clipped as the optimizer option ``{option: value}`` would
    clip them (clipping before apply_gradients sums the replicas)."""
    (option, value), = clip.items()
    if option == "clipnorm":
        return [tf.clip_by_norm(g, value) for g in grads]
    if option == "clipvalue":
        return [tf.clip_by_value(g, -value, value) for g in grads]
    return tf.clip_by_global_norm(grads, value)[0]


def _clip_per_replica():
    """The optimizer built without its clip option, which each replica's step applies to its own
    gradients before apply_gradients sums them: the option moved is bound to the step made next."""
    moved: dict = {}

    def options(strategy, opts):
        moved.clear()
        moved.update({k: opts.pop(k) for k in CLIP_OPTIONS if k in opts})

    def make_init(original):
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            self.clip_here = dict(moved)  # the options the last optimizer_options moved, for this step only
            moved.clear()
        return __init__

    undo = [_options(options)(), replace(steps.TrainStep, "__init__", make_init),
            _gradients(lambda step, grads: clip_in_replica(grads, step.clip_here)
                       if getattr(step, "clip_here", None) else grads)()]
    return lambda: [u() for u in reversed(undo)]


def _drop_clipping(strategy, options):
    for k in CLIP_OPTIONS:
        options.pop(k, None)


def _decay_per_replica(strategy, options):  # as if every replica applied the decay: first order in decay x rate
    if options.get("weight_decay"):
        options["weight_decay"] *= strategy.num_replicas_in_sync


def _ema_inverted(strategy, options):
    if "ema_momentum" in options:
        options["ema_momentum"] = 1 - options["ema_momentum"]


def _one_micro_step_more(strategy, options):
    if options.get("gradient_accumulation_steps"):
        options["gradient_accumulation_steps"] += 1


PATCHES = {
    "step_local_batch_denominator": lambda: replace(steps.TrainStep, "scaled_loss", _local_batch_denominator),
    "default_denominator_is_global": lambda: replace(steps.TrainStep, "scaled_loss", _default_denominator_is_global),
    "step_regularization_not_scaled": lambda: replace(steps.TrainStep, "regularization", _not_scaled),
    "step_regularization_left_out": lambda: replace(steps.TrainStep, "regularization", _left_out),
    "double_gradient_aggregation": _gradients(
        lambda step, grads: tf.distribute.get_replica_context().all_reduce(SUM, grads)),
    "step_one_replica_dropped": _gradients(_one_replica_dropped),
    "ps_gradient_doubled": _gradients(lambda step, grads: [2 * g for g in grads]),
    "step_applies_nothing": lambda: replace(steps.TrainStep, "apply_gradients", lambda original: lambda self, grads: None),
    "clip_per_replica": _clip_per_replica,
    "clipping_dropped": _options(_drop_clipping),
    "weight_decay_per_replica": _options(_decay_per_replica),
    "ema_momentum_inverted": _options(_ema_inverted),
    "accumulation_one_step_more": _options(_one_micro_step_more),
}
