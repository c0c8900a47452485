"""Optimizer updates applied once to the gradients summed over replicas (float64).

Update rules as in keras/src/optimizers/{sgd,adam,rmsprop,adagrad}.py (Keras 3) and the same
files of Keras 2.15 (identical formulas; see docs/reference.md):
  SGD             w -= lr * g
  SGD momentum    m = mom * m - lr * g;  w += m            (nesterov: w += mom * m - lr * g)
  Adam            t += 1;  alpha = lr * sqrt(1 - b2**t) / (1 - b1**t)
                  m += (g - m)(1 - b1);  v += (g^2 - v)(1 - b2);  w -= alpha * m / (sqrt(v) + eps)
  RMSprop         v = rho v + (1 - rho) g^2;  w -= lr * g / sqrt(v + eps)
  Adagrad         acc += g^2 (acc starts at initial_accumulator_value);  w -= lr * g / sqrt(acc + eps)
Weight decay (``weight_decay=`` on any Keras optimizer; AdamW is Adam with it), decoupled and
applied once per step before the update, to every variable:  w -= w * weight_decay * lr
(Keras 3 keras/src/optimizers/base_optimizer.py ``_apply_weight_decay``, the TF backend's
distributed version updating each variable once through ``distribution.extended.update``;
Keras 2.15 keras/optimizers/optimizer.py the same; the AdamW docstring: "weight decay ... as
described in Loshchilov & Hutter").
The suite's hyperparameters are binary fractions, so the float32 learning-rate variable and
float32-rounded constants Keras uses are exact and float64 runs compare tightly.
"""

from __future__ import annotations

import numpy as np

try:  # installed: tf_distribute_suite.reference beside tf_distribute_suite.common (suite/layout.py)
    from ..common.catalog import OPTIMIZERS
except ImportError:  # the repository: reference/ beside suite/
    from suite.common.catalog import OPTIMIZERS


class Optimizer:
    """One optimizer's state for a list of parameters; ``step`` applies summed gradients."""

    def __init__(self, name: str, params, weight_decay: float | None = None):
        self.name = name
        self.weight_decay = weight_decay
        self.cls, self.cfg = OPTIMIZERS[name]
        self.t = 0
        shapes = [np.shape(p) for p in params]
        init = self.cfg.get("initial_accumulator_value", 0.0)
        self.slots = [[np.full(s, init if name == "adagrad" else 0.0) for s in shapes]
                      for _ in range(2)]

    def step(self, params, grads):
        c = self.cfg
        lr = c["learning_rate"]
        out = []
        self.t += 1
        for i, (w, g) in enumerate(zip(params, grads)):
            w = np.asarray(w, dtype=np.float64)
            g = np.asarray(g, dtype=np.float64)
            m, v = self.slots[0][i], self.slots[1][i]
            if self.weight_decay:
                w = w - w * self.weight_decay * lr
            if self.name == "sgd":
                w = w - lr * g
            elif self.name in ("sgd_momentum", "sgd_nesterov"):
                m = c["momentum"] * m - lr * g
                w = w + (c["momentum"] * m - lr * g if c.get("nesterov") else m)
            elif self.name == "adam":
                b1, b2 = c["beta_1"], c["beta_2"]
                alpha = lr * np.sqrt(1 - b2 ** self.t) / (1 - b1 ** self.t)
                m = m + (g - m) * (1 - b1)
                v = v + (g * g - v) * (1 - b2)
                w = w - alpha * m / (np.sqrt(v) + c["epsilon"])
            elif self.name == "rmsprop":
                v = c["rho"] * v + (1 - c["rho"]) * g * g
                w = w - lr * g / np.sqrt(v + c["epsilon"])
            elif self.name == "adagrad":
                m = m + g * g
                w = w - lr * g / np.sqrt(m + c["epsilon"])
            else:
                raise ValueError(self.name)
            self.slots[0][i], self.slots[1][i] = m, v
            out.append(w)
        return out

    def used_slots(self) -> list[np.ndarray]:
        """Copies of the slot variables this optimizer keeps (momentum m, Adam m and v,
        RMSprop v, Adagrad accumulator); plain SGD keeps none."""
        used = {"sgd": (), "sgd_momentum": (0,), "sgd_nesterov": (0,), "adam": (0, 1),
                "rmsprop": (1,), "adagrad": (0,)}[self.name]
        return [np.array(slot) for k in used for slot in self.slots[k]]
