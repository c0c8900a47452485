"""The harness itself: TensorFlow stays out of the pytest process, engines die loudly and are
replaced, nothing hangs, no process outlives its pool, traces stay bounded."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from suite.common.specs import parse_spec
from suite.harness.pool import EngineDied, EnginePool, EngineStartError, EngineTimeout, ProbeError
from tests.helpers import ROOT, alive


def test_pytest_process_never_imports_tensorflow(engines, any_spec):
    spec = any_spec
    engines.call(spec, "engine.ping")  # engines are running, and still:
    assert "tensorflow" not in sys.modules
    assert "keras" not in sys.modules and "tf_keras" not in sys.modules


def test_killed_engine_fails_the_call_naming_spec_probe_and_signal(pool, any_spec):
    """A probe-answering process (the last worker; a parameter-server cluster's coordinator)
    kills itself; the call names it, and every process of the engine is replaced."""
    spec = any_spec
    engine = pool.get(spec)
    old = engine.pids()
    victim = spec.workers - 1 if spec.synchronous else 0
    with pytest.raises(EngineDied) as info:
        pool.call(spec, "engine.crash", how="kill", worker_index=victim)
    message = str(info.value)
    assert spec.text in message and "'engine.crash'" in message and "SIGKILL" in message, message
    if len(old) > 1:
        assert (f"worker {victim}" if spec.synchronous else "chief") in message, message
    assert not any(alive(p) for p in old), "the failed engine's processes must be gone"
    new = pool.get(spec).pids()
    pool.call(spec, "engine.ping")
    assert set(new).isdisjoint(old), "the pool must start a new engine for the next call"


def test_engine_exit_code_is_reported(pool):
    spec = parse_spec("default")
    with pytest.raises(EngineDied, match="exited with code 7"):
        pool.call(spec, "engine.crash", how="exit")


def test_hung_engine_times_out_and_is_replaced(pool):
    spec = parse_spec("default")
    start = time.monotonic()
    with pytest.raises(EngineTimeout, match=r"'default' did not answer probe 'engine.sleep' within 2s"):
        pool.call(spec, "engine.sleep", timeout=2, seconds=60)
    assert time.monotonic() - start < 20
    assert pool.call(spec, "engine.ping")


def test_probe_exception_keeps_the_engine(pool):
    spec = parse_spec("default")
    pid = pool.call(spec, "engine.ping")[0]["pid"]
    with pytest.raises(ProbeError, match="raised ValueError: boom") as info:
        pool.call(spec, "engine.fail", message="boom")
    assert info.value.type_name == "ValueError"
    assert pool.call(spec, "engine.ping")[0]["pid"] == pid
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
        message = str(info.value)
        assert "TensorFlow is not installed" in message and "\n" not in message, message
        with pytest.raises(EngineStartError):  # remembered, not retried
            pool.call(parse_spec("default"), "engine.ping")
    finally:
        pool.close()


def test_no_engine_outlives_its_pool_or_its_parent(tmp_path):
    """Closing the pool ends every engine; a parent killed without cleanup takes its engines
    with it (PR_SET_PDEATHSIG)."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import sys, os, signal
        sys.path.insert(0, {str(ROOT)!r})
        from suite.harness.pool import EnginePool
        from suite.common.specs import parse_spec
from tests.helpers import ROOT, alive
        pool = EnginePool()
        pids = []
        for s in ("default", "multi_worker:2x1"):
            pool.call(parse_spec(s), "engine.ping")
            pids += pool.get(parse_spec(s)).pids()
        print(" ".join(map(str, pids)), flush=True)
        if sys.argv[1] == "close":
            pool.close()
        else:
            os.kill(os.getpid(), signal.SIGKILL)
    """))
    for mode in ("close", "die"):
        # the killed parent cannot remove its log folder: keep it inside tmp_path
        proc = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, TMPDIR=str(tmp_path)))
        pids = [int(p) for p in proc.stdout.split()]
        assert len(pids) == 3, proc.stdout + proc.stderr[-2000:]
        deadline = time.monotonic() + 15
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(alive(p) for p in pids), f"engines {pids} outlived their parent ({mode})"


def test_engine_temporary_files_live_in_the_pools_folder(pool, any_spec):
    """Probes' temporary files (input files, checkpoints) go under the pool's folder, which
    close() removes: an engine killed in the middle of a probe leaves nothing in /tmp."""
    for info in pool.call(any_spec, "engine.info"):
        assert Path(info["tmpdir"]).resolve().is_relative_to(Path(pool._log_dir).resolve()), info["tmpdir"]


def test_trace_count_stays_bounded_over_many_examples(engines, spec):
    """One traced function serves every split and batch size (unknown batch dimension)."""
    rng = np.random.default_rng(0)
    before = engines.call(spec, "engine.trace_counts")[0].get("losses.compute_average_loss", 0)
    for i in range(30):
        sizes = [int(s) for s in rng.integers(0, 6, spec.replicas)]
        engines.call(spec, "losses.compute_average_loss", losses=rng.random(sum(sizes)).astype(np.float32),
                     sizes=sizes, global_batch_size=max(sum(sizes), 1) + i)
    after = engines.call(spec, "engine.trace_counts")[0].get("losses.compute_average_loss", 0)
    assert after - before <= 1, f"[{spec}] 30 calls with new shapes traced {after - before} times"
