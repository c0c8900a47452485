"""Engines forked from a server that has imported TensorFlow once (no TensorFlow here).

A plain engine process pays TensorFlow's import (seconds of CPU) at every start; a fork of
``suite.engine.forkserver`` pays nothing, because the server imported TensorFlow, Keras and the
probes without starting TensorFlow's runtime, which each fork then starts for itself (its own
logical CPUs, strategy and gRPC ports). ``ForkServers`` keeps one server per interpreter and
import-time environment (what the engines' environments share once the per-engine variables are
set aside); the pool's ``_Process`` asks it for a fork (``ForkServer.request``) and, once the
fork's pidfd says it exited, for its exit code. Where a server cannot serve (it does not start,
or an import started the runtime), ``ForkServers.server`` returns None and the pool starts plain
processes.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ... import layout
from . import cost

# set per engine, after the fork: they do not change what the server's imports do (the modules named in
# TFDS_ENGINE_IMPORTS, and the mutant they start with, are imported by each fork: suite/engine/worker.py).
# PYTEST_CURRENT_TEST is pytest's name of the test running, new at each test: as part of the server's key
# it started a server, a TensorFlow import, for each test that started an engine
PER_ENGINE = ("TF_CONFIG", "TMPDIR", "CUDA_VISIBLE_DEVICES", "TFDS_ENGINE_IMPORTS", "TFDS_MUTANT", "PYTEST_CURRENT_TEST")
REQUEST_TIMEOUT = 30.0  # a fork or a poll; the server does nothing else


_launcher: ThreadPoolExecutor | None = None
_launcher_lock = threading.Lock()


def launched(start, *args, **kwargs):
    """``start(*args, **kwargs)`` (a Popen) in the main thread or the one launcher thread. A child
    asks the kernel to kill it when its parent dies (PR_SET_PDEATHSIG), and "parent" means the
    thread that started it: a process started from a short-lived thread (the check starts engines
    from a thread pool) would be killed when that thread ends. The launcher lives until exit."""
    global _launcher
    if threading.current_thread() is threading.main_thread():
        return start(*args, **kwargs)
    with _launcher_lock:
        if _launcher is None:
            _launcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="process-launcher")
    return _launcher.submit(start, *args, **kwargs).result()


class ForkServerError(RuntimeError):
    """The fork server died or did not answer."""


class ForkServer:
    """One ``suite.engine.forkserver`` process and the pool's end of its socket."""

    def __init__(self, python: str, env: dict, log_dir: Path, start_timeout: float, preexec_fn=None):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log_path = log_dir / f"forkserver-{time.time_ns()}.log"
        with open(self.log_path, "wb") as log:
            self.popen = launched(
                subprocess.Popen, [python, "-m", layout.FORKSERVER_MODULE, "--fd", str(theirs.fileno())],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(layout.engine_cwd()),
                pass_fds=(theirs.fileno(),), start_new_session=True, preexec_fn=preexec_fn)
        theirs.close()
        self.sock = ours
        self.pid = self.popen.pid
        self._lock = threading.Lock()
        self.preload = self._reply("ready", start_timeout)[1]

    @property
    def usable(self) -> bool:
        """Forks of it can configure their own devices: the runtime did not start at import."""
        return not self.preload.get("runtime_started", False)

    def _reply(self, what: str, timeout: float):
        readable = select.select([self.sock], [], [], timeout)[0]
        try:
            data = self.sock.recv(1 << 20) if readable else None
        except OSError:
            data = None
        if not data:
            self.close()
            state = "died" if self.popen.poll() is not None else f"did not answer {what!r} within {timeout:.0f}s"
            raise ForkServerError(f"the engine fork server {state}: {self.log_tail()}")
        return pickle.loads(data)

    def request(self, message: tuple, fds: tuple = ()) -> tuple:
        with self._lock:
            try:
                socket.send_fds(self.sock, [pickle.dumps(message)], list(fds))
            except OSError as exc:
                raise ForkServerError(f"the engine fork server is gone ({exc})") from None
            return self._reply(message[0], REQUEST_TIMEOUT)

    def log_tail(self) -> str:
        try:
            lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return " | ".join(lines[-4:])

    def kill_now(self):
        """SIGKILL the server (its forks follow: PR_SET_PDEATHSIG), without its lock or a wait."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)

    def close(self):
        with contextlib.suppress(OSError):
            self.sock.close()  # the server reads EOF and exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=3)
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=10)


class ForkServers:
    """The pool's fork servers, one per interpreter and import-time environment, started on first
    use; ``server`` returns None where engines must start as plain processes."""

    def __init__(self, log_dir: Path, start_timeout: float, preexec_fn=None):
        self.log_dir, self.start_timeout, self.preexec_fn = log_dir, start_timeout, preexec_fn
        self._servers: dict = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(python: str, env: dict) -> tuple:
        return python, tuple(sorted((k, v) for k, v in env.items() if k not in PER_ENGINE))

    def server(self, python: str, env: dict) -> ForkServer | None:
        key = self.key(python, env)
        with self._lock:
            if key in self._servers:
                server = self._servers[key]
                if server is None or server.popen.poll() is None:
                    return server  # running, or known not to serve: plain processes
            server = self._start(python, env)  # the first, or one after a death
            self._servers[key] = server
            return server

    def _start(self, python: str, env: dict) -> ForkServer | None:
        cost.COUNTED.imports += 1
        try:
            server = ForkServer(python, {k: v for k, v in env.items() if k not in PER_ENGINE}, self.log_dir,
                                self.start_timeout, self.preexec_fn)
        except (ForkServerError, OSError):
            return None
        if not server.usable:
            server.close()
            return None
        return server

    def pids(self) -> list[int]:
        return [s.pid for s in self._servers.values() if s is not None and s.popen.poll() is None]

    def kill_now(self):
        """Every server SIGKILLed at once (an interruption; see ForkServer.kill_now)."""
        for server in list(self._servers.values()):
            if server is not None:
                server.kill_now()

    def close(self):
        with self._lock:
            for server in self._servers.values():
                if server is not None:
                    server.close()
            self._servers.clear()
