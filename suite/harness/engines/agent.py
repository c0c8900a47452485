"""Engine agents: run the engines of a real cluster on the hosts that own it (no TensorFlow here).

On each host of the cluster, with that host's TF_CONFIG (chief, worker, ps or evaluator task)
and a shared secret in ``TFDS_AGENT_KEY``::

    TF_CONFIG='{"cluster": {...}, "task": {"type": "worker", "index": 0}}' \\
    TFDS_AGENT_KEY=... python -m suite.harness.engines.agent --listen 0.0.0.0:7700

then, from any machine that reaches the agents::

    TFDS_AGENT_KEY=... pytest tests --strategies cluster --cluster-agents hostA:7700,hostB:7700

The pytest process asks each agent for its TF_CONFIG (``describe``), checks that the agents
cover the cluster's tasks exactly once, and derives the spec: MultiWorkerMirroredStrategy
over chief + workers, or ParameterServerStrategy when the cluster has ps tasks. For every
engine start the agent spawns ``python -m suite.engine.worker`` with its TF_CONFIG and hands
it the authenticated connection, so the engine speaks the usual protocol to the pytest
process. An agent runs one engine at a time (a new start replaces the old one) and kills its
engines when it exits; engines also die with their agent (PR_SET_PDEATHSIG).

Messages (pickled tuples over ``multiprocessing.connection`` with HMAC authentication):
``("describe",)`` -> ``("ok", info)``; ``("start", worker_args)`` -> ``("started", pid)``,
then the engine's own messages; ``("status", pid)`` -> ``("ok", exit code or None)``;
``("kill", pid)`` -> ``("ok", exit code)``; ``("tail", pid)`` -> ``("ok", last log lines)``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import AuthenticationError, Client, Listener
from pathlib import Path

from ... import layout
from . import topology

KEY_ENV = "TFDS_AGENT_KEY"


class AgentError(RuntimeError):
    """An agent could not be reached, refused us, or describes an unusable cluster."""


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise AgentError(f"agent address {text!r} is not HOST:PORT")
    return host, int(port)


def agent_key() -> bytes:
    key = os.environ.get(KEY_ENV, "")
    if not key:
        raise AgentError(f"{KEY_ENV} is not set; agents and pytest must share it (see docs/running.md, \"A real cluster\")")
    return key.encode()


def connect(address: tuple[str, int], key: bytes, timeout: float):
    """An authenticated connection to an agent, or AgentError within ``timeout`` seconds."""
    box: dict = {}

    def attempt():
        try:
            box["conn"] = Client(address, authkey=key)
        except (OSError, EOFError, AuthenticationError) as exc:
            box["error"] = exc

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(timeout)
    where = f"{address[0]}:{address[1]}"
    if thread.is_alive():
        raise AgentError(f"agent {where} did not answer within {timeout:.0f}s")
    if "error" in box:
        exc = box["error"]
        why = "refused the key (TFDS_AGENT_KEY differs)" if isinstance(exc, AuthenticationError) else \
            f"could not be reached ({type(exc).__name__}: {exc})"
        raise AgentError(f"agent {where} {why}")
    return box["conn"]


def request(address: tuple[str, int], key: bytes, message: tuple, timeout: float = 10.0):
    """Send one request on a fresh connection and return the reply's payload."""
    conn = connect(address, key, timeout)
    try:
        conn.send(message)
        if not conn.poll(timeout):
            raise AgentError(f"agent {address[0]}:{address[1]} did not reply to {message[0]!r} within {timeout:.0f}s")
        reply = conn.recv()
    except (EOFError, OSError) as exc:
        raise AgentError(f"agent {address[0]}:{address[1]} dropped the connection ({exc})") from None
    finally:
        conn.close()
    if reply[0] != "ok":
        raise AgentError(f"agent {address[0]}:{address[1]}: {reply[1]}")
    return reply[1]


def resolve_cluster(addresses: list[str], timeout: float = 20.0):
    """The ``cluster`` Spec of the agents at ``addresses``: ask each for its TF_CONFIG, then let
    ``topology.cluster_spec`` check that they cover one cluster and derive the strategy."""
    key = agent_key()
    found = []
    for text in addresses:
        address = parse_address(text)
        found.append((address, request(address, key, ("describe",), timeout)))
    try:
        return topology.cluster_spec(found)
    except topology.TopologyError as exc:
        raise AgentError(str(exc)) from None


# -- the agent process ---------------------------------------------------------------------
class Agent:
    def __init__(self, tf_config: dict, python: str, log_dir: Path, virtual_cpus: int):
        self.tf_config = tf_config
        self.python = python
        self.log_dir = log_dir
        self.virtual_cpus = virtual_cpus
        self.children: dict[int, tuple[subprocess.Popen, Path]] = {}

    def describe(self) -> dict:
        return {"tf_config": self.tf_config, "virtual_cpus": self.virtual_cpus,
                "host": os.uname().nodename, "python": self.python}

    def start(self, conn, worker_args: list[str]):
        self.kill_all()  # one engine per agent: a new start replaces the old
        fd = conn.fileno()
        env = dict(os.environ, TF_CONFIG=json.dumps(self.tf_config), CUDA_VISIBLE_DEVICES="")
        env.pop(KEY_ENV, None)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["PYTHONPATH"] = layout.engine_pythonpath(env.get("PYTHONPATH"))
        log_path = self.log_dir / f"engine-{time.time_ns()}.log"
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(
                [self.python, "-m", layout.ENGINE_MODULE, "--fd-in", str(fd), "--fd-out", str(fd), *worker_args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(layout.engine_cwd()),
                pass_fds=(fd,), start_new_session=True,
                preexec_fn=_set_pdeathsig if sys.platform.startswith("linux") else None)
        self.children[popen.pid] = (popen, log_path)
        conn.send(("started", popen.pid))

    def status(self, pid: int, wait: float = 5.0):
        popen = self.children.get(pid, (None,))[0]
        if popen is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=wait)
        return popen.returncode

    def kill(self, pid: int):
        popen = self.children.get(pid, (None,))[0]
        if popen is None:
            return None
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=10)
        return popen.returncode

    def tail(self, pid: int, lines: int = 6) -> str:
        entry = self.children.get(pid)
        if entry is None:
            return ""
        try:
            text = entry[1].read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join([ln for ln in text if ln.strip()][-lines:])

    def kill_all(self):
        for pid in list(self.children):
            self.kill(pid)
            self.children.pop(pid, None)

    def handle(self, conn):
        if not conn.poll(10):
            return
        msg = conn.recv()
        kind = msg[0]
        if kind == "describe":
            conn.send(("ok", self.describe()))
        elif kind == "start":
            self.start(conn, list(msg[1]))
        elif kind == "status":
            conn.send(("ok", self.status(msg[1])))
        elif kind == "kill":
            conn.send(("ok", self.kill(msg[1])))
        elif kind == "tail":
            conn.send(("ok", self.tail(msg[1])))
        else:
            conn.send(("error", f"unknown request {kind!r}"))


def _set_pdeathsig():
    with contextlib.suppress(Exception):
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def read_tf_config(text: str | None) -> dict:
    if not text:
        raise AgentError("TF_CONFIG is not set: give the agent its host's TF_CONFIG (cluster and task)")
    try:
        cfg = json.loads(text)
        task_type, index, cluster = cfg["task"]["type"], int(cfg["task"]["index"]), cfg["cluster"]
    except (ValueError, KeyError, TypeError) as exc:
        raise AgentError(f"TF_CONFIG is not a cluster with a task ({type(exc).__name__}: {exc})") from None
    if task_type not in topology.ROLES or task_type not in cluster or not 0 <= index < len(cluster[task_type]):
        raise AgentError(f"TF_CONFIG task {task_type} {index} is not one of the cluster's tasks {sorted(cluster)}")
    return cfg


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m suite.harness.engines.agent", description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", required=True, help="HOST:PORT to listen on (port 0: any free port)")
    p.add_argument("--python", default=sys.executable, help="interpreter with TensorFlow for the engines")
    p.add_argument("--virtual-cpus", type=int, default=1, help="logical CPUs per worker engine (R)")
    p.add_argument("--log-dir", default=None, help="where engine logs go (default: a temporary folder)")
    args = p.parse_args(argv)
    try:
        cfg = read_tf_config(os.environ.get("TF_CONFIG"))
        key = agent_key()
        host, port = parse_address(args.listen)
    except AgentError as exc:
        print(f"suite.harness.engines.agent: {exc}", file=sys.stderr)
        return 2
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="tfds-agent-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    if not args.log_dir:  # our own temporary folder: remove it when the agent ends
        atexit.register(shutil.rmtree, log_dir, True)
    agent = Agent(cfg, args.python, log_dir, args.virtual_cpus)
    signal.signal(signal.SIGTERM, lambda *_: (agent.kill_all(), sys.exit(0)))
    with Listener((host, port), authkey=key) as listener:
        bound = listener.address
        print(f"agent for {cfg['task']['type']} {cfg['task']['index']} listening on {bound[0]}:{bound[1]}", flush=True)
        try:
            while True:
                try:
                    conn = listener.accept()
                except (AuthenticationError, EOFError, OSError):
                    continue  # a client with the wrong key, or one that went away
                try:
                    agent.handle(conn)
                except (EOFError, OSError):
                    pass
                finally:
                    conn.close()
        finally:
            agent.kill_all()


if __name__ == "__main__":
    sys.exit(main())
