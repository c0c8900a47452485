"""The suite's own cost as a benchmark (benchmarks/bench_suite.py): test files of this repository run
as the README runs them (``HYPOTHESIS_PROFILE=ci pytest FILES``, in a pytest of their own), timed,
their cost table (suite/harness/tools/cost_table.py) in the benchmark's ``extra_info``, so the
history pytest-benchmark keeps (``--benchmark-autosave``, ``pytest-benchmark compare``) shows when a
file or the whole profile got slower. No TensorFlow.

``--bench-suite`` names what is run, comma-separated: test paths (``tests/properties/test_input.py``,
``tests``: the README's whole command), or ``slowest:N``: the N costliest files of the committed
table (docs/cost_table.json), each a benchmark of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import cost_table

COMMITTED = "docs/cost_table.json"  # relative to the repository's root
WORKERS = 2  # the README's command runs -n auto: two pytest-xdist workers on the 2 cores it is measured on
START_S = 20.0  # the sub-run's own start (collection, the workers') beside its tests' seconds, for estimates
KILL_GRACE_S = 30.0  # after SIGTERM on a timeout: the suite's pytest kills its engines and writes its JUnit


class SuiteBenchError(ValueError):
    """A ``--bench-suite`` value that names nothing to run (a usage error, one line)."""


@dataclass(frozen=True)
class Target:
    path: str  # what the sub-run is given: a file or folder of tests, relative to the root
    estimate_s: float  # from the committed table; 0 where it has none of the target's files


def committed_table(root: Path) -> dict:
    try:
        return json.loads((root / COMMITTED).read_text())
    except (OSError, ValueError):
        return {"files": []}


def _files_under(table: dict, path: str) -> list[dict]:
    """The table's rows of the files ``path`` runs (itself, or those under it)."""
    path = path.rstrip("/")
    return [r for r in table.get("files", []) if r["file"] == path or r["file"].startswith(path + "/")]


def estimate(table: dict, path: str) -> float:
    seconds = sum(r["wall_s"] for r in _files_under(table, path))
    return seconds / WORKERS + START_S if seconds else 0.0


def targets(value: str, root: Path) -> list[Target]:
    """What ``--bench-suite VALUE`` runs; SuiteBenchError for a path that is not there or a bad ``slowest:N``."""
    table = committed_table(root)
    out: list[str] = []
    for item in (v.strip() for v in value.split(",")):
        if not item:
            continue
        if item.startswith("slowest:"):
            n = item.removeprefix("slowest:")
            if not n.isdigit() or int(n) < 1:
                raise SuiteBenchError(f"--bench-suite {item!r}: N of slowest:N must be a positive integer")
            files = [r["file"] for r in table.get("files", [])][:int(n)]
            if not files:
                raise SuiteBenchError(f"--bench-suite {item!r}: no files in {root / COMMITTED}")
            out += files
        elif not (root / item.split("::")[0]).exists():
            raise SuiteBenchError(f"--bench-suite {item!r}: no such test file or folder under {root}")
        else:
            out.append(item)
    if not out:
        raise SuiteBenchError(f"--bench-suite {value!r}: names no tests")
    return [Target(p, estimate(table, p)) for p in dict.fromkeys(out)]


def _environment() -> dict:
    """The README's environment: the ci profile; nothing of this pytest's own (its xdist worker, its test)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST_", "PYTEST_CURRENT_TEST"))}
    env["HYPOTHESIS_PROFILE"] = "ci"
    return env


@dataclass
class SubRun:
    code: int
    wall_s: float
    table: dict
    tail: str


def run(target: Target, root: Path, folder: Path, timeout: float, python: str = sys.executable) -> SubRun:
    """``HYPOTHESIS_PROFILE=ci python -m pytest TARGET`` from ``root``, its JUnit in ``folder``; on a
    timeout its process group gets SIGTERM (the suite's pytest then kills its engines), then SIGKILL."""
    junit = folder / "suite.xml"
    log = folder / "suite.log"
    cmd = [python, "-m", "pytest", target.path, "-p", "no:cacheprovider", "--junitxml", str(junit)]
    start = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=_environment(), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise TimeoutError(f"the suite's {target.path} did not end within {timeout:.0f} s: {_tail(log)}") from None
        finally:
            if proc.poll() is None:
                _stop(proc)
    wall = time.perf_counter() - start
    try:
        table = cost_table.read([junit])
    except cost_table.ReportError:
        table = None
    if table is None:
        return SubRun(code if code else 3, wall, {"files": [], "tests": 0}, _tail(log) + f" (no JUnit at {junit})")
    return SubRun(code, wall, table, _tail(log))


def _stop(proc: subprocess.Popen):
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
            return


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def extra_info(target: Target, sub: SubRun, committed: dict, top: int = 10) -> dict:
    """What a result keeps beside its time: the sub-run's totals, its costliest files (each with its
    seconds in the committed table), the files that took twice their committed time."""
    table = sub.table
    then = {r["file"]: r["wall_s"] for r in committed.get("files", [])}
    return {
        "kind": "suite", "target": target.path, "hypothesis_profile": "ci", "exit_code": sub.code,
        "tests": table["tests"], "tests_s": table.get("tests_s", 0.0), "junit_wall_s": table.get("wall_s", 0.0),
        "sub_run_wall_s": round(sub.wall_s, 1), "estimate_s": round(target.estimate_s, 1),
        "files": [{**r, "committed_wall_s": then.get(r["file"])} for r in table["files"][:top]],
        "doubled": cost_table.doubled(table, committed) if committed.get("files") else [],
    }
