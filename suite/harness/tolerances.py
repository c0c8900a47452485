"""Per-dtype tolerances (after JAX's public_test_util): a value table, a table for values that
went through optimizer steps, and ``atol`` scaled by the number of terms summed."""

from __future__ import annotations

import dataclasses

import numpy as np

# |actual - expected| <= atol * n_terms + rtol * |expected|
VALUE = {"float32": (2e-6, 2e-6), "float64": (1e-13, 1e-13)}  # (atol, rtol)
# Parameters after optimizer steps: forward, backward and update each round once per step.
# float32 from measured error (python -m suite.harness.measure_error; docs/reference.md): the
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
