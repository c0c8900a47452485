"""The custom-training guide's per-replica train step, written once for every probe that trains
(training, checkpoints, parameter servers, benchmarks; the tutorial probe keeps the guide's own
code as the guide writes it).

Inside ``strategy.run`` each replica computes its per-example losses, scales them with
``tf.nn.compute_average_loss`` (by the global batch size given, or by its default, replicas x
local batch), adds ``tf.nn.scale_regularization_loss`` of the model's losses, and hands the
gradients to ``apply_gradients``, which sums them over replicas. The loss it returns is
SUM-reduced for reporting (``reported``).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ..common.catalog import OPTIMIZERS
from . import compat, mutants

SUM = tf.distribute.ReduceOp.SUM


class TrainStep:
    """``step(x, y, global_batch_size=None)`` in replica context: one step of ``model`` with
    ``optimizer`` on this replica's batch; returns the scaled loss. ``per_example_loss(y, out)``
    gives one loss per example; ``observe(per_example, x)``, if given, runs after the forward
    pass (metric updates). With a LossScaleOptimizer the step scales the loss and unscales the
    gradients as the mixed-precision guide's custom loop does."""

    def __init__(self, model, optimizer, per_example_loss, observe=None, clip_here=None, jit=False):
        self.model = model
        self.optimizer = optimizer
        self.loss_scaling = isinstance(optimizer, compat.keras.mixed_precision.LossScaleOptimizer)
        self.per_example_loss = per_example_loss
        self.observe = observe
        self.clip_here = clip_here  # mutant clip_per_replica: {option: value} clipped in the step
        # jit: the forward and backward pass compiled with XLA (tf.function(jit_compile=True)),
        # apply_gradients (which sums over replicas) outside it, as Keras' own train step does
        self.losses_and_grads = tf.function(self._losses_and_grads, jit_compile=True) if jit else self._losses_and_grads

    def __call__(self, x, y, global_batch_size=None):
        per_example, loss, grads = self.losses_and_grads(x, y, global_batch_size)
        if self.observe is not None:
            self.observe(per_example, x)
        return self._apply(loss, grads)

    def _losses_and_grads(self, x, y, global_batch_size):
        """Per-example losses, the replica's scaled loss and its gradients."""
        model = self.model
        with tf.GradientTape() as tape:
            per_example = self.per_example_loss(y, model(x, training=True))
            if mutants.on("step_local_batch_denominator"):
                loss = tf.math.divide_no_nan(tf.reduce_sum(per_example), tf.cast(tf.size(per_example), per_example.dtype))
            elif mutants.on("default_denominator_is_global") and global_batch_size is None:
                # the default (replicas x local batch) replaced by the global batch, all-reduced
                total = tf.distribute.get_replica_context().all_reduce(SUM, tf.shape(per_example)[0])
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=total)
            else:
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
            if model.losses and mutants.on("step_regularization_not_scaled"):
                loss += tf.add_n(model.losses)  # counted once per replica
            elif model.losses and not mutants.on("step_regularization_left_out"):
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            target = compat.scaled_loss(self.optimizer, loss) if self.loss_scaling else loss
        grads = tape.gradient(target, model.trainable_variables)
        return per_example, loss, compat.unscaled_gradients(self.optimizer, grads) if self.loss_scaling else grads

    def _apply(self, loss, grads):
        model = self.model
        if mutants.on("double_gradient_aggregation"):
            grads = tf.distribute.get_replica_context().all_reduce(SUM, grads)
        if mutants.on("step_one_replica_dropped"):  # replica 1's gradients never reach the sum
            keep = tf.not_equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 1)
            grads = [g * tf.cast(keep, g.dtype) for g in grads]
        if mutants.on("clip_per_replica") and self.clip_here:
            grads = clip_in_replica(grads, self.clip_here)
        if mutants.on("ps_gradient_doubled"):
            grads = [2 * g for g in grads]
        if not mutants.on("step_applies_nothing"):
            self.optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss


CLIP_OPTIONS = ("clipnorm", "clipvalue", "global_clipnorm")


def clip_in_replica(grads, clip: dict):
    """Each replica's own gradients clipped as the optimizer option ``{option: value}`` would
    clip them (the mutant clip_per_replica: clipping before apply_gradients sums the replicas)."""
    (option, value), = clip.items()
    if option == "clipnorm":
        return [tf.clip_by_norm(g, value) for g in grads]
    if option == "clipvalue":
        return [tf.clip_by_value(g, -value, value) for g in grads]
    return tf.clip_by_global_norm(grads, value)[0]


def optimizer_options(strategy, options: dict | None) -> tuple[dict, dict]:
    """The keyword arguments a block adds to the optimizer (``clipnorm``, ``weight_decay``, ...)
    and the clip options the step applies itself: none, unless a clipping or weight-decay
    mutant moves or changes them."""
    options = dict(options or {})
    moved = {}
    if mutants.on("clipping_dropped") or mutants.on("clip_per_replica"):
        moved = {k: options.pop(k) for k in CLIP_OPTIONS if k in options}
    if mutants.on("weight_decay_per_replica") and options.get("weight_decay"):
        # as if every replica applied the decay: first order in weight_decay x learning rate
        options["weight_decay"] *= strategy.num_replicas_in_sync
    if mutants.on("ema_momentum_inverted") and "ema_momentum" in options:
        options["ema_momentum"] = 1 - options["ema_momentum"]
    if mutants.on("accumulation_one_step_more") and options.get("gradient_accumulation_steps"):
        options["gradient_accumulation_steps"] += 1
    return options, moved if mutants.on("clip_per_replica") else {}


def reported(strategy, per_replica_loss):
    """The step's loss as a custom loop reports it: the replicas' scaled losses SUM-reduced."""
    return strategy.reduce(SUM, per_replica_loss, axis=None)


def arch_key(arch: dict) -> tuple:
    """A hashable key for a model family member given as plain data (to cache its step)."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in arch.items()))


def family_loss(arch: dict):
    """The model family's per-example loss (MSE for a linear head, sparse crossentropy of
    probabilities for softmax)."""
    return lambda y, out: compat.per_example_loss(arch["head"], y, out)


def family_model_and_optimizer(strategy, arch: dict, optimizer: str, dtype: str, options: dict | None = None):
    """A member of the model family and the optimizer ``OPTIMIZERS[optimizer]`` (with the
    keyword arguments ``options`` added), created under the strategy's scope and built eagerly
    (see known deviation keras3-lazy-optimizer-slots-mirrored)."""
    with strategy.scope():
        model = compat.build_model(arch, dtype)
        cls, cfg = OPTIMIZERS[optimizer]
        opt = compat.make_optimizer(cls, dict(cfg, **(options or {})))
        opt.build(model.trainable_variables)
    return model, opt


def optimizer_state(opt) -> list[np.ndarray]:
    """Copies of every optimizer variable's value (to reset the optimizer between calls)."""
    return [np.array(v.numpy()) for v in compat.optimizer_variables(opt)]


def load(model, params, dtype: str, opt=None, state=()):
    """Set the model's parameters to ``params`` (and ``opt``'s variables to ``state``)."""
    for var, value in zip(model.trainable_variables, params):
        var.assign(np.asarray(value, dtype))
    for var, value in zip(compat.optimizer_variables(opt) if opt is not None else [], state):
        var.assign(value)
