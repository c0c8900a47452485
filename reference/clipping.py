"""Gradient clipping (float64): the three Keras optimizer options (``clipnorm``, ``clipvalue``,
``global_clipnorm``), the ``tf.clip_by_*`` functions users call in their own step, and where the
clipping belongs under a strategy: on the gradient of the global batch, that is after the
replicas' gradients are summed, so that a strategy's step equals one device's step.

Sources: the ``tf.clip_by_norm``, ``tf.clip_by_value`` and ``tf.clip_by_global_norm`` docstrings
(``tensorflow/python/ops/clip_ops.py``), the Keras optimizer docstrings (``clipnorm``: "the
gradient of each weight is individually clipped so that its norm is no higher than this value";
``clipvalue``: "clipped to be no higher than this value"; ``global_clipnorm``: "the gradient of
all weights is clipped so that their global norm is no higher than this value"), and the custom
training guide's contract that the optimizer sums the replicas' gradients. Where each Keras
generation really clips relative to that sum is docs/research/clipping_and_weight_decay.md
(source reading: Keras 2.15 after the sum, Keras 3.5+ before it, per replica).
"""

from __future__ import annotations

import numpy as np

from .rules import documented

OPTIONS = ("clipnorm", "clipvalue", "global_clipnorm")


@documented("tf.clip_by_norm docstring: t * clip_norm / max(l2norm(t), clip_norm), the norm over the "
            "whole tensor (axes=None); a zero tensor is returned unchanged")
def clip_by_norm(t, clip_norm: float) -> np.ndarray:
    """One tensor scaled down to L2 norm ``clip_norm`` if its norm is larger."""
    t = np.asarray(t, dtype=np.float64)
    norm = float(np.sqrt(np.sum(t * t)))
    return t * clip_norm / max(norm, clip_norm)


@documented("tf.clip_by_value docstring: values below -c set to -c, above c set to c (the Keras "
            "clipvalue option clips to [-clipvalue, clipvalue])")
def clip_by_value(t, clip_value: float) -> np.ndarray:
    return np.clip(np.asarray(t, dtype=np.float64), -clip_value, clip_value)


@documented("tf.clip_by_global_norm docstring: t_list[i] * clip_norm / max(global_norm, clip_norm), "
            "global_norm = sqrt(sum(l2norm(t)**2)); an infinite global norm sets every entry to NaN")
def clip_by_global_norm(t_list, clip_norm: float) -> list[np.ndarray]:
    ts = [np.asarray(t, dtype=np.float64) for t in t_list]
    norm = global_norm(ts)
    if not np.isfinite(norm):
        return [np.full(t.shape, np.nan) for t in ts]
    return [t * clip_norm / max(norm, clip_norm) for t in ts]


@documented("tf.linalg.global_norm / tf.clip_by_global_norm docstring: sqrt(sum([l2norm(t)**2 for t in t_list]))")
def global_norm(t_list) -> float:
    return float(np.sqrt(sum(float(np.sum(np.asarray(t, dtype=np.float64) ** 2)) for t in t_list)))


@documented("Keras optimizer docstrings: clipnorm clips each weight's gradient to that norm, clipvalue "
            "each element to that magnitude, global_clipnorm all gradients to that global norm; one "
            "option per optimizer (Keras 3 raises for two; Keras 2.15 applies clipnorm before any other)")
def clip_gradients(grads, option: str, value: float) -> list[np.ndarray]:
    """What the optimizer option ``option`` makes of the gradients ``grads`` (one per variable)."""
    if option == "clipnorm":
        return [clip_by_norm(g, value) for g in grads]
    if option == "clipvalue":
        return [clip_by_value(g, value) for g in grads]
    if option == "global_clipnorm":
        return clip_by_global_norm(grads, value)
    raise ValueError(f"option must be one of {OPTIONS}, got {option!r}")


@documented("the custom training guide: apply_gradients sums the replicas' gradients, so a strategy's "
            "step equals one device's step on the global batch; the optimizer's clipping acts on "
            "the gradient it applies, the sum")
def distributed_clipped_gradients(per_replica_grads, option: str, value: float,
                                  clip_at: str = "sum") -> list[np.ndarray]:
    """The gradients a clipping optimizer applies under a strategy, from each replica's gradients
    (``per_replica_grads[r][v]``, already scaled by the global batch as the guide's loss is):
    the option applied once, to their sum over replicas. ``clip_at="replica"``: each replica's
    gradients clipped, then summed (not the rule: Keras 3's order, the deviation
    keras3-clipping-per-replica-before-the-sum, docs/research/clipping_and_weight_decay.md)."""
    n_vars = len(per_replica_grads[0])
    if clip_at == "replica":
        per_replica_grads = [clip_gradients(g, option, value) for g in per_replica_grads]
        return [np.sum([np.asarray(g[v], dtype=np.float64) for g in per_replica_grads], axis=0)
                for v in range(n_vars)]
    summed = [np.sum([np.asarray(g[v], dtype=np.float64) for g in per_replica_grads], axis=0)
              for v in range(n_vars)]
    return clip_gradients(summed, option, value)
