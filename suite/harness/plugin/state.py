"""What the suite's plugin keeps for a session, in pytest's stash (no module globals, no private
attributes on pytest objects): the session's ``SuiteState`` under ``config.stash``, and per test
item the known deviations in scope and, after its call, the ledger that judged it."""

from __future__ import annotations

import dataclasses

import pytest

from ..judging.findings import Findings
from ..pool.cost import Cost


@dataclasses.dataclass
class SuiteState:
    specs: list  # the selected strategy specs (suite.common.specs.Spec)
    versions: dict  # {"tensorflow": ..., "keras": ...} of the engine interpreter
    other_versions: dict  # SPEC@ENV text -> that env's versions
    deviations: list  # the known-deviations file's entries
    draws: dict = dataclasses.field(default_factory=dict)  # test id -> tally.Tally of its examples
    budgets: dict = dataclasses.field(default_factory=dict)  # property -> examples per spec without --deep
    findings: Findings = dataclasses.field(default_factory=Findings)
    # engine starts and traces per spec; "retried": "test id: error" per call asked again (EngineCallRetried)
    engines: dict = dataclasses.field(default_factory=lambda: {"starts": {}, "traces": {}, "retried": []})
    bands: dict = dataclasses.field(default_factory=dict)  # (deviation, quantity, band) -> [compared, explained]
    stale: list = dataclasses.field(default_factory=list)  # stale rounding bands, found at the session's end
    mutant: str | None = None  # the mutant the engines compute with (tools/mutation.py)
    pools: list = dataclasses.field(default_factory=list)  # the session's engine pools (killed on SIGINT/SIGTERM)
    interrupted: int | None = None  # the signal that interrupted the session (engines/interrupts.py)
    restore_signals: object = None  # puts back the handlers pytest_configure replaced
    cost: Cost = dataclasses.field(default_factory=Cost)  # the workers' engine costs, summed (the controller's)
    results_run: dict | None = None  # what results_dir.finish renames and records at the session's end


SUITE = pytest.StashKey[SuiteState]()
IN_SCOPE = pytest.StashKey[tuple]()  # item -> the deviations whose tests match it, for its versions
LEDGER = pytest.StashKey[object]()  # item -> the deviations.Ledger of its call
# item -> the process's engine cost (pool/cost.py) and its own CPU seconds as its setup began
COST_AT = pytest.StashKey[tuple]()


def of(config) -> SuiteState:
    """The session's state (pytest_configure of suite_plugin.py creates it)."""
    return config.stash[SUITE]
