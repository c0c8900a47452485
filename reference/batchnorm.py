"""BatchNormalization in training mode under a strategy (float64): the statistics each replica
normalises with and the moving statistics every replica's copy should hold.

Sources: the ``keras.layers.BatchNormalization`` docstring (Keras 2.15 and 3): during training
the layer "normalizes its output using the mean and standard deviation of the current batch of
inputs", ``gamma * (batch - mean(batch)) / sqrt(var(batch) + epsilon) + beta``, and updates
"moving_mean = moving_mean * momentum + mean(batch) * (1 - momentum)", "moving_var = moving_var *
momentum + var(batch) * (1 - momentum)"; ``synchronized``: "If True, synchronizes the global
batch statistics (mean and variance) for the layer across all devices at each training step in
a distributed training strategy" (Keras 2.15 ``SyncBatchNormalization``: "normalizes ... across
all devices"). ``var`` is the population (biased) variance, as ``tf.nn.moments`` /
``keras.ops.moments`` compute it. What each generation really does with an unsynchronised
layer's moving statistics and with empty replicas is docs/research/batchnorm.md.
"""

from __future__ import annotations

import numpy as np

from .rules import documented, observed


@documented("keras.layers.BatchNormalization docstring: mean(batch) and var(batch) of the current batch "
            "over every axis but the feature axis; the population (biased) variance, as tf.nn.moments")
def moments(x) -> tuple[np.ndarray, np.ndarray]:
    """Mean and population variance of a batch ``x`` (examples x features), computed in two
    passes (no cancellation)."""
    x = np.asarray(x, dtype=np.float64)
    mean = x.mean(axis=0)
    return mean, ((x - mean) ** 2).mean(axis=0)


@documented("keras.layers.BatchNormalization docstring: gamma * (batch - mean(batch)) / "
            "sqrt(var(batch) + epsilon) + beta (gamma 1 and beta 0 as initialised)")
def normalise(x, mean, var, epsilon: float) -> np.ndarray:
    return (np.asarray(x, np.float64) - mean) / np.sqrt(var + epsilon)


@documented("keras.layers.BatchNormalization docstring: moving_mean = moving_mean * momentum + mean(batch) "
            "* (1 - momentum), moving_var likewise with var(batch)")
def moving_update(moving, stat, momentum: float) -> np.ndarray:
    return np.asarray(moving, np.float64) * momentum + np.asarray(stat, np.float64) * (1 - momentum)


@documented("keras.layers.BatchNormalization(synchronized=True) docstring: 'synchronizes the global batch "
            "statistics (mean and variance) for the layer across all devices at each training step'; a "
            "strategy's mirrored variables hold one value on every replica")
def synchronized_steps(batches, sizes_per_step, momentum: float, epsilon: float, features: int,
                       empty: str = "update") -> list[dict]:
    """Per step (its global batch and split): every replica's output, normalised with the
    global batch's statistics, and each replica's copy of the moving mean and variance, updated
    once with them: the same on every replica. ``empty="skip"``: a replica with no rows keeps its
    copy (Keras 2.15, the deviation keras2-synchronized-bn-empty-replica-skips-update)."""
    replicas = len(sizes_per_step[0])
    mm = [np.zeros(features) for _ in range(replicas)]
    mv = [np.ones(features) for _ in range(replicas)]
    out = []
    for x, sizes in zip(batches, sizes_per_step):
        mean, var = moments(x)
        y = normalise(x, mean, var, epsilon)
        for r, n in enumerate(sizes):
            if n or empty == "update":
                mm[r], mv[r] = moving_update(mm[r], mean, momentum), moving_update(mv[r], var, momentum)
        out.append({"outputs": _split(y, sizes), "moving_mean": [m.copy() for m in mm],
                    "moving_variance": [v.copy() for v in mv]})
    return out


@observed("an unsynchronised layer normalises each replica's batch by itself (the docstring's 'current "
          "batch' is the replica's); each replica's copy of the moving statistics takes its own shard's "
          "update (Keras 2.15 SyncOnRead copies, Keras 3 MirroredVariable copies: docs/research/batchnorm.md)",
          since="TF 2.15.1 / Keras 2.15, TF 2.21.0 / Keras 3.15.1")
def unsynchronized_steps(batches, sizes_per_step, momentum: float, epsilon: float, features: int,
                         empty: str = "skip") -> list[dict]:
    """Per step: every replica's output, normalised with its own shard's statistics, and each
    replica's copy of the moving mean and variance, updated with its own shard's statistics.
    An empty replica's copy: ``empty="skip"`` keeps it (Keras 2.15 skips the update), ``"nan"``
    makes it NaN (Keras 3 updates it with the moments of no rows)."""
    replicas = len(sizes_per_step[0])
    mm = [np.zeros(features) for _ in range(replicas)]
    mv = [np.ones(features) for _ in range(replicas)]
    out = []
    for x, sizes in zip(batches, sizes_per_step):
        outputs = []
        for r, shard in enumerate(_split(np.asarray(x, np.float64), sizes)):
            if len(shard):
                mean, var = moments(shard)
                outputs.append(normalise(shard, mean, var, epsilon))
                mm[r], mv[r] = moving_update(mm[r], mean, momentum), moving_update(mv[r], var, momentum)
            else:
                outputs.append(shard)
                if empty == "nan":
                    mm[r], mv[r] = np.full(features, np.nan), np.full(features, np.nan)
        out.append({"outputs": outputs, "moving_mean": [m.copy() for m in mm],
                    "moving_variance": [v.copy() for v in mv]})
    return out


@observed("CentralStorageStrategy keeps one copy of each variable (an AggregatingVariable); Keras 2.15's "
          "moving statistics aggregate with MEAN: each replica's update arrives and the copy takes their mean",
          since="TF 2.15.1 / Keras 2.15 (Keras 3 raises: keras3-central-storage-replica-context-updates)")
def one_copy(copies) -> np.ndarray:
    """The single copy a strategy that keeps one copy of a variable holds, from what each
    replica's copy would be: their mean."""
    return np.mean([np.asarray(c, np.float64) for c in copies], axis=0)


def _split(x, sizes) -> list[np.ndarray]:
    return np.split(np.asarray(x), np.cumsum(sizes)[:-1])
