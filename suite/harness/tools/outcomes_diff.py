"""Two JUnit runs of the same selection compared test id by test id: what a refactoring must
keep. No TensorFlow.

    python -m suite.harness.tools.outcomes_diff BEFORE.xml AFTER.xml [--renamed OLD=NEW ...]

Prints the ids whose outcome changed (pass, deviation, fail, skip: the report's outcomes), the
ids only one run has (a renamed id maps with ``--renamed``), and the counts; exits 1 when a
surviving id changed its outcome or a mapped id is missing, 0 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from ..reporting.benchmark_results import ReportError
from ..reporting.run_report import case_outcome


def outcomes(path: Path) -> dict[str, str]:
    """``{test id: outcome}`` of a JUnit file (``module.path::name[params]`` as pytest's ids read)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise ReportError(f"{path}: not a readable JUnit XML file ({exc})") from None
    out = {}
    for case in root.iter("testcase"):
        module = case.get("classname", "?").replace(".", "/") + ".py"
        out[f"{module}::{case.get('name', '?')}"] = case_outcome(case)[0]
    return out


def compare(before: dict[str, str], after: dict[str, str], renamed: dict[str, str] | None = None) -> dict:
    renamed = renamed or {}
    changed, missing = [], []
    for old, outcome in sorted(before.items()):
        new = renamed.get(old, old)
        if new in after:
            if after[new] != outcome:
                changed.append(f"{old}: {outcome} -> {after[new]}" + (f" (as {new})" if new != old else ""))
        elif old in renamed:
            missing.append(f"{old} -> {new}: not in the second run")
    survived = {renamed.get(k, k) for k in before}
    return {"changed": changed, "missing": missing,
            "removed": sorted(k for k in before if k not in renamed and k not in after),
            "added": sorted(k for k in after if k not in survived),
            "counts": (collections.Counter(before.values()), collections.Counter(after.values()))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m suite.harness.tools.outcomes_diff", description=__doc__.split("\n\n")[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--renamed", action="append", default=[], metavar="OLD=NEW", help="an id the second run calls NEW")
    args = p.parse_args(argv)
    try:
        renamed = dict(item.split("=", 1) for item in args.renamed)
    except ValueError:
        print(f"outcomes_diff: --renamed takes OLD=NEW: {args.renamed}", file=sys.stderr)
        return 2
    try:
        result = compare(outcomes(args.before), outcomes(args.after), renamed)
    except ReportError as exc:
        print(f"outcomes_diff: {exc}", file=sys.stderr)
        return 2
    before, after = result["counts"]
    print(f"before: {dict(sorted(before.items()))}; after: {dict(sorted(after.items()))}")
    for title in ("changed", "missing", "removed", "added"):
        print(f"{title}: {len(result[title])}")
        for line in result[title]:
            print(f"  {line}")
    return 1 if result["changed"] or result["missing"] else 0


if __name__ == "__main__":
    sys.exit(main())
