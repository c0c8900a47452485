"""Benchmark results as the reports read them (pytest-benchmark JSON: each benchmark's extra_info
and its per-step statistics), the noise rule they share and their Markdown tables; no plots, no
sections (run_report.py and workload_versions.py write those)."""

from __future__ import annotations

import collections
import dataclasses
import json
import math
from pathlib import Path

NOISE_MARK = "≈"
# results timed K steps a round: their per-step figures divide a round by K (workload_step: a user's
# step per spec and version, benchmarks/bench_workload.py; its section is workload_versions.py)
STEP_KINDS = ("train_step", "plain_step", "block_step", "workload_step")


class ReportError(ValueError):
    """A result file that cannot be read; the message names it."""


# -- benchmark results ---------------------------------------------------------------------
@dataclasses.dataclass
class Entry:
    """One benchmark of one file: its extra_info and per-step statistics (seconds)."""

    name: str
    info: dict
    median: float  # seconds per step (per call for floors, per first call for traces)
    q1: float
    q3: float
    rounds: int

    @property
    def kind(self) -> str:
        return self.info.get("kind", "?")


@dataclasses.dataclass
class Results:
    path: Path
    label: str
    machine: dict
    entries: list[Entry]

    def of_kind(self, kind: str) -> list[Entry]:
        return [e for e in self.entries if e.kind == kind]


def load_benchmarks(path: Path) -> Results:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(data, dict) or "benchmarks" not in data:
        raise ReportError(f"{path}: not pytest-benchmark output (no 'benchmarks' list)")
    entries = []
    for b in data["benchmarks"]:
        info = b.get("extra_info") or {}
        stats = b.get("stats") or {}
        if "kind" not in info or "median" not in stats:
            continue  # a benchmark of another plugin user, or a smoke run without timings
        per = info.get("steps_per_round", 1) if info["kind"] in STEP_KINDS else 1
        entries.append(Entry(b.get("name", "?"), info, stats["median"] / per, stats.get("q1", stats["median"]) / per,
                             stats.get("q3", stats["median"]) / per, int(stats.get("rounds", 0))))
    if not entries:
        raise ReportError(f"{path}: no timed tf-distribute-suite benchmarks in it "
                          "(was it written with --benchmark-disable?)")
    machine = data.get("machine_info") or {}
    label = f"TF {machine.get('tensorflow', '?')} / Keras {machine.get('keras', '?')}"
    return Results(Path(path), label, machine, entries)


def unique_labels(results: list[Results]):
    counts = collections.Counter(r.label for r in results)
    for r in results:
        if counts[r.label] > 1:
            r.label = f"{r.label} ({r.path.stem})"


def run_to_run_noise(all_results: list[Results]) -> tuple[float, int] | None:
    """The machine's run-to-run variation, when several files hold runs of the same TF and
    Keras versions (an A/A comparison): the 90th percentile of ``|median_b / median_a - 1|``
    over the step benchmarks they share, and how many pairs it is based on (None below 3)."""
    groups = collections.defaultdict(list)
    for r in all_results:
        groups[(r.machine.get("tensorflow"), r.machine.get("keras"))].append(r)
    diffs = []
    for runs in groups.values():
        for i, a in enumerate(runs):
            steps_a = {e.name: e for e in a.entries if e.kind in STEP_KINDS}
            for b in runs[i + 1:]:
                diffs += [abs(e.median / steps_a[e.name].median - 1.0) for e in b.entries if e.name in steps_a]
    if len(diffs) < 3:
        return None
    diffs.sort()
    return diffs[min(len(diffs) - 1, math.ceil(0.9 * len(diffs)) - 1)], len(diffs)


def within_noise(a: Entry, b: Entry, noise: float = 0.0) -> bool:
    """Two results differ by less than the noise when their step times' inter-quartile
    ranges overlap, or (``noise`` > 0, the run-to-run variation of the machine as a fraction)
    when their medians differ by at most that fraction."""
    return (a.q1 <= b.q3 and b.q1 <= a.q3) or abs(b.median / a.median - 1.0) <= noise


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out
