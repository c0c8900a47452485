"""Probes about the engine itself: liveness, trace counts, deliberate crashes (for tests)."""

from __future__ import annotations

import os
import signal
import time

from suite.probes.registry import probe


@probe
def ping(ctx):
    return {"pid": os.getpid(), "worker_index": ctx.worker_index}


@probe
def info(ctx):
    return ctx.info()


@probe
def trace_counts(ctx):
    """How many times each probe's tf.function traced in this engine."""
    return dict(ctx.traces)


@probe
def crash(ctx, how="kill", worker_index=0):
    """Die the way a TF abort does (SIGKILL/SIGABRT/exit) on one worker; others answer."""
    if ctx.worker_index == worker_index:
        if how == "exit":
            os._exit(7)
        os.kill(os.getpid(), {"kill": signal.SIGKILL, "abort": signal.SIGABRT}[how])
    return {"worker_index": ctx.worker_index}


@probe
def sleep(ctx, seconds=1.0):
    time.sleep(seconds)
    return {"slept": seconds}


@probe
def fail(ctx, message="boom"):
    raise ValueError(message)
