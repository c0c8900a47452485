"""Ctrl-C and SIGTERM take one path: the pool's engines are killed at once (no call to a busy
engine), then the interruption unwinds as a KeyboardInterrupt that says which signal it was, so
that the command exits 128 + its number (130, 143) after its temporary folders are removed."""

from __future__ import annotations

import contextlib
import os
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A SIGINT or SIGTERM, after the engines were killed; ``exit_status`` is 128 + the signal."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.exit_status = 128 + signum


def install(pools, then=None):
    """SIGINT and SIGTERM kill every engine of ``pools()`` (a callable: the pools may be made
    later), call ``then(signum)`` and raise Interrupted in the main thread. Returns the function
    that restores the previous handlers; outside the main thread nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    raised = []

    def handler(signum, frame):
        if raised:  # a second signal (Ctrl-C twice, a wrapper that forwards it) while the first unwinds
            return
        raised.append(signum)
        for pool in pools():
            pool.kill_now()
        if then is not None:
            then(signum)
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    return lambda: [signal.signal(s, h) for s, h in previous.items()]


@contextlib.contextmanager
def interruptible(pools, then=None):
    """``install`` for the length of a block."""
    restore = install(pools, then)
    try:
        yield
    finally:
        restore()


def terminate_children():
    """SIGTERM every live child of this process (pytest-xdist's workers, which each kill their own
    engines on it): a SIGTERM reaches the process it was sent to only, where Ctrl-C reaches the
    terminal's whole process group."""
    me = str(os.getpid())
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me and fields[0] != "Z":
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(entry), signal.SIGTERM)
