"""Specs in parallel: pytest-xdist workers, each running whole strategy specs.

An engine is a process (or a local cluster of them) per spec, started on first use and kept
for the session; splitting one spec's tests over two workers would start it twice and leave
both copies mostly idle. ``SpecScheduling`` (internals.py) is xdist's load-scope scheduling with the spec as
the scope: every test parametrized by a selected spec (the first parameter of its id, as
``tally.split_nodeid`` reads it) goes to the worker that has that spec; any other test is a
scope of its own, but for the tests of a module that share a costly set-up (one scope). Scopes
go out largest first and a worker that finishes takes the next, so the costly specs start early
and the small tests fill the gaps.

The suite's plugin (suite_plugin.py) selects it for ``--dist loadscope`` (pyproject's addopts:
``-n auto --dist loadscope``); ``-n 0`` runs everything in the pytest process. The scope is
decided here (``scope_of``); the xdist scheduler that applies it is in internals.py.
"""

from __future__ import annotations

import json
import os

from ... import layout
from ...common.specs import SpecError, parse_spec
from ..drawing.tally import split_nodeid
from ..pool import topology

# Properties that call the engines of every selected spec (a checkpoint saved under the test's
# spec is restored under a drawn one): all their items form one scope, so one worker runs them
# and only that worker starts every spec's engine and traces their trainers (split by spec, both
# workers did). tests/units/test_parallel.py keeps this list equal to the properties taking
# ``restore_specs``.
CROSS_SPEC = ("tests/properties/test_checkpoint.py::test_checkpoint_restores_under_another_strategy",)


# Modules whose tests share a module-scoped fixture that runs child processes (whole pytest sessions,
# checks, an install): all their tests form one scope, so that fixture runs once (split test by test,
# each worker that took one of them ran it again). tests/units/test_parallel.py keeps each listed.
SHARED_SETUP = ("tests/harness/test_fault_matrix.py", "tests/workloads/test_hangs.py",
                "tests/harness/test_bench_selection.py", "tests/lint/test_packaging.py")


# Modules whose tests run, from the session's pool, engines of other tox envs' interpreters (SPEC@ENV: the
# loop check on other Keras releases, the upgrade check): all their tests form one scope, so each env's
# fork server imports its TensorFlow in one worker, not in both (test by test, each was a scope of its own
# and the two workers took them in turn). tests/units/test_parallel.py keeps the list equal to the modules
# that do so.
OTHER_ENVS = ("tests/workloads/test_other_versions.py", "tests/workloads/test_upgrade.py")


def scope_of(nodeid: str, specs: frozenset[str]) -> str:
    """"cross-spec" for a test of CROSS_SPEC; the module for a test of SHARED_SETUP or OTHER_ENVS;
    else the spec a test runs under (its first parameter, when that is a selected spec), else the test
    id itself."""
    if nodeid.split("[", 1)[0] in CROSS_SPEC:
        return "cross-spec"
    if nodeid.split("::", 1)[0] in SHARED_SETUP + OTHER_ENVS:
        return f"module {nodeid.split('::', 1)[0]}"
    spec = split_nodeid(nodeid)[1]
    return f"spec {spec}" if spec in specs else nodeid


def committed_table() -> dict | None:
    """The checkout's committed cost table (docs/cost_table.json), None where there is none (an
    installed suite) or it does not read."""
    if layout.REPO_ROOT is None:
        return None
    try:
        return json.loads((layout.REPO_ROOT / "docs" / "cost_table.json").read_text())
    except (OSError, ValueError):
        return None


def estimates(table: dict) -> tuple[dict, dict, float]:
    """From a cost table (tools/cost_table.py's JSON: docs/cost_table.json): each listed slow test's
    seconds, each file's mean seconds per test, and the mean over all tests (for a file it lacks)."""
    slow = {row["test"]: row["wall_s"] for row in table.get("slowest_tests", [])}
    per_file = {row["file"]: row["wall_s"] / row["tests"] for row in table.get("files", []) if row.get("tests")}
    overall = table.get("tests_s", 0.0) / table["tests"] if table.get("tests") else 1.0
    return slow, per_file, overall


def by_cost(scopes: dict, table: dict | None) -> list:
    """The scopes (scope -> its node ids) in the order workers should take them: the costliest first by
    the committed cost table's seconds (a test it does not list: its file's mean, else the mean of all),
    so the long scopes start early and the short ones fill the end (the longest-first rule); by their
    number of tests, as xdist orders them, without a table."""
    if not table:
        return sorted(scopes, key=lambda scope: -len(scopes[scope]))
    slow, per_file, overall = estimates(table)

    def seconds(nodeid: str) -> float:
        return slow.get(nodeid, per_file.get(nodeid.split("::", 1)[0], overall))
    return sorted(scopes, key=lambda scope: (-sum(map(seconds, scopes[scope])), -len(scopes[scope])))


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the platform has one (a container's
    or taskset's limit), else every core."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity (macOS, Windows)
        return os.cpu_count() or 1


def engine_processes(strategies: str) -> list[int]:
    """The processes of each spec's engine, for ``--strategies`` text (topology.tasks): 1 for a
    one-process spec (its replicas are threads), W for ``multi_worker:WxR``, 1 + W + P for
    ``parameter_server:WwPps`` (the coordinating chief, W worker and P ps servers), a SPEC@ENV's as
    its SPEC's; 1 for ``cluster``, whose processes run on the cluster's hosts. A spec that does not
    parse is left out (pytest_configure makes it a usage error)."""
    out = []
    for text in filter(None, (part.strip() for part in strategies.split(","))):
        if text == "cluster":
            out.append(1)
            continue
        try:
            out.append(len(topology.tasks(parse_spec(text))))
        except SpecError:
            continue
    return out


def auto_workers(cores: int, processes: list[int]) -> int:
    """``-n auto``: how many xdist workers, on ``cores`` usable cores, for specs whose engines run
    ``processes`` (one count per selected spec). A worker runs one test at a time, so one engine at a
    time, and waits while that engine computes: its load is that engine's processes, and over a
    session, as it takes spec after spec, their mean. So: the cores divided by the mean processes per
    engine, rounded up (engine processes also wait, on the cases the worker draws and judges and on
    each other in collectives, so rounding down would leave cores idle), at least 1, and at most one
    worker per spec and one more (a spec's tests all go to one worker; the tests without a spec and the
    cross-spec scope are the rest of the work, so more workers than that would only wait).
    The default specs (13 processes over 9 specs) get 2 workers on 2 cores, 3 on 4, 6 on 8, 10 from 14 on."""
    if not processes:
        return max(1, cores)
    return max(1, min(-(-cores * len(processes) // sum(processes)), len(processes) + 1))
