"""An engine agent runs code for whoever holds its key, so: weak keys are refused on both sides,
an agent listens on loopback unless told otherwise, and after the handshake every message, to
the agent and to the engines it hands its connections to, is authenticated before it is
unpickled (suite/common/authframe.py). Attacks here use a pickle that would create a folder
if it were ever loaded; each test shows the folder absent and the connection closed."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import secrets
import select
import signal
import socket
import subprocess
import sys
from multiprocessing.connection import Client, Connection
from pathlib import Path

import pytest

from suite.common import authframe
from suite.common.specs import parse_spec
from suite.harness.judging.judgment import Check
from suite.harness.pool import agent as agent_mod
from suite.harness.pool.pool import EnginePool
from tests.helpers import ROOT, alive

KEY = agent_mod.new_key()
TF_CONFIG = json.dumps({"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}})
HOW = "make one with: python -m suite.harness.pool.agent --new-key"


class Exploit:
    """Unpickled, it creates the folder ``path``: proof of whether a message was loaded."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


def _agent_command(*args) -> list[str]:
    return [sys.executable, "-m", "suite.harness.pool.agent", *args]


def _run_agent(key: str, *args, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CONFIG=TF_CONFIG, TFDS_AGENT_KEY=key)
    return subprocess.run(_agent_command(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


class RunningAgent:
    def __init__(self, *args, key: str = KEY):
        env = dict(os.environ, TF_CONFIG=TF_CONFIG, TFDS_AGENT_KEY=key)
        self.proc = subprocess.Popen(_agent_command(*args), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.first = self.line(30)
        match = re.search(r"listening on (\S+):(\d+)", self.first)
        self.address = (match.group(1), int(match.group(2))) if match else None

    def line(self, timeout: float) -> str:
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            return ""
        return self.proc.stdout.readline()

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture
def running():
    started = []

    def start(*args, **kw) -> RunningAgent:
        started.append(RunningAgent(*args, **kw))
        return started[-1]

    yield start
    for a in started:
        a.stop()


# -- keys -------------------------------------------------------------------------------------
WEAK = {
    "the documentation's old example": "some-long-secret",
    "a short key": "tfds-test-key",
    "a short random key": secrets.token_urlsafe(16),
    "31 random bytes in hex": secrets.token_hex(31),
    "42 base64 characters": secrets.token_urlsafe(32)[:42],
    "changeme": "changeme",
    "a placeholder inside a long key": secrets.token_urlsafe(32) + "-changeme",
    "'secret' repeated": "secret" * 12,
    "one character repeated": "a" * 64,
    "a short string repeated": "q7Zk2mXv9Lp4Rt8W" * 4,
    "few distinct characters": "0101010110101101" * 4 + "23",
    "an alphabet": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQ",
    "not hex or base64": "correct horse battery staple correct horse battery staple!",
}


@pytest.mark.parametrize("key", list(WEAK.values()), ids=list(WEAK))
def test_a_weak_key_is_refused_by_the_check(key):
    check = Check("agent key", case={"key": key})
    with pytest.raises(agent_mod.AgentError) as info:
        agent_mod.check_key(key)
    check.contains(str(info.value), ["TFDS_AGENT_KEY", HOW], "the refusal")
    check.equal(str(info.value).count("\n"), 0, "line breaks in the refusal")


@pytest.mark.parametrize("make", [lambda: secrets.token_urlsafe(32), lambda: secrets.token_hex(32),
                                  lambda: __import__("base64").b64encode(secrets.token_bytes(32)).decode(),
                                  lambda: secrets.token_urlsafe(48)],
                         ids=["token_urlsafe(32)", "token_hex(32)", "openssl rand -base64 32", "token_urlsafe(48)"])
def test_a_random_key_is_accepted(make):
    for _ in range(20):
        key = make()
        Check("agent key", case={"key": key}).equal(agent_mod.check_key(key), key.encode(), "the key's bytes")


def test_weak_keys_are_refused_by_the_agent_and_by_pytest(monkeypatch):
    """The agent exits 2 with one line and no traceback, and the pytest side refuses the same
    keys before it connects to any agent (the address given has no agent: the refusal is the
    key's)."""
    check = Check("weak keys")
    documented = set()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        documented |= {k for k in re.findall(r"TFDS_AGENT_KEY=([^\s`'\"$]+)", page.read_text()) if k != "..."}
    for what, key in [("the documentation's old example", "some-long-secret"), ("a short key", "tfds-test-key"),
                      ("no key", ""), *[(f"a literal key of the docs ({k})", k) for k in sorted(documented)]]:
        proc = _run_agent(key, "--listen", "127.0.0.1:0")
        check.equal(proc.returncode, 2, f"the agent's exit status with {what}", proc.stdout + proc.stderr)
        check.contains(proc.stderr, [HOW], f"the agent's error with {what}")
        check.equal(proc.stderr.strip().count("\n"), 0, f"line breaks in the agent's error with {what}")
        check.that("Traceback" not in proc.stderr, f"the agent's error with {what}", proc.stderr, "no traceback")
        check.equal(proc.stdout, "", f"the agent's output with {what} (it never listened)")
        monkeypatch.setenv("TFDS_AGENT_KEY", key)
        with pytest.raises(agent_mod.AgentError) as info:
            agent_mod.resolve_cluster(["127.0.0.1:9"], timeout=5)
        check.contains(str(info.value), [HOW], f"pytest's refusal of {what}")


def test_new_key_prints_a_key_the_agent_and_pytest_accept(running):
    """``--new-key`` prints one fresh key (no TF_CONFIG needed), and an agent started with it
    answers pytest's side."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TFDS_AGENT_KEY")}
    printed = [subprocess.run(_agent_command("--new-key"), cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=60) for _ in range(2)]
    check = Check("--new-key")
    for proc in printed:
        check.equal(proc.returncode, 0, "the exit status of --new-key", proc.stderr)
        check.equal(len(proc.stdout.splitlines()), 1, "lines --new-key prints", proc.stdout)
    key = printed[0].stdout.strip()
    check.that(key != printed[1].stdout.strip(), "two keys --new-key printed", key, "different")
    check.equal(agent_mod.check_key(key), key.encode(), "the printed key, checked")
    a = running("--listen", "127.0.0.1:0", key=key)
    check.that(a.address is not None, "the agent's first line", a.first, "listening on HOST:PORT")
    info = agent_mod.request(a.address, key.encode(), ("describe",))
    check.equal(info["tf_config"]["task"], {"type": "worker", "index": 0}, "the task the agent describes")


# -- where it listens -------------------------------------------------------------------------
def _listening(pid: int) -> list[tuple[str, int]]:
    """The addresses ``pid``'s listening TCP sockets are bound to, read from /proc (not from
    what the process says)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, family in [("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)]:
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            host_hex, port_hex = fields[1].split(":")
            raw = bytes.fromhex(host_hex)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.append((socket.inet_ntop(family, raw), int(port_hex, 16)))
    return found


def test_an_agent_listens_on_loopback_unless_told_otherwise(running):
    """Without --listen the agent binds 127.0.0.1:7700 (and says so), and with a bare port
    127.0.0.1 too: the socket the kernel lists for its process is on loopback, nowhere else.
    (Should another process hold port 7700, the agent must say it cannot listen on
    127.0.0.1:7700, in one line.)"""
    check = Check("agent address")
    for args, port in [((), 7700), (("--listen", "0"), None)]:
        a = running(*args)
        if not args and "cannot listen on" in a.first:
            check.contains(a.first, ["cannot listen on 127.0.0.1:7700: "], "the line of an agent whose port is taken")
            check.equal(a.proc.wait(timeout=30), 2, "its exit status")
            continue
        check.that(a.address is not None, f"the first line of an agent started with {list(args)}", a.first,
                   "listening on HOST:PORT")
        check.equal(a.address[0], "127.0.0.1", f"the address an agent started with {list(args)} reports")
        if port:
            check.equal(a.address[1], port, "the port an agent without --listen reports")
        bound = _listening(a.proc.pid)
        check.equal(bound, [a.address], f"the listening sockets of an agent started with {list(args)} (/proc)")
        info = agent_mod.request(a.address, KEY.encode(), ("describe",))
        check.equal(info["tf_config"]["task"]["type"], "worker", "the loopback agent's answer")
        a.stop()


# -- messages ---------------------------------------------------------------------------------
def _handshake(address) -> object:
    """A raw connection after a valid handshake (the key is right), nothing framed yet."""
    return Client(address, authkey=KEY.encode())


def _closed_unanswered(conn, timeout: float = 10.0) -> bool:
    """Whether the peer closed ``conn`` without a reply (its hello aside)."""
    while conn.poll(timeout):
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return True
        if not data.startswith(authframe.HELLO):
            return False
    return False


def test_the_agent_unpickles_no_message_that_fails_authentication(running, tmp_path):
    """After a valid handshake: a pickle sent with no framing at all, one sent where a framed
    message is due, a framed one whose tag has one bit flipped, and a framed request recorded
    on one connection and replayed on another are each refused: the agent closes the
    connection without a reply, the pickle's folder is never made, and it still answers the
    next honest client; so is an authentic frame longer than any request (1 MiB). The pickle is
    live: loaded here, it makes its folder."""
    a = running("--listen", "127.0.0.1:0")
    check = Check("agent messages")
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(Exploit(control)))
    check.that(control.is_dir(), "the exploit pickle loaded in this process", "no folder", "its folder made")

    def attack(what: str, send) -> None:
        target = tmp_path / what.replace(" ", "-")
        conn = _handshake(a.address)
        send(conn, Exploit(target))
        closed = _closed_unanswered(conn)
        conn.close()
        check.that(not target.exists(), f"the folder {what} would make", "made: the agent unpickled it", "absent")
        check.that(closed, f"the agent's answer to {what}", "a reply or nothing", "the connection closed")
        line = a.line(10)
        check.contains(line, ["refused a message from 127.0.0.1:", "refused, connection closed"],
                       f"the agent's log line for {what}")

    attack("a bare pickle", lambda conn, obj: conn.send(obj))

    def unframed(conn, obj):
        authframe.client_channel(conn, KEY.encode(), 10)
        conn.send_bytes(pickle.dumps(obj))
    attack("an unframed pickle after the hello", unframed)

    def flipped(conn, obj):
        frame = bytearray(authframe.client_channel(conn, KEY.encode(), 10).frame(obj))
        frame[0] ^= 1
        conn.send_bytes(bytes(frame))
    attack("a frame with a flipped bit", flipped)

    def flipped_payload(conn, obj):
        frame = bytearray(authframe.client_channel(conn, KEY.encode(), 10).frame(("describe",)))
        frame[-3] ^= 0x40
        conn.send_bytes(bytes(frame))
    attack("a request with a flipped payload bit", lambda conn, obj: flipped_payload(conn, obj))

    def oversized(conn, obj):  # authentic, but longer than any request: refused before it is read whole
        frame = authframe.client_channel(conn, KEY.encode(), 10).frame((obj, b"x" * (2 << 20)))
        with contextlib.suppress(OSError):  # the agent closes while this is still being sent
            conn.send_bytes(frame)
    attack("an authentic frame over 1 MiB", oversized)

    recorded = {}

    def record(conn, obj):  # an honest framed request, recorded as a wire tapper would see it
        chan = authframe.client_channel(conn, KEY.encode(), 10)
        recorded["frame"] = chan.frame(obj)
    first = _handshake(a.address)
    record(first, ("describe",))
    first.send_bytes(recorded["frame"])
    check.that(first.poll(10), "the agent's reply to an honest framed request", "nothing", "a reply")
    first.close()
    attack("a framed request replayed on another connection",
           lambda conn, obj: (authframe.client_channel(conn, KEY.encode(), 10), conn.send_bytes(recorded["frame"])))
    info = agent_mod.request(a.address, KEY.encode(), ("describe",))
    check.equal(info["tf_config"]["task"]["type"], "worker", "the agent's answer to an honest client afterwards")


def _start_engine(address):
    chan = agent_mod.connect(address, KEY.encode(), 20)
    chan.send(("start", ["--spec", "default"]))
    check = Check("agent engine")
    check.that(chan.poll(20), "the agent's reply to a start", "nothing in 20 s", "('started', pid)")
    pid = chan.recv()[1]
    check.that(chan.poll(180), "the engine's first message", "nothing in 180 s", "'ready'")
    check.equal(chan.recv()[0], "ready", "the engine's first message (authenticated)")
    return chan, pid


def _engine_end(address, pid: int) -> tuple[int | None, str]:
    code = agent_mod.request(address, KEY.encode(), ("status", pid), timeout=20)
    return code, agent_mod.request(address, KEY.encode(), ("tail", pid))


def test_an_agents_engine_refuses_replayed_and_forged_messages(running, tmp_path):
    """The engine an agent hands a connection to continues its authenticated sequence: an
    honest call is answered; the same frame sent again (a replay) ends the engine unread; on a
    second engine, the exploit pickle framed with a tag one bit off ends it too, and its folder
    is never made."""
    a = running("--listen", "127.0.0.1:0")
    check = Check("engine messages")
    chan, pid = _start_engine(a.address)
    call = chan.frame(("call", 1, "engine.ping", {}))
    chan.conn.send_bytes(call)
    check.that(chan.poll(60), "the engine's reply to an honest call", "nothing in 60 s", "a reply")
    check.equal(chan.recv()[0], "ok", "the engine's reply to an honest call")
    chan.conn.send_bytes(call)  # the same frame again
    check.that(_closed_unanswered(chan.conn, 30), "the engine's answer to a replayed call", "a reply or nothing",
               "the connection closed")
    code, tail = _engine_end(a.address, pid)
    check.equal(code, 5, "the exit status of the engine that was sent a replay", tail)
    check.contains(tail, ["arrived where message 2 was due (replayed or reordered)"], "the engine's last words")

    chan, pid = _start_engine(a.address)
    target = tmp_path / "engine-exploit"
    frame = bytearray(chan.frame(Exploit(target)))
    frame[5] ^= 1
    chan.conn.send_bytes(bytes(frame))
    check.that(_closed_unanswered(chan.conn, 30), "the engine's answer to a forged frame", "a reply or nothing",
               "the connection closed")
    code, tail = _engine_end(a.address, pid)
    check.that(not target.exists(), "the folder the forged frame would make", "made: the engine unpickled it",
               "absent")
    check.equal(code, 5, "the exit status of the engine that was sent a forged frame", tail)
    check.contains(tail, ["failed authentication (bad tag"], "the engine's last words")
    check.that(not alive(pid), f"engine {pid}", "alive", "gone")


def test_a_channel_refuses_what_the_pytest_side_is_sent(tmp_path):
    """Either end checks the same way (the pytest side reads the engine's replies through it):
    a message reflected back to its sender, one reordered (its tag is right, its number is
    not the next) and one tagged under another session's key are refused unread."""
    check = Check("channel")
    key = secrets.token_bytes(32)
    for what in ["reflected", "reordered", "forged"]:
        left, right = socket.socketpair()
        client = authframe.Channel(Connection(left.detach()), key, authframe.CLIENT)
        engine = authframe.Channel(Connection(right.detach()), key, authframe.AGENT)
        target = tmp_path / what
        if what == "reflected":  # a frame the engine sent, delivered back to it
            reader = engine
            client.conn.send_bytes(authframe.Channel(None, key, authframe.AGENT).frame(Exploit(target)))
        elif what == "reordered":
            reader = client
            first, second = engine.frame(("ok", 1)), engine.frame(Exploit(target))
            engine.conn.send_bytes(second)
            engine.conn.send_bytes(first)
        else:
            reader = client
            engine.conn.send_bytes(authframe.Channel(None, secrets.token_bytes(32), authframe.AGENT)
                                   .frame(Exploit(target)))
        try:
            got = f"a message: {reader.recv()!r}"
        except authframe.FrameError as exc:
            got = str(exc)
        check.that(not target.exists(), f"the folder a {what} message would make", "made: it was unpickled", "absent")
        check.contains(got, ["refused, connection closed"], f"the refusal of a {what} message")
        check.that(reader.closed, f"the receiver's connection after a {what} message", "open", "closed")
        for chan in (client, engine):
            chan.close()


def test_local_engines_do_not_inherit_the_agents_key(monkeypatch):
    """Engines run user code; the key that lets a client run code through an agent stays in the
    pytest process: neither a fork server nor an engine (forked or spawned) has it in its environment."""
    monkeypatch.setenv(agent_mod.KEY_ENV, agent_mod.new_key())
    check = Check("local engines' environment")
    for start in ("fork", "spawn"):
        monkeypatch.setenv("TFDS_ENGINE_START", start)
        pool = EnginePool()
        try:
            pool.call(parse_spec("default"), "engine.ping")
            pids = pool.live_pids()
            check.that(len(pids) > 0, f"processes of a pool ({start})", pids, "some")
            holding = [p for p in pids if f"{agent_mod.KEY_ENV}=".encode() in Path(f"/proc/{p}/environ").read_bytes()]
            check.equal(holding, [], f"processes ({start}) whose environment holds {agent_mod.KEY_ENV}")
        finally:
            pool.close()
