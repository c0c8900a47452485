"""Per-example losses as Keras computes them (float64), and Keras loss reductions per generation.

Formulas: keras/src/losses/losses.py and the backend ``nn`` crossentropies (Keras 3), and
keras/src/backend.py (Keras 2); epsilon is ``keras.backend.epsilon()`` = 1e-7.
"""

from __future__ import annotations

import numpy as np

from .rules import documented, helper, observed

EPSILON = 1e-7


def _f64(x):
    return np.asarray(x, dtype=np.float64)


@helper
def log_softmax(z, axis=-1):
    z = _f64(z)
    m = z.max(axis=axis, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=axis, keepdims=True))


@helper
def softmax(z, axis=-1):
    return np.exp(log_softmax(z, axis))


@documented("keras.losses.mean_squared_error: loss = mean(square(y_true - y_pred), axis=-1)")
def mean_squared_error(y_true, y_pred):
    """Mean over the last axis: [B, D] -> [B]."""
    return np.mean((_f64(y_pred) - _f64(y_true)) ** 2, axis=-1)


@documented("keras.losses.mean_absolute_error: loss = mean(abs(y_true - y_pred), axis=-1)")
def mean_absolute_error(y_true, y_pred):
    return np.mean(np.abs(_f64(y_pred) - _f64(y_true)), axis=-1)


@observed(
    'keras backend sparse_categorical_crossentropy: clip to [eps, 1-eps], log, sparse softmax '
    'cross-entropy (clipping undocumented)'
)
def sparse_categorical_crossentropy(labels, output, from_logits=False):
    """labels [...] (integers), output [..., C] -> [...].

    From probabilities Keras clips to [eps, 1-eps], takes the log and runs softmax
    crossentropy on it, i.e. renormalises *after* clipping."""
    labels = np.asarray(labels).astype(np.int64)
    if from_logits:
        logp = log_softmax(output)
    else:
        p = np.clip(_f64(output), EPSILON, 1 - EPSILON)
        logp = log_softmax(np.log(p))
    return -np.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]


@observed("keras backend categorical_crossentropy: renormalise, clip, log (clipping undocumented)")
def categorical_crossentropy(y_true, output, from_logits=False):
    """Targets [..., C], output [..., C] -> [...]; from probabilities: renormalise, then clip."""
    y = _f64(y_true)
    if from_logits:
        return -(y * log_softmax(output)).sum(axis=-1)
    p = _f64(output)
    p = np.clip(p / p.sum(axis=-1, keepdims=True), EPSILON, 1 - EPSILON)
    return -(y * np.log(p)).sum(axis=-1)


@documented(
    'tf.nn.sigmoid_cross_entropy_with_logits: max(x, 0) - x * z + log(1 + exp(-abs(x))), mean over '
    'the last axis'
)
def binary_crossentropy_from_logits(y_true, logits):
    """``sigmoid_cross_entropy_with_logits`` then mean over the last axis: [B, D] -> [B]."""
    z, y = _f64(logits), _f64(y_true)
    return np.mean(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z))), axis=-1)


PER_EXAMPLE = {
    "mse": lambda y, p: mean_squared_error(y, p),
    "mae": lambda y, p: mean_absolute_error(y, p),
    "sparse_cce_logits": lambda y, p: sparse_categorical_crossentropy(y, p, from_logits=True),
    "sparse_cce_probs": lambda y, p: sparse_categorical_crossentropy(y, p, from_logits=False),
    "cce_logits": lambda y, p: categorical_crossentropy(y, p, from_logits=True),
    "cce_probs": lambda y, p: categorical_crossentropy(y, p, from_logits=False),
    "bce_logits": lambda y, p: binary_crossentropy_from_logits(y, p),
}


class Raises(str):
    """An expected outcome that is an exception of the named type, not a value."""


@observed(
    'Keras 2 Loss docstring: AUTO/SUM_OVER_BATCH_SIZE raise in custom loops (documented); Keras 3 '
    'loss.py reduce_values -> scale_loss_for_distribution (divide by replicas, '
    'keras-team/keras#20609, 3.8.0; undocumented)'
)
def keras_loss_in_replica(per_example, reduction: str, keras_version: tuple, num_replicas: int,
                          has_strategy: bool):
    """What a Keras ``Loss(reduction=...)`` returns on one replica inside ``strategy.run``.

    Keras 2 (keras/src/losses.py ``Loss._get_reduction``): ``auto`` and
    ``sum_over_batch_size`` raise ValueError under any non-default strategy (custom loops must
    use ``sum`` or ``none``); otherwise ``sum`` sums, ``sum_over_batch_size`` divides by the
    number of elements. Keras 3 (keras/src/losses/loss.py ``reduce_values``): nothing raises;
    ``sum_over_batch_size`` divides the local sum by the local element count and by the replica
    count (``scale_loss_for_distribution``, keras-team/keras#20609), so that the SUM over
    replicas is the loss of the global batch, as the custom-training guide requires of a
    per-replica loss. Keras 3.0-3.7 return the unscaled local mean (a loss the guide's SUM
    turns into replicas x the mean): known deviation keras3-loss-unscaled-before-3.8. A replica
    with no rows contributes 0 (divide_no_nan since Keras 3.7); Keras 3.0-3.6 give 0 / 0 = NaN:
    known deviation keras3-loss-nan-on-empty-replica-before-3.7.
    ``none`` returns the per-example losses in every generation.
    """
    values = _f64(per_example)
    if reduction == "none":
        return values
    if keras_version[0] < 3:
        if reduction in ("auto", "sum_over_batch_size") and has_strategy:
            return Raises("ValueError")
        if reduction == "sum":
            return float(values.sum())
        return float(values.sum() / values.size) if values.size else 0.0
    if reduction == "auto":
        return Raises("ValueError")  # Keras 3 knows no 'auto' reduction
    if reduction == "sum":
        return float(values.sum())
    mean = float(values.sum() / values.size) if values.size else 0.0
    if num_replicas > 1:
        mean /= num_replicas
    return mean
