"""The session memo of the check's one-device runs (suite/harness/pool/memo.py): a key runs once,
in this process and across the processes that share its folder; what decides an engine's reply
(spec, mutant, environment, arguments, the files the run reads) makes another key; replies come back
as copies; errors, a pool of a test's own and a disabled memo run every time. The engines here are
stand-ins that count their calls (no TensorFlow)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from suite.common.specs import parse_spec
from suite.harness.judging.judgment import Check
from suite.harness.loopcheck import usercheck
from suite.harness.pool import memo
from suite.harness.pool.pool import EnginePool, ProbeError

SPEC = parse_spec("default")


class CountingEngine:
    """Answers a probe with how many calls it has answered (one result per worker, as engines do)."""

    def __init__(self, fail: bool = False):
        self.calls, self.fail = 0, fail

    def call(self, probe, timeout=None, **kwargs):
        self.calls += 1
        if self.fail:
            raise ProbeError("probe raised", None, "", probe)
        return [{"call": self.calls, "probe": probe, "kwargs": kwargs}]


@pytest.fixture
def engine(monkeypatch):
    e = CountingEngine()
    monkeypatch.setattr(EnginePool, "get", lambda self, spec: e)
    return e


@pytest.fixture
def pools():
    """EnginePool() for the test, each closed after it (its log folder removed)."""
    made = []

    def make(cls=EnginePool):
        made.append(cls())
        return made[-1]
    yield make
    for pool in made:
        pool.close()


@pytest.fixture
def shared(tmp_path):
    m = memo.Memo()
    m.enable(tmp_path / "memo")
    return m


def test_a_key_runs_once_and_each_caller_gets_its_own_copy(engine, shared, pools):
    pool = pools()
    first = shared.call(pool, SPEC, "script.run", {"steps": 3})
    first[0]["kwargs"]["steps"] = 99  # a checker that changes what it was given
    again = shared.call(pool, SPEC, "script.run", {"steps": 3})
    check = Check(SPEC, case={"steps": 3})
    check.equal((engine.calls, again), (1, [{"call": 1, "probe": "script.run", "kwargs": {"steps": 3}}]),
                "engine calls and the second caller's reply")


def test_what_decides_a_reply_makes_another_key(engine, shared, pools, monkeypatch):
    pool = pools()
    shared.call(pool, SPEC, "script.run", {"steps": 3})
    shared.call(pool, SPEC, "script.run", {"steps": 4})  # the probe's arguments
    shared.call(pool, parse_spec("one_device"), "script.run", {"steps": 3})  # the spec
    shared.call(pool, SPEC, "workload.run", {"steps": 3})  # the probe
    shared.call(pool, SPEC, "script.run", {"steps": 3}, content=lambda: "another folder")  # the files it reads
    pool.mutant = "some-mutant"  # the engine's mutant (set_mutant without engines to switch)
    shared.call(pool, SPEC, "script.run", {"steps": 3})
    pool.mutant = None
    monkeypatch.setenv("TF_DETERMINISTIC_OPS", "1")  # the environment engines inherit
    shared.call(pool, SPEC, "script.run", {"steps": 3})
    monkeypatch.delenv("TF_DETERMINISTIC_OPS")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")  # ... but not which worker asks
    shared.call(pool, SPEC, "script.run", {"steps": 3})
    Check(SPEC).equal(engine.calls, 7, "engine calls: one per key")


def test_one_device_keeps_default_runs_alone_and_nothing_without_a_digest(engine, shared, pools):
    """``one_device``: a spec's own runs always run, a run under ``default`` once; a run whose files
    cannot be digested (content None: a namespace package's workload) always runs."""
    pool = pools()
    for _ in range(2):
        shared.one_device(pool, parse_spec("mirrored:2"), "script.run", {"steps": 3})
        shared.one_device(pool, SPEC, "script.run", {"steps": 3})
        shared.one_device(pool, SPEC, "workload.run", {"steps": 3}, content=lambda: None)
    Check(SPEC).equal(engine.calls, 5, "engine calls: the spec's twice, default's once, the undigested twice")


def test_a_folders_digest_follows_its_files(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "data.py").write_text("X = 1\n")
    before = memo.folder_digest(str(tmp_path), str(tmp_path / "train.py"))
    (tmp_path / "data.py").write_text("X = 2\n")  # a module the script imports from its folder
    after = memo.folder_digest(str(tmp_path), str(tmp_path / "train.py"))
    check = Check(SPEC)
    check.that(before != after, "the digests before and after a sibling module changed", (before, after), "differ")
    entry = memo.folder_digest(str(tmp_path), None)  # an entry function's: its package's folder, no file of its own
    check.that(entry not in (before, after), "an entry function's digest", entry, "its folder's files alone")


def test_a_workloads_digest_follows_its_modules_folder(tmp_path, pools):
    """The workload check's one-device runs are keyed by the files of its module's folder."""
    (tmp_path / "loops_memo_a").mkdir()
    (tmp_path / "loops_memo_a" / "__init__.py").write_text("")
    (tmp_path / "loops_memo_a" / "loop.py").write_text("from .parts import MODEL\n")
    (tmp_path / "loops_memo_a" / "parts.py").write_text("MODEL = 1\n")
    checker = usercheck.Checker(pools(), "loops_memo_a.loop:workload", path=str(tmp_path))
    before = checker._content()
    (tmp_path / "loops_memo_a" / "parts.py").write_text("MODEL = 2\n")
    Check(SPEC).that(checker._content() != before, "the workload's digest after a module beside it changed",
                     checker._content(), f"not {before}")


def test_errors_and_pools_of_a_tests_own_are_not_kept(monkeypatch, shared, pools):
    failing = CountingEngine(fail=True)
    monkeypatch.setattr(EnginePool, "get", lambda self, spec: failing)
    pool = pools()
    for _ in range(2):
        with pytest.raises(ProbeError):
            shared.call(pool, SPEC, "script.run", {"steps": 3})

    class OwnPool(EnginePool):
        pass

    own = pools(OwnPool)
    counting = CountingEngine()
    monkeypatch.setattr(EnginePool, "get", lambda self, spec: counting)
    shared.call(own, SPEC, "script.run", {"steps": 3})
    shared.call(own, SPEC, "script.run", {"steps": 3})
    off = memo.Memo()  # never enabled: a check run as a command
    off.call(pool, SPEC, "script.run", {"steps": 3})
    off.call(pool, SPEC, "script.run", {"steps": 3})
    Check(SPEC).equal((failing.calls, counting.calls), (2, 4),
                      "calls of the failing engine, and of a subclass's pool and a disabled memo's")


def test_another_process_reads_the_reply_from_the_shared_folder(engine, shared, pools, tmp_path):
    """The xdist workers' case: a second process with the same folder gets the reply without a call."""
    shared.call(pools(), SPEC, "script.run", {"steps": 3})
    code = textwrap.dedent(f"""
        from pathlib import Path
        from suite.common.specs import parse_spec
        from suite.harness.pool import memo
        from suite.harness.pool.pool import EnginePool
        def refuse(self, spec):
            raise SystemExit("the other process called an engine")
        EnginePool.get = refuse
        m = memo.Memo()
        m.enable(Path({str(tmp_path / 'memo')!r}))
        pool = EnginePool()
        print(m.call(pool, parse_spec("default"), "script.run", {{"steps": 3}})[0]["call"], m.hits)
        pool.close()
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    Check(SPEC).equal((done.returncode, done.stdout.split(), done.stderr[-300:]), (0, ["1", "1"], ""),
                      "the other process's exit, its reply's call number and its hits")
