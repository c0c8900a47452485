"""Forward and backward of the model family: a Dense stack (relu hidden layers) with a linear
head (MSE loss) or a softmax head (sparse categorical crossentropy), and an optional L2 kernel
regularizer ``l2 * sum(kernel**2)`` per layer (keras.regularizers.L2). Float64 throughout.

Parameters are a list ``[kernel_0, bias_0, kernel_1, bias_1, ...]`` in the order of
``model.trainable_variables``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import losses
from .rules import documented, helper


@dataclasses.dataclass(frozen=True)
class Arch:
    """A member of the model family."""

    input_dim: int
    hidden: tuple[int, ...]
    outputs: int
    head: str  # "linear" (MSE against float targets) | "softmax" (sparse CE, integer labels)
    l2: float = 0.0  # L2 kernel regularization factor; 0 means no regularizer
    activity: float = 0.0  # L2 activity regularization factor of every hidden layer's output; 0: none

    def shapes(self) -> list[tuple[int, ...]]:
        dims = [self.input_dim, *self.hidden, self.outputs]
        out = []
        for a, b in zip(dims[:-1], dims[1:]):
            out += [(a, b), (b,)]
        return out


@dataclasses.dataclass
class Trace:
    """What one forward/backward pass computed."""

    per_example_loss: np.ndarray
    grads: list[np.ndarray]  # gradient of sum_i weight_i * loss_i (+ regularization)
    preactivations: list[np.ndarray]  # hidden pre-activations (their distance to 0 matters)
    head_output: np.ndarray
    activations: list[np.ndarray] = dataclasses.field(default_factory=list)  # input, then each hidden output


@documented("keras.layers.Dense: output = activation(dot(input, kernel) + bias)")
def forward(arch: Arch, params, x):
    h = np.asarray(x, dtype=np.float64)
    pre = []
    acts = [h]
    n = len(arch.hidden)
    for i in range(n):
        z = h @ params[2 * i] + params[2 * i + 1]
        pre.append(z)
        h = np.maximum(z, 0.0)
        acts.append(h)
    out = h @ params[2 * n] + params[2 * n + 1]
    return out, pre, acts


@documented("keras.regularizers.L2: loss = l2 * reduce_sum(square(x))")
def regularization(arch: Arch, params) -> float:
    if not arch.l2:
        return 0.0
    return float(sum(arch.l2 * np.sum(np.asarray(k, np.float64) ** 2) for k in params[0::2]))


@documented("keras.layers.Layer activity_regularizer (Keras 2.15 base_layer._handle_activity_regularization, "
            "Keras >= 3.14 Layer.__call__): the layer adds regularizer(output) / its batch size to "
            "layer.losses; keras.regularizers.L2: l2 * reduce_sum(square(x)); the guide's step scales "
            "model.losses by scale_regularization_loss (1 / replicas)")
def activity_weights(sizes, normalised: bool = True) -> np.ndarray:
    """The weight of each example's activity penalty ``l * ||h_i||^2`` in the sum over replicas
    of the guide's loss: replica r adds ``scale_regularization_loss(sum_{i in r} penalty_i / b_r)``,
    so its examples weigh ``1 / (replicas x b_r)``; an empty replica adds nothing
    (``divide_no_nan``). On an even split that is one device's ``1 / global batch``.
    ``normalised=False``: the penalty not divided by the batch (Keras 3.0-3.13, the deviation
    keras3-activity-regularizer-not-normalised-before-3.14): every example weighs ``1 / replicas``."""
    from . import distribute

    if not normalised:
        return np.full(int(sum(sizes)), 1.0 / len(sizes))
    return distribute.replica_weights(sizes, None)


@helper
def loss_and_grads(arch: Arch, params, x, y, example_weights, reg_weight: float = 1.0,
                   activity_w=None) -> Trace:
    """Per-example losses and the gradient of ``sum_i w_i * loss_i + reg_weight * reg``
    (+ ``sum_i activity_w_i * activity * ||h_i||^2`` over every hidden layer's output h, when
    the model has an activity regularizer).

    With ``w_i = 1/global_batch`` this is the gradient of the single-device mean loss."""
    params = [np.asarray(p, dtype=np.float64) for p in params]
    out, pre, acts = forward(arch, params, x)
    w = np.asarray(example_weights, dtype=np.float64)[:, None]
    if arch.head == "linear":
        y = np.asarray(y, dtype=np.float64)
        per_ex = losses.mean_squared_error(y, out)
        d_out = 2.0 * (out - y) / arch.outputs
        head = out
    else:
        labels = np.asarray(y).astype(np.int64)
        probs = losses.softmax(out)
        per_ex = losses.sparse_categorical_crossentropy(labels, probs, from_logits=False)
        onehot = np.eye(arch.outputs)[labels] if len(labels) else np.zeros((0, arch.outputs))
        d_out = probs - onehot  # exact while the probabilities stay inside [eps, 1-eps]
        head = probs
    delta = d_out * w
    n = len(arch.hidden)
    grads = [None] * len(params)
    for i in range(n, -1, -1):
        grads[2 * i] = acts[i].T @ delta
        grads[2 * i + 1] = delta.sum(axis=0)
        if i > 0:
            back = delta @ params[2 * i].T
            if arch.activity:  # d/dh of activity_w_i * activity * ||h_i||^2
                back = back + 2.0 * arch.activity * np.asarray(activity_w, np.float64)[:, None] * acts[i]
            delta = back * (pre[i - 1] > 0)
    if arch.l2:
        for i in range(0, len(params), 2):
            grads[i] = grads[i] + reg_weight * 2.0 * arch.l2 * params[i]
    return Trace(per_ex, grads, pre, head, acts)


@documented(
    "https://www.tensorflow.org/guide/distributed_training: 'it performs a sum-over-all-replicas of "
    "the gradients' before applying them; "
    "https://www.tensorflow.org/tutorials/distribute/custom_training: 'gradients are summed up across"
    " replicas'"
)
def train(arch: Arch, params, optimizer: str, steps, denominator: str = "global", clip: tuple | None = None,
          weight_decay: float | None = None, clip_at: str = "sum", activity_normalised: bool = True,
          accumulation_steps: int | None = None, unscaled: bool = False) -> list[dict]:
    """Run the steps of a distributed custom loop in the reference.

    Each step is ``(x, y, sizes)``: the global batch and how it is split over replicas. Every
    replica computes ``compute_average_loss(per_example, global_batch_size=G)`` (denominator
    ``"global"``: G = len(x); an int: that constant G, as the guide's GLOBAL_BATCH_SIZE, also
    on a short last batch; ``"default"``: each replica divides by its own batch x replicas)
    plus ``scale_regularization_loss(model.losses)``; the gradients are summed over replicas
    and applied once. ``clip = (option, value)``: the optimizer's clipping option
    (reference/clipping.py), applied to the summed gradient, as on one device; ``clip_at =
    "replica"`` instead clips each replica's gradient before the sum (what Keras 3 does: the
    deviation keras3-clipping-per-replica-before-the-sum). ``weight_decay``: decoupled, once
    per step (reference/optimizers.py). An activity regularizer's penalty is scaled as the guide
    prescribes (``activity_weights``; ``activity_normalised=False``: not divided by the local
    batch, as Keras 3.0-3.13 do). ``accumulation_steps`` N (Keras 3 ``gradient_accumulation_steps``):
    the optimizer applies, every N-th step, the mean of the last N steps' gradients (nothing in
    between). ``unscaled``: each replica's loss is its own batch's mean plus the whole
    regularization, not divided by the replicas, and the gradients are summed (Keras 3.5-3.7's fit,
    whose losses and regularization keras-team/keras#20609 scaled first in 3.8: the known deviation
    keras3-loss-unscaled-before-3.8); with ``denominator="default"`` each example then weighs
    1 / its replica's batch and the regularization replicas x. Returns, per step, the parameters
    after it, the summed loss, the applied gradients and the trace (for conditioning checks)."""
    from . import distribute
    from .optimizers import Optimizer

    params = [np.asarray(p, dtype=np.float64) for p in params]
    from . import clipping

    params = [np.asarray(p, dtype=np.float64) for p in params]
    opt = Optimizer(optimizer, params, weight_decay)
    history, pending = [], []
    for x, y, sizes in steps:
        gbs = len(x) if denominator == "global" else None if denominator == "default" else int(denominator)
        scale = len(sizes) if unscaled else 1
        w = scale * distribute.replica_weights(sizes, gbs)
        aw = scale * activity_weights(sizes, activity_normalised) if arch.activity else None
        trace = loss_and_grads(arch, params, x, y, w, reg_weight=scale, activity_w=aw)
        loss = float(np.sum(w * trace.per_example_loss)) + scale * regularization(arch, params)
        if arch.activity:
            loss += float(sum(np.sum(aw * arch.activity * np.sum(h * h, axis=1)) for h in trace.activations[1:]))
        grads = trace.grads
        if clip is not None and clip_at == "sum":
            grads = clipping.clip_gradients(grads, *clip)
        elif clip is not None:
            grads = clipping.distributed_clipped_gradients(replica_grads(arch, params, x, y, sizes, gbs), *clip,
                                                           clip_at="replica")
        if accumulation_steps:
            pending = [grads] if not len(history) % accumulation_steps else pending + [grads]
            if len(pending) == accumulation_steps:
                params = opt.step(params, [np.mean(gs, axis=0) for gs in zip(*pending)])
        else:
            params = opt.step(params, grads)
        history.append({"params": params, "loss": loss, "grads": grads, "trace": trace,
                        "slots": opt.used_slots(), "iterations": opt.t})
    return history


@helper
def train_unsummed(arch: Arch, params, optimizer: str, steps, denominator: str = "global", clip: tuple | None = None,
                   weight_decay: float | None = None, activity_normalised: bool = True,
                   restored: dict | None = None, unscaled: bool = False) -> list[dict]:
    """``train``'s steps where nothing sums the replicas' gradients: each replica applies its own
    gradient (its examples weighed as in ``train``, plus the regularization / replicas, each on
    its own copy; clipped by itself where the optimizer clips) to its own copy of the parameters,
    with its own optimizer state. Not a rule of the guides: the model of the known deviation
    keras3-gradients-not-summed-before-3.5 (Keras 3.0-3.4 updated each replica's copy of a
    mirrored variable with that replica's gradient). ``restored``: an entry of an earlier history
    of this function whose replica 0 a checkpoint saved (the primary copy): every copy starts from
    its parameters and optimizer state instead of ``params``. ``unscaled``: each replica's loss is
    its own batch's mean plus the whole regularization, not divided by the replicas (Keras 3.0-3.7's
    fit: keras3-loss-unscaled-before-3.8). Returns, per step, ``{"params": [per
    replica, its parameters after the step], "loss": the sum of the replicas' losses, each on its
    copy, "slots": [per replica, its optimizer's slots], "opts": [per replica, its optimizer],
    "replica_losses": [per replica, (the sum of its examples' losses on its copy, their count)]}``."""
    import copy

    from . import clipping, distribute
    from .optimizers import Optimizer

    n = len(steps[0][2])
    if restored is None:
        copies = [[np.asarray(p, dtype=np.float64) for p in params] for _ in range(n)]
        opts = [Optimizer(optimizer, copies[r], weight_decay) for r in range(n)]
    else:
        copies = [list(restored["params"][0]) for _ in range(n)]
        opts = [copy.deepcopy(restored["opts"][0]) for _ in range(n)]
    history = []
    for x, y, sizes in steps:
        gbs = len(x) if denominator == "global" else None if denominator == "default" else int(denominator)
        w = distribute.replica_weights(sizes, gbs)
        aw = activity_weights(sizes, activity_normalised) if arch.activity else None
        loss, start, replica_losses = 0.0, 0, []
        for r, m in enumerate(sizes):
            part = slice(start, start + m)
            start += m
            mine = np.full(m, 1.0 / m) if unscaled and m else w[part]
            trace = loss_and_grads(arch, copies[r], x[part], y[part], mine, reg_weight=1.0 if unscaled else 1.0 / n,
                                   activity_w=aw[part] if aw is not None else None)
            replica_losses.append((float(np.sum(trace.per_example_loss)), int(m)))
            loss += float(np.sum(w[part] * trace.per_example_loss)) + regularization(arch, copies[r]) / n
            if arch.activity:
                loss += float(sum(np.sum(aw[part] * arch.activity * np.sum(h * h, axis=1))
                                  for h in trace.activations[1:]))
            grads = clipping.clip_gradients(trace.grads, *clip) if clip is not None else trace.grads
            copies[r] = opts[r].step(copies[r], grads)
        history.append({"params": [list(c) for c in copies], "loss": loss, "slots": [o.used_slots() for o in opts],
                        "opts": [copy.deepcopy(o) for o in opts], "replica_losses": replica_losses})
    return history


@helper
def replica_grads(arch: Arch, params, x, y, sizes, gbs) -> list[list[np.ndarray]]:
    """Each replica's gradient of its scaled loss (its examples weighed as in ``train``, plus
    ``scale_regularization_loss``: the regularization / replicas), in replica order; their sum
    is the gradient of the global batch."""
    from . import distribute

    w = distribute.replica_weights(sizes, gbs)
    out, start = [], 0
    for n in sizes:
        part = slice(start, start + n)
        aw = activity_weights(sizes)[part] if arch.activity else None
        out.append(loss_and_grads(arch, params, x[part], y[part], w[part], reg_weight=1.0 / len(sizes),
                                  activity_w=aw).grads)
        start += n
    return out


@documented("the optimizers' use_ema docstring (Keras 2.15 and 3): 'new_average = ema_momentum * old_average "
            "+ (1 - ema_momentum) * current_variable_value' after each step; where the average starts is each "
            "generation's (Keras 2.15: the variable's value when the optimizer is built; Keras 3: zeros, and the "
            "first step copies the variable, its momentum taken as 0 while iterations is 0)")
def ema(initial, history, momentum: float, start: str) -> list[list[np.ndarray]]:
    """Per step, the moving average of every parameter after it, from the parameters ``initial``
    and each step's (``history[s]["params"]``); ``start="built"`` (Keras 2.15) or ``"copy"``
    (Keras 3)."""
    avg = [np.asarray(p, np.float64) for p in initial]
    out = []
    for s, step in enumerate(history):
        m = 0.0 if start == "copy" and s == 0 else momentum
        avg = [m * a + (1 - m) * np.asarray(p, np.float64) for a, p in zip(avg, step["params"])]
        out.append(avg)
    return out


@helper
def one_weight_sgd(kernel: float, learning_rate: float, features: list) -> list[float]:
    """A weight w (a linear model with no bias) trained by SGD on the mean squared error against the
    label 0, one step per batch whose every example has the feature x (of ``features``): the loss is
    w^2 x^2, its gradient 2 w x^2, so w becomes w (1 - 2 lr x^2); w after each step."""
    out, w = [], float(kernel)
    for x in features:
        w = w * (1.0 - 2.0 * learning_rate * float(x) ** 2)
        out.append(w)
    return out
