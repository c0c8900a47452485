"""Hypothesis profiles: each property draws the profile's examples per spec over its items;
derandomized draws are seeded by the test id, so specs with the same
replica count see different cases, and a rerun of one test id sees the same ones."""

from __future__ import annotations

import hypothesis
from hypothesis import strategies as st

from suite.harness.drawing import profiles, tally
from suite.harness.judging.judgment import Check
from suite.harness.plugin.suite_plugin import running


def _draws(nodeid: str, prop, drawn: list) -> list:
    """What ``prop`` draws when the plugin runs it as the test ``nodeid``."""
    drawn.clear()
    with running(prop, nodeid, (), tally.Tally()):
        prop()
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
        profiles.load()  # the session's profile again
    check = Check("ci profile")
    check.that(a != b, "cases drawn for two specs of one test", (a, b), "different streams")
    check.equal(again, a, "cases drawn when the same test id runs again")


def test_draws_count_accepted_and_rejected_examples():
    from suite.harness.drawing import tally

    @hypothesis.settings(max_examples=20, database=None, derandomize=True,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(st.integers(0, 9))
    def prop(x):
        hypothesis.assume(x % 2 == 0)

    counted = tally.Tally()
    with tally.counting(prop, counted):
        prop()
    check = Check("draws")
    check.that(counted.rejected > 0 and counted.accepted >= 1, "examples counted", counted, "both accepted and rejected")
    lines = tally.table({"tests/properties/t.py::test_p[mirrored:2-float32]": counted})
    check.contains("\n".join(lines), [f"test_p: {counted.accepted} accepted, {counted.rejected} rejected",
                                      f"mirrored:2 {counted.accepted}/{counted.rejected}", "REJECTS MORE THAN 10%"],
                   "the draws table")


def test_draws_table_marks_a_spec_below_the_examples_per_spec():
    from suite.harness.drawing import tally

    tallies = {"tests/properties/t.py::test_p[mirrored:2-float32]": tally.Tally(12, 0),
               "tests/properties/t.py::test_p[mirrored:2-float64]": tally.Tally(13, 0),
               "tests/properties/t.py::test_p[default-float32]": tally.Tally(12, 0)}
    text = "\n".join(tally.table(tallies, per_spec=25))
    Check("draws").contains(text, ["test_p: 37 accepted, 0 rejected (0%)  FEWER THAN 25 UNDER default (",
                                   "default 12/0, mirrored:2 25/0"], "the draws table")


def test_draws_count_the_examples_with_an_uneven_split_and_an_empty_replica():
    """An example counts as uneven (empty) when any split it drew is; a forced even split is not
    counted. Expected counts come from the sizes the test saw."""
    from suite.harness.drawing import cases, tally

    seen = []

    @hypothesis.settings(max_examples=40, database=None, derandomize=True,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(first=cases.splits(3), data=st.data())
    def prop(first, data):
        second = data.draw(cases.splits(3, min_total=2))
        third = data.draw(cases.splits(3, even=False))
        data.draw(cases.splits(3, even=True))  # forced even: not a drawn shape
        seen.append([first, second, third])

    counted = tally.Tally()
    with tally.counting(prop, counted):
        prop()
    check = Check("draws")
    check.equal(counted.split, len(seen), "examples that drew a split")
    check.equal(counted.uneven, sum(any(len(set(s)) > 1 for s in ex) for ex in seen), "examples with an uneven split")
    check.equal(counted.empty, sum(any(0 in s for s in ex) for ex in seen), "examples with an empty replica")
    check.that(0 < counted.empty < counted.split, "examples with an empty replica", counted.empty, "some, not all")
    lines = "\n".join(tally.table({"tests/properties/t.py::test_p[mirrored:3]": counted}))
    check.contains(lines, [f"mirrored:3 {counted.accepted}/0 ({counted.uneven} uneven, {counted.empty} empty)"],
                   "the draws table")
    check.that("NO UNEVEN" not in lines and "NO EMPTY" not in lines, "the draws table", lines, "no mark")


def test_draws_table_marks_a_spec_whose_splits_were_never_uneven_or_never_empty():
    from suite.harness.drawing import tally

    tallies = {"tests/properties/t.py::test_p[mirrored:2]": tally.Tally(25, 0, 25, 0, 0),
               "tests/properties/t.py::test_p[mirrored:3]": tally.Tally(25, 0, 25, 10, 0),
               "tests/properties/t.py::test_p[default]": tally.Tally(25, 0)}
    text = "\n".join(tally.table(tallies, per_spec=25))
    Check("draws").contains(text, ["NO UNEVEN SPLIT UNDER mirrored:2  NO EMPTY SPLIT UNDER mirrored:2, mirrored:3",
                                   "default 25/0, mirrored:2 25/0 (0 uneven, 0 empty)"], "the draws table")


def test_each_property_draws_the_profiles_examples_per_spec_over_its_items():
    """profiles.allot: K items of a property under a spec share the profile's number (at least
    MIN_PER_ITEM each); a test with settings of its own keeps them."""
    from suite.harness.drawing import profiles

    check = Check("profiles.per_item")
    for items, want in [(1, 25), (2, 13), (6, 5), (12, 3), (13, 2), (72, 2)]:
        check.equal(profiles.per_item(items, 25), want, f"examples per item of {items} items (25 per spec)")
        check.that(items * profiles.per_item(items, 25) >= 25, f"{items} items together", items, "at least 25")

    @hypothesis.given(st.integers())
    def shared(x):
        pass

    @hypothesis.settings(max_examples=3)
    @hypothesis.given(st.integers())
    def own(x):
        pass

    def plain():
        pass

    allotted = profiles.allot({shared: 6, own: 1, plain: 1})
    n = hypothesis.settings.default.max_examples
    check.equal(allotted, {shared: profiles.per_item(6, n)}, "tests given an allotment")
    check.equal(shared._hypothesis_internal_use_settings.max_examples, profiles.per_item(6, n),
                "max_examples of the shared property")
    check.equal(own._hypothesis_internal_use_settings.max_examples, 3, "max_examples of a test with its own settings")
