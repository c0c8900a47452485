"""Which model variable of one build is which of another's: the upgrade check trains one model on
two TensorFlow/Keras versions, whose builds name their variables differently (Keras 2
``dense/kernel``, Keras 3 ``sequential/dense/kernel``) and may own state the other lacks (Keras
3's seed generator state of a seeded Dropout). Plain data in and out: the engine loads one
version's initial values with it, and the pytest side compares with it."""

from __future__ import annotations


def match(a: list, b: list) -> list:
    """For each variable of ``b``, the index of the same variable in ``a``, or None. Each is
    ``(name, shape, trainable)``: the trainable variables pair up in order (both versions build the
    same layers in the same order) where their shapes agree; the others by their last name
    (``moving_mean``) and shape, in order; what one build has alone pairs with nothing."""
    out: list = [None] * len(b)
    trainable_a = [i for i, v in enumerate(a) if v[2]]
    trainable_b = [i for i, v in enumerate(b) if v[2]]
    for i, j in zip(trainable_a, trainable_b):
        if list(a[i][1]) == list(b[j][1]):
            out[j] = i
    taken = set()
    for j, (name, shape, trainable) in enumerate(b):
        if trainable:
            continue
        last = name.rsplit("/", 1)[-1]
        for i, (name_a, shape_a, trainable_a_) in enumerate(a):
            if not trainable_a_ and i not in taken and name_a.rsplit("/", 1)[-1] == last and list(shape_a) == list(shape):
                out[j] = i
                taken.add(i)
                break
    return out
