"""Loss scaling and cross-replica reductions: what ``strategy.run`` + ``strategy.reduce`` mean.

Sources: ``tf.nn.compute_average_loss`` and ``tf.nn.scale_regularization_loss``
(tensorflow/python/ops/nn_impl_distribute.py, and the "Custom training with tf.distribute.Strategy"
guide), ``tf.distribute.Strategy.reduce`` and ``experimental_local_results``
(tensorflow/python/distribute/distribute_lib.py docstrings).
"""

from __future__ import annotations

import numpy as np

from .rules import documented, helper, observed


@helper
def split(global_batch: np.ndarray, sizes) -> list[np.ndarray]:
    """Cut a global batch into consecutive per-replica batches of the given sizes."""
    sizes = [int(s) for s in sizes]
    if sum(sizes) != len(global_batch):
        raise ValueError(f"sizes {sizes} do not add up to the batch length {len(global_batch)}")
    bounds = np.cumsum([0] + sizes)
    return [np.asarray(global_batch[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


@documented(
    "tf.nn.compute_average_loss: 'Defaults to (size of first dimension of losses) * (number of "
    "replicas)', 'If global_batch_size is zero, the result is zero'; "
    'https://www.tensorflow.org/tutorials/distribute/custom_training'
)
def compute_average_loss(per_example_loss, sample_weight=None, global_batch_size=None,
                         num_replicas: int = 1) -> float:
    """``tf.nn.compute_average_loss`` on one replica: sum(loss * weight) / global_batch_size.

    The loss may have any rank >= 1 (every element is summed); a weight broadcasts against it
    (scalar or per-example, i.e. shape [B] against [B, ...] after expanding trailing axes).
    Without ``global_batch_size`` the denominator is ``num_replicas * local batch`` (the
    documented default: "(size of first dimension of losses) * (number of replicas)"; the guide:
    "num_replicas_in_sync times the actual batch size seen on the replica"). A zero
    denominator (an empty replica batch) gives 0 (TF divides with ``div_no_nan``).
    """
    loss = np.asarray(per_example_loss, dtype=np.float64)
    if sample_weight is not None:
        w = np.asarray(sample_weight, dtype=np.float64)
        if w.ndim and w.ndim < loss.ndim:
            w = w.reshape(w.shape + (1,) * (loss.ndim - w.ndim))
        loss = loss * w
    if global_batch_size is None:
        global_batch_size = loss.shape[0] * num_replicas
    # nn_impl_distribute.py divides with div_no_nan: an empty replica contributes 0, not NaN.
    return float(loss.sum() / global_batch_size) if global_batch_size else 0.0


@documented(
    "tf.nn.scale_regularization_loss: 'Scales the sum of the given regularization losses by number of"
    " replicas'"
)
def scale_regularization_loss(regularization_loss, num_replicas: int) -> float:
    """``tf.nn.scale_regularization_loss``: sum of the losses divided by num_replicas_in_sync,
    so that summing it over replicas gives the regularization loss once."""
    return float(np.sum(np.asarray(regularization_loss, dtype=np.float64)) / num_replicas)


@documented(
    "tf.distribute.Strategy.reduce: 'using axis=0 will use the correct denominator' for MEAN over "
    'uneven replicas'
)
def reduce(per_replica, op: str, axis=None) -> np.ndarray:
    """``strategy.reduce(op, value, axis)`` over a list of per-replica values.

    ``axis=None``: element-wise SUM or MEAN across replicas (all values the same shape).
    ``axis=0``: SUM or MEAN over the concatenation of every replica's values along axis 0, so
    MEAN divides by the total number of rows across replicas, not by the replica count.
    """
    values = [np.asarray(v, dtype=np.float64) for v in per_replica]
    if op not in ("SUM", "MEAN"):
        raise ValueError(f"op must be SUM or MEAN, got {op!r}")
    if axis is None:
        stacked = np.stack(values)
        return stacked.sum(axis=0) if op == "SUM" else stacked.mean(axis=0)
    joined = np.concatenate(values, axis=axis)
    return joined.sum(axis=axis) if op == "SUM" else joined.sum(axis=axis) / joined.shape[axis]


@observed(
    "experimental_local_results: 'ith element corresponds to ith replica' (documented); worker-major "
    'replica ids: collective_all_reduce_strategy.py _get_replica_id_in_sync_group'
)
def local_results(per_replica: list, worker_index: int, num_workers: int) -> list:
    """``experimental_local_results`` on one worker: its replicas' values in replica-id order
    (replica ids are numbered worker by worker)."""
    per_worker = len(per_replica) // num_workers
    return list(per_replica[worker_index * per_worker:(worker_index + 1) * per_worker])


@helper
def replica_weights(sizes, global_batch_size=None) -> np.ndarray:
    """The weight each example's loss gets in the sum over replicas of
    ``compute_average_loss``: 1/denominator of its replica (per example)."""
    sizes = [int(s) for s in sizes]
    r = len(sizes)
    out = []
    for s in sizes:
        if s:  # an empty replica has no examples to weigh
            denom = global_batch_size if global_batch_size is not None else s * r
            out.extend([1.0 / denom] * s)
    return np.asarray(out, dtype=np.float64)
