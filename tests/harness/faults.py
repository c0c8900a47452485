"""One fault injected into one engine call, from outside the engine, for the runs that
tests/harness/test_fault_matrix.py compares with fault-free ones: a pytest plugin
(``pytest -p tests.harness.faults``) and a runner of the check (``python -m tests.harness.faults
CHECK-ARGS``), both armed by ``TFDS_FAULT="FAULT@SPEC#N"``: the Nth engine call on SPEC's engine in
this process gets FAULT, once. What was touched (the test running, or the spec; the probe) is
appended to the file ``TFDS_FAULT_LOG`` names.

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


def parse(text: str) -> tuple[str, str, int]:
    fault, _, rest = text.partition("@")
    spec, _, n = rest.rpartition("#")
    if fault not in FAULTS or not spec or not n.isdigit():
        raise SystemExit(f"error: {ENV}={text!r}: expected FAULT@SPEC#N, FAULT one of {sorted(FAULTS)}")
    return fault, spec, int(n)


def install(text: str) -> None:
    """Patch the pool's Engine so that the call ``text`` names gets its fault (once)."""
    from suite.harness.engines import pool

    fault, spec, n = parse(text)
    original = pool.Engine._call
    calls: Counter = Counter()
    lock = threading.Lock()

    def _call(self, probe, timeout, evaluator, kwargs):
        with lock:
            calls[self.spec.text] += 1
            hit = self.spec.text == spec and calls[spec] == n
        if not hit:
            return original(self, probe, timeout, evaluator, kwargs)
        proc = self.procs[(self.evaluators if evaluator else self.callees)[0]]
        if os.environ.get(LOG_ENV):
            with open(os.environ[LOG_ENV], "a") as log:
                log.write(json.dumps({"fault": fault, "spec": spec, "call": n, "probe": probe,
                                      "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]}) + "\n")
        real = proc.send_conn
        proc.send_conn = _AfterSend(real, FAULTS[fault], proc)
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
    from suite.harness.loopcheck.usercheck import main

    sys.exit(main(sys.argv[1:]))
