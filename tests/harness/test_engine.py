"""The harness itself: TensorFlow stays out of the pytest process, engines die loudly and are
replaced, nothing hangs, no process outlives its pool, traces stay bounded."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from suite.common.specs import parse_spec
from suite.harness.judging.judgment import Check
from suite.harness.pool.pool import (
    EngineCallRetried,
    EngineCrashed,
    EngineDied,
    EnginePool,
    EngineStartError,
    EngineTimeout,
    ProbeError,
)
from tests.helpers import ROOT, alive, check_replaced


def test_pytest_process_never_imports_tensorflow(engines, any_spec):
    spec = any_spec
    engines.call(spec, "engine.ping")  # engines are running, and still:
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "tf_keras"))
    Check("pytest process").equal(loaded, [], "TensorFlow and Keras modules loaded while engines run")


def test_killed_engine_fails_the_call_naming_spec_probe_and_signal(pool, layout_spec):
    """A probe-answering process (the last worker; a parameter-server cluster's coordinator)
    kills itself; the call names it, and every process of the engine is replaced. One spec
    per engine layout: a one-process engine dies and is replaced the same way whatever its
    strategy."""
    spec = layout_spec
    engine = pool.get(spec)
    old = engine.pids()
    victim = spec.workers - 1 if spec.synchronous else 0
    with pytest.raises(EngineCrashed) as info:
        pool.call(spec, "engine.crash", how="kill", worker_index=victim, retries=0)
    check = Check(spec)
    who = [(f"worker {victim}" if spec.synchronous else "chief")] if len(old) > 1 else []
    check.contains(str(info.value), [spec.text, "'engine.crash'", "SIGKILL", *who], "the error of a killed engine")
    check_replaced(check, pool, spec, old)


def test_engine_exit_code_is_reported(pool):
    spec = parse_spec("default")
    with pytest.raises(EngineCrashed, match="exited with code 7"):
        pool.call(spec, "engine.crash", how="exit", retries=0)


def test_a_call_whose_engine_crashed_is_asked_again_of_a_fresh_engine_with_a_warning(pool, tmp_path):
    """The suite's own runs (--engine-retries, 1 by default) ask a call whose engine died while it ran
    it again of a fresh engine: the answer stands, and the warning quotes the death (seen in CI: a
    worker of multi_worker:2x1 aborted in TensorFlow after a collective timed out)."""
    spec = parse_spec("default")
    old = pool.get(spec).pids()
    with pytest.warns(EngineCallRetried) as warned:
        answer = pool.call(spec, "engine.crash", how="abort", marker=str(tmp_path / "crashed"), retries=1)
    check = Check(spec)
    check.equal(type(answer[0]).__name__, "Ping", "the answer of the call asked again")
    check.equal(len(warned), 1, "warnings for one retried call")
    check.contains(str(warned[0].message), ["'default' killed by signal SIGABRT while running probe 'engine.crash'",
                                            "asked again of a fresh engine"], "the warning")
    check_replaced(check, pool, spec, old)


def test_a_call_whose_engine_crashes_again_fails(pool):
    """A retried call whose fresh engine dies too fails with the second death (one warning for the first)."""
    spec = parse_spec("default")
    with pytest.warns(EngineCallRetried), pytest.raises(EngineCrashed, match="killed by signal SIGKILL"):
        pool.call(spec, "engine.crash", how="kill", retries=1)
    pool.call(spec, "engine.ping")


def test_hung_engine_times_out_and_is_replaced(pool):
    spec = parse_spec("default")
    start = time.monotonic()
    with pytest.raises(EngineTimeout, match=r"'default' did not answer probe 'engine.sleep' within 2s") as hung:
        pool.call(spec, "engine.sleep", timeout=2, retries=0, seconds=60)
    elapsed = time.monotonic() - start
    check = Check(spec)
    check.that(elapsed < 20, "seconds until a 2 s deadline failed the call", elapsed, "under 20")
    blocked = (r"it used \d+\.\ds of CPU in the \d+s it was waited for and 0\.0\ds in the 1s after \(blocked\); "
               r"machine load \d")
    check.that(re.search(blocked, str(hung.value)) is not None, "what a sleeping engine did while it was waited for",
               str(hung.value), blocked)
    pool.call(spec, "engine.ping")


def test_a_call_that_hung_is_asked_again_of_a_fresh_engine_with_a_warning(pool, tmp_path):
    """The suite's own runs (--engine-retries, 1 by default) ask a call whose engine timed out
    again of a fresh engine: the answer stands, and the warning quotes the timeout."""
    spec = parse_spec("default")
    old = pool.get(spec).pids()
    with pytest.warns(EngineCallRetried) as warned:
        answer = pool.call(spec, "engine.sleep_once", marker=str(tmp_path / "slept"), seconds=60, timeout=2,
                           retries=1)
    check = Check(spec)
    check.equal(answer, ["again"], "the answer of the call asked again")
    check.equal(len(warned), 1, "warnings for one retried call")
    check.contains(str(warned[0].message), ["did not answer probe 'engine.sleep_once' within 2s (killed)",
                                            "(blocked)", "asked again of a fresh engine"], "the warning")
    check_replaced(check, pool, spec, old)


def test_a_call_that_hangs_again_fails(pool):
    """A retried call that times out again fails with the second timeout (one warning for the first)."""
    spec = parse_spec("default")
    with pytest.warns(EngineCallRetried), pytest.raises(EngineTimeout, match="'engine.sleep' within 2s"):
        pool.call(spec, "engine.sleep", timeout=2, retries=1, seconds=60)
    pool.call(spec, "engine.ping")


def test_a_timed_out_engine_that_computes_says_it_was_running(pool):
    """A probe that spins past its deadline is told apart from one that waits on something: the
    timeout says the engine used the CPU in the second after the deadline."""
    spec = parse_spec("default")
    with pytest.raises(EngineTimeout, match=r"did not answer probe 'engine.sleep' within 2s") as hung:
        pool.call(spec, "engine.sleep", timeout=2, retries=0, seconds=60, busy=True)
    running = r"it used \d+\.\ds of CPU in the \d+s it was waited for and [0-9.]+s in the 1s after \(running\)"
    Check(spec).that(re.search(running, str(hung.value)) is not None, "what a spinning engine did while it was waited for",
                     str(hung.value), running)
    pool.call(spec, "engine.ping")


def test_probe_exception_keeps_the_engine(pool):
    spec = parse_spec("default")
    pid = pool.call(spec, "engine.ping")[0].pid
    with pytest.raises(ProbeError, match="raised ValueError: boom") as info:
        pool.call(spec, "engine.fail", message="boom")
    check = Check(spec)
    check.raises(info.value.raised, "ValueError", "engine.fail", "boom")
    check.equal(info.value.raised.where, "probe 'engine.fail'", "where the exception was raised")
    check.equal(pool.call(spec, "engine.ping")[0].pid, pid, "the engine's pid after a probe raised")
    with pytest.raises(ProbeError, match="unknown probe"):
        pool.call(spec, "engine.no_such_probe")


def test_missing_tensorflow_is_a_one_line_error(tmp_path):
    python = tmp_path / "python-without-site-packages"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    python.chmod(0o755)
    pool = EnginePool(python=str(python), start_timeout=60)
    try:
        with pytest.raises(EngineStartError) as info:
            pool.call(parse_spec("default"), "engine.ping")
        check = Check("default", case={"python": str(python)})
        check.contains(str(info.value), ["TensorFlow is not installed"], "the start error")
        check.equal(str(info.value).count("\n"), 0, "line breaks in the start error")
        with pytest.raises(EngineStartError):  # remembered, not retried
            pool.call(parse_spec("default"), "engine.ping")
    finally:
        pool.close()


def test_no_engine_outlives_its_pool_or_its_parent(tmp_path):
    """Closing the pool ends every engine; a parent killed without cleanup takes its engines
    with it (PR_SET_PDEATHSIG); one killed right after an interruption's kill_now (a pytest-xdist
    worker its controller SIGKILLs while it unwinds) leaves no folder either."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import sys, os, signal
        sys.path.insert(0, {str(ROOT)!r})
        from suite.harness.pool.pool import EnginePool
        from suite.common.specs import parse_spec
        pool = EnginePool()
        for s in ("default", "multi_worker:2x1"):
            pool.call(parse_spec(s), "engine.ping")
        print(" ".join(map(str, pool.live_pids())), flush=True)  # the engines' and the fork server's
        if sys.argv[1] == "close":
            pool.close()
        else:
            if sys.argv[1] == "interrupted":
                pool.kill_now()
            os.kill(os.getpid(), signal.SIGKILL)
    """))
    for mode in ("close", "die", "interrupted"):
        # the killed parent cannot remove its log folder: keep it inside tmp_path
        scratch = tmp_path / mode
        scratch.mkdir()
        proc = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, TMPDIR=str(scratch)))
        pids = [int(p) for p in proc.stdout.split()]
        check = Check("default, multi_worker:2x1", case={"parent": mode})
        check.equal(len(pids), 4, "processes the parent printed (3 engine processes, 1 fork server)",
                    proc.stderr[-2000:])
        deadline = time.monotonic() + 15
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        check.equal([p for p in pids if alive(p)], [], "engine processes alive 15 s after their parent ended")
        if mode != "die":
            check.equal([f.name for f in scratch.glob("tfds-engines-*")], [], "the pool's folder left")


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_engines_are_forked_from_one_tensorflow_import_and_configure_their_own_devices():
    """Every local engine process, cluster workers included, is a fork of the pool's one fork
    server (which imported TensorFlow and never started its runtime), and each configures its own
    devices after the fork: 2, 3 and 4 replicas, two workers with their own TF_CONFIG tasks.
    TFDS_ENGINE_START=spawn (fork=False) starts each as a process of its own."""
    pool = EnginePool(start_timeout=180, call_timeout=120)
    try:
        servers = pool.fork_servers.pids()
        check = Check("mirrored:2, mirrored:3, mirrored:4:reduce_to_one, multi_worker:2x1")
        check.equal(servers, [], "fork servers before the first engine")
        replicas, tasks = {}, []
        for text in ("mirrored:2", "mirrored:3", "mirrored:4:reduce_to_one", "multi_worker:2x1"):
            infos = pool.call(parse_spec(text), "engine.info")
            replicas[text] = [info.num_replicas_in_sync for info in infos]
            tasks += [info.tf_config["task"] for info in infos if info.tf_config]
            for pid in pool.get(parse_spec(text)).pids():
                check.equal(parent_of(pid), pool.fork_servers.pids()[0], f"the parent of {text}'s process {pid}")
        check.equal(len(pool.fork_servers.pids()), 1, "fork servers for one interpreter")
        check.equal(replicas, {"mirrored:2": [2], "mirrored:3": [3], "mirrored:4:reduce_to_one": [4],
                               "multi_worker:2x1": [2, 2]}, "replicas in sync per engine process")
        check.equal(tasks, [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}], "the workers' tasks")
    finally:
        pool.close()
    spawned = EnginePool(start_timeout=180, call_timeout=60, fork=False)
    try:
        pid = spawned.call(parse_spec("mirrored:2"), "engine.info")[0].pid
        Check("mirrored:2", case={"fork": False}).equal(parent_of(pid), os.getpid(), "the parent of a spawned engine")
    finally:
        spawned.close()


def test_engines_started_in_later_tests_fork_from_the_same_import(monkeypatch):
    """pytest names the running test in the environment (PYTEST_CURRENT_TEST), which the engines
    inherit: an engine started again in the next test (released, a cluster, another env's) forks from
    the server that imported TensorFlow already, not from a new import."""
    pool = EnginePool(start_timeout=180, call_timeout=120)
    spec = parse_spec("default")
    try:
        servers, pids = [], []
        for test in ("tests/t.py::test_one (call)", "tests/t.py::test_two (call)"):
            monkeypatch.setenv("PYTEST_CURRENT_TEST", test)
            pids.append(pool.call(spec, "engine.info")[0].pid)
            servers.append(pool.fork_servers.pids())
            pool.release(spec)
        check = Check("default", case={"PYTEST_CURRENT_TEST": "changed between the two starts"})
        check.that(pids[0] != pids[1], "the engine's processes", pids, "two (released after each test)")
        check.equal(servers[1], servers[0], "the fork servers the second engine was forked from")
    finally:
        pool.close()


def test_a_killed_fork_server_takes_its_engines_and_is_replaced():
    """SIGKILL to the fork server: its engines die with it (PR_SET_PDEATHSIG), the next call on
    one fails naming the spec, and the call after it gets an engine from a new server."""
    pool = EnginePool(start_timeout=180, call_timeout=60)
    try:
        spec = parse_spec("mirrored:2")
        old = pool.get(spec).pids()
        server = pool.fork_servers.pids()[0]
        os.kill(server, 9)
        deadline = time.monotonic() + 15
        while alive(old[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        check = Check(spec)
        check.equal(alive(old[0]), False, "the engine 15 s after its fork server was killed")
        with pytest.raises(EngineDied) as info:
            pool.call(spec, "engine.ping")
        check.contains(str(info.value), [spec.text, "SIGKILL"], "the error of an engine whose server was killed")
        new = pool.call(spec, "engine.info")[0]
        check.equal(new.num_replicas_in_sync, 2, "replicas of the engine from the new server")
        check.that(pool.fork_servers.pids() not in ([], [server]), "the fork servers after the kill",
                   pool.fork_servers.pids(), f"a new one, not {server}")
    finally:
        pool.close()


def test_engine_temporary_files_live_in_the_pools_folder(pool, any_spec):
    """Probes' temporary files (input files, checkpoints) go under the pool's folder, which
    close() removes: an engine killed in the middle of a probe leaves nothing in /tmp."""
    folder = Path(pool._log_dir).resolve()
    for info in pool.call(any_spec, "engine.info"):
        Check(any_spec).that(Path(info.tmpdir).resolve().is_relative_to(folder), "the engine's TMPDIR", info.tmpdir,
                             f"inside the pool's folder {folder}")


def test_trace_count_stays_bounded_over_many_examples(engines, spec):
    """One traced function serves every split and batch size (unknown batch dimension)."""
    rng = np.random.default_rng(0)
    before = engines.call(spec, "engine.trace_counts")[0].get("losses.compute_average_loss", 0)
    for i in range(30):
        sizes = [int(s) for s in rng.integers(0, 6, spec.replicas)]
        engines.call(spec, "losses.compute_average_loss", losses=rng.random(sum(sizes)).astype(np.float32),
                     sizes=sizes, global_batch_size=max(sum(sizes), 1) + i)
    after = engines.call(spec, "engine.trace_counts")[0].get("losses.compute_average_loss", 0)
    Check(spec).that(after - before <= 1, "traces of 30 calls with new shapes", after - before, "at most 1")
