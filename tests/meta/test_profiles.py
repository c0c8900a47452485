"""Hypothesis profiles: derandomized draws are seeded by the test id, so specs with the same
replica count see different cases, and a rerun of one test id sees the same ones."""

from __future__ import annotations

import types

import hypothesis
from hypothesis import strategies as st

import conftest
from suite.harness.check import Check


def _draws(nodeid: str, prop, drawn: list) -> list:
    drawn.clear()
    config = types.SimpleNamespace(_tfds_draws={})
    hook = conftest.pytest_runtest_call(types.SimpleNamespace(obj=prop, nodeid=nodeid, config=config))
    next(hook)
    try:
        prop()
    finally:
        hook.close()
    return list(drawn)


def test_derandomized_draws_are_seeded_by_the_test_id():
    drawn = []

    @hypothesis.settings(max_examples=8, database=None)
    @hypothesis.given(st.integers(0, 10 ** 9))
    def prop(x):
        drawn.append(x)

    hypothesis.settings.load_profile("ci")
    try:
        a = _draws("tests/properties/test_x.py::test_p[mirrored:2]", prop, drawn)
        b = _draws("tests/properties/test_x.py::test_p[multi_worker:2x1]", prop, drawn)
        again = _draws("tests/properties/test_x.py::test_p[mirrored:2]", prop, drawn)
    finally:
        hypothesis.settings.load_profile(conftest.PROFILE)
    check = Check("ci profile")
    check.that(a != b, "cases drawn for two specs of one test", (a, b), "different streams")
    check.equal(again, a, "cases drawn when the same test id runs again")


def test_draws_count_accepted_and_rejected_examples():
    from suite.harness import draws

    @hypothesis.settings(max_examples=20, database=None, derandomize=True,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(st.integers(0, 9))
    def prop(x):
        hypothesis.assume(x % 2 == 0)

    tally = draws.Tally()
    with draws.counting(prop, tally):
        prop()
    check = Check("draws")
    check.that(tally.rejected > 0 and tally.accepted >= 1, "examples counted", tally, "both accepted and rejected")
    lines = draws.table({"tests/properties/t.py::test_p[mirrored:2-float32]": tally})
    check.contains("\n".join(lines), [f"test_p: {tally.accepted} accepted, {tally.rejected} rejected",
                                      f"mirrored:2 {tally.accepted}/{tally.rejected}", "REJECTS MORE THAN 10%"],
                   "the draws table")
