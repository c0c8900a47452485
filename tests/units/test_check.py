"""The check object: tolerances, the one message format, diagnoses, and that every failure in
tests/ goes through it (no failure message is assembled by hand)."""

from __future__ import annotations

import ast

import numpy as np
import pytest

from suite.common.results import Raised, ReplicaValues
from suite.harness.judging.judgment import Check, PropertyFailure, factor_hint, ratio
from suite.harness.judging.tolerances import tolerance
from tests.helpers import ROOT


def test_values_within_tolerance_pass_and_outside_fail():
    check = Check("s", "float64")
    check.close(1.0 + 1e-14, 1.0, "x")
    with pytest.raises(PropertyFailure, match=r"\[s\] x: got 1.000001, but should be 1"):
        check.close(1.000001, 1.0, "x")
    with pytest.raises(PropertyFailure, match="got shape"):
        Check("s", "float32").close(np.zeros(2), np.zeros(3), "x")
    Check("s", "float32").close(np.nan, np.nan, "nan")


def test_tolerance_scales_atol_with_terms():
    assert tolerance("float32", n_terms=10).atol == pytest.approx(10 * tolerance("float32").atol)
    assert tolerance("float64", "trained").rtol > tolerance("float64").rtol


@pytest.mark.parametrize("factor, phrase", [(2.0, "= replicas"), (0.5, "= 1/replicas")])
def test_replica_factor_is_diagnosed(factor, phrase):
    expected = np.array([0.3, -1.2, 2.0])
    assert phrase in factor_hint(expected * factor, expected, replicas=2)
    with pytest.raises(PropertyFailure, match="diagnosis"):
        Check("mirrored:2", "float32", replicas=2).close(expected * factor, expected, "gradient")


def test_elements_factor_and_generic_ratio():
    assert "elements per example" in factor_hint(np.array([6.0]), np.array([2.0]), replicas=2, elements=3)
    assert ratio([2.0, 4.0], [1.0, 2.0]) == pytest.approx(2.0)
    assert "not a constant multiple" in factor_hint(np.array([1.0, 5.0]), np.array([1.0, 2.0]), 2)


def test_every_failure_has_the_same_parts():
    """Each comparison fails with ``[spec] quantity: got ..., but should ...``, then the case and
    the repro snippet as a note."""
    check = Check("mirrored:2", "float64", {"sizes": [1, 2]}, "import tensorflow as tf\n")
    failing = [lambda: check.close(2.0, 1.0, "q"), lambda: check.exact(np.float32([1]), np.float64([1]), "q"),
               lambda: check.equal([1, 2], [2, 1], "q"), lambda: check.that(False, "q", 3, "4"),
               lambda: check.contains("abc", ["d"], "q"), lambda: check.raises(ReplicaValues([1.0]), "ValueError", "q"),
               lambda: check.returned(Raised("ValueError", "boom", "probe 'x'"), "q")]
    for fail in failing:
        with pytest.raises(PropertyFailure) as info:
            fail()
        first, *rest = str(info.value).splitlines()
        assert first.startswith("[mirrored:2] q: ")
        assert "got " in first or "raised " in first
        assert rest[-1] == "  case: sizes=[1, 2]"
        assert "import tensorflow as tf" in "".join(info.value.__notes__)


def test_raises_matches_type_and_message():
    check = Check("s")
    check.raises(Raised("ValueError", "The global batch size 5 is not divisible", "p"), "ValueError", "q", "divisible")
    with pytest.raises(PropertyFailure, match="but should raise ValueError with 'nope'"):
        check.raises(Raised("ValueError", "The global batch size", "p"), "ValueError", "q", "nope")
    with pytest.raises(PropertyFailure, match="got TypeError: x, but should raise ValueError"):
        check.raises(Raised("TypeError", "x", "p"), "ValueError", "q")


def test_per_replica_checks_each_worker_against_its_replicas():
    results = [ReplicaValues([1.0]), ReplicaValues([2.0])]
    check = Check("multi_worker:2x1", "float64")
    check.per_replica(results, [1.0, 2.0], "v")
    with pytest.raises(PropertyFailure, match=r"worker 1\) replica 1"):
        check.per_replica(results, [1.0, 3.0], "v")
    with pytest.raises(PropertyFailure, match="local results: got 2, but should be 1"):
        Check("s", "float64").per_replica([ReplicaValues([1.0, 2.0])], [1.0], "v")


def _failure_statements(path):
    """``(line, what)`` of each hand-made failure: an assert with a message, a raise of
    AssertionError or PropertyFailure; in tests/properties and tests/harness any assert."""
    strict = path.parts[-2] in ("properties", "harness")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assert) and (node.msg is not None or strict):
            yield node.lineno, "assert" + (" with a message" if node.msg is not None else "")
        if isinstance(node, ast.Raise) and node.exc is not None:
            name = ast.unparse(node.exc).split("(")[0]
            if name in ("AssertionError", "PropertyFailure"):
                yield node.lineno, f"raise {name}"


def test_every_failure_message_in_tests_comes_from_the_check_object():
    """The properties and harness tests state every expectation through ``Check``; the meta
    tests may assert plainly (pytest shows the values) but assemble no failure message."""
    found = [f"{p.relative_to(ROOT)}:{line}: {what}" for p in sorted((ROOT / "tests").rglob("*.py"))
             for line, what in _failure_statements(p)]
    Check("tests/").equal(found, [], "failures not produced by the check object")


def test_the_message_rule_sees_a_hand_made_failure(tmp_path):
    folder = tmp_path / "properties"
    folder.mkdir()
    for source, what in [("assert x, 'x is wrong'", "assert with a message"), ("assert x", "assert"),
                         ("raise PropertyFailure(f'{x} is wrong')", "raise PropertyFailure")]:
        (folder / "test_x.py").write_text(f"def test_x(x):\n    {source}\n")
        assert list(_failure_statements(folder / "test_x.py")) == [(2, what)]
