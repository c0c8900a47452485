"""Per-dtype tolerances (after JAX's public_test_util): a value table, a table for values that
went through optimizer steps, and ``atol`` scaled by the number of terms summed."""

from __future__ import annotations

import dataclasses

import numpy as np

# |actual - expected| <= atol * n_terms + rtol * |expected|
VALUE = {"float32": (2e-6, 2e-6), "float64": (1e-13, 1e-13)}  # (atol, rtol)
# Parameters after optimizer steps: forward, backward and update each round once per step.
# float32 from measured error (python -m suite.harness.tools.measure_error; docs/reference.md): the
# largest of 80,000 elements was 6.2 u (u = 2^-24) in the tolerance's unit, the bound is 67 u.
TRAINED = {"float32": (4e-6, 4e-6), "float64": (1e-11, 1e-11)}

TABLES = {"value": VALUE, "trained": TRAINED}


@dataclasses.dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float

    def bound(self, expected) -> np.ndarray:
        return self.atol + self.rtol * np.abs(np.asarray(expected, dtype=np.float64))


def tolerance(dtype, kind: str = "value", n_terms: int = 1, override: dict | None = None) -> Tolerance:
    """The tolerance for comparing a ``dtype`` result that summed ``n_terms`` terms."""
    name = np.dtype(dtype).name
    if override and name in override:
        atol, rtol = override[name]
    else:
        atol, rtol = TABLES[kind][name]
    return Tolerance(atol * max(int(n_terms), 1), rtol)


def between_engines(kind: str = "value") -> dict:
    """The ``override`` for comparing two engines' results with each other instead of with the
    reference (tests/properties/test_across_versions.py): each is within the table's tolerance of
    the exact value, so the two are within twice it of each other."""
    return {name: (2 * atol, 2 * rtol) for name, (atol, rtol) in TABLES[kind].items()}


# -- BatchNormalization: bounds derived from the computation, not a table -----------------------
UNIT = {"float32": 2.0 ** -24, "float64": 2.0 ** -53}
SAFETY = 4.0  # on top of the first-order worst-case bounds below


def batch_norm_bounds(x, dtype: str, epsilon: float, terms: int, one_pass: bool = False) -> dict:
    """First-order worst-case rounding bounds for BatchNormalization's statistics of the rows
    ``x`` computed in ``dtype`` (``terms``: how many numbers each sum adds, rows and replicas):
    the mean (recursive summation: ``terms * u * max|x|``), the variance, two-pass (the mean of
    squared deviations: ``2 max|x - mean| e_dev + terms * u * var``) or one pass
    (``E[x^2] - E[x]^2``, as the synchronized layers all-reduce sums of x and x^2: the error
    scales with ``E[x^2]`` instead of the variance, ``2 (terms + 2) u E[x^2]``), and each
    normalised output element ``(x - mean) / sqrt(var + eps)``. Returns arrays per feature
    ("mean", "var") and per element ("output"), each times SAFETY."""
    u = UNIT[dtype]
    x = np.asarray(x, np.float64)
    if not len(x):
        zero = np.zeros(x.shape[1:])
        return {"mean": zero, "var": zero, "output": np.zeros(x.shape)}
    mean = x.mean(axis=0)
    var = ((x - mean) ** 2).mean(axis=0)
    big = np.abs(x).max(axis=0)
    e_mean = (terms + 2) * u * big
    e_dev = e_mean + u * (np.abs(x) + np.abs(mean))  # per element
    if one_pass:
        e_var = 2 * (terms + 2) * u * (x ** 2).mean(axis=0) + 2 * np.abs(mean) * e_mean
    else:
        e_var = 2 * np.abs(x - mean).max(axis=0) * e_dev.max(axis=0) + (terms + 3) * u * var
    scale = np.sqrt(np.maximum(var - e_var, 0) + epsilon)
    out = (e_dev + np.abs(x - mean) * (e_var / (2 * scale ** 2) + 4 * u)) / scale
    return {"mean": SAFETY * e_mean, "var": SAFETY * e_var, "output": SAFETY * out}
