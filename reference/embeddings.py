"""An Embedding table trained under a strategy (float64): the gradient of a lookup is sparse (a
``tf.IndexedSlices`` with one row per looked-up index, repeated indices included), and what the
optimizer must apply is the dense gradient of the global batch, each row's contributions summed
over its occurrences, within a replica and across replicas.

Sources: ``keras.layers.Embedding`` (a lookup ``table[indices]``); ``tf.IndexedSlices``
("a sparse representation of a set of tensor slices at given indices", duplicates denoting a
sum: ``tf.convert_to_tensor`` of it adds them); the optimizer docstrings' update rules
(reference/optimizers.py), which state them for the gradient, so a row's second moment takes the
square of its summed gradient; the custom-training guide's sum over replicas.
"""

from __future__ import annotations

import numpy as np

from .optimizers import Optimizer
from .rules import documented


def _row_gradients(table, indices, targets, weights):
    """Per occurrence k: the gradient of ``w_k * ||table[i_k] - t_k||^2`` with respect to row
    ``i_k``."""
    rows = np.asarray(table, np.float64)[np.asarray(indices, np.int64)]
    return 2.0 * (rows - np.asarray(targets, np.float64)) * np.asarray(weights, np.float64)[:, None]


@documented("tf.IndexedSlices: duplicate indices are summed when the gradient is applied (as "
            "tf.convert_to_tensor densifies it); the optimizer rules are stated for that gradient")
def train(table, steps, optimizer: str, squares: str = "of_sum", replica: int | None = None) -> list[np.ndarray]:
    """Per step ``(indices, targets, sizes)`` of the global batch (``sizes``: its split, unused
    by the rule: the dense gradient does not depend on it) with the loss
    ``compute_average_loss(||table[i] - t||^2, global batch)``: the table after the optimizer
    (``sgd``, ``adam``, ``adagrad`` of suite/common/catalog.py) applied the dense gradient.
    ``squares="per_occurrence"``: Adam's second moment and Adagrad's accumulator take the sum of
    each occurrence's squared gradient instead of the square of the row's sum (Keras 3: the
    deviation keras3-sparse-second-moments-square-each-occurrence). ``replica`` r: the table of
    replica r where nothing sums the replicas' gradients (the deviation
    keras3-gradients-not-summed-before-3.5): its own copy takes only its own occurrences' gradient
    (still divided by the global batch)."""
    table = np.asarray(table, np.float64)
    opt = Optimizer(optimizer, [table])
    out = []
    for indices, targets, sizes in steps:
        n = len(indices)
        if replica is not None:
            start = int(sum(sizes[:replica]))
            part = slice(start, start + int(sizes[replica]))
            indices, targets = np.asarray(indices)[part], np.asarray(targets)[part]
        per = _row_gradients(table, indices, targets, np.full(len(indices), 1.0 / n))
        dense = np.zeros_like(table)
        np.add.at(dense, np.asarray(indices, np.int64), per)
        if squares == "per_occurrence" and optimizer in ("adam", "adagrad"):
            sq = np.zeros_like(table)
            np.add.at(sq, np.asarray(indices, np.int64), per * per)
            table = _step_with_squares(opt, table, dense, sq)
        else:
            table = opt.step([table], [dense])[0]
        out.append(table)
    return out


def _step_with_squares(opt: Optimizer, w, g, sq):
    """One Adam or Adagrad step of ``opt`` whose squared-gradient term is ``sq``."""
    c, lr = opt.cfg, opt.cfg["learning_rate"]
    opt.t += 1
    m, v = opt.slots[0][0], opt.slots[1][0]
    if opt.name == "adam":
        b1, b2 = c["beta_1"], c["beta_2"]
        alpha = lr * np.sqrt(1 - b2 ** opt.t) / (1 - b1 ** opt.t)
        m = m + (g - m) * (1 - b1)
        v = v + (sq - v) * (1 - b2)
        w = w - alpha * m / (np.sqrt(v) + c["epsilon"])
    else:
        m = m + sq
        w = w - lr * g / np.sqrt(m + c["epsilon"])
    opt.slots[0][0], opt.slots[1][0] = m, v
    return w
