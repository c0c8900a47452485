"""Keras metrics aggregated across replicas (float64).

Metric state variables are sync-on-read with SUM aggregation (keras/src/metrics/metric.py
``add_variable``; Keras 2 base_metric.py ``add_weight``): each replica accumulates its own
``total`` (and ``count``); reading ``result()`` in cross-replica context sums the states over
replicas first, so the result is the metric of all the data seen by all replicas.
"""

from __future__ import annotations

import numpy as np

from .rules import documented, helper, observed

METRICS = ("mean", "sum", "accuracy", "binary_accuracy", "sparse_categorical_accuracy",
           "categorical_accuracy")


@documented(
    'keras.metrics.Accuracy etc.: how often predictions equal labels; tf.math.argmax: smallest index '
    "on ties; BinaryAccuracy's strict > observed (accuracy_metrics.py)"
)
def values(kind: str, y_true, y_pred) -> np.ndarray:
    """Per-example values a metric accumulates: the value for Mean/Sum, 1.0/0.0 matches else.

    Accuracy: exact equality. BinaryAccuracy: ``y_pred > 0.5`` (strict) equals ``y_true``.
    (Sparse)CategoricalAccuracy: argmax over the last axis, ties to the lowest index."""
    y_pred = np.asarray(y_pred, dtype=np.float64)
    if kind in ("mean", "sum"):
        return y_pred
    y_true = np.asarray(y_true, dtype=np.float64)
    if kind == "accuracy":
        return (y_true == y_pred).astype(np.float64)
    if kind == "binary_accuracy":
        return ((y_pred > 0.5).astype(np.float64) == y_true).astype(np.float64)
    if kind == "sparse_categorical_accuracy":
        return (np.argmax(y_pred, axis=-1) == y_true).astype(np.float64)
    if kind == "categorical_accuracy":
        return (np.argmax(y_pred, axis=-1) == np.argmax(y_true, axis=-1)).astype(np.float64)
    raise ValueError(f"unknown metric {kind!r}")


@helper
def state(kind: str, batches) -> tuple[float, float]:
    """(total, count) after updating one replica's metric with each (y_true, y_pred) batch
    (rank-1 values: one value per example)."""
    total, count = 0.0, 0.0
    for y_true, y_pred in batches:
        v = values(kind, y_true, y_pred)
        total += float(v.sum())
        count += float(v.size)
    return total, count


@documented("keras.metrics.Mean: 'simply total divided by count'; count 0 gives 0: divide_no_nan (observed)")
def result(kind: str, total: float, count: float) -> float:
    """``result()`` from a (possibly summed) state; Sum is the total, others divide_no_nan."""
    if kind == "sum":
        return total
    return total / count if count else 0.0


@observed(
    'tf.distribute: a SyncOnRead variable read in cross-replica context aggregates its components '
    '(documented); Keras metric state is SUM on_read: keras metric.py add_variable, Keras 2 '
    'base_metric.py'
)
def cross_replica_result(kind: str, per_replica_states) -> float:
    """``result()`` read in cross-replica context: states SUM-aggregated over replicas."""
    total = sum(s[0] for s in per_replica_states)
    count = sum(s[1] for s in per_replica_states)
    return result(kind, total, count)


@observed(
    'Keras 2 metrics_utils.result_wrapper merge_call; Keras 3 plain read of an on_read variable '
    '(values.py SyncOnReadVariable.value), on_read since Keras 3.10 (keras-team/keras#21072)'
)
def replica_context_result(kind: str, per_replica_states, replica: int, keras_version: tuple,
                           one_copy: bool = False) -> float:
    """``result()`` read inside ``strategy.run`` on ``replica``.

    Keras 2 wraps ``result`` in ``metrics_utils.result_wrapper``, which merge_calls and reads the
    aggregated value: the global result. Keras 3's ``result`` is a plain read of sync-on-read
    variables, which in replica context returns the local replica's component. Under
    CentralStorageStrategy (``one_copy``) a metric's state is one AggregatingVariable on the
    parameter device (central_storage_strategy.py: variables are placed once and updates from
    every replica are aggregated into it), so every replica reads the merged state: the global
    result in either generation."""
    if keras_version[0] < 3 or one_copy:
        return cross_replica_result(kind, per_replica_states)
    return result(kind, *per_replica_states[replica])
