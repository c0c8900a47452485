"""The check's one-device runs that a pytest session repeats, computed once (no TensorFlow).

A check's reference (a script run twice on one device, or a workload's) and its stand-in control
(the suite's own model with the script's optimizer) are functions of what the probe is given and
of the engine that runs it: the interpreter and its environment, the spec, the mutant. In a pytest
session many tests check the same example script, in several modules and under specs of the same
replica count that run on both xdist workers, and each test's checker ran them again.

``MEMO.call(pool, spec, probe, kwargs, content)`` runs ``pool.call`` once per key and answers
later calls with a copy of that reply: the key is the engine's identity (``identity``), the probe,
its arguments and what ``content()`` returns, a digest of the files the run reads (the script's
folder; None: nothing to key it by, so it is not kept). A reply is kept pickled in the shared folder
and unpickled for each caller, so no checker sees another's changes. Errors are not kept: the next
caller runs the probe itself. ``MEMO.one_device`` keeps the runs under ``default`` and the references alone.

Off unless enabled: a check run as a command computes its own runs, and so does a check that
a test runs as a command. The pytest plugin enables it for the session (``enable``) with a folder
the xdist workers share, where each reply is a file written whole (a rename); a worker that
wants a key another is computing waits for it on the key's lock file (``fcntl.flock``) rather
than computing it too.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pickle
import shutil
import threading
import time
from collections import defaultdict
from pathlib import Path

from . import forks
from .pool import EnginePool

# variables that differ between the session's processes and say nothing of what an engine computes
VOLATILE = (*forks.PER_ENGINE, "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "TFDS_COST_FILE", "COLUMNS", "LINES")
LARGE = 1 << 20  # bytes: a file in a script's folder larger than this is digested by its size and time
SHM, SHM_FREE = "/dev/shm", 4 << 30  # bytes free there before the memo goes there
WAIT = 1800.0  # seconds a process waits for another's run of a key before it runs the probe itself


def identity(pool, spec) -> tuple:
    """What decides an engine's replies besides a probe's arguments: its interpreter, spec and
    mutant, and the environment its engines inherit (less VOLATILE)."""
    env = hashlib.sha256(repr(sorted((k, v) for k, v in os.environ.items() if k not in VOLATILE)).encode())
    return pool.python, spec.text, pool._mutant_of(spec), env.hexdigest()


def folder_digest(folder: str | None, *paths: str | None) -> str:
    """A digest of the files directly in ``folder`` and of ``paths`` (names and contents; None: none):
    what a script run can import from its own folder."""
    h = hashlib.sha256()
    try:
        names = sorted(e.name for e in os.scandir(folder) if e.is_file()) if folder else []
    except OSError:
        names = []
    for path in [os.path.join(folder, n) for n in names] + [p for p in paths if p]:
        h.update(path.encode() + b"\0")
        with contextlib.suppress(OSError):
            stat = os.stat(path)  # a large file (data) by its size and time, not read
            h.update(Path(path).read_bytes() if stat.st_size <= LARGE else f"{stat.st_size} {stat.st_mtime_ns}".encode())
    return h.hexdigest()


def scratch() -> str | None:
    """Where the session's memo folder goes: /dev/shm (memory) where it is a folder with room to spare,
    else the temporary folder. A session's replies are hundreds of megabytes, written once and read
    back; on a disk they were writes that the engines' own file work (temporary folders, checkpoints,
    input files) waited behind."""
    try:
        free = shutil.disk_usage(SHM)
    except OSError:
        return None
    return SHM if os.access(SHM, os.W_OK) and free.free >= SHM_FREE else None


class Memo:
    """A process's view of the session's memo: its folder (None: off) and the keys this process
    has seen there, whose replies it reads back from the folder (not kept in its own memory: each
    worker would hold the session's hundreds of megabytes again)."""

    def __init__(self):
        self.folder: Path | None = None
        self._seen: set[str] = set()
        self._locks: defaultdict = defaultdict(threading.Lock)
        self._lock = threading.Lock()
        self.hits = 0  # replies read back, not computed here

    def enable(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder

    def disable(self):
        self.folder = None
        self._seen.clear()

    def call(self, pool, spec, probe: str, kwargs: dict, content=None) -> list:
        """``pool.call(spec, probe, **kwargs)``, once per key while enabled; ``content`` (called only
        then) digests what else the run reads."""
        if self.folder is None or type(pool) is not EnginePool or "call" in vars(pool):
            return pool.call(spec, probe, **kwargs)  # (a pool of a test's own making answers for itself)
        files = content() if content else ""
        if files is None:
            return pool.call(spec, probe, **kwargs)
        key = hashlib.sha256(pickle.dumps((identity(pool, spec), probe, files, sorted(kwargs.items())))).hexdigest()
        with self._lock:
            lock = self._locks[key]
        with lock:  # this process's threads: one computes, the others wait
            data = None
            if key in self._seen:
                with contextlib.suppress(OSError):
                    data = (self.folder / f"{key}.pickle").read_bytes()
                    self.hits += 1
            if data is None:
                data = self._shared(key, lambda: pickle.dumps(pool.call(spec, probe, **kwargs)))
                self._seen.add(key)
            return pickle.loads(data)

    def one_device(self, pool, spec, probe: str, kwargs: dict, content=None, reference: bool = False) -> list:
        """``call`` for a run under ``default`` or for a ``reference`` (one device's: the same in every
        test that checks the same code, whatever engine runs it); a spec's own runs always run."""
        if spec.kind != "default" and not reference:
            return pool.call(spec, probe, **kwargs)
        return self.call(pool, spec, probe, kwargs, content)

    def _shared(self, key: str, compute) -> bytes:
        """The pickled reply of ``key`` from the shared folder, or computed under its lock and written."""
        path = self.folder / f"{key}.pickle"
        with open(self.folder / f"{key}.lock", "a") as lock:
            deadline = time.monotonic() + WAIT  # the other's run is bounded by its engine's timeouts
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released at close, or when its process dies
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        return compute()
                    time.sleep(0.05)
            if path.exists():
                self.hits += 1
                return path.read_bytes()
            data = compute()
            part = path.with_name(f"{key}.{os.getpid()}.part")
            part.write_bytes(data)
            part.rename(path)
            return data


MEMO = Memo()
