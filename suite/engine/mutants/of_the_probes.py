"""Mutants of what the engine reports, applied from outside: ``foreign_result`` wraps the probe
registry's ``run`` so that every result comes back moved off its value; ``optimizer_names_extra``
lists one built-in optimizer more; the others each replace one of the suite's own helpers that a
probe calls (reading a metric, normalising a loss, exporting a model, the stand-in data); three
wrap a user's optimizer as the workload and script probes take it (``_Capture.__init__``), so that
what the probe's wrapper hands over reaches the optimizer's own ``apply_gradients`` mutated: the
user's loop is wrong while the suite's own step (the loop check's control) is not.
``PATCHES[name]()`` applies a mutant's patch and returns the function that puts the original back."""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from ...common.results import Raised
from .. import compat
from ..probes import losses, metrics, registry, training, workload
from ..workloads import fashion
from . import replace


def foreign(x):
    """Every number of a result moved off its value (floats by 0.1% + 0.001, integers by 1), every
    list of names given one more, every caught exception renamed: a wrong value that no known
    deviation's signature describes (tests/units/test_deviations.py)."""
    if isinstance(x, Raised):
        return dataclasses.replace(x, type="ForeignError")
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return type(x)(**{f.name: foreign(getattr(x, f.name)) for f in dataclasses.fields(x)})
    if isinstance(x, dict):
        return {k: foreign(v) for k, v in x.items()}
    if isinstance(x, list):
        names = bool(x) and all(isinstance(v, str) for v in x)
        return [foreign(v) for v in x] + (["foreign"] if names else [])  # a list of names gains one
    if isinstance(x, bool) or isinstance(x, str) or x is None:
        return x
    if isinstance(x, float):
        return x * 1.001 + 0.001
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        return (x * 1.001 + 0.001).astype(x.dtype)
    if isinstance(x, int) or isinstance(x, np.ndarray) and x.dtype.kind in "iu":
        return x + 1
    return x


def _moved(original):
    def run(ctx, name, kwargs):
        return foreign(original(ctx, name, kwargs))
    return run


def _one_more_name(original):
    """Keras' built-in optimizers as the engine lists them, with one the suite's catalogue lacks."""
    return lambda: original() + ["Prodigy"]


def _read_before_update(original):
    """A replica's read of the metric taken before its batch is added: the read never sees that batch."""
    def update_and_read(metric, kind, y_true, y_pred):
        before = tf.identity(metric.result())
        with tf.control_dependencies([before]):
            metric.update_state(y_true, y_pred) if kind not in ("mean", "sum") else metric.update_state(y_pred)
        return before
    return update_and_read


def _first_replica(original):
    """The cross-replica result read from the first replica's copies of the metric's state (a Sum's
    total; a mean's total over its count), not from their reduction."""
    def read_metric(metric):
        states = [compat.tf_variable(v) for v in metric.variables]
        strategy = getattr(states[0], "distribute_strategy", None)
        if strategy is None or strategy.num_replicas_in_sync == 1:
            return original(metric)
        first = [v.values[0] for v in states]
        return first[0] if len(first) == 1 else tf.math.divide_no_nan(first[0], first[1])
    return read_metric


def _replica_zero_decides(original):
    """The unscaled gradients with what is not finite on any replica but 0 replaced by zeros: what replica 0
    cannot see never reaches the loss scale's check."""
    def unscaled_gradients(opt, grads):
        rid = tf.distribute.get_replica_context().replica_id_in_sync_group
        return [tf.where(tf.math.is_finite(g) | tf.equal(rid, 0), g, tf.zeros_like(g)) for g in original(opt, grads)]
    return unscaled_gradients


def _outside_scope(original):
    """The optimizer created outside the strategy's scope (its variables then are not the strategy's)."""
    return lambda strategy, name: getattr(compat.keras.optimizers, name)()


def _exported_as_built(original):
    """The SavedModel written from a fresh copy of the model: the weights it has when built, not the
    ones loaded into it."""
    def export_saved_model(model, path, input_spec):
        return original(compat.keras.models.clone_model(model), path, input_spec)
    return export_saved_model


def _unseeded(original):
    """The stand-in data drawn from an unseeded generator: other arrays on every call."""
    def load_data(n_train=2048, n_test=512, seed=0):
        return original(n_train, n_test, seed=None)
    return load_data


def _handed_over(mutate):
    """``_Capture.__init__`` (suite/engine/probes/workload.py) that first wraps the optimizer's own
    ``apply_gradients`` with ``mutate(pairs, record)``: the mutation sits between the probe's wrapper (which
    records what the loop hands over) and the user's optimizer only."""
    def make(original):
        def __init__(self, optimizer, variables, dense=False, record=True):
            own = optimizer.apply_gradients

            def apply_gradients(grads_and_vars, *args, **kwargs):
                return own(mutate(list(grads_and_vars), record), *args, **kwargs)

            optimizer.apply_gradients = apply_gradients
            original(self, optimizer, variables, dense=dense, record=record)
        return __init__
    return make


def _summed_twice(pairs, record):
    """Each replica's gradients all-reduced by hand, then summed again by apply_gradients."""
    context = tf.distribute.get_replica_context()
    if context is None:
        return pairs
    return [(context.all_reduce(tf.distribute.ReduceOp.SUM, g), v) for g, v in pairs]


def _replica_one_dropped(pairs, record):
    """Replica 1's gradients zeroed: they never reach the sum."""
    context = tf.distribute.get_replica_context()
    if context is None:
        return pairs
    keep = tf.cast(tf.not_equal(context.replica_id_in_sync_group, 1), pairs[0][0].dtype)
    return [(g * keep, v) for g, v in pairs]


def _doubled_on_a_cluster(pairs, record):
    """A script's scheduled step on a parameter-server cluster applying twice its gradients."""
    if record or not hasattr(tf.distribute.get_strategy(), "_is_parameter_server_strategy_v2"):
        return pairs
    return [(2 * g, v) for g, v in pairs]


PATCHES = {"foreign_result": lambda: replace(registry, "run", _moved),
           "optimizer_names_extra": lambda: replace(compat, "builtin_optimizer_names", _one_more_name),
           "metric_read_before_update": lambda: replace(metrics, "update_and_read", _read_before_update),
           "metric_first_replica": lambda: replace(metrics, "read_metric", _first_replica),
           "unnormalised_multi_dim": lambda: replace(losses, "elements_per_example",
                                                     lambda original: lambda labels: tf.constant(1, tf.int32)),
           "loss_scale_replica_zero_decides": lambda: replace(compat, "unscaled_gradients", _replica_zero_decides),
           "optimizer_outside_scope": lambda: replace(training, "optimizer_under", _outside_scope),
           "saved_model_before_load": lambda: replace(compat, "export_saved_model", _exported_as_built),
           "fashion_data_unseeded": lambda: replace(fashion, "load_data", _unseeded),
           "double_gradient_aggregation": lambda: replace(workload._Capture, "__init__", _handed_over(_summed_twice)),
           "step_one_replica_dropped": lambda: replace(workload._Capture, "__init__", _handed_over(_replica_one_dropped)),
           "ps_gradient_doubled": lambda: replace(workload._Capture, "__init__", _handed_over(_doubled_on_a_cluster))}
