"""The check's verdicts and causes beyond the one style of examples/mistakes.py: the zoo of loops
in examples/zoo.py (Sequential, functional and subclassed models; tuple, dict and weighted
inputs; both distribute modes; SGD and Adam), each with the cause it must be diagnosed with, or
none for a right loop. A wrong verdict or a wrong cause fails; "no catalogued cause" is the
right answer only for a mistake the catalogue lacks. Runs with --deep (.ci/run's deep step on
Keras 3; ``tox -e tf215`` on Keras 2); ``python -m tests.workloads.test_zoo`` prints the confusion table per spec
kind."""

from __future__ import annotations

import pytest

from suite.harness.judging.judgment import Check
from suite.harness.loopcheck import differential, render, usercheck
from suite.harness.loopcheck.causes import CAUSES
from tests.helpers import ROOT
from tests.workloads.test_examples import checker, from_structure_alone

ZOO_SPECS = ("mirrored:2", "central_storage:2", "multi_worker:2x1")
RANDOM_DRAWS = "random_draws"  # EXPECTED's word for a right loop whose own random draws cannot be compared


def _zoo():
    """examples/zoo.py's tables (EXPECTED, STYLE, HARMLESS_ON: plain literals at its end), read
    from its source: the module itself imports TensorFlow, which this process never does."""
    source = (ROOT / "examples" / "zoo.py").read_text()
    namespace: dict = {}
    exec(compile(source[source.index("EXPECTED: dict"):], "examples/zoo.py", "exec"), namespace)
    return namespace["EXPECTED"], namespace["HARMLESS_ON"]


EXPECTED, HARMLESS_ON = _zoo()


def expected_outcome(name: str, kind: str) -> tuple[tuple[str, ...], list[str]]:
    """(the verdicts allowed, the causes that must be named) for loop ``name`` under a spec kind."""
    cause = EXPECTED[name]
    if cause == RANDOM_DRAWS:  # draws of the loop's own: the check says it cannot compare, never FAIL
        return ("RANDOM",), []
    if cause is None or kind in HARMLESS_ON.get(name, ()):
        # right (here): PASS, or DEVIATION where a known deviation predicted every difference
        return ("PASS", "DEVIATION"), []
    if cause.rsplit(": ", 1)[-1] not in CAUSES:  # "MODEL: cause" in a workload of several models
        return ("FAIL",), []  # no catalogued cause: the honest answer
    return ("FAIL",), [cause]


def _structural(cause: str) -> str | None:
    """The catalogued cause of ``cause`` ("MODEL: cause" or "cause") where it is found from structure alone."""
    bare = cause.rsplit(": ", 1)[-1]
    return bare if bare in differential.FROM_STRUCTURE else None


def classify(name: str, kind: str, v) -> str:
    """right cause / no cause / wrong cause / wrong verdict / right verdict (for a right loop)."""
    allowed, causes = expected_outcome(name, kind)
    named = [f"{d.model}: {d.cause}" if d.model else d.cause for d in v.diagnoses]
    if causes and _structural(causes[0]) and v.status in ("PASS", "DEVIATION") and any(
            CAUSES[_structural(causes[0])].title in n and "every step agreed" in n for n in v.notes):
        return "right verdict"  # a mistake of structure that trains alike here: a note, never FAIL (issue 62)
    if v.status not in allowed or any(i == "unrecorded" for i, _ in v.deviations):
        return "wrong verdict"  # an unrecorded deviation is a finding to record, not a right verdict
    if not causes:
        return "right verdict" if not named else "wrong cause"
    if named == causes:
        return "right cause"
    return "no cause" if not named else "wrong cause"


@pytest.mark.deep
@pytest.mark.specs(lambda spec: spec.text in ZOO_SPECS)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_zoo_gets_the_right_verdict_and_cause(spec, name, pool):
    v = checker(pool, f"examples.zoo:{name}").check(spec)
    allowed, causes = expected_outcome(name, spec.strategy)
    if causes and _structural(causes[0]):  # FAIL with it where a step differs or raised, else a note (issue 62)
        from_structure_alone(Check(spec), v, _structural(causes[0]), causes, f"examples.zoo:{name}")
        return
    outcome = classify(name, spec.strategy, v)
    Check(spec).that(outcome in ("right cause", "right verdict") or (outcome == "no cause" and not causes),
                     f"examples.zoo:{name}", f"{outcome}: {v.status} {[d.cause for d in v.diagnoses]}",
                     f"verdict in {allowed} with causes {causes}", render.details(v))


def main() -> None:
    """Run the zoo on ZOO_SPECS and print the confusion table per spec kind (the closing note's)."""
    import collections

    from suite.common.specs import parse_spec
    from suite.harness.pool.pool import EnginePool

    pool = EnginePool(call_timeout=300.0)
    table: dict = collections.defaultdict(collections.Counter)
    try:
        for name in sorted(EXPECTED):
            for text in ZOO_SPECS:
                spec = parse_spec(text)
                try:
                    v = checker(pool, f"examples.zoo:{name}").check(spec)
                except usercheck.CheckInputError as exc:  # the loop itself cannot be checked (exit 2)
                    table[spec.strategy]["input error"] += 1
                    print(f"{name:55s} {text:18s} input error: {str(exc)[:150]}", flush=True)
                    continue
                outcome = classify(name, spec.strategy, v)
                table[spec.strategy][outcome] += 1
                print(f"{name:55s} {text:18s} {v.status:9s} {[d.cause for d in v.diagnoses]} -> {outcome}", flush=True)
    finally:
        pool.close()
    kinds = ["right verdict", "right cause", "no cause", "wrong cause", "wrong verdict", "input error"]
    print("| spec | " + " | ".join(kinds) + " |")
    print("| --- |" + " --- |" * len(kinds))
    for strategy, counts in table.items():
        print(f"| {strategy} | " + " | ".join(str(counts[k]) for k in kinds) + " |")


if __name__ == "__main__":
    main()
