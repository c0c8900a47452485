"""The assertion helpers: tolerances, failure messages and diagnoses."""

from __future__ import annotations

import numpy as np
import pytest

from suite.harness.check import PropertyFailure, assert_close, assert_per_replica, diagnose, ratio
from suite.harness.tolerances import tolerance


def test_values_within_tolerance_pass_and_outside_fail():
    assert_close(1.0 + 1e-14, 1.0, what="x", spec="s", dtype="float64")
    with pytest.raises(PropertyFailure, match=r"\[s\] x: got 1.000001, but should be 1"):
        assert_close(1.000001, 1.0, what="x", spec="s", dtype="float64")
    with pytest.raises(PropertyFailure, match="shape"):
        assert_close(np.zeros(2), np.zeros(3), what="x", spec="s", dtype="float32")
    assert_close(np.nan, np.nan, what="nan", spec="s", dtype="float32")


def test_tolerance_scales_atol_with_terms():
    assert tolerance("float32", n_terms=10).atol == pytest.approx(10 * tolerance("float32").atol)
    assert tolerance("float64", "trained").rtol > tolerance("float64").rtol


@pytest.mark.parametrize("factor, phrase", [(2.0, "= replicas"), (0.5, "= 1/replicas")])
def test_replica_factor_is_diagnosed(factor, phrase):
    expected = np.array([0.3, -1.2, 2.0])
    assert phrase in diagnose(expected * factor, expected, replicas=2)
    with pytest.raises(PropertyFailure, match="diagnosis"):
        assert_close(expected * factor, expected, what="gradient", spec="mirrored:2", dtype="float32",
                     replicas=2)


def test_elements_factor_and_generic_ratio():
    assert "elements per example" in diagnose(np.array([6.0]), np.array([2.0]), replicas=2, elements=3)
    assert ratio([2.0, 4.0], [1.0, 2.0]) == pytest.approx(2.0)
    assert "not a constant multiple" in diagnose(np.array([1.0, 5.0]), np.array([1.0, 2.0]), 2)


def test_failure_note_carries_the_repro():
    with pytest.raises(PropertyFailure) as info:
        assert_close(2.0, 1.0, what="x", spec="s", dtype="float32", repro="import tensorflow as tf\n")
    assert "import tensorflow as tf" in "".join(getattr(info.value, "__notes__", []))


def test_per_replica_checks_each_worker_against_its_replicas():
    results = [{"local": [1.0]}, {"local": [2.0]}]
    assert_per_replica(results, [1.0, 2.0], what="v", spec="multi_worker:2x1", dtype="float64")
    with pytest.raises(PropertyFailure, match=r"worker 1\) replica 1"):
        assert_per_replica(results, [1.0, 3.0], what="v", spec="multi_worker:2x1", dtype="float64")
    with pytest.raises(PropertyFailure, match="local results"):
        assert_per_replica([{"local": [1.0, 2.0]}], [1.0], what="v", spec="s", dtype="float64")
