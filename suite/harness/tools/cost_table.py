"""Where a run's time goes: a cost table from its JUnit files and the engines' own accounting
(``tfds_cost`` per test, ``tfds_probes`` per run: suite/harness/pool/cost.py). No TensorFlow.

    python -m suite.harness.tools.cost_table RUN.xml [RUN.xml ...] [--json OUT.json] [--top 15]
        [--against docs/cost_table.json]

Prints the files by wall seconds (the sum of their tests' setup, call and teardown), then the
slowest tests and the probes that cost most; ``--json`` writes the whole table (docs/cost_table.json
is the committed one, which docs/ci_timings.md shows). ``--against`` warns, one line each, about every
file that took at least twice its time in that table (never an error: a machine's drift is no
failure of a test). Exit 2 when a file cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from ..pool.cost import FIELDS, Cost, parse_text
from ..reporting.benchmark_results import ReportError

COLUMNS = ("tests", "wall_s", *FIELDS)
DOUBLED_FLOOR_S = 20.0  # a file under this in the committed table is not warned about: its noise is its size


def _row(tests: int, wall: float, spent: Cost) -> dict:
    return {"tests": tests, "wall_s": round(wall, 1),
            **{name: round(getattr(spent, name), 1) if name.endswith("_s") else getattr(spent, name)
               for name in FIELDS}}


def read(paths: list[Path]) -> dict:
    """The table of the runs in ``paths`` (several: one run's JUnit files, summed by file)."""
    files: dict[str, list] = {}
    tests: list[dict] = []
    probes: dict[str, list] = {}
    wall = 0.0
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as exc:
            raise ReportError(f"{path}: not a readable JUnit XML file ({exc})") from None
        for suite in root.iter("testsuite"):
            wall += float(suite.get("time", 0) or 0)
            for prop in suite.iterfind("properties/property"):
                if prop.get("name") == "tfds_probes":
                    for probe, (calls, seconds, traces) in json.loads(prop.get("value", "{}")).items():
                        entry = probes.setdefault(probe, [0, 0.0, 0])
                        entry[0], entry[1], entry[2] = entry[0] + calls, entry[1] + seconds, entry[2] + traces
        for case in root.iter("testcase"):
            module = case.get("classname", "?").replace(".", "/") + ".py"
            seconds = float(case.get("time", 0) or 0)
            spent = Cost()
            for prop in case.iterfind("properties/property"):
                if prop.get("name") == "tfds_cost":
                    spent.add(parse_text(prop.get("value", "")))
            tests.append({"test": f"{module}::{case.get('name', '?')}", **_row(1, seconds, spent)})
            entry = files.setdefault(module, [0, 0.0, Cost()])
            entry[0] += 1
            entry[1] += seconds
            entry[2].add(spent)
    by_file = sorted(({"file": f, **_row(n, s, c)} for f, (n, s, c) in files.items()),
                     key=lambda r: (-r["wall_s"], r["file"]))
    tests.sort(key=lambda r: (-r["wall_s"], r["test"]))
    return {"runs": [p.name for p in paths], "wall_s": round(wall, 1),
            "tests_s": round(sum(r["wall_s"] for r in tests), 1), "tests": len(tests),
            "files": by_file, "slowest_tests": tests[:50],
            "probes": [{"probe": p, "calls": c, "call_s": round(s, 1), "traces": t}
                       for p, (c, s, t) in sorted(probes.items(), key=lambda kv: (-kv[1][1], kv[0]))]}


def lines(table: dict, top: int = 15, what: str = "files") -> list[str]:
    """A markdown table of the ``top`` rows of ``what`` (files, slowest_tests, probes)."""
    rows = table[what][:top]
    if what == "probes":
        head = ("probe", "calls", "call_s", "traces")
    else:
        head = ("file", *COLUMNS) if what == "files" else ("test", *COLUMNS[1:])
    out = ["| " + " | ".join(h.replace("_s", " s").replace("_", " ") for h in head) + " |",
           "|" + "|".join(" --- " for _ in head) + "|"]
    out += ["| " + " | ".join(f"`{r[h]}`" if i == 0 else str(r[h]) for i, h in enumerate(head)) + " |" for r in rows]
    return out


def page(table: dict) -> list[str]:
    """What docs/ci_timings.md shows of a table: its totals, the 15 costliest files, the 10 slowest
    tests and the 10 costliest probes."""
    return [summary(table) + ".", "", *lines(table, 15, "files"), "", *lines(table, 10, "slowest_tests"), "",
            *lines(table, 10, "probes")]


def summary(table: dict) -> str:
    return (f"{table['tests']} tests, their summed time {table['tests_s']:.0f} s, the run's wall clock "
            f"{table['wall_s']:.0f} s (JUnit's)")


def doubled(table: dict, committed: dict, floor: float = DOUBLED_FLOOR_S) -> list[str]:
    """A line per file that took at least twice its time in ``committed`` (files under ``floor``
    seconds there are left out)."""
    then = {r["file"]: r["wall_s"] for r in committed["files"]}
    return [f"warning: {r['file']} took {r['wall_s']:.0f} s, {r['wall_s'] / then[r['file']]:.1f}x its "
            f"{then[r['file']]:.0f} s in the committed cost table"
            for r in table["files"] if then.get(r["file"], 0) >= floor and r["wall_s"] >= 2 * then[r["file"]]]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m suite.harness.tools.cost_table", description=__doc__.split("\n\n")[0])
    p.add_argument("junit", type=Path, nargs="+", help="a run's JUnit files (pytest --junitxml, --results-dir)")
    p.add_argument("--json", type=Path, default=None, help="write the whole table here")
    p.add_argument("--top", type=int, default=15, help="rows of each table printed (default 15)")
    p.add_argument("--against", type=Path, default=None, metavar="TABLE.json",
                   help="warn about each file that took twice its time in this table (docs/cost_table.json)")
    args = p.parse_args(argv)
    try:
        table = read(args.junit)
        committed = json.loads(args.against.read_text()) if args.against else None
    except (ReportError, OSError, ValueError) as exc:
        print(f"cost_table: {exc}", file=sys.stderr)
        return 2
    print(summary(table))
    for what in ("files", "slowest_tests", "probes"):
        print("\n".join(lines(table, args.top, what)), end="\n\n")
    for line in doubled(table, committed) if committed else ():
        print(line)
    if args.json:
        args.json.write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
