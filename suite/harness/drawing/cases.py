"""Hypothesis strategies that draw cases (no TensorFlow). "Strategy" in this project means a
tf.distribute strategy; the hypothesis strategies here are called cases."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ... import layout
from . import tally

ref_model = layout.reference("model")

DTYPES = ("float32", "float64")


def dtypes():
    return st.sampled_from(DTYPES)


@st.composite
def splits(draw, replicas: int, max_per_replica: int = 5, min_total: int = 0, even: bool | None = None):
    """Per-replica batch sizes (replica-id order). Uneven and empty replicas are drawn unless
    ``even``; ``even=True`` gives equal sizes; ``min_total`` bounds the global batch below."""
    drawn = even is None  # the draws table counts the drawn shapes (tally.saw_split), not forced ones
    if drawn:
        even = draw(st.booleans(), label="even split")
    if even:
        b = draw(st.integers(max(1, -(-min_total // replicas)), max_per_replica), label="per-replica batch")
        if drawn:
            tally.saw_split([b] * replicas)
        return [b] * replicas
    drawn_sizes = draw(st.lists(st.integers(0, max_per_replica), min_size=replicas, max_size=replicas),
                       label="sizes")
    # a bijection per replica that moves hypothesis' simplest case (all zeros, which every test
    # item draws first) to [0, 1, 2, ...]: uneven, with replica 0 empty. Items that draw only a
    # few examples (a property with many parameters) still see both shapes.
    sizes = [(v + r) % (max_per_replica + 1) for r, v in enumerate(drawn_sizes)]
    short = min_total - sum(sizes)
    if short > 0:  # top up one drawn replica (no rejection): the others stay as drawn, empty or not
        r = draw(st.integers(0, replicas - 1), label="replica topped up")
        sizes[r] += short
    tally.saw_split(sizes)  # drawn: not even
    return sizes


def floats(dtype: str, shape, lo: float = -4.0, hi: float = 4.0):
    """Arrays of ``dtype`` with finite values in [lo, hi], exactly representable in ``dtype``
    (so the float64 reference sees the very numbers TensorFlow sees)."""
    width = 32 if dtype == "float32" else 64
    return hnp.arrays(np.dtype(dtype), shape,
                      elements=st.floats(lo, hi, width=width, allow_nan=False, allow_infinity=False,
                                         allow_subnormal=False))


def magnitudes(dtype: str, shape, lo: float, hi: float):
    """Arrays of ``dtype`` whose values have magnitudes in [lo, hi] and either sign, drawn as a
    sign and a magnitude (no filter): training inputs and parameters bounded away from zero, so
    that exact zeros (a dead input times a weight) and tiny products that cancel are not drawn
    and the relu kinks the conditioning filter guards against are rare by construction."""
    width = 32 if dtype == "float32" else 64
    value = st.tuples(st.booleans(), st.floats(lo, hi, width=width)).map(lambda t: -t[1] if t[0] else t[1])
    return hnp.arrays(np.dtype(dtype), shape, elements=value)


# Margins below which float rounding could flip a relu or make an adaptive optimizer's
# update ill-conditioned (its sensitivity to the gradient is ~eps/|g|^2): cases closer
# than this are discarded, not compared with a wider tolerance. With inputs and parameters
# drawn away from zero (magnitudes) the float32 margins were lowered from 1e-4 and 1e-3 and
# measured: python -m suite.harness.tools.measure_error leaves out 0% of SGD cases and 9-10% of
# adaptive ones, and the largest error is 8.9 u against a bound of 67 u (docs/reference.md).
RELU_MARGIN = {"float32": 1e-5, "float64": 1e-9}
ADAPTIVE_GRAD_FLOOR = {"float32": 1e-5, "float64": 1e-6}


def well_conditioned(history, dtype: str, adaptive: bool) -> bool:
    """True when a reference training run stays away from the kinks where float32/float64
    rounding can legitimately change the result (relu at 0, saturated softmax, adaptive
    updates of near-zero gradients)."""
    for step in history:
        trace = step["trace"]
        for pre in trace.preactivations:
            nonzero = np.abs(pre[pre != 0])
            if nonzero.size and nonzero.min() < RELU_MARGIN[dtype]:
                return False
            if np.any(pre == 0):
                return False
        head = trace.head_output
        if head.size and head.min() >= 0 and np.allclose(head.sum(axis=-1), 1.0):
            if head.min() < 1e-6 or head.max() > 1 - 1e-6:
                return False
        if adaptive:
            for g in step["grads"]:
                a = np.abs(g)
                if np.any((a > 0) & (a < ADAPTIVE_GRAD_FLOOR[dtype])):
                    return False
    return True


# The model family the training and checkpoint properties draw from (reference/model.py).
ARCHS = {
    "mlp_linear_l2": ref_model.Arch(input_dim=3, hidden=(4,), outputs=2, head="linear", l2=1 / 64),
    "mlp_softmax": ref_model.Arch(input_dim=3, hidden=(5, 3), outputs=3, head="softmax"),
    "linear_l2": ref_model.Arch(input_dim=2, hidden=(), outputs=1, head="linear", l2=1 / 8),
}


# Models of the building-block properties only (tests/properties/test_blocks.py).
BLOCK_ARCHS = {
    "mlp_activity": ref_model.Arch(input_dim=3, hidden=(4, 3), outputs=2, head="linear", activity=1 / 16),
}


def arch_named(name: str):
    return ARCHS[name] if name in ARCHS else BLOCK_ARCHS[name]


@st.composite
def training_cases(draw, replicas: int, dtype: str, max_steps: int = 4, arch: str | None = None):
    """(arch name, initial parameters, steps): each step a global batch (x, y) and its split
    (the model ``arch``, or one drawn)."""
    arch_name = arch or draw(st.sampled_from(sorted(ARCHS)), label="arch")
    arch = arch_named(arch_name)
    params = [draw(magnitudes(dtype, shape, 1 / 16, 1.0), label=f"param {i}")
              for i, shape in enumerate(arch.shapes())]
    return arch_name, params, draw(training_steps(arch_name, replicas, dtype, max_steps))


@st.composite
def training_steps(draw, arch_name: str, replicas: int, dtype: str, max_steps: int = 4):
    """1..max_steps global batches (x, y, split) for the model ``arch_name`` on ``replicas``."""
    arch = arch_named(arch_name)
    steps = []
    for _ in range(draw(st.integers(1, max_steps), label="steps")):
        sizes = draw(splits(replicas, max_per_replica=4, min_total=1), label="sizes")
        n = sum(sizes)
        x = draw(magnitudes(dtype, (n, arch.input_dim), 1 / 16, 2.0), label="x")
        if arch.head == "softmax":
            y = draw(hnp.arrays(np.int32, n, elements=st.integers(0, arch.outputs - 1)), label="labels")
        else:
            y = draw(floats(dtype, (n, arch.outputs), -2.0, 2.0), label="y")
        steps.append((x, y, sizes))
    return steps


def arch_dict(arch) -> dict:
    """An Arch as plain data for a probe."""
    return {"input_dim": arch.input_dim, "hidden": list(arch.hidden), "outputs": arch.outputs,
            "head": arch.head, "l2": arch.l2, "activity": arch.activity}
