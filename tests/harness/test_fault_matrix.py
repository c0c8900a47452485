"""A fault never changes a verdict it did not touch: the same sequence of engine calls on two specs,
fault-free and then with one fault injected into one call (the engine SIGKILLed mid-call, SIGSTOPped
past the call's deadline, the call interrupted by a signal handler that raises, a reply frame cut
short, a garbled frame). Every other call returns what it returned fault-free, the touched call
fails with an EngineError (or the handler's exception), and once the pool closes no process and no
folder of it is left. ``PYTHONPATH=. python tests/harness/test_fault_matrix.py`` prints the table."""

from __future__ import annotations

import os
import signal
import struct
import threading
import time

import pytest

from suite.common.specs import parse_spec
from suite.harness.engines.pool import EngineError, EnginePool
from suite.harness.verdict.judgment import Check
from tests.harness.test_replies import Interrupted, _raise_interrupted, _reply_pipe
from tests.helpers import alive

SPECS = [parse_spec("default"), parse_spec("mirrored:2")]
# (spec, seconds): each call's reply is its own seconds, so a reply read by another call shows
CALLS = [(SPECS[i % 2], round(0.05 + 0.01 * i, 2)) for i in range(6)]
TOUCHED = 2  # the call the fault hits: the default spec's second
TIMEOUT = 4.0  # each call's deadline


def _kill(engine):
    os.kill(engine.procs[0].pid, signal.SIGKILL)


def _stop(engine):
    os.kill(engine.procs[0].pid, signal.SIGSTOP)


def _frame(data: bytes):
    def inject(engine):
        fd = _reply_pipe(engine.procs[0])
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    return inject


FAULTS = {  # name: what is done to the touched call's engine 0.5 s into the call (None: a raising handler)
    "SIGKILL mid-call": _kill,
    "SIGSTOP past the deadline": _stop,
    "call interrupted": None,
    "reply cut short": _frame(struct.pack("!i", 100) + b"0123456789"),
    "garbled reply": _frame(struct.pack("!i", 5) + b"\x00garb"),
}


def run_sequence(fault: str | None) -> tuple[list, list[int], str]:
    """Outcomes of CALLS (each its reply, or the name of what it raised) with ``fault`` in call
    TOUCHED; the pool's processes still alive after it closed; its folder."""
    pool = EnginePool(call_timeout=TIMEOUT)
    outcomes, pids = [], set()
    try:
        for i, (spec, seconds) in enumerate(CALLS):
            engine = pool.get(spec)
            pids.update(engine.pids())
            pids.update(pool.live_pids())
            hit = fault is not None and i == TOUCHED
            seconds = 2.0 if hit else seconds  # long enough to be hit mid-call, inside the deadline
            timer = previous = None
            if hit and FAULTS[fault] is None:
                previous = signal.signal(signal.SIGALRM, _raise_interrupted)
                signal.setitimer(signal.ITIMER_REAL, 0.5)
            elif hit:
                timer = threading.Timer(0.5, FAULTS[fault], (engine,))
                timer.start()
            try:
                outcomes.append(pool.call(spec, "engine.sleep", seconds=seconds)[0])
            except (EngineError, Interrupted) as exc:
                outcomes.append(type(exc).__name__)
            finally:
                if timer is not None:
                    timer.join()
                if previous is not None:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    signal.signal(signal.SIGALRM, previous)
    finally:
        folder = str(pool._log_dir)
        pool.close()
    time.sleep(0.5)
    for pid in pids:  # a SIGSTOPped process is killed, not left stopped
        if alive(pid):
            os.kill(pid, signal.SIGCONT)
    return outcomes, sorted(p for p in pids if alive(p)), folder


@pytest.fixture(scope="module")
def baseline():
    outcomes, left, folder = run_sequence(None)
    Check("fault-free").equal((outcomes, left, os.path.exists(folder)),
                              ([s for _, s in CALLS], [], False), "outcomes, processes left, folder left")
    return outcomes


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_fault_changes_only_the_call_it_hits_and_leaves_nothing(baseline, fault):
    outcomes, left, folder = run_sequence(fault)
    check = Check(f"fault: {fault}", case={"calls": [(s.text, x) for s, x in CALLS], "touched": TOUCHED})
    changed = [i for i, (a, b) in enumerate(zip(outcomes, baseline)) if a != b and i != TOUCHED]
    check.equal(changed, [], "calls the fault did not touch whose outcome changed", f"{outcomes} vs {baseline}")
    check.that(isinstance(outcomes[TOUCHED], str), "the touched call's outcome", outcomes[TOUCHED],
               "an error (EngineDied, EngineTimeout, the handler's exception)")
    check.equal(left, [], "processes left after the pool closed")
    check.equal(os.path.exists(folder), False, "the pool's folder left after it closed")


if __name__ == "__main__":
    base = run_sequence(None)[0]
    print("| fault | touched call | other calls changed | processes left | folders left |")
    print("| --- | --- | --- | --- | --- |")
    for name in sorted(FAULTS):
        got, left, folder = run_sequence(name)
        changed = sum(1 for i, (a, b) in enumerate(zip(got, base)) if a != b and i != TOUCHED)
        print(f"| {name} | {got[TOUCHED]} | {changed} | {len(left)} | {int(os.path.exists(folder))} |")
