"""How many drawn cases each property accepted and rejected (``assume``), per test item.

conftest wraps a hypothesis test's ``inner_test`` (hypothesis reads it at call time so that
plugins can wrap it) while the item runs and counts the calls and the calls that ended in
``UnsatisfiedAssumption``; the terminal summary lists them per property and spec, and marks a
property that rejects more than ``LIMIT`` of its draws (a filter that hides a skip).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools

from hypothesis.errors import UnsatisfiedAssumption

LIMIT = 0.10


@dataclasses.dataclass
class Tally:
    examples: int = 0
    rejected: int = 0

    @property
    def accepted(self) -> int:
        return self.examples - self.rejected

    @property
    def rate(self) -> float:
        return self.rejected / self.examples if self.examples else 0.0


@contextlib.contextmanager
def counting(test, tally: Tally):
    """Count ``test``'s hypothesis examples into ``tally`` while the block runs."""
    handle = getattr(test, "hypothesis", None)
    if handle is None:
        yield
        return
    inner = handle.inner_test

    @functools.wraps(inner)  # hypothesis names the failing test case after it
    def counted(*args, **kwargs):
        __tracebackhide__ = True
        tally.examples += 1
        try:
            return inner(*args, **kwargs)
        except UnsatisfiedAssumption:
            tally.rejected += 1
            raise

    handle.inner_test = counted
    try:
        yield
    finally:
        handle.inner_test = inner


def split_nodeid(nodeid: str) -> tuple[str, str]:
    """``(property, spec)`` of a test id: the function and the first parameter of its id."""
    name, _, params = nodeid.partition("[")
    return name.rsplit("::", 1)[-1], params.rstrip("]").split("-", 1)[0] if params else ""


def table(tallies: dict[str, Tally], per_spec: int = 0) -> list[str]:
    """Lines: per property, its accepted/rejected draws per spec and overall; a property that
    rejects more than ``LIMIT``, or accepts fewer than ``per_spec`` under some spec, is marked."""
    by_property: dict[str, dict[str, Tally]] = collections.defaultdict(lambda: collections.defaultdict(Tally))
    for nodeid, t in tallies.items():
        prop, spec = split_nodeid(nodeid)
        cell = by_property[prop][spec]
        cell.examples += t.examples
        cell.rejected += t.rejected
    lines = []
    for prop in sorted(by_property):
        cells = by_property[prop]
        total = Tally(sum(c.examples for c in cells.values()), sum(c.rejected for c in cells.values()))
        flag = f"  REJECTS MORE THAN {LIMIT:.0%}" if total.rate > LIMIT else ""
        short = sorted(spec for spec, c in cells.items() if spec and c.accepted < per_spec)
        if short:
            flag += f"  FEWER THAN {per_spec} UNDER {', '.join(short)} (all its cases, or a failure)"
        lines.append(f"{prop}: {total.accepted} accepted, {total.rejected} rejected ({total.rate:.0%}){flag}")
        lines.append("    " + ", ".join(f"{spec or '-'} {c.accepted}/{c.rejected}" for spec, c in sorted(cells.items())))
    return lines
