"""Remedies (engine side: imports TensorFlow): the change a later Keras made, applied in the engine
for one run of an earlier one, so that the check can show a difference is exactly what that change
removes (known_deviations.toml ``remedy``; suite/harness/judging/deviations.py REMEDIES).

``scaled_keras_losses``: keras-team/keras#20609 and keras-team/keras#20610 (first released in Keras 3.8.0) in Keras
3.0-3.7, on the TensorFlow backend under a strategy of several replicas:

- ``keras.src.losses.loss.reduce_values`` multiplies a loss it reduced with a mean
  ("sum_over_batch_size", "mean", "mean_with_sample_weight") by 1 / replicas
  (``scale_loss_for_distribution``);
- ``Trainer.compute_loss`` adds each of ``model.losses`` (the regularization) times 1 / replicas
  (the TensorFlow trainer's ``_aggregate_additional_loss``);
- Keras' own ``train_step`` and ``test_step`` update the loss tracker with the loss times replicas
  (``unscale_loss_for_distribution``), so fit's and evaluate's logs stay the mean loss.

Where Keras already has them (3.8+) nothing is changed.
"""

from __future__ import annotations

import contextlib
import inspect

import tensorflow as tf

from . import compat

MEAN_REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight")


def _replicas() -> int:
    return tf.distribute.get_strategy().num_replicas_in_sync


@contextlib.contextmanager
def scaled_keras_losses():
    if compat.KERAS_GENERATION < 3:
        yield
        return
    try:
        from keras.src import backend, ops
        from keras.src.backend.tensorflow import trainer as tf_trainer
        from keras.src.losses import loss as loss_module
        from keras.src.trainers import trainer as trainer_module
    except ImportError:  # Keras 3.0 kept its modules outside keras.src
        raise RuntimeError(f"the remedy scaled_keras_losses is not written for Keras {compat.KERAS_VERSION}") from None
    if hasattr(loss_module, "scale_loss_for_distribution"):  # Keras 3.8+: nothing to remedy
        yield
        return

    reduce_values = loss_module.reduce_values
    compute_loss = trainer_module.Trainer.compute_loss
    train_step, test_step = tf_trainer.TensorFlowTrainer.train_step, tf_trainer.TensorFlowTrainer.test_step
    signature = inspect.signature(reduce_values)

    def scaled_reduce_values(*args, **kwargs):
        out = reduce_values(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values, reduction = bound.arguments["values"], bound.arguments["reduction"]
        if reduction in MEAN_REDUCTIONS and tuple(values.shape) not in ((), (0,)) and _replicas() > 1:
            out = ops.multiply(out, ops.cast(1.0 / _replicas(), out.dtype))
        return out

    def scaled_compute_loss(self, *args, **kwargs):
        total = compute_loss(self, *args, **kwargs)
        extra = [ops.sum(ops.cast(loss, dtype=backend.floatx())) for loss in self.losses]
        if not extra or _replicas() == 1:
            return total
        added = ops.sum(extra) if len(extra) > 1 else extra[0]
        return total - added + ops.multiply(added, ops.cast(1.0 / _replicas(), added.dtype))

    trackers: list = []  # the loss trackers given an unscaling update_state (each replica's thread traces the step)

    def unscaled_tracker(step):
        def wrapped(self, data):
            tracker = getattr(self, "_loss_tracker", None)
            if tracker is not None and "update_state" not in vars(tracker):
                update = type(tracker).update_state.__get__(tracker)

                def update_state(values, sample_weight=None):
                    values = ops.convert_to_tensor(values)
                    return update(ops.multiply(values, ops.cast(_replicas(), values.dtype)), sample_weight=sample_weight)

                vars(tracker)["update_state"] = update_state  # past Keras' attribute tracking; once per tracker
                trackers.append(tracker)
            return step(self, data)
        return wrapped

    loss_module.reduce_values = scaled_reduce_values
    trainer_module.Trainer.compute_loss = scaled_compute_loss
    tf_trainer.TensorFlowTrainer.train_step = unscaled_tracker(train_step)
    tf_trainer.TensorFlowTrainer.test_step = unscaled_tracker(test_step)
    try:
        yield
    finally:
        for tracker in trackers:
            vars(tracker).pop("update_state", None)
        loss_module.reduce_values = reduce_values
        trainer_module.Trainer.compute_loss = compute_loss
        tf_trainer.TensorFlowTrainer.train_step, tf_trainer.TensorFlowTrainer.test_step = train_step, test_step


REMEDIES = {"scaled_keras_losses": scaled_keras_losses}


@contextlib.contextmanager
def applied(names) -> None:
    """The remedies ``names`` (keys of REMEDIES) in force for the block."""
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(REMEDIES[name]())
        yield
