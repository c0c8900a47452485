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
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

from ... import layout
from ...common import authframe, limits, protocol
from ...common.results import Raised
from ...common.specs import Spec
from . import agent, cost, forks, stacks, topology, versions

# what every engine process imports at start, comma-separated (suite/engine/worker.py)
IMPORTS_ENV = "TFDS_ENGINE_IMPORTS"
# the meta tests' deliberately wrong engines: an engine imports this package only when the session
# wants a mutant (set_mutant, or TFDS_MUTANT=<name> in this process's environment: the one it starts with)
MUTANTS_MODULE = f"{layout.PACKAGE_DIR.name}.engine.mutants"  # as the engines name their package (layout.ENGINE_MODULE)
MUTANT_ENV = "TFDS_MUTANT"

layout.alias_engine_names()  # replies name the engines' package (suite.…): this process's modules


class EngineError(RuntimeError):
    """An engine failed: it could not start, died, hung, or a probe raised."""


class EngineStartError(EngineError):
    """The engine could not start (no TensorFlow, a strategy that cannot be built)."""


class EngineUnavailable(EngineError):
    """The spec needs hardware that is not here (GPUs, a TPU); tests skip on this."""


class EngineDied(EngineError):
    """An engine process exited or was killed while the parent waited on it."""


class EngineCrashed(EngineDied):
    """An engine process exited or was killed while it ran a call (not a message it sent out of
    step or garbled: those are EngineDied)."""


class EngineTimeout(EngineError):
    """An engine did not answer within its deadline (it was killed)."""


class EngineCallRetried(UserWarning):
    """A call's engine timed out or crashed (EngineTimeout, EngineCrashed) and the call was asked
    again of a fresh engine (``EnginePool.retries``); the message quotes the error."""


# a call's progress (Engine.on_progress) is shown once it has run this many seconds (TFDS_PROGRESS_AFTER), then
# at each change and at least this often
PROGRESS_AFTER, PROGRESS_EVERY = float(os.environ.get("TFDS_PROGRESS_AFTER") or 5.0), 30.0
RETRIED = (EngineTimeout, EngineCrashed)  # what EnginePool.call asks again of a fresh engine


class ProbeError(EngineError):
    """A probe raised inside the engine; ``raised`` says what (type name, message, where)."""

    def __init__(self, message: str, raised: Raised, tb: str, probe: str = "?"):
        super().__init__(message)
        self.raised = raised
        self.traceback = tb
        self.probe = probe


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


def _pidfd(pid: int) -> int | None:
    """A descriptor that turns readable when ``pid`` exits (Linux 5.3+), for a process that is not
    this one's child; None where the kernel has none (the fork server is asked instead)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class _Process:
    """One local engine process: its two pipe ends, its log file, and either its Popen (a plain
    start: TensorFlow imported anew) or the fork server it was forked from (suite/harness/pool/forks.py)."""

    def __init__(self, spec: Spec, task: topology.Task, worker_args: list[str], python: str, env: dict,
                 log_dir: Path, server: forks.ForkServer | None = None):
        self.task = task
        # a file name: SPEC@ENV's env may be an interpreter's path
        slug = re.sub(r"[^A-Za-z0-9_.@-]", "_", spec.text) + (f"-{task.type}{task.index}" if task.type else "")
        self.log_path = log_dir / f"{slug}-{time.time_ns()}.log"
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        self.popen, self.server, self._code, self._pidfd = None, server, None, None
        self._stacks_at = None  # where in the log the first stacks it was asked for begin (None: all of it)
        try:
            if server is not None:
                self.log_path.touch()
                self.pid = server.request(("fork", worker_args, env, str(self.log_path), str(layout.engine_cwd())),
                                          fds=(to_child_r, from_child_w))[1]
                self._pidfd = _pidfd(self.pid)
            else:
                cmd = [python, "-m", layout.ENGINE_MODULE, "--fd-in", str(to_child_r), "--fd-out", str(from_child_w),
                       *worker_args]
                with open(self.log_path, "wb") as log:
                    self.popen = forks.launched(
                        subprocess.Popen, cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                        cwd=str(layout.engine_cwd()), pass_fds=(to_child_r, from_child_w), start_new_session=True,
                        preexec_fn=_set_pdeathsig if sys.platform.startswith("linux") else None)
                self.pid = self.popen.pid
        except BaseException:
            for fd in (to_child_w, from_child_r):
                os.close(fd)
            raise
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.send_conn = protocol.writer(to_child_w)
        self.recv_conn = protocol.reader(from_child_r, env.get(protocol.SNAPSHOTS_ENV))

    def receive(self, deadline: float):
        """The next message from the engine, whole by ``deadline`` (protocol.receive)."""
        return protocol.receive(self.recv_conn, deadline, protocol.CHUNK)

    def stacks(self, wait: float = 2.0) -> str:
        """Every thread's Python stack, as faulthandler writes it to the engine's log on
        protocol.STACKS_SIGNAL (suite/engine/worker.py); "" if the process wrote none within ``wait``."""
        start, dump = stacks.dump(self.pid, self.log_path, wait)
        if start is not None and self._stacks_at is None:
            self._stacks_at = start
        return dump

    def cpu_seconds(self) -> float | None:
        """The CPU time the process has used so far, user and system, all its threads (/proc);
        None where that cannot be read."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None

    def peak_rss(self) -> int | None:
        """The process's peak resident memory so far (bytes; VmHWM), None where it cannot be read."""
        try:
            with open(f"/proc/{self.pid}/status") as f:
                return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
        except (OSError, StopIteration, ValueError, IndexError):
            return None

    def poll(self) -> int | None:
        if self.popen is not None:
            return self.popen.poll()
        if self._code is None:
            if self._pidfd is not None and not select.select([self._pidfd], [], [], 0)[0]:
                return None  # running: its pidfd turns readable when it exits (no call to the server)
            try:
                self._code = self.server.request(("poll", self.pid))[1]
            except forks.ForkServerError:
                self._code = -int(signal.SIGKILL)  # its server is gone, and took its forks with it (PDEATHSIG)
        return self._code

    def wait(self, timeout: float):
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout)
            return
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)

    def log_tail(self, lines: int = 6) -> str:
        """The last lines the engine wrote before any stacks it was asked for."""
        try:
            with open(self.log_path, "rb") as log:
                text = log.read(self._stacks_at).decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        useful = [ln for ln in text if ln.strip()][-lines:]
        return " | ".join(useful)

    def kill_now(self):
        """SIGKILL without waiting or asking anyone (an interruption: close() reaps it later)."""
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(self.pid, signal.SIGKILL)

    def kill(self):
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)  # a fork killed before its setsid() is no group leader yet
        self.wait(10)
        for conn in (self.send_conn, self.recv_conn):
            with contextlib.suppress(OSError):
                conn.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class _RemoteProcess:
    """One engine process on a cluster host, started by that host's agent
    (suite/harness/pool/agent.py); the same interface as ``_Process`` over a socket whose
    messages, both ways, are authenticated frames (suite/common/authframe.py)."""

    def __init__(self, address: tuple[str, int], task: topology.Task, worker_args: list[str], timeout: float):
        self.task = task
        self.address = address
        self._key = agent.agent_key()
        try:
            conn = agent.connect(address, self._key, timeout)
            conn.send(("start", worker_args))
            if not conn.poll(timeout):
                raise agent.AgentError(f"agent {address[0]}:{address[1]} did not start an engine within {timeout:.0f}s")
            reply = conn.recv()
        except authframe.FrameError as exc:
            raise agent.AgentError(f"agent {address[0]}:{address[1]}: its reply to 'start': {exc}") from None
        except (EOFError, OSError) as exc:
            raise agent.AgentError(f"agent {address[0]}:{address[1]} dropped the connection ({exc})") from None
        self.pid = reply[1]
        self.send_conn = self.recv_conn = conn
        self._peek = socket.fromfd(conn.fileno(), socket.AF_INET, socket.SOCK_STREAM)
        self._code = None

    def _ask(self, kind: str, default=None, timeout: float = 10.0):
        try:
            return agent.request(self.address, self._key, (kind, self.pid), timeout)
        except agent.AgentError:
            return default

    def receive(self, deadline: float):
        """The next message, whole by ``deadline`` (its length read first and capped), then checked
        as an authenticated frame before it is unpickled."""
        return self.recv_conn.accept(protocol.receive_bytes(self.recv_conn.conn, deadline))

    def stacks(self, wait: float = 2.0) -> str:
        """Every thread's Python stack, dumped to the engine's log at its agent's signal (the
        agent's ``stacks`` request); "" if it wrote none or the agent did not answer."""
        return self._ask("stacks", "", timeout=wait + 10.0)

    def cpu_seconds(self) -> float | None:
        """Not known here: the process runs on another host."""
        return None

    def poll(self) -> int | None:
        """The exit code once the engine's connection has closed (asked of the agent)."""
        if self._code is None:
            try:
                readable = select.select([self._peek], [], [], 0)[0]
                closed = bool(readable) and self._peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
            except OSError:
                closed = True
            if closed:
                code = self._ask("status")
                self._code = code if code is not None else -int(signal.SIGKILL)
        return self._code

    def wait(self, timeout: float):
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)

    def log_tail(self, lines: int = 6) -> str:
        tail = self._ask("tail", "")
        return f"(on {self.address[0]}) {tail}" if tail else ""

    def kill_now(self):
        """A remote process is killed through its agent, by close() (no network call from a signal handler)."""

    def kill(self):
        if self._code is None:
            self._code = self._ask("kill", -int(signal.SIGKILL))
        for closable in (self.send_conn, self._peek):
            with contextlib.suppress(OSError):
                closable.close()


class Engine:
    """The processes of one spec; ``call`` returns one reply per probe-answering process
    (the workers of a multi-worker spec, the coordinator of a parameter-server spec), in
    worker order. Server-only processes (parameter-server workers and ps) are watched: one
    that dies fails the running call."""

    def __init__(self, spec: Spec, *, python: str, log_dir: Path, start_timeout: float,
                 call_timeout: float, start_attempts: int = 3, fork_servers: forks.ForkServers | None = None,
                 env: dict | None = None):
        self.spec = spec
        self.env = dict(env or {})  # set in its local processes' environment (an empty value removes one)
        self.fork_servers = fork_servers  # None: every process imports TensorFlow itself
        self._calling = threading.RLock()  # one call at a time: replies are read in the order sent
        # what its processes used, after each call (EnginePool.usage: shared by the spec's engines, one after another)
        self.used: dict = new_usage()
        self._counted: dict = {}  # (pipe end, count) -> its count when last added to ``used``
        self.call_timeout = call_timeout
        # TF's own collective timeout fires first, leaving the 5 s grace for silent peers
        self.collective_timeout = max(call_timeout - 7.0, 1.0)
        self.alive = False
        self.start_seconds = None
        self.started_at = 0.0  # time.monotonic() once started
        self._restart = False
        self._waited_from: tuple = (None, {})  # (time.monotonic(), CPU seconds per process) at the last request
        self._requests = 0  # the number of the last call sent (its replies must echo it)
        # where a long call is (its first probe-answering process's progress messages): a line to this
        # callable once the call has run PROGRESS_AFTER seconds, at each change and every PROGRESS_EVERY
        self.on_progress = None
        self._progress: list = [None, None, 0.0]  # the latest text, the last text shown, when shown
        # whether its processes imported the mutants package, and the mutant they compute with (EnginePool)
        self.mutants = MUTANTS_MODULE in _imports(self.env) and spec.kind != "cluster"
        self.mutant = (self.env.get(MUTANT_ENV) or None) if self.mutants else None
        if spec.kind == "cluster":
            start_attempts = 1  # the user chose those ports
        for attempt in range(1, start_attempts + 1):
            began = time.monotonic()
            self._launch(python, log_dir)
            self.callees = [i for i, p in enumerate(self.procs) if p.task.answers_probes]
            self.evaluators = [i for i, p in enumerate(self.procs) if p.task.type == "evaluator"]
            self.alive = True
            try:
                replies = self._gather("start", start_timeout, range(len(self.procs)))
            except (EngineDied, EngineTimeout) as exc:  # a start that fails will fail again...
                cost.COUNTED.start_failed(time.monotonic() - began, timed_out=isinstance(exc, EngineTimeout))
                self.close()
                if attempt < start_attempts and _port_taken(str(exc)):
                    continue  # ...unless another process took one of its ports: new ports
                raise EngineStartError(f"{exc} (while starting)") from None
            except EngineError as exc:
                cost.COUNTED.start_failed(time.monotonic() - began)
                self.close()
                if attempt < start_attempts and _port_taken(str(exc)):
                    continue
                raise
            self.started_at = time.monotonic()
            self.start_seconds = self.started_at - began
            cost.COUNTED.started(self.start_seconds, len(self.procs))
            cost.COUNTED.engine_cpu(self._cpu())  # a fork's CPU from its start
            self.start_attempts = attempt
            break
        self.infos = [replies[i] for i in self.callees]
        if spec.gpus and self.infos[0].num_replicas_in_sync != spec.replicas:
            self.close()
            raise EngineStartError(f"engine {spec.text!r} runs {self.infos[0].num_replicas_in_sync} replicas, but "
                                   f"{spec.replicas} GPUs are visible to the pytest process (nvidia-smi -L, "
                                   "CUDA_VISIBLE_DEVICES): cases would be drawn for the wrong replica count")

    def _launch(self, python: str, log_dir: Path):
        if self.spec.kind == "cluster":
            return self._launch_on_agents()
        # SPEC@ENV: another env's TensorFlow (TF_USE_LEGACY_KERAS as that env says)
        base_env = versions.environment({**(versions.interpreter(self.spec.python)[1] if self.spec.python else {}),
                                         **self.env})
        base_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        base_env["PYTHONPATH"] = layout.engine_pythonpath(base_env.get("PYTHONPATH"))
        base_env.pop("TF_CONFIG", None)
        base_env.pop(agent.KEY_ENV, None)  # engines run user code: the agents' key stays in this process
        # Engines' temporary files (probe inputs, checkpoints) live under the pool's folder, which the
        # pool removes at close: an engine killed mid-probe never runs its own clean-up.
        tmp = log_dir / "tmp"
        tmp.mkdir(exist_ok=True)
        base_env["TMPDIR"] = str(tmp)
        # ... and so do the large arrays a probe keeps in files (suite/engine/snapshots.py), which this process
        # maps and unlinks as it reads each reply (protocol.PipeEnd)
        snapshots = log_dir / "snapshots"
        snapshots.mkdir(exist_ok=True)
        base_env[protocol.SNAPSHOTS_ENV] = str(snapshots)
        if not self.spec.gpus:
            base_env["CUDA_VISIBLE_DEVICES"] = ""  # CPU specs stay on (virtual) CPUs
        if self.spec.gpus:  # a GPU runtime maps its own address space: no memory limit (EnginePool.memory_limit)
            base_env[limits.MEMORY_ENV] = "0"
        server = self.fork_servers.server(python, base_env) if self.fork_servers else None
        self.procs = []
        try:
            for task, env in topology.local_envs(self.spec, base_env):
                cost.COUNTED.imports += server is None  # a process of its own imports TensorFlow
                self.procs.append(_Process(self.spec, task, task.worker_args(self.spec, self.collective_timeout),
                                           python, env, log_dir, server))
        except forks.ForkServerError as exc:
            for proc in self.procs:
                proc.kill()
            raise EngineStartError(f"engine {self.spec.text!r}: {exc}") from None

    def _launch_on_agents(self):
        """A real cluster: each agent starts the engine of its TF_CONFIG task (the tasks and what
        each runs come from ``topology.tasks``)."""
        self.procs = []
        for address, task in zip(self.spec.cluster["agents"], topology.tasks(self.spec)):
            try:
                self.procs.append(_RemoteProcess(tuple(address), task,
                                                 task.worker_args(self.spec, self.collective_timeout), timeout=20.0))
            except agent.AgentError as exc:
                self.alive = True
                self.close()
                raise EngineStartError(f"engine 'cluster' {task.name}: {exc}") from None

    # -- waiting -----------------------------------------------------------------------
    def _gather(self, probe: str, timeout: float, indices, request: int | None = None) -> list:
        """Wait for one message from each process in ``indices`` while watching all of them: the
        reply to ``request`` (None: the start's ready); raise EngineError on a death, an error reply,
        a reply to another request, a garbled message or the deadline."""
        deadline = time.monotonic() + timeout
        self._waited_from = (time.monotonic(), {i: self.procs[i].cpu_seconds() for i in indices})
        self._progress = [None, None, 0.0]
        replies: list = [None] * len(self.procs)
        pending = set(indices)
        first_error = None
        while pending:
            for i in sorted(pending):
                proc = self.procs[i]
                eof = False
                if proc.recv_conn.poll(0.02):
                    try:
                        msg = proc.receive(deadline)
                    except authframe.FrameError as exc:  # not unpickled; a cluster engine's socket
                        self._fail(EngineDied, f"{self._where(i)}'s connection carried a message that failed "
                                               f"authentication while running probe {probe!r} ({exc}; engine killed)", i)
                    except protocol.FrameTimeout as exc:
                        self._fail(EngineTimeout, f"{self._where(i)} began a reply to probe {probe!r} and did not "
                                                  f"finish it within {timeout:.0f}s ({exc}; killed)", i)
                    except protocol.BadFrame as exc:
                        self._fail(EngineDied, f"{self._where(i)} sent a reply that could not be read while "
                                               f"running probe {probe!r} ({exc}; engine killed)", i)
                    except (EOFError, OSError):
                        msg, eof = None, True  # the process closed its pipe: it is exiting
                    if isinstance(msg, tuple) and msg and msg[0] == protocol.PROGRESS:
                        self._progressed(i, msg)  # not a reply: the call goes on
                        continue
                    if msg is not None:
                        self._check_in_step(msg, request, probe, i)
                        replies[i] = msg
                        pending.discard(i)
                        if msg[0] == protocol.OK and msg[3].get("restart"):
                            self._restart = True
                        if msg[0] in (protocol.ERROR, protocol.FATAL) and first_error is None:
                            first_error = i
                            # peers of a failed worker may block in a collective: give them
                            # a short grace, not the full timeout
                            deadline = min(deadline, time.monotonic() + 5.0)
                        continue
                if eof:
                    proc.wait(5)
                code = proc.poll()
                if eof or (code is not None and not proc.recv_conn.poll(0)):
                    if first_error is not None:
                        pending.discard(i)
                        continue
                    others = pending - {i}
                    waiting = f" (still waiting for {self._names(others)})" if others else ""
                    self._fail(EngineCrashed, f"{self._where(i)} {_describe_exit(code)} "
                                              f"while running probe {probe!r}{waiting}{self._out_of(i, code)}", i)
            if first_error is None:
                for i, proc in enumerate(self.procs):  # servers answer nothing: watch them
                    if i not in pending and replies[i] is None and proc.poll() is not None:
                        self._fail(EngineCrashed, f"{self._where(i)} {_describe_exit(proc.poll())} "
                                                  f"while the engine ran probe {probe!r}", i)
            if self._progress[0] is not None:
                self._show_progress()
            if pending and time.monotonic() > deadline:
                if first_error is not None:
                    break
                i = min(pending)
                self._fail(EngineTimeout, f"{self._where(i, pending)} did not answer probe {probe!r} "
                                          f"within {timeout:.0f}s (killed){self._waiting(pending)}", i)
        if first_error is not None:
            silent = f"; {self._names(pending)} did not answer within 5s (killed){self._waiting(pending)}" \
                if pending else ""
            if len(self.procs) > 1:
                self.close(graceful=not pending)  # a cluster with one failed process is not reusable
            self._raise_reply(replies[first_error], probe, first_error, silent)
        payload = 1 if request is None else 2  # ("ready", info); ("ok", request, result, extra)
        return [msg[payload] if msg is not None else None for msg in replies]

    def _waiting(self, indices) -> str:
        """Where each of these processes waits: the frames of the thread that runs the probe, from
        the stacks it dumps on request (``; where it waited: ...``; per worker on a cluster), and
        whether it was blocked or running (``_activity``)."""
        parts = []
        for i in sorted(indices):
            where = stacks.waiting_frames(self.procs[i].stacks())
            if where:
                parts.append(self._who(i) + where)
        text = f"; where it waited (innermost first): {'; '.join(parts)}" if parts else ""
        activity = self._activity(sorted(indices))
        return text + (f"; {activity}" if activity else "")

    def _who(self, i: int) -> str:
        return f"{self.procs[i].task.name}: " if len(self.procs) > 1 else ""

    def _activity(self, indices: list[int], window: float = 1.0) -> str:
        """What each of these processes did while it was waited for: the CPU time it used since the
        request was sent and in the ``window`` seconds after (blocked: next to none; running: about
        the window), and the machine's load (a busy machine slows every engine); "" where /proc
        cannot say (a process on another host)."""
        since, at_send = self._waited_from
        if since is None:
            return ""
        now = {i: self.procs[i].cpu_seconds() for i in indices}
        known = [i for i in indices if at_send.get(i) is not None and now[i] is not None]
        if not known:
            return ""
        elapsed = time.monotonic() - since
        time.sleep(window)
        parts = []
        for i in known:
            after = self.procs[i].cpu_seconds()
            if after is not None:
                state = "blocked" if after - now[i] < 0.1 * window else "running"
                parts.append(f"{self._who(i)}it used {now[i] - at_send[i]:.1f}s of CPU in the {elapsed:.0f}s it was "
                             f"waited for and {after - now[i]:.2f}s in the {window:.0f}s after ({state})")
        return "; ".join(parts) + f"; machine load {os.getloadavg()[0]:.1f}" if parts else ""

    def _progressed(self, i: int, msg) -> None:
        """A progress message of process ``i`` (protocol.PROGRESS): kept if it is the first probe-answering
        process's and of the call awaited (a late one of an earlier call is dropped)."""
        if len(msg) == 3 and msg[1] == self._requests and self.callees and i == self.callees[0]:
            self._progress[0] = msg[2]
            self._show_progress()

    def _show_progress(self) -> None:
        """The latest progress as a line to ``on_progress`` (with the call's seconds so far), once the call has
        run PROGRESS_AFTER seconds: when it changed, or PROGRESS_EVERY seconds after the last line."""
        text, shown, at = self._progress
        now, began = time.monotonic(), self._waited_from[0]
        if self.on_progress is None or began is None or now - began < PROGRESS_AFTER:
            return
        if text != shown or now - at >= PROGRESS_EVERY:
            self._progress[1:] = [text, now]
            self.on_progress(f"{text} ({now - began:.0f} s)")

    def _check_in_step(self, msg, request: int | None, probe: str, i: int):
        """A reply answers the request awaited (``request``; None: the start, whose replies say ready
        or fatal), or the channel is out of step: some earlier call's reply was never read."""
        expected = (protocol.READY, protocol.FATAL) if request is None else (protocol.OK, protocol.ERROR)
        kind = msg[0] if isinstance(msg, tuple) and msg else None
        if kind in expected and len(msg) == (2 if request is None else 4) and (request is None or msg[1] == request):
            return
        got = f"a {kind!r} message" if kind not in (protocol.OK, protocol.ERROR) else f"the reply to request {msg[1]!r}"
        awaited = "its start" if request is None else f"request {request}"
        self._fail(EngineDied, f"{self._where(i)} sent {got} while {awaited} (probe {probe!r}) was awaited: its "
                               "replies are out of step (engine killed)", i)

    def _where(self, i: int, pending=None) -> str:
        who = f"engine {self.spec.text!r}"
        if len(self.procs) > 1:
            who += " " + (self._names(pending) if pending and len(pending) > 1 else self.procs[i].task.name)
        return who

    def _names(self, indices) -> str:
        """``worker 1`` or ``workers 0, 1`` (or ``chief, ps 0``) for these processes."""
        tasks = [self.procs[i].task for i in sorted(indices)]
        if len(tasks) > 1 and all(t.type == "worker" for t in tasks):
            return "workers " + ", ".join(str(t.index) for t in tasks)
        return ", ".join(t.name for t in tasks)

    def _out_of(self, i: int, code: int | None) -> str:
        """Which resource process ``i``, which ended with ``code``, ran out of, with its limit and the step its
        call was at (its progress): CPU time where the kernel ended it at its CPU-time limit (SIGXCPU), memory
        where its last output says a native allocation failed (an abort inside TensorFlow at its memory
        limit); else ""."""
        step = re.search(r"step \d+ of \d+", self._progress[0] or "")
        where = step[0] if step else ""
        if code == -signal.SIGXCPU:
            return limits.cpu_said(limits.given(limits.CPU_ENV, self.env), where)
        if limits.allocation_failed(self.procs[i].log_tail().replace(" | ", "\n")) is None:
            return ""  # (the same last lines _fail quotes)
        return limits.crashed_at(limits.given(limits.MEMORY_ENV, self.env), where)

    def _fail(self, cls, message: str, i: int):
        tail = self.procs[i].log_tail()
        self.close(graceful=False)
        raise cls(message + (f"; last output: {tail}" if tail else ""))

    def _raise_reply(self, msg, probe: str, i: int, suffix: str = ""):
        kind = msg[0]
        if kind == protocol.FATAL:
            text = msg[1]
            if text.startswith("unavailable: "):
                raise EngineUnavailable(f"{self._where(i)}: {text[len('unavailable: '):]}")
            raise EngineStartError(f"{self._where(i)} could not start: {text}")
        _, _, raised, tb = msg
        raise ProbeError(f"{self._where(i)}: probe {probe!r} raised {raised.type}: {_cause(raised.message)}{suffix}",
                         raised, tb, probe)

    # -- calls -------------------------------------------------------------------------
    def call(self, probe: str, timeout: float | None = None, evaluator: bool = False, **kwargs) -> list:
        """Run ``probe`` on every probe-answering process; their results in worker order.
        ``evaluator=True`` runs it on the cluster's evaluator tasks instead."""
        with self._calling:
            try:
                return self._call(probe, timeout, evaluator, kwargs)
            finally:
                self._measure()

    def _measure(self) -> None:
        """``used`` brought up to date: the largest peak resident memory of a process (each process's
        VmHWM, read while it lives) and the bytes its pipes carried since the last call, added."""
        peaks = [p for p in (getattr(proc, "peak_rss", lambda: None)() for proc in self.procs) if p]
        self.used["peak_rss"] = max([self.used["peak_rss"], *peaks])
        for proc in self.procs:
            for conn, counts in ((proc.send_conn, ("sent",)), (proc.recv_conn, ("received", "mapped"))):
                for count in counts:
                    now = getattr(conn, count, None)
                    if now is not None:
                        self.used[count] += now - self._counted.get((id(conn), count), 0)
                        self._counted[id(conn), count] = now

    def _call(self, probe: str, timeout: float | None, evaluator: bool, kwargs: dict) -> list:
        if not self.alive:
            raise EngineError(f"engine {self.spec.text!r} is closed")
        targets = self.evaluators if evaluator else self.callees
        if not targets:
            raise EngineError(f"engine {self.spec.text!r} has no {'evaluator' if evaluator else 'probe-answering'} task")
        self._requests += 1
        request = self._requests
        began, cpu_before = time.monotonic(), self._cpu()
        try:
            for i in targets:
                proc = self.procs[i]
                try:
                    proc.send_conn.send((protocol.CALL, request, probe, kwargs))
                except OSError:
                    self._fail(EngineCrashed, f"{self._where(i)} {_describe_exit(proc.poll())} "
                                              f"before probe {probe!r} could be sent", i)
            self._restart = False
            replies = self._gather(probe, timeout or self.call_timeout, targets, request)
        except ProbeError:
            cost.COUNTED.called(probe, time.monotonic() - began, self._cpu() - cpu_before)
            raise  # its reply was read whole: the channel is in step (a cluster's engine closed itself)
        except BaseException as exc:
            # (its CPU read before the close below kills its processes)
            cost.COUNTED.called(probe, time.monotonic() - began, self._cpu() - cpu_before,
                                timed_out=isinstance(exc, EngineTimeout))
            # anything else between the request and its reply (a death, a timeout, a signal handler's
            # exception, Ctrl-C) leaves the channel's state unknown: the engine is never used again
            self.close(graceful=False)
            raise
        cost.COUNTED.called(probe, time.monotonic() - began, self._cpu() - cpu_before)
        if self._restart:
            self._measure()  # (its processes' peaks, read while they live)
            self.close()  # the pool starts a fresh one for the next call
        return [replies[i] for i in targets]

    def _cpu(self) -> float:
        """The CPU seconds its local processes have used so far (a remote one's are not read: that
        would be a round trip to its agent per call)."""
        return sum(p.cpu_seconds() or 0.0 for p in self.procs if isinstance(p, _Process))

    def trace_counts(self) -> dict | None:
        """The engine's traces per probe; None when it is closed, failing, or busy with a call
        (another thread's, which the pool's close is about to end)."""
        if not self.alive or not self._calling.acquire(blocking=False):
            return None
        try:
            return self._call("engine.trace_counts", 10, False, {})[0]
        except EngineError:
            return None
        finally:
            self._calling.release()

    def pids(self) -> list[int]:
        """Every process of the engine, servers included."""
        return [p.pid for p in self.procs]

    def kill_now(self):
        """Every local process SIGKILLed at once: no message, no wait, no lock (an interruption; a
        call in progress on another thread then fails with EngineDied, and close() reaps them)."""
        for proc in getattr(self, "procs", ()):
            proc.kill_now()

    def close(self, graceful: bool = True):
        """End every process: ask them to exit (``graceful``, up to 3 s), then SIGKILL the rest."""
        if not self.alive:
            return
        self.alive = False
        if graceful:
            for proc in self.procs:
                with contextlib.suppress(OSError):
                    proc.send_conn.send((protocol.EXIT,))
            deadline = time.monotonic() + 3.0
            for proc in self.procs:
                proc.wait(max(deadline - time.monotonic(), 0.01))
        for proc in self.procs:
            proc.kill()


def new_usage() -> dict:
    """What a spec's engines used: ``peak_rss`` (the largest peak resident memory of one of their processes,
    bytes), ``sent`` (bytes of requests written to their pipes), ``received`` (bytes of replies read off them)
    and ``mapped`` (bytes of reply arrays mapped from the engines' snapshot files, suite/engine/snapshots.py)."""
    return {"peak_rss": 0, "sent": 0, "received": 0, "mapped": 0}


def _cause(message: str) -> str:
    """The line of a TensorFlow error message that says what went wrong: tf.function errors
    open with "in user code:" or "Graph execution error:" and a traceback, and end with the
    cause followed by "[[node ...]]" and "[Op:...]" decorations."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    if not (lines[0].startswith("in user code") or lines[0].startswith("Graph execution error")):
        return lines[0]
    noise = ("File ", "[[", "[Op:", "Detected at node", "in user code", "Graph execution error", "Traceback")
    tallies = ("successful operations", "derived errors ignored", "root error(s) found")
    useful = [ln for ln in lines if not ln.startswith(noise) and not ln.endswith(":")
              and not any(t in ln for t in tallies)]
    cause = useful[-1] if useful else lines[-1]
    return cause if len(cause) <= 300 else cause[:300] + " ..."


_PORT_TAKEN = ("address already in use", "could not start grpc server", "failed to add port")


def _port_taken(message: str) -> bool:
    """Whether a failed start looks like a loopback port taken between choosing and binding it."""
    low = message.lower()
    return any(mark in low for mark in _PORT_TAKEN)


def _imports(env) -> list[str]:
    """The modules ``env`` has engines import at start (as suite/engine/worker.py reads IMPORTS_ENV)."""
    return [m.strip() for m in env.get(IMPORTS_ENV, "").split(",") if m.strip()]


class EnginePool:
    """Session-wide engines by spec: started on first use, replaced after a failure,
    all closed by ``close()`` (conftest calls it at session end, and atexit as a backstop)."""

    def __init__(self, python: str | None = None, start_timeout: float = 180.0,
                 call_timeout: float = 120.0, fork: bool | None = None, retries: int = 0, memory: int | None = None):
        self.python = python or sys.executable
        # bytes each CPU engine may allocate (suite/common/limits.py): the check's pools pass one; None: only what
        # TFDS_ENGINE_MEMORY in this process's environment asks (the test session's pool, whose long-lived
        # multi-worker engines map more and more memory they do not use: measured past 5 GiB of data mappings
        # at 350 MB resident)
        self.memory = memory
        self.start_timeout = start_timeout
        self.call_timeout = call_timeout
        # a call whose engine times out or crashes is asked again of a fresh engine this many times, each
        # retry a warning (EngineCallRetried): the suite's own runs; a user's check reports the first one
        self.retries = retries
        self.retried: list[str] = []  # each retried call's error, until take_retried()
        self._engines: dict[str, Engine] = {}
        self._start_failures: dict[str, EngineError] = {}
        self._lock = threading.Lock()
        self._starting: dict[str, threading.RLock] = {}
        self._log_dir = Path(tempfile.mkdtemp(prefix="tfds-engines-"))
        # engines forked from one TensorFlow import per interpreter (forks.py); TFDS_ENGINE_START=spawn:
        # every engine a fresh interpreter
        fork = os.environ.get("TFDS_ENGINE_START", "fork") != "spawn" if fork is None else fork
        self.fork_servers = forks.ForkServers(self._log_dir, start_timeout, _set_pdeathsig) \
            if fork and sys.platform.startswith("linux") else None
        self.starts: dict[str, int] = {}
        self.trace_report: dict[str, dict] = {}  # spec -> probe -> traces, read at close()
        self.usage: dict[str, dict] = {}  # spec -> what its engines used, all of them (new_usage)
        # the meta tests' deliberately wrong engines (set_mutant); engines start with TFDS_MUTANT
        self.mutant: str | None = os.environ.get(MUTANT_ENV) or None
        # once a mutant is wanted, every engine started imports the mutants package (IMPORTS_ENV)
        self.mutants = self.mutant is not None or MUTANTS_MODULE in _imports(os.environ)
        self.interrupted = False  # kill_now() was called: no engine starts again
        self.progress = None  # a callable given each long call's progress lines (the check's, unless -q)

    def set_mutant(self, name: str | None):
        """Every engine of the pool, running or started later, computes with mutant ``name``
        (None: none) from the next call on (suite/engine/mutants/). ``NAME@other``: only the
        engines of SPEC@ENV specs (another TensorFlow), so that the tests comparing two versions
        see one side wrong."""
        self.mutant = name
        self.mutants = self.mutants or name is not None
        for engine in list(self._engines.values()):
            if engine.alive and engine.mutant != self._mutant_of(engine.spec):
                self._switch(engine)

    def _mutant_of(self, spec: Spec) -> str | None:
        if self.mutant and self.mutant.endswith("@other"):
            return self.mutant.removesuffix("@other") if spec.python else None
        return self.mutant

    def _switch(self, engine: Engine):
        """``engine`` switched to its spec's mutant by the mutants package's probe; one started before a
        mutant was wanted has no such package: it is closed, and starts afresh with it at its next use."""
        if not engine.mutants and engine.spec.kind != "cluster":
            self.release(engine.spec)
            return
        name = self._mutant_of(engine.spec)
        engine.call("mutants.switch", name=name)
        engine.mutant = name

    def memory_limit(self) -> int:
        """Bytes each CPU engine of the pool may allocate (suite/common/limits.py; 0: no limit): the pool's own,
        else what TFDS_ENGINE_MEMORY in this process's environment asks."""
        if self.memory is not None:
            return self.memory
        asked = os.environ.get(limits.MEMORY_ENV)
        return limits.parse_memory(asked) if asked else 0

    def _env(self, spec: Spec) -> dict:
        """What an engine of ``spec`` gets in its environment: its memory limit in bytes, the mutants package
        to import and its spec's mutant to start with, once a mutant is wanted."""
        env = {limits.MEMORY_ENV: str(self.memory_limit()), limits.CPU_ENV: str(limits.call_cpu(self.call_timeout))}
        if not self.mutants:
            return env
        imports = [m for m in _imports(os.environ) if m != MUTANTS_MODULE] + [MUTANTS_MODULE]
        return {**env, IMPORTS_ENV: ",".join(imports), MUTANT_ENV: self._mutant_of(spec) or ""}

    def get(self, spec: Spec) -> Engine:
        """``spec``'s engine, started if it is not running (threads may ask at once: each spec's
        engine starts once)."""
        with self._lock:
            lock = self._starting.setdefault(spec.text, threading.RLock())
        with lock:
            return self._get(spec)

    def _get(self, spec: Spec) -> Engine:
        key = spec.text
        if self.interrupted:
            raise EngineError(f"engine {spec.text!r} not started: the run was interrupted")
        if key in self._start_failures:  # do not retry a start that cannot succeed
            raise self._start_failures[key]
        engine = self._engines.get(key)
        if engine is not None and engine.alive and engine.mutant != self._mutant_of(spec):
            self._switch(engine)  # (closed if it cannot switch: started afresh below)
            engine = self._engines.get(key)
        if engine is None or not engine.alive:
            try:
                engine = Engine(spec, python=versions.interpreter(spec.python)[0] if spec.python else self.python,
                                log_dir=self._log_dir, fork_servers=self.fork_servers,
                                start_timeout=self.start_timeout, call_timeout=self.call_timeout,
                                env=self._env(spec))
            except (EngineStartError, EngineUnavailable) as exc:
                self._start_failures[key] = exc
                raise
            engine.on_progress = self.progress
            engine.used = self.usage.setdefault(key, new_usage())
            self._engines[key] = engine
            self.starts[key] = self.starts.get(key, 0) + 1
        if engine.mutant != self._mutant_of(spec):
            self._switch(engine)
        return engine

    def call(self, spec: Spec, probe: str, timeout: float | None = None, retries: int | None = None,
             **kwargs) -> list:
        """``probe`` run under ``spec``'s engine (started if need be); one result per worker. A call
        whose engine timed out or crashed (``RETRIED``) is asked again of a fresh engine up to
        ``retries`` times (None: the pool's), each retry an ``EngineCallRetried`` warning, and the
        error raised after the last."""
        retries = self.retries if retries is None else retries
        while True:
            try:
                return self.get(spec).call(probe, timeout=timeout, **kwargs)
            except RETRIED as exc:
                if retries <= 0 or self.interrupted:
                    raise
                retries -= 1
                self.retried.append(str(exc))
                warnings.warn(EngineCallRetried(f"{exc}; asked again of a fresh engine"), stacklevel=2)

    def take_retried(self) -> list[str]:
        """The errors of the calls retried since the last take (the plugin files them under the test)."""
        taken, self.retried = self.retried, []
        return taken

    def release(self, spec: Spec) -> None:
        """Close ``spec``'s engine if it runs (its memory back before the session ends; a later call
        starts it afresh): for the specs a test alone uses, a cluster or another env's interpreter."""
        engine = self._engines.pop(spec.text, None)
        if engine is not None:
            counts = engine.trace_counts()
            if counts is not None:
                self.trace_report[spec.text] = counts
                cost.COUNTED.traced(counts)
            engine.close()

    def release_all(self) -> None:
        """Close every local engine (each starts afresh on its next call, from its interpreter's fork
        server): what a group of tests made grow is given back before the next group starts its own.
        A real cluster's (the ``cluster`` spec, on machines the user owns) is kept: it starts through
        the agents, once a session."""
        for key in list(self._engines):
            if self._engines[key].spec.kind != "cluster":
                self.release(self._engines[key].spec)

    def live_pids(self) -> list[int]:
        """Every running process of the pool: its engines' and its fork servers'."""
        servers = self.fork_servers.pids() if self.fork_servers else []
        return [pid for e in self._engines.values() if e.alive for pid in e.pids()] + servers

    def kill_now(self):
        """An interruption (Ctrl-C, SIGTERM; safe in a signal handler): every engine process and fork
        server SIGKILLed at once, without a call to any of them and without taking a lock; no engine
        starts afterwards. The pool's folder (logs, the engines' temporary files) goes at once too:
        the process may not live to close(), which reaps the engines and removes what is left (under
        pytest-xdist, the controller SIGKILLs a worker whose unwinding takes over 10 s; a loaded run
        left a worker's folder so)."""
        self.interrupted = True
        for engine in list(self._engines.values()):
            engine.kill_now()
        if self.fork_servers:
            self.fork_servers.kill_now()
        shutil.rmtree(self._log_dir, ignore_errors=True)

    def close(self):
        for key, engine in list(self._engines.items()):
            counts = None if self.interrupted else engine.trace_counts()
            if counts is not None:
                self.trace_report[key] = counts
                cost.COUNTED.traced(counts)
            engine.close()
        self._engines.clear()
        if self.fork_servers:
            self.fork_servers.close()
        shutil.rmtree(self._log_dir, ignore_errors=True)
