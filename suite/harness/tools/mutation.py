"""Properties against mutants, many in one pytest session (tests/mutation/test_mutants.py):

    pytest -p suite.harness.tools.mutation --mutation-plan PLAN.json --mutation-out OUT.json TEST_IDS

PLAN is a JSON list of ``[test id, mutant]``. Each entry runs its test item once with every
engine of the session switched to the mutant (``EnginePool.set_mutant``; the engines start
once, importing the mutants package, and drop their cached traces at each switch), so one item can
run under several mutants.
OUT gets one record per entry: the outcome (``failed``, ``passed``, ``xfailed``, ``skipped``), the
report's text and the seconds it took. The session reports nothing itself: a property that
fails here is what the meta test wants, and it reads OUT.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ...common.files import write_atomically
from ..plugin import state
from ..plugin.internals import run_again


def pytest_addoption(parser):
    group = parser.getgroup("tf-distribute-suite mutation")
    group.addoption("--mutation-plan", default=None, help="JSON list of [test id, mutant] to run")
    group.addoption("--mutation-out", default=None, help="where to write each entry's outcome (JSON)")


@pytest.fixture(autouse=True)
def _tfds_mutant(request):
    """Every engine computes with the entry's mutant (none outside a plan)."""
    name = state.of(request.config).mutant
    if name is not None:
        request.getfixturevalue("pool").set_mutant(name)


class _Next:
    """The ``nextitem`` of an entry's teardown: the next entry's item, minus the item itself
    when that is this one again (pytest tears down what the next item does not share, so the
    item's own function-scoped fixtures go and the session's engines stay)."""

    def __init__(self, item, following):
        self._chain = following.listchain()
        if following is item:
            self._chain = self._chain[:-1]

    def listchain(self):
        return self._chain


def _outcome(reports) -> tuple[str, str]:
    for rep in reports:
        if rep.failed:
            return "failed", rep.longreprtext
    for rep in reports:
        if hasattr(rep, "wasxfail"):
            return "xfailed", str(rep.wasxfail)
        if rep.skipped:
            return "skipped", rep.longreprtext
    return "passed", ""


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    config = session.config
    plan_path, out_path = config.getoption("--mutation-plan"), config.getoption("--mutation-out")
    if plan_path is None:
        return None
    if out_path is None:
        raise pytest.UsageError("--mutation-plan needs --mutation-out")
    plan = [tuple(entry) for entry in json.loads(Path(plan_path).read_text())]
    items = {item.nodeid: item for item in session.items}
    missing = sorted({test for test, _ in plan} - set(items))
    if missing:
        raise pytest.UsageError(f"--mutation-plan: not collected (check the ids and --strategies): {missing}")
    records = []
    try:
        for i, (test, mutant) in enumerate(plan):
            item = items[test]
            state.of(config).mutant = mutant
            began = time.monotonic()  # a fresh fixture request: the item runs once per entry
            reports = run_again(item, _Next(item, items[plan[i + 1][0]]) if i + 1 < len(plan) else None)
            outcome, text = _outcome(reports)
            records.append({"test": test, "mutant": mutant, "outcome": outcome, "text": text,
                            "seconds": round(time.monotonic() - began, 1)})
    finally:
        state.of(config).mutant = None
        write_atomically(out_path, json.dumps(records, indent=1))
    return True
