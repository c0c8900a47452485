"""Mixed precision in a custom loop under a strategy (float64): loss scaling with a dynamic or a
fixed scale, and the rounding a float16 or bfloat16 forward and backward pass may add.

Sources: the mixed precision guide (https://www.tensorflow.org/guide/mixed_precision, "Training
the model with a custom training loop": scale the loss, unscale the gradients, apply them); the
``LossScaleOptimizer`` docstrings (Keras 2.15 and 3): a dynamic scale "is multiplied by 2 every
``dynamic_growth_steps`` steps where the gradients are finite" and, when "any gradient is
non-finite, the step is skipped" and the scale is halved; the guide's contract that a strategy's
step equals one device's step on the global batch, so a non-finite gradient on any replica
(the sum is then non-finite) skips the step on every replica. What each generation really does
is docs/research/mixed_precision.md and the properties' findings.
"""

from __future__ import annotations

import numpy as np

from . import model as ref_model
from .rules import documented, helper

UNIT = {"mixed_float16": 2.0 ** -11, "mixed_bfloat16": 2.0 ** -8}  # unit roundoff of the compute dtype


@documented("LossScaleOptimizer docstrings (dynamic: halve the scale and skip the step when a gradient is "
            "non-finite, double it after dynamic_growth_steps finite steps; fixed: never changes, never "
            "skips); the guide: apply_gradients sums the replicas' gradients, so one non-finite replica "
            "makes the summed gradient non-finite")
def scaled_training(arch, params, steps, poison, lr: float, scale: str, initial_scale: float,
                    growth_steps: int, decided_by=None) -> list[dict]:
    """Per step ``(x, y, sizes)`` with ``poison[step][replica]`` (1, or inf: that replica's
    gradients non-finite): the parameters after it and the loss scale. A dynamic scale skips
    a step where any replica is poisoned and halves the scale; otherwise SGD applies the global
    batch's gradient and, after ``growth_steps`` finite steps in a row, the scale doubles. A
    fixed scale never skips: a poisoned step makes the parameters non-finite (NaN here).
    ``decided_by``: judge finiteness on these replicas only (Keras 3, which looks at replica 0:
    the deviation keras3-loss-scale-finiteness-from-replica-0)."""
    params = [np.asarray(p, np.float64) for p in params]
    s, good = float(initial_scale), 0
    out = []
    for (x, y, _sizes), factors in zip(steps, poison):
        judged = factors if decided_by is None else [factors[r] for r in decided_by]
        finite_here = all(np.isfinite(f) for f in judged)
        finite = all(np.isfinite(f) for f in factors)
        if scale == "dynamic" and not finite_here:
            s, good = s / 2, 0
        else:
            if finite:
                w = np.full(len(x), 1.0 / len(x))
                grads = ref_model.loss_and_grads(arch, params, x, y, w).grads
                params = [p - lr * g for p, g in zip(params, grads)]
            else:  # applied although a replica's gradients are not finite
                params = [np.full(p.shape, np.nan) for p in params]
            if scale == "dynamic":
                good += 1
                if good == growth_steps:
                    s, good = s * 2, 0
        out.append({"params": params, "scale": s, "finite": bool(all(np.isfinite(p).all() for p in params))})
    return out


@helper
def scaled_training_unsummed(arch, params, steps, poison, lr: float, scale: str, initial_scale: float,
                             growth_steps: int, workers: int = 1) -> list[dict]:
    """``scaled_training`` where nothing sums the replicas' gradients (the known deviation
    keras3-gradients-not-summed-before-3.5, Keras 3.0-3.4): each worker judges finiteness on its
    first replica's gradients (LossScaleOptimizer takes the first local replica's flag) and keeps
    its own scale; an applied step moves each replica's copy by its own gradient (its rows over
    the global batch, the regularization over the replicas), and a replica whose own gradients
    are not finite gets non-finite parameters (NaN here). Returns, per step, ``{"params": [per
    replica, its parameters], "scale": [per worker, its scale], "finite"}``."""
    n = len(steps[0][2])
    local = n // workers
    copies = [[np.asarray(p, np.float64) for p in params] for _ in range(n)]
    scales, good = [float(initial_scale)] * workers, [0] * workers
    out = []
    for (x, y, sizes), factors in zip(steps, poison):
        w, start = np.full(len(x), 1.0 / len(x)), 0
        for r, m in enumerate(sizes):
            part = slice(start, start + m)
            start += m
            if scale == "dynamic" and not np.isfinite(factors[r - r % local]):
                continue  # its worker skips the step
            if np.isfinite(factors[r]):
                grads = ref_model.loss_and_grads(arch, copies[r], x[part], y[part], w[part], reg_weight=1.0 / n).grads
                copies[r] = [p - lr * g for p, g in zip(copies[r], grads)]
            else:
                copies[r] = [np.full(p.shape, np.nan) for p in copies[r]]
        if scale == "dynamic":
            for k in range(workers):
                if not np.isfinite(factors[k * local]):
                    scales[k], good[k] = scales[k] / 2, 0
                else:
                    good[k] += 1
                    if good[k] == growth_steps:
                        scales[k], good[k] = scales[k] * 2, 0
        out.append({"params": [list(c) for c in copies], "scale": list(scales),
                    "finite": bool(all(np.isfinite(p).all() for c in copies for p in c))})
    return out
