"""Engine agents: run the engines of a real cluster on the hosts that own it (no TensorFlow here).

An agent is a remote-code-execution service: whoever holds its key can make it run any code
as the agent's user on its host (the engines unpickle what they are sent and import what they
are told to). Run it only on a private network, or bound to loopback and reached through an
SSH tunnel; never on a public interface.

Make one key (``python -m suite.harness.pool.agent --new-key``) and give it to every agent
and to pytest in ``TFDS_AGENT_KEY``. On each host of the cluster, with that host's TF_CONFIG
(chief, worker, ps or evaluator task)::

    TF_CONFIG='{"cluster": {...}, "task": {"type": "worker", "index": 0}}' \\
    TFDS_AGENT_KEY=... python -m suite.harness.pool.agent --listen 10.0.0.5:7700

(without ``--listen`` it listens on 127.0.0.1:7700, loopback only; ``--listen PORT`` is
loopback on that port) then, from a machine that reaches the agents::

    TFDS_AGENT_KEY=... pytest tests --strategies cluster --cluster-agents hostA:7700,hostB:7700

The checks. A key must carry 32 random bytes (``check_key``: 64+ hex digits or 43+ base64
characters, and nothing that looks like a placeholder); the agent and pytest both refuse
any other key with one line. ``multiprocessing.connection``'s HMAC handshake proves the key
when a connection opens; after it every message, both ways, is a frame authenticated by
HMAC-SHA256 under a per-connection session key with a sequence number and a direction
(suite/common/authframe.py), checked before it is unpickled: an altered, forged, replayed,
reordered or unframed message closes the connection unread.

The pytest process asks each agent for its TF_CONFIG (``describe``), checks that the agents
cover the cluster's tasks exactly once, and derives the spec: MultiWorkerMirroredStrategy
over chief + workers, or ParameterServerStrategy when the cluster has ps tasks. For every
engine start the agent spawns ``python -m suite.engine.worker`` with its TF_CONFIG and hands
it the connection and its session (never the key), so the engine speaks the usual protocol,
framed the same way, to the pytest process. An agent runs one engine at a time (a new start
replaces the old one) and kills its engines when it exits; engines also die with their agent
(PR_SET_PDEATHSIG).

Messages (pickled tuples in authenticated frames): ``("describe",)`` -> ``("ok", info)``;
``("start", worker_args)`` -> ``("started", pid)``, then the engine's own messages;
``("status", pid)`` -> ``("ok", exit code or None)``; ``("kill", pid)`` -> ``("ok", exit code)``;
``("tail", pid)`` -> ``("ok", last log lines)``; ``("stacks", pid)`` -> ``("ok", every thread's stack,
as the engine's faulthandler dumps it)``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import secrets
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
from ...common import authframe
from . import stacks, topology

KEY_ENV = "TFDS_AGENT_KEY"
DEFAULT_LISTEN = ("127.0.0.1", 7700)  # loopback: reach it through an SSH tunnel, or give --listen
NEW_KEY = "python -m suite.harness.pool.agent --new-key"
REQUEST_BYTES = 1 << 20  # an agent's requests are a few hundred bytes: a longer frame is refused unread
HEX = frozenset("0123456789abcdefABCDEF")
BASE64 = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_+/")
# what a key must not contain (any case): the documentation's old example, the usual stand-ins
# and keyboard runs. A random 43-character base64 key contains one by chance with p < 1e-7.
PLACEHOLDERS = ("some-long-secret", "secret", "changeme", "change-me", "change_me", "password", "passw0rd",
                "example", "placeholder", "your-key", "your_key", "yourkey", "replace-me", "tfds-test-key",
                "12345678", "01234567", "abcdefgh", "qwertyui", "xxxxxxxx")


class AgentError(RuntimeError):
    """An agent could not be reached, refused us, or describes an unusable cluster."""


def parse_address(text: str) -> tuple[str, int]:
    if text.strip().isdigit():  # a bare port: loopback
        return DEFAULT_LISTEN[0], int(text)
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise AgentError(f"agent address {text!r} is not HOST:PORT")
    return host, int(port)


def new_key() -> str:
    """A fresh key: 32 random bytes as 43 urlsafe-base64 characters (one ``check_key`` accepts)."""
    while True:  # a random key looks like a placeholder with p < 1e-7: draw again then
        key = secrets.token_urlsafe(32)
        try:
            check_key(key)
        except AgentError:
            continue
        return key


def check_key(text: str) -> bytes:
    """The key's bytes, or AgentError (one line, saying how to make a key) unless ``text``
    carries at least 32 random bytes. Precisely, after stripping surrounding whitespace:

    * it contains none of PLACEHOLDERS, in any case;
    * it is hex text of at least 64 digits (256 bits), or else base64 text (urlsafe or
      standard alphabet, trailing ``=`` padding not counted) of at least 43 characters (258 bits);
    * it has at least 10 distinct characters (hex) or 16 (base64): fewer in a random key of
      that length has p < 1e-11;
    * it is not one shorter string repeated.
    """
    key = text.strip()
    how = f"make one with: {NEW_KEY}"
    if not key:
        raise AgentError(f"{KEY_ENV} is not set: agents and pytest must share a key; {how}")
    found = next((word for word in PLACEHOLDERS if word in key.lower()), None)
    if found:
        raise AgentError(f"{KEY_ENV} looks like a placeholder ({found!r}), not a random key; {how}")
    if set(key) <= HEX:
        kind, bits, need, distinct = "hex", 4, 64, 10
    elif set(key.rstrip("=")) <= BASE64:
        kind, bits, need, distinct = "base64", 6, 43, 16
        key = key.rstrip("=")
    else:
        raise AgentError(f"{KEY_ENV} is neither hex nor base64 text (letters, digits, -_+/); {how}")
    if len(key) < need:
        raise AgentError(f"{KEY_ENV} is too short: {len(key)} {kind} characters carry {len(key) * bits} bits, "
                         f"a key needs 32 random bytes ({need} {kind} characters); {how}")
    if len(set(key)) < distinct:
        raise AgentError(f"{KEY_ENV} has only {len(set(key))} distinct characters: not a random key; {how}")
    if any(key == (key[:period] * (len(key) // period + 1))[:len(key)] for period in range(1, len(key) // 2 + 1)):
        raise AgentError(f"{KEY_ENV} repeats a shorter string: not a random key; {how}")
    return text.strip().encode()


def agent_key() -> bytes:
    """``TFDS_AGENT_KEY``, checked (``check_key``): the agent and pytest both refuse a weak key."""
    return check_key(os.environ.get(KEY_ENV, ""))


def connect(address: tuple[str, int], key: bytes, timeout: float):
    """An authenticated connection to an agent, or AgentError within ``timeout`` seconds."""
    box: dict = {}

    def attempt():
        try:
            box["conn"] = authframe.client_channel(Client(address, authkey=key), key, timeout)
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
            f"refused authenticated frames ({exc})" if isinstance(exc, authframe.FrameError) else \
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
    except authframe.FrameError as exc:
        raise AgentError(f"agent {address[0]}:{address[1]}: its reply to {message[0]!r}: {exc}") from None
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
        self.stacks_at: dict[int, int] = {}  # per engine, where in its log the stacks it was asked for begin

    def describe(self) -> dict:
        return {"tf_config": self.tf_config, "virtual_cpus": self.virtual_cpus,
                "host": os.uname().nodename, "python": self.python}

    def start(self, conn: authframe.Channel, worker_args: list[str]):
        """Spawn the engine on ``conn``'s socket, answer ``("started", pid)``, then hand the
        engine the session (through a pipe it reads before it sends anything), so that its
        messages follow ours in the same authenticated sequence."""
        self.kill_all()  # one engine per agent: a new start replaces the old
        fd = conn.fileno()
        env = dict(os.environ, TF_CONFIG=json.dumps(self.tf_config), CUDA_VISIBLE_DEVICES="")
        env.pop(KEY_ENV, None)  # engines run the client's code: they get the session, never the key
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["PYTHONPATH"] = layout.engine_pythonpath(env.get("PYTHONPATH"))
        log_path = self.log_dir / f"engine-{time.time_ns()}.log"
        session_r, session_w = os.pipe()
        try:
            with open(log_path, "wb") as log:
                popen = subprocess.Popen(  # our own descriptors last: the client's arguments cannot replace them
                    [self.python, "-m", layout.ENGINE_MODULE, *worker_args,
                     "--fd-in", str(fd), "--fd-out", str(fd), "--session-fd", str(session_r)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                    cwd=str(layout.engine_cwd()), pass_fds=(fd, session_r), start_new_session=True,
                    preexec_fn=_set_pdeathsig if sys.platform.startswith("linux") else None)
        except BaseException:
            os.close(session_w)
            raise
        finally:
            os.close(session_r)
        self.children[popen.pid] = (popen, log_path)
        try:
            conn.send(("started", popen.pid))
        finally:
            conn.handover(session_w)

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
            with open(entry[1], "rb") as log:
                text = log.read(self.stacks_at.get(pid, -1)).decode(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join([ln for ln in text if ln.strip()][-lines:])

    def stacks(self, pid: int) -> str:
        """Every thread's stack of a running engine, dumped to its log at protocol.STACKS_SIGNAL."""
        popen, log_path = self.children.get(pid, (None, None))
        if popen is None or popen.poll() is not None:
            return ""
        start, dump = stacks.dump(pid, log_path)
        if start is not None:
            self.stacks_at.setdefault(pid, start)  # the tail stops where the first dump begins
        return dump

    def kill_all(self):
        for pid in list(self.children):
            self.kill(pid)
            self.children.pop(pid, None)

    def handle(self, conn: authframe.Channel):
        if not conn.poll(10):
            return
        msg = conn.recv(REQUEST_BYTES)  # authenticated before it is unpickled (FrameError otherwise)
        kind = msg[0] if isinstance(msg, tuple) and msg else None
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
        elif kind == "stacks":
            conn.send(("ok", self.stacks(msg[1])))
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
    p = argparse.ArgumentParser(prog="python -m suite.harness.pool.agent", description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", default=None,
                   help="HOST:PORT to listen on (default 127.0.0.1:7700, loopback only; PORT alone: loopback; "
                        "port 0: any free port). Only a private network's address: a key holder runs code here")
    p.add_argument("--new-key", action="store_true", help=f"print a fresh key for {KEY_ENV} and exit")
    p.add_argument("--python", default=sys.executable, help="interpreter with TensorFlow for the engines")
    p.add_argument("--virtual-cpus", type=int, default=1, help="logical CPUs per worker engine (R)")
    p.add_argument("--log-dir", default=None, help="where engine logs go (default: a temporary folder)")
    args = p.parse_args(argv)
    if args.new_key:
        print(new_key())
        return 0
    try:
        key = agent_key()
        cfg = read_tf_config(os.environ.get("TF_CONFIG"))
        host, port = parse_address(args.listen) if args.listen else DEFAULT_LISTEN
        listener = Listener((host, port), authkey=key)
    except AgentError as exc:
        print(f"suite.harness.pool.agent: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the address is taken, or not this host's
        print(f"suite.harness.pool.agent: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="tfds-agent-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    if not args.log_dir:  # our own temporary folder: remove it when the agent ends
        atexit.register(shutil.rmtree, log_dir, True)
    agent = Agent(cfg, args.python, log_dir, args.virtual_cpus)
    signal.signal(signal.SIGTERM, lambda *_: (agent.kill_all(), sys.exit(0)))
    with listener:
        bound = listener.address
        print(f"agent for {cfg['task']['type']} {cfg['task']['index']} listening on {bound[0]}:{bound[1]}", flush=True)
        if not bound[0].startswith("127.") and bound[0] not in ("localhost", "::1"):
            print(f"suite.harness.pool.agent: not loopback: any host that reaches {bound[0]}:{bound[1]} and holds "
                  f"the key can run code here as {_user()}; keep this address on a private network", file=sys.stderr,
                  flush=True)
        try:
            while True:
                try:
                    conn = listener.accept()
                except (AuthenticationError, EOFError, OSError):
                    continue  # a client with the wrong key, or one that went away
                peer = listener.last_accepted
                try:
                    agent.handle(authframe.agent_channel(conn, key, 10))
                except authframe.FrameError as exc:
                    where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
                    print(f"suite.harness.pool.agent: refused a message from {where}: {exc}", file=sys.stderr,
                          flush=True)
                except (EOFError, OSError):
                    pass
                finally:
                    conn.close()
        finally:
            agent.kill_all()


def _user() -> str:
    with contextlib.suppress(Exception):
        import pwd
        return pwd.getpwuid(os.getuid()).pw_name
    return f"uid {os.getuid()}"


if __name__ == "__main__":
    sys.exit(main())
