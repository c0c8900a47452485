"""Helpers shared by the tests (pytest side: no TensorFlow): the repository root, process
liveness from /proc, a child pytest run the way a user would start one, the examples budgets
of properties that trace a step per case, and the skip of a step XLA cannot compile."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from suite.common.catalog import XLA_UNSUPPORTED
from suite.common.results import Raised

ROOT = Path(__file__).resolve().parents[1]


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` (from /proc parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def check_replaced(check, pool, spec, old: list[int]):
    """After a failure: every old process of ``spec``'s engine is gone, the pool's next engine
    has only new processes, and it answers."""
    __tracebackhide__ = True
    check.equal([p for p in old if alive(p)], [], "processes of the failed engine still alive")
    new = pool.get(spec).pids()
    check.that(set(new).isdisjoint(old), "the engine's processes after the failure", new,
               f"all new (the pool starts a new engine; the failed one had {old})")
    pool.call(spec, "engine.ping")


def run_pytest(args: list[str], timeout: float, **env) -> subprocess.CompletedProcess:
    """``python -m pytest -n 0 ARGS -q -p no:cacheprovider`` in the repository root (in this
    process, without pytest-xdist workers unless ARGS say ``-n``), with ``env`` added to this
    environment; its output as text."""
    # a session of its own: nothing of a pytest-xdist worker this may run in
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    return subprocess.run([sys.executable, "-m", "pytest", "-n", "0", *args, "-q", "-p", "no:cacheprovider"],
                          cwd=ROOT, env=dict(base, **env), capture_output=True, text=True, timeout=timeout)


# Properties where every drawn case traces (or compiles) a new step: a few per spec by default,
# the profile's number with --deep (suite/harness/drawing/profiles.py)
RETRACES = pytest.mark.budget(4)
# one trace per spec, three engine steps per case: more cases for the same time
CHEAP = pytest.mark.budget(8)
# The end-to-end properties that cost the most per case (a dataset iterated several ways, an
# epoch trained, a checkpoint or SavedModel written and read back): about half the profile's
# cases per spec by default, all of them with --deep. Measured on 2 cores at ba8d0b8 (item
# seconds across the default specs): iteration styles 199, short last batch 175, checkpoint
# restores 158, SavedModel 92, replica batches 87, delivered once 61: 772 of the run's 2069.
COSTLY = pytest.mark.budget(12)


def skip_if_xla_unsupported(results, spec, jit: str) -> None:
    """Skip the test with TensorFlow's error where it cannot compile the step with XLA under the
    spec's strategy (catalog.XLA_UNSUPPORTED); any other error stays for the check."""
    if jit == "none":
        return
    for r in results:
        found = re.search(XLA_UNSUPPORTED, r.message) if isinstance(r, Raised) else None
        if found:
            pytest.skip(f"XLA ({jit}) unsupported under {spec.text}: {r.type}: ...{found.group(0)}...")
