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

``global_batch_loss``: what known deviation fit-loss-mean-per-replica-on-uneven-split says Keras would do to train as
one device does (no Keras has it): each replica's compiled loss reduced with a mean ("sum_over_batch_size") divided by
the rows of the global batch (the replicas' divisors summed with an all-reduce) instead of its own rows times the
replicas, as TensorFlow's custom-training guide has tf.nn.compute_average_loss do; the loss trackers are fed what
Keras feeds them. Written for Keras 3.8+ (``keras.src.losses.loss.reduce_values``) and Keras 2 / tf-keras
(``engine/compile_utils.py LossesContainer``); on an even split it changes nothing.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import threading

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


def _global_rows(local):
    """The sum over the replicas of ``local`` (a float scalar each replica computed), or None outside a
    replica context of several replicas. On one worker the local results are added in the merge (no
    collective: a script's second strategy in the engine would take the collective instance keys its
    first one registered with other shapes); across workers an all-reduce."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return None
    if getattr(ctx.strategy.extended, "_in_multi_worker_mode", lambda: False)():
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, local)
    return ctx.merge_call(lambda strategy, value: tf.add_n(strategy.experimental_local_results(value)),
                          args=(local,))


@contextlib.contextmanager
def global_batch_loss():
    if compat.KERAS_GENERATION < 3:
        with _global_batch_loss_keras2():
            yield
        return
    from keras.src import ops
    from keras.src.losses import loss as loss_module
    if not hasattr(loss_module, "scale_loss_for_distribution"):
        raise RuntimeError(f"the remedy global_batch_loss is not written for Keras {compat.KERAS_VERSION} (before "
                           "3.8 its losses are not scaled for distribution at all)")
    reduce_values, unscale = loss_module.reduce_values, loss_module.unscale_loss_for_distribution
    signature = inspect.signature(reduce_values)
    local = threading.local()  # per replica thread: (graph, the loss this remedy gave, the one Keras gave)

    def records() -> list:
        graph = tf.compat.v1.get_default_graph()
        return [r for r in getattr(local, "records", []) if r[0] is graph]

    def global_reduce_values(*args, **kwargs):
        out = reduce_values(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values, weight, reduction = (bound.arguments[k] for k in ("values", "sample_weight", "reduction"))
        if reduction not in MEAN_REDUCTIONS or tuple(values.shape) in ((), (0,)):
            return out
        total = ops.sum(values)
        if reduction == "mean_with_sample_weight" and weight is not None:
            divisor = ops.cast(ops.sum(weight), total.dtype)
        else:
            divisor = ops.cast(ops.prod(ops.convert_to_tensor(ops.shape(values), dtype="int32")), total.dtype)
        rows = _global_rows(divisor)
        if rows is None:
            return out
        mine = ops.divide_no_nan(total, rows)
        local.records = [*getattr(local, "records", []), (tf.compat.v1.get_default_graph(), mine, out)]
        return mine

    def keras_unscale(value):
        """What Keras' own loss gave, unscaled: the trackers' value (the total of a step, or one of its losses)."""
        mine = records()
        same = [keras for _, ours, keras in mine if ours is value]
        if same:
            return unscale(same[0])
        if mine:
            value = value - sum(ours - keras for _, ours, keras in mine)
            local.records = [r for r in local.records if r not in mine]
        return unscale(value)

    loss_module.reduce_values, loss_module.unscale_loss_for_distribution = global_reduce_values, keras_unscale
    try:
        yield
    finally:
        loss_module.reduce_values, loss_module.unscale_loss_for_distribution = reduce_values, unscale


def _keras2_module(name: str):
    for prefix in ("tf_keras.src", "keras.src", "keras"):
        try:
            return importlib.import_module(f"{prefix}.{name}")
        except ImportError:
            continue
    raise RuntimeError(f"the remedy global_batch_loss found no Keras 2 {name} (Keras {compat.KERAS_VERSION})")


@contextlib.contextmanager
def _global_batch_loss_keras2():
    compile_utils = _keras2_module("engine.compile_utils")
    losses_utils = compile_utils.losses_utils
    call, scale = compile_utils.LossesContainer.__call__, losses_utils.scale_loss_for_distribution
    local = threading.local()  # per replica thread: the values LossesContainer scaled, while it runs

    def recording_scale(value):
        scaled = getattr(local, "scaled", None)
        if scaled is not None:
            scaled.append(value)
        return scale(value)

    def global_call(self, y_true, y_pred, sample_weight=None, regularization_losses=None):
        local.scaled = []
        try:
            total = call(self, y_true, y_pred, sample_weight=sample_weight,
                         regularization_losses=regularization_losses)
        finally:
            scaled, local.scaled = local.scaled, None
        data = scaled[:-1] if regularization_losses else scaled  # the regularization is scaled last
        if total is None or not data:
            return total
        first = tf.nest.flatten(y_pred)[0]
        rows = tf.cast(tf.shape(first)[0], total.dtype)
        every = _global_rows(rows)
        if every is None:
            return total
        share = tf.math.divide_no_nan(rows, every) - 1.0 / tf.distribute.get_strategy().num_replicas_in_sync
        return total + sum(tf.cast(v, total.dtype) * share for v in data)

    compile_utils.LossesContainer.__call__, losses_utils.scale_loss_for_distribution = global_call, recording_scale
    try:
        yield
    finally:
        compile_utils.LossesContainer.__call__, losses_utils.scale_loss_for_distribution = call, scale


REMEDIES = {"scaled_keras_losses": scaled_keras_losses, "global_batch_loss": global_batch_loss}


@contextlib.contextmanager
def applied(names) -> None:
    """The remedies ``names`` (keys of REMEDIES) in force for the block."""
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(REMEDIES[name]())
        yield
