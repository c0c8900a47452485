"""What engines cost the process that drives them, counted where they start and answer: engine
and cluster starts, seconds starting them, seconds waiting on calls (per probe too), seconds of
calls that ended at their deadline, and the traces each probe made. No TensorFlow.

One ``Cost`` per process (``COUNTED``), which every ``EnginePool`` and ``Engine`` of the process
adds to. A process that runs others of its own (a test that runs the check or pytest as a
command) gets their costs too: ``adopt()`` points ``TFDS_COST_FILE`` at a file of its own, every
process that imported this module appends its totals there as one JSON line when it exits (its
own CPU among them), and
``absorb()`` adds the lines that arrived since the last call. The pytest plugin files each test's
difference of ``COUNTED`` under the test in JUnit (``tfds_cost``); ``tools/cost_table.py`` makes
the table from it.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

COST_ENV = "TFDS_COST_FILE"  # where this process's children append their totals (a JSON line each)

FIELDS = ("imports", "engine_starts", "cluster_starts", "start_s", "calls", "call_s", "timeout_s", "engine_cpu_s",
          "harness_cpu_s")


@dataclasses.dataclass
class Cost:
    imports: int = 0  # interpreters started to import TensorFlow: fork servers, engine processes not forked from one
    engine_starts: int = 0  # engines started (a cluster counts once here and once in cluster_starts)
    cluster_starts: int = 0  # engines of more than one process: multi_worker, parameter_server
    start_s: float = 0.0  # wall seconds from an engine's launch to its ready, failed starts too
    calls: int = 0  # probe calls answered or failed
    call_s: float = 0.0  # wall seconds waiting on them
    timeout_s: float = 0.0  # of call_s and start_s, the seconds of waits that ended at their deadline
    # CPU seconds (user and system) of the engines' local processes while they started and answered calls:
    # on a machine whose cores are all busy, what a test costs the others
    engine_cpu_s: float = 0.0
    # CPU seconds of the processes that drive engines (pytest's, the check's): the children's as they
    # exit; the plugin adds its own process's per test
    harness_cpu_s: float = 0.0
    probes: dict = dataclasses.field(default_factory=dict)  # probe -> [calls, seconds, traces]

    def started(self, seconds: float, processes: int):
        self.engine_starts += 1
        self.cluster_starts += processes > 1
        self.start_s += seconds

    def engine_cpu(self, seconds: float | None):
        self.engine_cpu_s += max(seconds or 0.0, 0.0)

    def start_failed(self, seconds: float, timed_out: bool = False):
        self.start_s += seconds
        self.timeout_s += seconds if timed_out else 0.0

    def called(self, probe: str, seconds: float, cpu: float | None = None, timed_out: bool = False):
        """A call of ``probe`` that took ``seconds`` and ``cpu`` seconds of its engine's CPU."""
        self.calls += 1
        self.call_s += seconds
        self.timeout_s += seconds if timed_out else 0.0
        self.engine_cpu(cpu)
        entry = self.probes.setdefault(probe, [0, 0.0, 0])
        entry[0] += 1
        entry[1] += seconds

    def traced(self, counts: dict):
        """An engine's traces per probe (read as it closes)."""
        for probe, n in counts.items():
            self.probes.setdefault(probe, [0, 0.0, 0])[2] += int(n)

    def add(self, other: Cost | dict):
        other = other if isinstance(other, Cost) else load(other)
        for name in FIELDS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for probe, (calls, seconds, traces) in other.probes.items():
            entry = self.probes.setdefault(probe, [0, 0.0, 0])
            entry[0] += calls
            entry[1] += seconds
            entry[2] += traces

    def minus(self, before: Cost) -> Cost:
        """What was counted since ``before`` (a ``snapshot()``), probes left out."""
        return Cost(**{name: getattr(self, name) - getattr(before, name) for name in FIELDS})

    def snapshot(self) -> Cost:
        return Cost(**{name: getattr(self, name) for name in FIELDS})

    def dump(self) -> dict:
        out = {name: round(v, 3) if isinstance(v, float) else v for name in FIELDS for v in [getattr(self, name)]}
        out["probes"] = {p: [c, round(s, 3), t] for p, (c, s, t) in sorted(self.probes.items())}
        return out

    def text(self) -> str:
        """One line for a JUnit property: ``engine_starts=2 cluster_starts=0 start_s=3.1 ...``."""
        return " ".join(f"{name}={round(getattr(self, name), 1) if name.endswith('_s') else getattr(self, name)}"
                        for name in FIELDS)


def load(data: dict) -> Cost:
    return Cost(**{name: data.get(name, 0) for name in FIELDS},
                probes={p: list(v) for p, v in data.get("probes", {}).items()})


def parse_text(text: str) -> Cost:
    """``Cost.text()`` read back (unknown names are refused: a misread column is no figure)."""
    values = dict(pair.split("=", 1) for pair in text.split())
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise ValueError(f"tfds_cost {text!r}: unknown fields {sorted(unknown)}")
    return Cost(**{name: (float if name.endswith("_s") else int)(values.get(name, 0)) for name in FIELDS})


COUNTED = Cost()
_children: dict = {"path": None, "offset": 0}  # the file this process's children append to, read so far
_parent_file = os.environ.get(COST_ENV)  # the file of the process that started this one (None: none)
_pid = os.getpid()


def adopt() -> Path:
    """Make this process the one its children's costs go to (idempotent): ``TFDS_COST_FILE`` names
    a new file of its own, which ``absorb()`` reads."""
    if _children["path"] is None:
        fd, name = tempfile.mkstemp(prefix="tfds-cost-", suffix=".jsonl")
        os.close(fd)
        _children["path"] = Path(name)
        os.environ[COST_ENV] = name
    return _children["path"]


def absorb() -> Cost:
    """Add to ``COUNTED`` what this process's children appended since the last call; also returned."""
    got = Cost()
    path = _children["path"]
    if path is None:
        return got
    try:
        with open(path, "rb") as f:
            f.seek(_children["offset"])
            data = f.read()
    except OSError:
        return got
    end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
    _children["offset"] += end
    for line in data[:end].splitlines():
        try:
            got.add(json.loads(line))
        except (ValueError, TypeError):
            continue  # a line no process of ours wrote whole
    COUNTED.add(got)
    return got


@atexit.register
def _report_to_parent():
    if os.getpid() != _pid:  # a fork of this process: its parent reports what it counted
        return
    absorb()
    if _children["path"] is not None:
        _children["path"].unlink(missing_ok=True)
    if _parent_file:
        totals = COUNTED.dump()
        totals["harness_cpu_s"] += round(time.process_time(), 3)  # this process's own CPU, once, as it ends
        try:  # one write of one line, O_APPEND: lines of processes that exit together do not interleave
            fd = os.open(_parent_file, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, (json.dumps(totals) + "\n").encode())
            finally:
                os.close(fd)
        except OSError:
            pass  # the parent is gone, or did not ask: nobody to tell
