"""Helpers shared by the tests (pytest side: no TensorFlow): the repository root, process
liveness from /proc, and a child pytest run the way a user would start one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
