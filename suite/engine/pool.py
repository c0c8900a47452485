"""Parent side of the engines: start them lazily, call probes, notice deaths, clean up.

No TensorFlow here. One ``Engine`` per strategy spec: a single process, or for
``multi_worker:WxR`` a cluster of W processes with TF_CONFIG on free loopback ports. A call
sends the request to every process of the engine and returns one reply per worker. Every
wait has a deadline; a dead or hung engine fails the call with an ``EngineError`` naming the
spec, the probe and what happened, and the pool starts a new engine for the next call.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from suite.engine import cluster, protocol
from suite.specs import Spec

REPO_ROOT = Path(__file__).resolve().parents[2]


class EngineError(RuntimeError):
    """An engine failed: it could not start, died, hung, or a probe raised."""


class EngineStartError(EngineError):
    """The engine could not start (no TensorFlow, a strategy that cannot be built)."""


class EngineUnavailable(EngineError):
    """The spec needs hardware that is not here (GPUs, a TPU); tests skip on this."""


class EngineDied(EngineError):
    """An engine process exited or was killed while the parent waited on it."""


class EngineTimeout(EngineError):
    """An engine did not answer within its deadline (it was killed)."""


class ProbeError(EngineError):
    """A probe raised inside the engine; ``type_name`` is the exception's class name."""

    def __init__(self, message: str, type_name: str, probe_message: str, tb: str):
        super().__init__(message)
        self.type_name = type_name
        self.probe_message = probe_message
        self.traceback = tb


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _set_pdeathsig():  # runs in the child between fork and exec
    # If the pytest process dies without cleaning up, the kernel kills the engine too.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _Process:
    """One engine process: its Popen, its two pipe ends and its log file."""

    def __init__(self, spec: Spec, worker_index: int, python: str, env: dict, log_dir: Path,
                 collective_timeout: float):
        self.worker_index = worker_index
        self.log_path = log_dir / f"{spec.text.replace(':', '_')}-w{worker_index}-{time.time_ns()}.log"
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        cmd = [python, "-m", "suite.engine.worker", "--spec", spec.text,
               "--fd-in", str(to_child_r), "--fd-out", str(from_child_w),
               "--worker-index", str(worker_index),
               "--collective-timeout", str(collective_timeout)]
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                cwd=str(REPO_ROOT), pass_fds=(to_child_r, from_child_w), start_new_session=True,
                preexec_fn=_set_pdeathsig if sys.platform.startswith("linux") else None)
        os.close(to_child_r)
        os.close(from_child_w)
        self.send_conn = protocol.writer(to_child_w)
        self.recv_conn = protocol.reader(from_child_r)

    def log_tail(self, lines: int = 6) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        useful = [ln for ln in text if ln.strip()][-lines:]
        return " | ".join(useful)

    def kill(self):
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        for conn in (self.send_conn, self.recv_conn):
            with contextlib.suppress(OSError):
                conn.close()


class Engine:
    """The processes of one spec; ``call`` returns one reply per worker, in worker order."""

    def __init__(self, spec: Spec, *, python: str, log_dir: Path, start_timeout: float,
                 call_timeout: float):
        self.spec = spec
        self.call_timeout = call_timeout
        self.alive = True
        base_env = dict(os.environ)
        base_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        base_env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT)] + [p for p in base_env.get("PYTHONPATH", "").split(os.pathsep) if p])
        base_env.pop("TF_CONFIG", None)
        if not spec.gpus:
            base_env["CUDA_VISIBLE_DEVICES"] = ""  # CPU specs stay on (virtual) CPUs
        envs = cluster.worker_envs(spec, base_env)
        collective_timeout = max(call_timeout - 5.0, 1.0)
        self.procs = [_Process(spec, i, python, env, log_dir, collective_timeout)
                      for i, env in enumerate(envs)]
        try:
            replies = self._gather("start", start_timeout)
        except (EngineDied, EngineTimeout) as exc:  # a start that fails will fail again
            self.close()
            raise EngineStartError(f"{exc} (while starting)") from None
        except EngineError:
            self.close()
            raise
        self.infos = replies

    # -- waiting -----------------------------------------------------------------------
    def _gather(self, probe: str, timeout: float) -> list:
        """Wait for one message from every process; raise EngineError on death or deadline."""
        deadline = time.monotonic() + timeout
        replies: list = [None] * len(self.procs)
        pending = set(range(len(self.procs)))
        first_error = None
        while pending:
            for i in sorted(pending):
                proc = self.procs[i]
                eof = False
                if proc.recv_conn.poll(0.02):
                    try:
                        msg = proc.recv_conn.recv()
                    except (EOFError, OSError):
                        msg, eof = None, True  # the process closed its pipe: it is exiting
                    if msg is not None:
                        replies[i] = msg
                        pending.discard(i)
                        if msg[0] in (protocol.ERROR, protocol.FATAL) and first_error is None:
                            first_error = i
                            # peers of a failed worker may block in a collective: give them
                            # a short grace, not the full timeout
                            deadline = min(deadline, time.monotonic() + 5.0)
                        continue
                if eof:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.popen.wait(timeout=5)
                code = proc.popen.poll()
                if eof or (code is not None and not proc.recv_conn.poll(0)):
                    if first_error is not None:
                        pending.discard(i)
                        continue
                    self._fail(EngineDied, f"{self._where(i)} {_describe_exit(code)} "
                                           f"while running probe {probe!r}", i)
            if pending and time.monotonic() > deadline:
                if first_error is not None:
                    break
                i = min(pending)
                self._fail(EngineTimeout, f"{self._where(i)} did not answer probe {probe!r} "
                                          f"within {timeout:.0f}s (killed)", i)
        if first_error is not None:
            if len(self.procs) > 1:
                self.close()  # a cluster with one failed worker is not reusable
            self._raise_reply(replies[first_error], probe, first_error)
        return [msg[1] for msg in replies]

    def _where(self, i: int) -> str:
        who = f"engine {self.spec.text!r}"
        if len(self.procs) > 1:
            who += f" worker {i}"
        return who

    def _fail(self, cls, message: str, i: int):
        tail = self.procs[i].log_tail()
        self.close()
        raise cls(message + (f"; last output: {tail}" if tail else ""))

    def _raise_reply(self, msg, probe: str, i: int):
        kind = msg[0]
        if kind == protocol.FATAL:
            text = msg[1]
            if text.startswith("unavailable: "):
                raise EngineUnavailable(f"{self._where(i)}: {text[len('unavailable: '):]}")
            raise EngineStartError(f"{self._where(i)} could not start: {text}")
        _, type_name, message, tb = msg
        lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
        # tf.function errors open with "in user code:" and a traceback; the cause is last
        first = (lines[-1] if lines and lines[0].startswith("in user code") else
                 lines[0] if lines else "")
        raise ProbeError(f"{self._where(i)}: probe {probe!r} raised {type_name}: {first}",
                         type_name, message, tb)

    # -- calls -------------------------------------------------------------------------
    def call(self, probe: str, timeout: float | None = None, **kwargs) -> list:
        """Run ``probe`` on every worker; return the per-worker results in worker order."""
        if not self.alive:
            raise EngineError(f"engine {self.spec.text!r} is closed")
        for i, proc in enumerate(self.procs):
            try:
                proc.send_conn.send((protocol.CALL, probe, kwargs))
            except OSError:
                self._fail(EngineDied, f"{self._where(i)} {_describe_exit(proc.popen.poll())} "
                                       f"before probe {probe!r} could be sent", i)
        return self._gather(probe, timeout or self.call_timeout)

    def pids(self) -> list[int]:
        return [p.popen.pid for p in self.procs]

    def close(self):
        if not self.alive:
            return
        self.alive = False
        for proc in self.procs:
            with contextlib.suppress(OSError):
                proc.send_conn.send((protocol.EXIT,))
        deadline = time.monotonic() + 3.0
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=max(deadline - time.monotonic(), 0.01))
        for proc in self.procs:
            proc.kill()


class EnginePool:
    """Session-wide engines by spec: started on first use, replaced after a failure,
    all closed by ``close()`` (conftest calls it at session end, and atexit as a backstop)."""

    def __init__(self, python: str | None = None, start_timeout: float = 180.0,
                 call_timeout: float = 120.0):
        self.python = python or sys.executable
        self.start_timeout = start_timeout
        self.call_timeout = call_timeout
        self._engines: dict[str, Engine] = {}
        self._start_failures: dict[str, EngineError] = {}
        self._log_dir = Path(tempfile.mkdtemp(prefix="tfds-engines-"))
        self.starts: dict[str, int] = {}
        self.trace_report: dict[str, dict] = {}  # spec -> probe -> traces, read at close()

    def get(self, spec: Spec) -> Engine:
        key = spec.text
        if key in self._start_failures:  # do not retry a start that cannot succeed
            raise self._start_failures[key]
        engine = self._engines.get(key)
        if engine is None or not engine.alive:
            try:
                engine = Engine(spec, python=self.python, log_dir=self._log_dir,
                                start_timeout=self.start_timeout, call_timeout=self.call_timeout)
            except (EngineStartError, EngineUnavailable) as exc:
                self._start_failures[key] = exc
                raise
            self._engines[key] = engine
            self.starts[key] = self.starts.get(key, 0) + 1
        return engine

    def call(self, spec: Spec, probe: str, timeout: float | None = None, **kwargs) -> list:
        return self.get(spec).call(probe, timeout=timeout, **kwargs)

    def live_pids(self) -> list[int]:
        return [pid for e in self._engines.values() if e.alive for pid in e.pids()]

    def close(self):
        for key, engine in self._engines.items():
            if engine.alive:
                try:
                    self.trace_report[key] = engine.call("engine.trace_counts", timeout=10)[0]
                except EngineError:
                    pass
            engine.close()
        self._engines.clear()
        shutil.rmtree(self._log_dir, ignore_errors=True)
