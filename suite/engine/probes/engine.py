"""Probes about the engine itself: liveness, trace counts, deliberate crashes (for tests)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import tensorflow as tf

from ...common.results import Ping
from .registry import probe


@probe
def ping(ctx):
    return Ping(os.getpid(), ctx.worker_index)


@probe
def info(ctx):
    return ctx.info()


@probe
def echo(ctx, arrays=(), text=0, make=0):
    """What it was sent, back (the pipe's round trip): ``arrays`` as they came, a string of ``text``
    characters (in the pickle, not beside it), and ``make`` more bytes as one array made here (a reply
    larger than what a request carries)."""
    made = np.arange(make, dtype=np.uint8) if make else None
    return {"arrays": list(arrays), "text": "x" * text, "made": made,
            "sums": [int(np.asarray(a, np.int64).sum()) for a in arrays]}


@probe
def trace_counts(ctx):
    """How many times each probe's tf.function traced in this engine."""
    return dict(ctx.traces)


def _first_time(marker: str) -> bool:
    """Whether ``marker`` (a file path) did not exist yet; it does now: a fault that does not repeat."""
    if os.path.exists(marker):
        return False
    with open(marker, "w"):
        pass
    return True


@probe
def crash(ctx, how="kill", worker_index=0, marker=None):
    """Die the way a TF abort does (SIGKILL/SIGABRT/exit) on one worker; others answer. With
    ``marker`` (a file path), only while it does not exist (it is made first): a crash that does not
    repeat."""
    if ctx.worker_index == worker_index and (marker is None or _first_time(marker)):
        if how == "exit":
            os._exit(7)
        os.kill(os.getpid(), {"kill": signal.SIGKILL, "abort": signal.SIGABRT}[how])
    return Ping(os.getpid(), ctx.worker_index)


@probe
def sleep(ctx, seconds=1.0, busy=False):
    """Answer after ``seconds``, asleep or (``busy``) spinning on the CPU the whole time."""
    if not busy:
        time.sleep(seconds)
        return seconds
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return seconds


@probe
def sleep_once(ctx, marker, seconds=60.0):
    """Sleep ``seconds`` the first time (``marker``, a file path, does not exist yet: it is made);
    answer "again" at once on every later call: a hang that does not repeat."""
    if not _first_time(marker):
        return "again"
    time.sleep(seconds)
    return "first"


@probe
def fail(ctx, message="boom"):
    raise ValueError(message)


@probe
def collective_fault(ctx, victim=1, how="kill", seconds=3600.0):
    """One step of two all-reduces on every replica; between them, worker ``victim`` kills
    itself (``how="kill"``: a worker dying mid-step) or sleeps ``seconds`` (``how="hang"``: its
    peers wait in the second all-reduce, a collective that never completes)."""
    strategy = ctx.strategy

    def act():
        if ctx.worker_index == victim:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(seconds)
        return np.float32(0.0)

    @tf.function
    def step():
        def replica_fn():
            rc = tf.distribute.get_replica_context()
            x = rc.all_reduce(tf.distribute.ReduceOp.SUM, tf.constant(1.0))
            y = tf.numpy_function(act, [], tf.float32, stateful=True)
            return rc.all_reduce(tf.distribute.ReduceOp.SUM, x + y)

        return strategy.run(replica_fn)

    return [float(v) for v in strategy.experimental_local_results(step())]


@probe
def endless_steps(ctx, steps=4):
    """Parameter servers: schedule ``steps`` closures that count to 2**31 - 1 on their worker
    (a step that does not end by itself) and join: the call ends only by a fault or its
    deadline."""
    coordinator = ctx.coordinator
    with ctx.strategy.scope():
        total = tf.Variable(0, dtype=tf.int32)

    @tf.function
    def spin():
        (n,) = tf.while_loop(lambda i: i < 2**31 - 1, lambda i: (i + 1,), [tf.constant(0)])
        total.assign_add(n)
        return n

    for _ in range(steps):
        coordinator.schedule(spin)
    coordinator.join()
    return int(total.numpy())
