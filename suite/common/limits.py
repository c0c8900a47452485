"""The memory an engine process may allocate and the CPU time each call may use (issue 63).

Memory: a limit each engine sets on itself at start, so that a
script that allocates beyond it gets MemoryError (or TensorFlow's ResourceExhaustedError) in its own step, and
the check ends that spec as ERROR naming memory, the limit and the step, before the host's OOM killer chooses
a process. No TensorFlow here: the harness reads it too.

The limit is ``RLIMIT_DATA`` (Linux counts every private writable mapping against it: the heap, numpy's and
TensorFlow's CPU buffers), in bytes, from ``TFDS_ENGINE_MEMORY`` in the engine's environment: set by the pool
for every CPU engine it starts where the pool has a limit (the check's: ``--engine-memory``, that variable in
the caller's environment, else ``DEFAULT_SHARE`` of the machine's memory) or the caller's environment asks one
(the test session's pool); ``0`` for no limit. GPU specs get none (a GPU runtime maps its own address space).
What it bounds is mapped memory, not resident memory: an engine that maps much it does not touch (a
multi-worker engine's, over a long session: measured past 5 GiB at 350 MB resident) meets it sooner.

CPU time: before each call an engine sets ``RLIMIT_CPU``'s soft limit to the CPU time it has used plus
``TFDS_ENGINE_CPU`` seconds, which the pool sets to its engine timeout times the CPUs the engine may use: a
call busy on every CPU for the whole timeout. The pool's deadline ends a call sooner; the limit is what ends
one the pool no longer watches (a check stopped with Ctrl-Z, a pool whose thread is stuck): the kernel sends
SIGXCPU, which ends the engine (no core file: ``RLIMIT_CORE`` is 0), and a pool that reads its end names CPU
time, the limit and the step."""

from __future__ import annotations

import math
import os
import re

MEMORY_ENV = "TFDS_ENGINE_MEMORY"
CPU_ENV = "TFDS_ENGINE_CPU"  # CPU seconds each call may use (the pool: its timeout times the CPUs)
# of the machine's memory, each engine: a check runs the reference's engine and a spec's at once
DEFAULT_SHARE = 0.4
FLOOR = 4 << 30  # the default never below what an engine of TensorFlow maps at start, with room (measured: under 1 GiB)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def machine_memory() -> int:
    """The machine's memory in bytes (``MemTotal``), or 0 where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def parse_memory(text: str) -> int:
    """Bytes from ``8G``, ``512M``, ``8GiB``, ``0.25`` (a share of the machine's memory) or ``0``/``none`` (no
    limit); ValueError, one line, for anything else."""
    value = str(text).strip().lower().removesuffix("ib").removesuffix("b")
    if value in ("0", "none", "no", "off"):
        return 0
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?)", value)
    if not match:
        raise ValueError(f"engine memory {text!r}: give bytes with a unit (8G, 512M), a share of the machine's "
                         "memory (0.4), or 0 for no limit")
    number, unit = float(match.group(1)), match.group(2)
    if not unit and number < 1:
        return int(number * machine_memory())
    return int(number * _UNITS[unit])


def engine_memory(environ=None) -> int:
    """The limit engines get: ``TFDS_ENGINE_MEMORY`` of ``environ`` (this process's), else the default share."""
    environ = os.environ if environ is None else environ
    if environ.get(MEMORY_ENV):
        return parse_memory(environ[MEMORY_ENV])
    share = int(DEFAULT_SHARE * machine_memory())
    return max(share, FLOOR) if share else 0


def gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def given(name: str, environ=None) -> int:
    """The whole number the engine's environment (``environ``, else this process's) gives as ``name`` (the pool
    writes the limits in bytes and seconds); 0 where it is unset, not a number or not positive."""
    environ = os.environ if environ is None else environ
    try:
        return max(int(float(environ.get(name) or 0)), 0)
    except ValueError:
        return 0


def _set_soft(kind: str, value: int) -> int | None:
    """``value`` as the soft limit of resource ``kind`` (``RLIMIT_DATA``, ...), within its hard limit: the limit
    set, or None where this platform has no such limit."""
    try:
        import resource

        which = getattr(resource, kind)
        _, hard = resource.getrlimit(which)
        soft = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (soft, hard))
    except (ImportError, ValueError, OSError, AttributeError):
        return None
    return soft


def apply(environ=None) -> int:
    """In an engine, before it imports TensorFlow: its ``RLIMIT_DATA`` from ``TFDS_ENGINE_MEMORY`` (bytes); the
    limit set, or 0 (none asked, or none this platform has)."""
    limit = given(MEMORY_ENV, environ)
    return (_set_soft("RLIMIT_DATA", limit) or 0) if limit else 0


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def call_cpu(call_timeout: float, environ=None) -> int:
    """The CPU seconds each engine call may use: ``TFDS_ENGINE_CPU`` of ``environ`` (this process's) where set,
    else ``call_timeout`` on every CPU (0: no limit)."""
    environ = os.environ if environ is None else environ
    return given(CPU_ENV, environ) if environ.get(CPU_ENV) else math.ceil(call_timeout * usable_cpus())


def limit_call_cpu(environ=None) -> int:
    """In an engine, before a call: ``RLIMIT_CPU``'s soft limit at the CPU time used so far plus ``TFDS_ENGINE_CPU``
    seconds (no core file when it is met); the seconds given, or 0 (none asked, or none this platform has)."""
    seconds = given(CPU_ENV, environ)
    if not seconds or _set_soft("RLIMIT_CORE", 0) is None:
        return 0
    used = os.times()  # this process's CPU time, every thread's
    return seconds if _set_soft("RLIMIT_CPU", int(used.user + used.system) + seconds) is not None else 0


def cpu_said(seconds: int, where: str = "") -> str:
    """What a check says of an engine the kernel ended at its CPU-time limit (SIGXCPU)."""
    return (f"; it used more CPU time than its limit{' at ' + where if where else ''}: {seconds} s in one call "
            f"({CPU_ENV}; by default the engine timeout on each CPU it may use)")


def out_of_memory(raised) -> bool:
    """Whether a raise (results.Raised) is an allocation refused: Python's MemoryError, or TensorFlow's
    ResourceExhaustedError for a tensor it could not allocate."""
    return raised is not None and (raised.type == "MemoryError" or (
        raised.type == "ResourceExhaustedError" and "OOM when allocating" in raised.message))


# what a process's last output says where a native allocation failed (C++'s, LLVM's, glibc's): under RLIMIT_DATA
# TensorFlow's own code aborts (SIGABRT) when a thread's stack cannot be mapped, "LLVM ERROR: pthread_create
# failed: Resource temporarily unavailable" (measured on TF 2.21 with 2 MiB left under the limit)
ALLOCATION_FAILED = ("std::bad_alloc", "pthread_create failed", "Cannot allocate memory", "out of memory",
                     "OOM when allocating", "failed to allocate", "MemoryError")


def allocation_failed(output: str) -> str | None:
    """The last line of a process's ``output`` that says a native allocation failed, or None."""
    lines = [line for line in output.splitlines() if any(s.lower() in line.lower() for s in ALLOCATION_FAILED)]
    return lines[-1].strip() if lines else None


def crashed_at(limit: int, where: str = "") -> str:
    """What a check says of an engine that died once a native allocation failed (its last output, quoted after
    this, says so): the resource, the limit and, where known, the step (``where``)."""
    how = (f"its memory limit, {gib(limit)} ({MEMORY_ENV}, --engine-memory)" if limit > 0 else
           "the machine's memory (no limit was set)")
    return f"; it ran out of memory{' at ' + where if where else ''}: a native allocation failed at {how}"


def said(raised, limit: int) -> str:
    """What a check says of an engine out of memory: the resource, the limit, the step and the script's line."""
    how = (f"its memory limit, {gib(limit)} ({MEMORY_ENV}, --engine-memory)" if limit > 0 else
           "no memory (no limit was set: the machine's memory)")
    return (f"the engine ran out of memory: {raised.where} allocated beyond {how}{raised.said()} "
            f"({raised.type}: {' '.join(raised.message.split())[:200]})")
