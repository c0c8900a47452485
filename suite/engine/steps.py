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
from . import compat

SUM = tf.distribute.ReduceOp.SUM


class TrainStep:
    """``step(x, y, global_batch_size=None)`` in replica context: one step of ``model`` with
    ``optimizer`` on this replica's batch; returns the scaled loss. ``per_example_loss(y, out)``
    gives one loss per example; ``observe(per_example, x)``, if given, runs after the forward
    pass (metric updates). With a LossScaleOptimizer the step scales the loss and unscales the
    gradients as the mixed-precision guide's custom loop does."""

    def __init__(self, model, optimizer, per_example_loss, observe=None, jit=False):
        self.model = model
        self.optimizer = optimizer
        self.loss_scaling = isinstance(optimizer, compat.keras.mixed_precision.LossScaleOptimizer)
        self.per_example_loss = per_example_loss
        self.observe = observe
        # jit: the forward and backward pass compiled with XLA (tf.function(jit_compile=True)),
        # apply_gradients (which sums over replicas) outside it, as Keras' own train step does
        self.losses_and_grads = tf.function(self._losses_and_grads, jit_compile=True) if jit else self._losses_and_grads

    def __call__(self, x, y, global_batch_size=None):
        per_example, loss, grads = self.losses_and_grads(x, y, global_batch_size)
        if self.observe is not None:
            self.observe(per_example, x)
        self.apply_gradients(grads)
        return loss

    def _losses_and_grads(self, x, y, global_batch_size):
        """Per-example losses, the replica's scaled loss and its gradients."""
        model = self.model
        with tf.GradientTape() as tape:
            per_example = self.per_example_loss(y, model(x, training=True))
            loss = self.scaled_loss(per_example, global_batch_size)
            if model.losses:
                loss += self.regularization(model.losses)
            target = compat.scaled_loss(self.optimizer, loss) if self.loss_scaling else loss
        grads = tape.gradient(target, model.trainable_variables)
        return per_example, loss, compat.unscaled_gradients(self.optimizer, grads) if self.loss_scaling else grads

    def scaled_loss(self, per_example, global_batch_size):
        """The replica's share of the global mean: its per-example losses summed over the global batch
        size (by default replicas x local batch)."""
        return tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)

    def regularization(self, losses):
        """The model's weight penalties, divided by the replica count (every replica adds them)."""
        return tf.nn.scale_regularization_loss(tf.add_n(losses))

    def apply_gradients(self, grads):
        """The replica's gradients handed to the optimizer, which sums them over the replicas."""
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))


def optimizer_options(strategy, options: dict | None) -> dict:
    """The keyword arguments a block adds to the optimizer (``clipnorm``, ``weight_decay``, ...), as
    the optimizer gets them under ``strategy``: unchanged (a copy)."""
    return dict(options or {})


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
