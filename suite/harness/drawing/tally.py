"""How many drawn cases each property accepted and rejected (``assume``), per test item, and
how many of them split the batch unevenly or left a replica empty.

conftest wraps a hypothesis test's ``inner_test`` (hypothesis reads it at call time so that
plugins can wrap it) while the item runs and counts the calls and the calls that ended in
``UnsatisfiedAssumption``; ``cases.splits`` reports each split it draws (``saw_split``), and
an example counts as uneven (or empty) when any of its splits is. The terminal summary lists
them per property and spec, and marks a property that rejects more than ``LIMIT`` of its
draws (a filter that hides a skip), or that draws splits under a spec but never an uneven one
or never an empty replica there.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools

from hypothesis.errors import StopTest, UnsatisfiedAssumption

from ...common.specs import id_parts

LIMIT = 0.10


@dataclasses.dataclass
class Tally:
    examples: int = 0
    rejected: int = 0
    split: int = 0  # examples that drew a split of the batch over two or more replicas
    uneven: int = 0  # ... one with unequal sizes
    empty: int = 0  # ... one with an empty replica

    def dump(self) -> list[int]:
        return [self.examples, self.rejected, self.split, self.uneven, self.empty]

    def add(self, other: Tally):
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def accepted(self) -> int:
        return self.examples - self.rejected

    @property
    def rate(self) -> float:
        return self.rejected / self.examples if self.examples else 0.0


_seen: set[str] | None = None  # the split shapes drawn since the last example ended


def saw_split(sizes) -> None:
    """``cases.splits`` drew ``sizes`` (drawn unevenness, not a forced even split)."""
    if _seen is not None and len(sizes) > 1:
        _seen.add("split")
        if len(set(sizes)) > 1:
            _seen.add("uneven")
        if 0 in sizes:
            _seen.add("empty")


@contextlib.contextmanager
def counting(test, tally: Tally):
    """Count ``test``'s hypothesis examples into ``tally`` while the block runs. Hypothesis
    draws an example's ``@given`` arguments just before calling it and its ``st.data()``
    draws during the call, so the splits seen since the previous example ended are this one's."""
    global _seen
    handle = getattr(test, "hypothesis", None)
    if handle is None:
        yield
        return
    inner = handle.inner_test
    _seen = set()

    @functools.wraps(inner)  # hypothesis names the failing test case after it
    def counted(*args, **kwargs):
        __tracebackhide__ = True
        overrun = False
        try:
            return inner(*args, **kwargs)
        except UnsatisfiedAssumption:
            tally.rejected += 1
            raise
        except StopTest:  # hypothesis ran out of data mid-draw: not an example
            overrun = True
            raise
        finally:
            if not overrun:
                tally.examples += 1
                tally.split += "split" in _seen
                tally.uneven += "uneven" in _seen
                tally.empty += "empty" in _seen
            _seen.clear()

    handle.inner_test = counted
    try:
        yield
    finally:
        handle.inner_test = inner
        _seen = None


def split_nodeid(nodeid: str) -> tuple[str, str]:
    """``(property, spec)`` of a test id: the function and the first parameter of its id."""
    name, _, params = nodeid.partition("[")
    return name.rsplit("::", 1)[-1], id_parts(params.rstrip("]"))[0] if params else ""


def table(tallies: dict[str, Tally], per_spec: int = 0, budgets: dict[str, int] | None = None) -> list[str]:
    """Lines: per property, its accepted/rejected draws per spec and overall, and where it draws
    splits, how many examples had an uneven one and an empty replica; a property that rejects
    more than ``LIMIT``, accepts fewer than ``per_spec`` (its budget, for a property of
    ``budgets``, named there: ``pytest --deep`` draws more) under some spec, or draws splits
    under a spec but no uneven split or no empty replica there, is marked."""
    budgets = budgets or {}
    by_property: dict[str, dict[str, Tally]] = collections.defaultdict(lambda: collections.defaultdict(Tally))
    for nodeid, t in tallies.items():
        prop, spec = split_nodeid(nodeid)
        by_property[prop][spec].add(t)
    lines = []
    for prop in sorted(by_property):
        cells = by_property[prop]
        total = Tally(sum(c.examples for c in cells.values()), sum(c.rejected for c in cells.values()))
        flag = f"  REJECTS MORE THAN {LIMIT:.0%}" if total.rate > LIMIT else ""
        wanted = budgets.get(prop, per_spec)
        short = sorted(spec for spec, c in cells.items() if spec and c.accepted < wanted)
        if short:
            flag += f"  FEWER THAN {wanted} UNDER {', '.join(short)} (all its cases, or a failure)"
        if prop in budgets:
            flag += f"  BUDGET {wanted} PER SPEC (--deep: {per_spec})"
        for shape in ("uneven", "empty"):
            never = sorted(spec for spec, c in cells.items() if c.split and not getattr(c, shape))
            if never:
                flag += f"  NO {shape.upper()} SPLIT UNDER {', '.join(never)}"
        lines.append(f"{prop}: {total.accepted} accepted, {total.rejected} rejected ({total.rate:.0%}){flag}")
        lines.append("    " + ", ".join(f"{spec or '-'} {c.accepted}/{c.rejected}"
                                        + (f" ({c.uneven} uneven, {c.empty} empty)" if c.split else "")
                                        for spec, c in sorted(cells.items())))
    return lines
