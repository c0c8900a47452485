"""The one module that uses pytest's and pytest-xdist's private APIs, where no public one does
the job. Everything else in the project uses public pytest, xdist and hypothesis API.

- ``SpecScheduling``: xdist's load-scope scheduling keyed by strategy spec. xdist offers no
  public hook for the scope of a test; ``LoadScopeScheduling._split_scope`` is the method xdist's
  own ``LoadFileScheduling`` overrides to the same end. Nor for the order scopes go out in:
  ``_assign_work_unit`` reorders its ``workqueue`` before the first unit is taken.
- ``junit_suite_property``: a property of the whole run in the JUnit file, written by the process
  that writes the file (pytest-xdist's controller). ``record_testsuite_property`` is a fixture, and a
  fixture runs in a worker; ``LogXML.add_global_property`` is what it calls.
- ``run_again``: run a collected item once more in the same session (the mutation matrix runs
  one item under several mutants). pytest has no public API to re-run an item: a fresh fixture
  request (``Item._initrequest``) and ``_pytest.runner.runtestprotocol``.
"""

from __future__ import annotations

from _pytest.junitxml import xml_key
from _pytest.runner import runtestprotocol
from xdist.scheduler import LoadScopeScheduling

from .scheduling import by_cost, scope_of


class SpecScheduling(LoadScopeScheduling):
    """Load-scope scheduling whose scope is the strategy spec (scheduling.scope_of), the scopes taken
    costliest first by the committed cost table (scheduling.by_cost)."""

    def __init__(self, config, specs: list[str], log=None, table: dict | None = None):
        super().__init__(config, log)
        self.specs = frozenset(specs)
        self.table = table
        self._ordered = False

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid, self.specs)

    def _assign_work_unit(self, node) -> None:
        # xdist fills ``workqueue`` (scope -> its node ids) in ``schedule`` and pops it from the front
        # here, with no hook between: the queue is put in cost order before its first unit goes out
        if not self._ordered:
            self._ordered = True
            order = by_cost(self.workqueue, self.table)
            self.workqueue = type(self.workqueue)((scope, self.workqueue[scope]) for scope in order)
        super()._assign_work_unit(node)


def run_again(item, nextitem) -> list:
    """Run ``item``'s setup, call and teardown again with a fresh fixture request; its reports."""
    item._initrequest()
    return runtestprotocol(item, nextitem=nextitem, log=False)


def junit_suite_property(config, name: str, value: str) -> None:
    """``name=value`` among the JUnit file's testsuite properties (nothing without ``--junitxml``)."""
    xml = config.stash.get(xml_key, None)
    if xml is not None:
        xml.add_global_property(name, value)
