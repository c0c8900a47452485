"""Faults injected into engine calls, from outside the engine, for the runs that
tests/harness/test_fault_matrix.py compares with fault-free ones: a pytest plugin
(``pytest -p tests.harness.faults``) and a runner of the check (``python -m tests.harness.faults
CHECK-ARGS``), both armed by ``TFDS_FAULT``, a JSON list of ``{"fault": FAULT, "spec": SPEC, "call": N,
"test": TEST}``: the Nth engine call on SPEC's engine in this process (with ``test``: the Nth made
while the running test's id contains TEST) gets FAULT, once. What each struck (the test running, the
spec, the probe) is appended to the file ``TFDS_FAULT_LOG`` names.

Every fault strikes right after the call's request is written to the engine's first answering
process, before it can reply (an engine needs milliseconds to unpickle a request and run a probe;
the fault takes microseconds): the process SIGKILLed or SIGSTOPped, the call interrupted by an
exception (as a signal handler that raises would: pytest-timeout's signal method, a caught Ctrl-C),
or a frame cut short or garbled written into its reply pipe ahead of its own reply."""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import threading
from collections import Counter

ENV, LOG_ENV = "TFDS_FAULT", "TFDS_FAULT_LOG"
STOPPED_DEADLINE = 8.0  # seconds: the deadline of a call whose engine is SIGSTOPped (the run's others: its own)


class Interrupted(Exception):
    """What an interrupting signal handler raises in the middle of a call."""


def reply_pipe(proc) -> int | None:
    """A descriptor of this engine process's reply pipe (its write end), opened through /proc."""
    ours = os.readlink(f"/proc/self/fd/{proc.recv_conn.fileno()}")
    for fd in os.listdir(f"/proc/{proc.pid}/fd"):
        try:
            if os.readlink(f"/proc/{proc.pid}/fd/{fd}") == ours:
                return os.open(f"/proc/{proc.pid}/fd/{fd}", os.O_WRONLY)
        except OSError:
            continue
    return None


def _frame(data: bytes):
    def inject(proc):
        fd = reply_pipe(proc)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    return inject


def _interrupt(proc):
    raise Interrupted("a signal handler raised while the call awaited its reply")


FAULTS = {  # name: what is done to the touched call's first answering process once its request is sent
    "SIGKILL mid-call": lambda proc: os.kill(proc.pid, signal.SIGKILL),
    "SIGSTOP past the deadline": lambda proc: os.kill(proc.pid, signal.SIGSTOP),
    "call interrupted": _interrupt,
    "reply cut short": _frame(struct.pack("!i", 100) + b"0123456789"),
    "garbled reply": _frame(struct.pack("!i", 5) + b"\x00garb"),
}


class _AfterSend:
    """A send connection that strikes ``fault`` right after its next message is written."""

    def __init__(self, conn, fault, proc):
        self._conn, self._fault, self._proc = conn, fault, proc

    def send(self, obj):
        self._conn.send(obj)
        self._fault(self._proc)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def parse(text: str) -> list[dict]:
    try:
        entries = json.loads(text)
        ok = isinstance(entries, list) and all(
            e["fault"] in FAULTS and isinstance(e["spec"], str) and int(e.get("call", 1)) >= 1 for e in entries)
    except (ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise SystemExit(f"error: {ENV}={text!r}: expected a JSON list of {{fault, spec, call, test}}, each fault one "
                         f"of {sorted(FAULTS)}")
    return [dict(e, call=int(e.get("call", 1)), test=e.get("test", "")) for e in entries]


def install(text: str) -> None:
    """Patch the pool's Engine so that each call ``text`` names gets its fault (once)."""
    from suite.harness.pool import pool

    entries = parse(text)
    original = pool.Engine._call
    calls: Counter = Counter()  # per (spec, test named by an entry or ""): calls made
    lock = threading.Lock()

    def _call(self, probe, timeout, evaluator, kwargs):
        running = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
        with lock:
            hit = None
            for scope in {e["test"] for e in entries if e["spec"] == self.spec.text and e["test"] in running}:
                calls[self.spec.text, scope] += 1
                hit = hit or next((e for e in entries if e["spec"] == self.spec.text and e["test"] == scope
                                   and e["call"] == calls[self.spec.text, scope]), None)
        if hit is None:
            return original(self, probe, timeout, evaluator, kwargs)
        proc = self.procs[(self.evaluators if evaluator else self.callees)[0]]
        if os.environ.get(LOG_ENV):
            with open(os.environ[LOG_ENV], "a") as log:
                log.write(json.dumps({"fault": hit["fault"], "spec": self.spec.text, "probe": probe,
                                      "test": running}) + "\n")
        real = proc.send_conn
        proc.send_conn = _AfterSend(real, FAULTS[hit["fault"]], proc)
        if hit["fault"] == "SIGSTOP past the deadline":  # this call's deadline short, the run's others as they are
            timeout = min(timeout or self.call_timeout, STOPPED_DEADLINE)
        try:
            return original(self, probe, timeout, evaluator, kwargs)
        finally:
            proc.send_conn = real

    pool.Engine._call = _call


def pytest_configure(config):
    if os.environ.get(ENV):
        install(os.environ[ENV])


if __name__ == "__main__":  # the check, with the fault armed
    if os.environ.get(ENV):
        install(os.environ[ENV])
    from suite.check import main

    sys.exit(main(sys.argv[1:]))
