"""Checkpoint probes: train under one strategy and save a tf.train.Checkpoint (model, optimizer,
metrics); restore it under another strategy (or none) and train one more step; export a
SavedModel and reload it without a strategy."""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from ...common.results import Counters, Prediction, Restored, TrainingState
from .. import compat
from ..steps import arch_key, load
from .registry import probe
from .training import _trainer


def _state(ctx, model, opt, metrics, path=None) -> TrainingState:
    """Every variable's value: model (every local replica's copy), optimizer, metric states."""
    return TrainingState(
        params=[compat.local_values(ctx.strategy, v) for v in model.trainable_variables],
        optimizer=[np.asarray(v.numpy()) for v in compat.optimizer_variables(opt)],
        iterations=int(compat.tf_variable(opt.iterations).numpy()),
        metrics={name: [np.asarray(v.numpy()) for v in m.variables] for name, m in metrics.items()},
        metric_results={name: np.asarray(m.result()) for name, m in metrics.items()}, path=path)


def _run_steps(step, steps):
    for x, y, sizes in steps:
        step(x, y, np.asarray(sizes, np.int32), np.int64(len(x)))


def _metric_states(metrics: dict) -> dict:
    """Keras 3 metrics are not tf.train trackables: checkpoint their (sync-on-read) tf.Variables."""
    return {name: [compat.tf_variable(v) for v in m.variables] for name, m in metrics.items()}


def _fresh(ctx, arch, optimizer, dtype):
    """Model, optimizer, metrics and traced step of ``(arch, optimizer, dtype)`` holding the values
    of fresh objects (the model's initial weights, the optimizer's initial state, empty metrics),
    and a new Checkpoint of them. The objects and the step are built and traced once per engine
    (a trace per call cost most of a call); every variable is reset here, so nothing carries
    over from an earlier call."""
    def build():
        metrics: dict = {}
        model, opt, initial, step = _trainer(ctx, arch, optimizer, dtype, False, metrics)
        weights = [np.array(v.numpy()) for v in model.trainable_variables]
        return model, opt, initial, weights, metrics, step

    model, opt, initial, weights, metrics, step = ctx.cached(("checkpoint", arch_key(arch), optimizer, dtype), build)
    load(model, weights, dtype, opt, initial)
    for m in metrics.values():
        compat.reset_metric(m)
    return model, opt, metrics, step, tf.train.Checkpoint(model=model, optimizer=opt, **_metric_states(metrics))


@probe
def save(ctx, arch, optimizer, dtype, params, steps, directory):
    """Set ``params``, train ``steps`` under this strategy, save a checkpoint (the chief to
    ``directory``, other workers to their own folders, as the multi-worker guide does)."""
    model, opt, metrics, step, ckpt = _fresh(ctx, arch, optimizer, dtype)
    load(model, params, dtype)
    _run_steps(step, steps)
    target = directory if ctx.worker_index == 0 else os.path.join(directory, f"worker{ctx.worker_index}")
    path = ckpt.save(os.path.join(target, "ckpt"))
    return _state(ctx, model, opt, metrics, path if ctx.worker_index == 0 else None)


@probe
def restore(ctx, arch, optimizer, dtype, path, steps):
    """Build the same objects fresh under this strategy, restore ``path``, then run ``steps``."""
    model, opt, metrics, step, ckpt = _fresh(ctx, arch, optimizer, dtype)
    ckpt.restore(path).assert_existing_objects_matched()
    restored = _state(ctx, model, opt, metrics)
    _run_steps(step, steps)
    return Restored(restored, _state(ctx, model, opt, metrics))


@probe
def export(ctx, arch, dtype, params, x, directory):
    """Build the model under this strategy with ``params``, predict ``x``, export a SavedModel
    (the chief to ``directory``, other workers to their own folders)."""
    with ctx.strategy.scope():
        model = compat.build_model(arch, dtype)
    target = directory if ctx.worker_index == 0 else os.path.join(directory, f"worker{ctx.worker_index}")
    signature = tf.TensorSpec([None, arch["input_dim"]], dtype)
    load(model, params, dtype)
    prediction = model(tf.constant(x), training=False)
    compat.export_saved_model(model, target, signature)
    return Prediction(np.asarray(prediction))


@probe
def reload_predict(ctx, directory, x):
    """Load a SavedModel (under this engine's strategy, normally none) and run its
    serving_default signature on ``x``."""
    loaded = tf.saved_model.load(directory)
    outputs = loaded.signatures["serving_default"](tf.constant(x))
    return Prediction(np.asarray(next(iter(outputs.values()))))


@probe
def counters_save(ctx, values, directory):
    """Keras int64 Sum metrics (sync-on-read SUM state), one per value, updated once each under
    this strategy and saved in one checkpoint."""
    with ctx.strategy.scope():
        counters = [compat.make_metric("sum", "int64") for _ in values]
    for counter, value in zip(counters, values):
        counter.update_state(np.int64(value))
    states = {f"c{i}": [compat.tf_variable(v) for v in c.variables] for i, c in enumerate(counters)}
    target = directory if ctx.worker_index == 0 else os.path.join(directory, f"worker{ctx.worker_index}")
    path = tf.train.Checkpoint(**states).save(os.path.join(target, "ckpt"))
    return Counters([int(c.result()) for c in counters], path)


@probe
def counters_restore(ctx, n, path):
    """``n`` fresh int64 Sum metrics under this strategy, restored from ``path``: their results."""
    with ctx.strategy.scope():
        counters = [compat.make_metric("sum", "int64") for _ in range(n)]
    states = {f"c{i}": [compat.tf_variable(v) for v in c.variables] for i, c in enumerate(counters)}
    tf.train.Checkpoint(**states).restore(path).assert_existing_objects_matched()
    return Counters([int(c.result()) for c in counters])
