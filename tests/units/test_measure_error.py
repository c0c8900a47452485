"""The float32 error measurement behind the TRAINED tolerance: its unit is the tolerance's, so
a tolerance atol = rtol = t passes exactly the elements whose unit error is at most t."""

from __future__ import annotations

import numpy as np

from suite.harness.judging.judgment import Check
from suite.harness.judging.tolerances import Tolerance
from suite.harness.tools import measure_error


def test_unit_error_is_the_smallest_passing_tolerance():
    expected = np.array([0.0, 1.5, -3.0, 100.0])
    actual = expected + np.array([1e-7, -2e-6, 5e-6, 1e-4])
    n_terms = 4
    t = measure_error.unit_errors(actual, expected, n_terms)
    check = Check("measure_error")

    def passes(tol, a, e):
        return bool(abs(a - e) <= Tolerance(tol * n_terms, tol).bound(e))

    for i, (a, e) in enumerate(zip(actual, expected)):
        check.that(passes(t[i] * (1 + 1e-9), a, e) and not passes(t[i] * (1 - 1e-6), a, e), f"element {i}", t[i],
                   "the smallest t with atol = rtol = t that passes it")


def test_table_reports_the_largest_error_in_roundoff_units():
    errors = {("trained", "parameters (sgd)"): [0.0, 2 * measure_error.U, 8 * measure_error.U],
              ("value", "compute_average_loss"): [measure_error.U]}
    text = "\n".join(measure_error.table(errors))
    Check("measure_error").contains(text, ["| trained | parameters (sgd) | 3 |", "| 8.00 |",
                                           "largest trained error: 8.0 u", "largest value error: 1.0 u"], "the table")
