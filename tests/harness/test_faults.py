"""Faults in clusters: a worker killed mid-step and a collective that never completes fail the
running call within a bounded, configurable time, naming the spec, the worker and what
happened; the pool replaces the cluster; a taken port is retried; no process outlives the
engines it belongs to."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from suite.common.specs import parse_spec
from suite.common.strategies import HEARTBEAT_TIMEOUT_MS
from suite.harness.judging.judgment import Check
from suite.harness.pool import topology
from suite.harness.pool.pool import EngineDied, EngineError, EnginePool, ProbeError
from tests.helpers import alive, check_replaced, descendants

# the bound the hung-collective test configures (what --engine-timeout sets for a session)
HUNG_TIMEOUT = 20.0

clusters = pytest.mark.specs(lambda spec: len(topology.tasks(spec)) > 1 or spec.kind == "cluster")


@clusters
def test_worker_killed_mid_step_fails_the_call_naming_it(pool, any_spec):
    """Multi-worker: the last worker SIGKILLs itself between the two all-reduces of a step
    while its peers wait in the second. Parameter servers: worker 1's server is killed while
    the coordinator's scheduled steps run. Either way the call fails at once (well inside
    the engine timeout) with EngineDied naming the spec, the worker and the signal."""
    spec = any_spec
    engine = pool.get(spec)
    old = engine.pids()
    start = time.monotonic()
    if spec.synchronous:
        victim = spec.workers - 1
        with pytest.raises(EngineDied) as info:
            pool.call(spec, "engine.collective_fault", victim=victim, how="kill", retries=0)
        name = f"worker {victim}"
    else:
        name = "worker 0" if spec.workers == 1 else "worker 1"
        target = next(p.pid for p in engine.procs if p.task.name == name)
        killer = threading.Timer(3.0, os.kill, (target, signal.SIGKILL))
        killer.start()
        try:
            with pytest.raises(EngineDied) as info:
                pool.call(spec, "engine.endless_steps", retries=0)
        finally:
            killer.cancel()
    elapsed = time.monotonic() - start
    check = Check(spec)
    check.contains(str(info.value), [spec.text, name, "SIGKILL"], "the error of a killed worker")
    check.that(elapsed < pool.call_timeout / 2, "seconds until the death failed the call", elapsed,
               f"under half the engine timeout ({pool.call_timeout / 2:g}): at once")
    check_replaced(check, pool, spec, old)


@pytest.mark.specs(lambda spec: spec.synchronous and spec.workers > 1)
def test_hung_collective_fails_within_the_configured_time(spec):
    """Worker 1 never reaches the step's second all-reduce. With the engine timeout set to
    HUNG_TIMEOUT, the peers' collective times out inside TensorFlow (CommunicationOptions, a
    little under the timeout) and the call fails within the bound, naming the spec, the error
    and the worker that did not answer; the next call gets a fresh cluster."""
    pool = EnginePool(start_timeout=180, call_timeout=HUNG_TIMEOUT)
    try:
        old = pool.get(spec).pids()
        start = time.monotonic()
        with pytest.raises(EngineError) as info:
            pool.call(spec, "engine.collective_fault", victim=1, how="hang")
        elapsed = time.monotonic() - start
        message = str(info.value)
        check = Check(spec, case={"engine timeout": HUNG_TIMEOUT})
        check.that(elapsed < HUNG_TIMEOUT + 15, "seconds until a hung collective failed the call", elapsed,
                   f"under {HUNG_TIMEOUT + 15:g}")
        check.contains(message, [spec.text, "worker 1"], "the error of a hung collective")
        if isinstance(info.value, ProbeError):  # TF's own collective timeout fired first
            check.contains(message, ["worker 1 did not answer"], "the error of TF's collective timeout")
            check.raises(info.value.raised, "DeadlineExceededError", "the collective on the peers")
        elif isinstance(info.value, EngineDied):  # a peer crashed on that timeout (seen: SIGSEGV, 2x2)
            check.contains(message, ["still waiting for", "Collective"], "the error of a peer that crashed")
        else:
            check.contains(message, [f"did not answer probe 'engine.collective_fault' within {HUNG_TIMEOUT:.0f}s"],
                           "the error of the engine deadline")
        check_replaced(check, pool, spec, old)
    finally:
        pool.close()


STARVED = 14.0  # seconds a worker is stopped: over TensorFlow's default heartbeat timeout, 10 s


def test_a_worker_starved_of_cpu_for_longer_than_tensorflows_heartbeat_timeout_keeps_its_cluster():
    """A loaded machine can pause a worker for seconds. Each worker of multi_worker:2x1 in turn is
    stopped (SIGSTOP) for STARVED seconds, then continued; the next step's all-reduces complete on
    both workers (each replica adds 1, then the sums: 2 replicas x 2). With TensorFlow's default
    heartbeat timeout the coordination service declared the stopped task failed and aborted
    every later collective ("heartbeat timeout"), which failed a fresh-clone .ci/run; engines
    give the service HEARTBEAT_TIMEOUT_MS, which every worker's info reports."""
    spec = parse_spec("multi_worker:2x1")
    pool = EnginePool(start_timeout=180, call_timeout=120)
    try:
        check = Check(spec, case={"stopped for": STARVED})
        infos = pool.call(spec, "engine.info")
        check.equal([info.heartbeat_timeout_ms for info in infos], [HEARTBEAT_TIMEOUT_MS] * 2,
                    "the coordination service's heartbeat timeout on each worker (ms)")
        pool.call(spec, "engine.collective_fault", victim=-1)  # the step traced before the pause
        for worker, pid in enumerate(pool.get(spec).pids()):
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(STARVED)
            finally:
                os.kill(pid, signal.SIGCONT)
            time.sleep(2.0)  # the service's next check of the heartbeats
            sums = pool.call(spec, "engine.collective_fault", victim=-1)
            check.equal(sums, [[4.0], [4.0]], f"the step's sums per worker after worker {worker} was stopped")
    finally:
        pool.close()


def test_a_taken_port_is_retried_with_fresh_ports(monkeypatch):
    """Ports are chosen free on loopback, but another process may bind one before TensorFlow
    does; the start fails on that port and is retried with new ones."""
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    real, calls = topology.free_ports, []

    def first_call_collides(n):
        calls.append(n)
        ports = real(n)
        if len(calls) == 1:
            ports[-1] = taken
        return ports

    monkeypatch.setattr(topology, "free_ports", first_call_collides)
    pool = EnginePool(start_timeout=180, call_timeout=60)
    try:
        spec = parse_spec("multi_worker:2x1")
        engine = pool.get(spec)
        check = Check(spec, case={"taken port": taken})
        check.equal(engine.start_attempts, 2, "start attempts")
        check.equal(calls, [len(topology.tasks(spec))] * 2, "port choices (ports per choice)")
        check.equal(len(pool.call(spec, "engine.ping")), 2, "workers answering after the retry")
    finally:
        pool.close()
        held.close()


def test_no_engine_process_outlives_its_engine(pool):
    """After the faults above (run earlier in this module), every process below pytest is a
    process of a live engine in the session pool, or a child of one: nothing was left behind
    by a killed or replaced cluster or by the closed private pools."""
    live = set(pool.live_pids())
    mine = {os.getpid()}
    allowed = set(live)
    for pid in live:
        allowed |= descendants(pid)
    strays = {p for p in descendants(os.getpid()) if p not in allowed and p not in mine}
    deadline = time.monotonic() + 10
    while strays and time.monotonic() < deadline:  # a process being reaped right now
        time.sleep(0.2)
        strays = {p for p in strays if alive(p)}
    described = {p: Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")[:120] for p in strays if alive(p)}
    Check("session pool").equal(described, {}, "processes below pytest that belong to no live engine")
