"""Specs in parallel: pytest-xdist workers, each running whole strategy specs.

An engine is a process (or a local cluster of them) per spec, started on first use and kept
for the session; splitting one spec's tests over two workers would start it twice and leave
both copies mostly idle. ``SpecScheduling`` (internals.py) is xdist's load-scope scheduling with the spec as
the scope: every test parametrized by a selected spec (the first parameter of its id, as
``tally.split_nodeid`` reads it) goes to the worker that has that spec; any other test is a
scope of its own. Scopes go out largest first and a worker that finishes takes the next, so the
costly specs start early and the small tests fill the gaps.

The suite's plugin (suite_plugin.py) selects it for ``--dist loadscope`` (pyproject's addopts:
``-n auto --dist loadscope``); ``-n 0`` runs everything in the pytest process. The scope is
decided here (``scope_of``); the xdist scheduler that applies it is in internals.py.
"""

from __future__ import annotations

from ..drawing.tally import split_nodeid

# Properties that call the engines of every selected spec (a checkpoint saved under the test's
# spec is restored under a drawn one): all their items form one scope, so one worker runs them
# and only that worker starts every spec's engine and traces their trainers (split by spec, both
# workers did). tests/meta/test_parallel.py keeps this list equal to the properties taking
# ``restore_specs``.
CROSS_SPEC = ("tests/properties/test_checkpoint.py::test_checkpoint_restores_under_another_strategy",)


def scope_of(nodeid: str, specs: frozenset[str]) -> str:
    """"cross-spec" for a test of CROSS_SPEC; else the spec a test runs under (its first
    parameter, when that is a selected spec), else the test id itself."""
    if nodeid.split("[", 1)[0] in CROSS_SPEC:
        return "cross-spec"
    spec = split_nodeid(nodeid)[1]
    return f"spec {spec}" if spec in specs else nodeid
