"""Which signatures cover each quantity a run asked of, under two versions of the known-deviations
file: the check that rewriting a signature's quantity (its fields, or a test's Quantity) kept what it
covers. No TensorFlow.

    TFDS_QUANTITY_LOG=/tmp/q.jsonl pytest tests/properties/test_training.py ...
    python -m suite.harness.tools.quantity_log /tmp/q.jsonl --before OLD.toml [--after known_deviations.toml]

Every ledger a run consults (a test's, a loop check's) appends ``{scope, text, kind, fields}`` of
each quantity it is asked of (deviations.log_quantity). For each recorded quantity and each entry
whose ``tests`` name its scope (whatever versions the entry applies to: a signature of an older
Keras covers the same quantities), the signatures that cover it before and after are compared by
their place in the entry (for a loop check's scope, those that speak for it). Prints each
difference; exits 1 when there is one, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..judging import deviations
from ..judging.quantity import Quantity
from ..loopcheck.differential import speaks_for_the_loop_check
from ..reporting.benchmark_results import ReportError


def records(path: Path) -> list[tuple[str, Quantity | str]]:
    """The distinct ``(scope, quantity)`` of a log; a quantity without a kind is plain text."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ReportError(f"{path}: cannot read the quantity log ({exc})") from None
    out = {}
    for line in lines:
        r = json.loads(line)
        what = r["text"] if r["kind"] is None else Quantity(r["text"], r["kind"], tuple(map(tuple, r["fields"])))
        out[(r["scope"], repr(what))] = (r["scope"], what)
    return list(out.values())


def covering(entries, scope: str, what) -> set[tuple[str, int]]:
    loop_check = scope.startswith("loop-check[")
    return {(d.id, i) for d in entries if d.matches(scope) for i, s in enumerate(d.signatures)
            if (not loop_check or speaks_for_the_loop_check(s)) and s.covers(what)}


def differences(logged, before, after) -> list[str]:
    shapes = ({d.id: len(d.signatures) for d in before}, {d.id: len(d.signatures) for d in after})
    if shapes[0] != shapes[1]:
        changed = sorted(k for k in shapes[0].keys() | shapes[1].keys() if shapes[0].get(k) != shapes[1].get(k))
        raise ReportError(f"the two files differ in their entries or signature counts: {changed}")
    out = []
    for scope, what in sorted(logged, key=lambda r: (r[0], str(r[1]))):
        was, now = covering(before, scope, what), covering(after, scope, what)
        for ident, i in sorted(was - now):
            out.append(f"{scope}: {what!s} ({getattr(what, 'kind', 'text')}): no longer covered by {ident} signature {i}")
        for ident, i in sorted(now - was):
            out.append(f"{scope}: {what!s} ({getattr(what, 'kind', 'text')}): now covered by {ident} signature {i}")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suite.harness.tools.quantity_log", description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=deviations.PATH)
    args = parser.parse_args(argv)
    try:
        logged = records(args.log)
        found = differences(logged, deviations.load(args.before), deviations.load(args.after))
    except (ReportError, ValueError) as exc:
        print(f"quantity_log: {exc}", file=sys.stderr)
        return 2
    for line in found:
        print(line)
    print(f"{len(logged)} quantities recorded; {len(found)} differences in what covers them")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
