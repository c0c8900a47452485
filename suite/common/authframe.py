"""Authenticated messages over an engine agent's connection (no TensorFlow here).

An engine agent (suite/harness/pool/agent.py) and the engines it spawns talk to the pytest
process over TCP. ``multiprocessing.connection``'s HMAC handshake proves that both ends hold
the shared key when the connection opens, but what follows is pickled, and unpickling runs code:
a message injected into a hijacked connection would run as the agent's user. So after the
handshake every message is authenticated before it is unpickled:

1. Each side sends a hello, ``HELLO`` + 32 random bytes (its nonce). The session key is
   ``HMAC-SHA256(message key, "session" || client nonce || agent nonce)``, where the message
   key is ``HMAC-SHA256(shared key, "tfds-agent message key v1")`` (the handshake's own key is
   never used for messages). Both sides' randomness makes the session key fresh per connection,
   so a message recorded from one connection fails in any other.
2. Every message is one ``send_bytes`` frame: ``tag || seq || payload``, where ``payload`` is
   the pickle, ``seq`` the sender's count of messages sent (8 bytes, big-endian, from 0) and
   ``tag = HMAC-SHA256(session key, seq || direction || payload)``; ``direction`` is ``b"C"``
   for client-to-agent (pytest to agent or engine) and ``b"A"`` for the other way, so a message
   cannot be reflected back to its sender.
3. The receiver checks the tag with ``hmac.compare_digest`` and then that ``seq`` is the next
   one it expects, and only then unpickles. A bad tag, a replayed or reordered message, or an
   unframed one closes the connection and raises ``FrameError`` (a ``ConnectionError``).

When an agent hands its connection to the engine it spawns, it hands over the session too
(``Channel.handover`` / ``Channel.taken_over``: key and both sequence numbers, through a pipe),
and the engine goes on with the same counters, so the pytest process sees one authenticated
conversation. Local engines talk over OS pipes with no framing.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import struct
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler

from . import protocol  # noqa: F401  (registers the numpy reducers with ForkingPickler)

HELLO = b"tfds-authframe-v1:"
NONCE_BYTES = 32
TAG_BYTES = 32
SEQ = struct.Struct(">Q")
CLIENT, AGENT = b"C", b"A"
_STATE = struct.Struct(">32sQQc")  # session key, next seq to send, next seq to receive, own direction


class FrameError(ConnectionError):
    """A message failed authentication (bad tag, replayed, reordered, unframed): refused, connection closed."""


def message_key(shared_key: bytes) -> bytes:
    return hmac.new(shared_key, b"tfds-agent message key v1", hashlib.sha256).digest()


def session_key(shared_key: bytes, client_nonce: bytes, agent_nonce: bytes) -> bytes:
    return hmac.new(message_key(shared_key), b"session" + client_nonce + agent_nonce, hashlib.sha256).digest()


def _hello(conn: Connection, timeout: float) -> tuple[bytes, bytes]:
    """Send our hello; our nonce and the peer's (its hello checked for form, never unpickled)."""
    mine = secrets.token_bytes(NONCE_BYTES)
    conn.send_bytes(HELLO + mine)
    if not conn.poll(timeout):
        conn.close()
        raise FrameError(f"no authenticated-frames hello within {timeout:.0f}s: connection closed")
    try:
        theirs = conn.recv_bytes(len(HELLO) + NONCE_BYTES)
    except OSError:  # "bad message length": an unframed message, or an older suite
        theirs = b""
    if len(theirs) != len(HELLO) + NONCE_BYTES or not theirs.startswith(HELLO):
        conn.close()
        raise FrameError("the peer does not speak authenticated frames (a message other than the hello came "
                         "first): refused, connection closed")
    return mine, theirs[len(HELLO):]


def client_channel(conn: Connection, shared_key: bytes, timeout: float) -> Channel:
    """The pytest side of a connection whose handshake just succeeded."""
    mine, theirs = _hello(conn, timeout)
    return Channel(conn, session_key(shared_key, mine, theirs), CLIENT)


def agent_channel(conn: Connection, shared_key: bytes, timeout: float) -> Channel:
    """The agent side of a connection whose handshake just succeeded."""
    mine, theirs = _hello(conn, timeout)
    return Channel(conn, session_key(shared_key, theirs, mine), AGENT)


class Channel:
    """A connection whose messages are framed and authenticated (the module docstring); the
    ``send``/``recv``/``poll``/``fileno``/``close`` of a ``multiprocessing.connection.Connection``."""

    def __init__(self, conn: Connection, key: bytes, direction: bytes, sent: int = 0, received: int = 0):
        self.conn = conn
        self._key = key
        self._out, self._in = direction, (AGENT if direction == CLIENT else CLIENT)
        self._sent, self._received = sent, received

    def _tag(self, seq: bytes, direction: bytes, payload) -> bytes:
        mac = hmac.new(self._key, seq, hashlib.sha256)
        mac.update(direction)
        mac.update(payload)
        return mac.digest()

    def frame(self, obj) -> bytes:
        """``obj`` pickled and framed as the next message this side sends (counted as sent)."""
        payload = bytes(ForkingPickler.dumps(obj))
        seq = SEQ.pack(self._sent)
        self._sent += 1
        return self._tag(seq, self._out, payload) + seq + payload

    def send(self, obj) -> None:
        self.conn.send_bytes(self.frame(obj))

    def recv(self, maxlength: int | None = None):
        """The next message, unpickled only once its tag and number are checked; a frame longer
        than ``maxlength`` bytes is refused unread too."""
        try:
            frame = self.conn.recv_bytes(maxlength)
        except OSError as exc:
            if str(exc) == "bad message length":  # multiprocessing's word for a frame over maxlength
                self._refuse(f"message {self._received} is longer than {maxlength} bytes")
            raise
        return self.accept(frame)

    def accept(self, data: bytes):
        """The message in ``data``, a frame's body read off the connection by the caller (with its own
        deadline and cap): unpickled only once its tag and number are checked."""
        frame = memoryview(data)
        if len(frame) < TAG_BYTES + SEQ.size:
            self._refuse(f"message {self._received} is not an authenticated frame ({len(frame)} bytes)")
        tag, seq, payload = frame[:TAG_BYTES], frame[TAG_BYTES:TAG_BYTES + SEQ.size], frame[TAG_BYTES + SEQ.size:]
        if not hmac.compare_digest(tag, self._tag(seq, self._in, payload)):
            self._refuse(f"message {self._received} failed authentication (bad tag: altered, forged or unframed)")
        number = SEQ.unpack(seq)[0]
        if number != self._received:
            self._refuse(f"message {number} arrived where message {self._received} was due (replayed or reordered)")
        self._received += 1
        return ForkingPickler.loads(payload)

    def _refuse(self, why: str):
        self.close()
        raise FrameError(f"{why}: refused, connection closed")

    def poll(self, timeout: float = 0.0) -> bool:
        return self.conn.poll(timeout)

    def fileno(self) -> int:
        return self.conn.fileno()

    def close(self) -> None:
        self.conn.close()

    @property
    def closed(self) -> bool:
        return self.conn.closed

    # -- handing the session to a spawned engine -------------------------------------------
    def handover(self, fd: int) -> None:
        """Write this session's state (key, counters, direction) to ``fd`` and close it; the
        process that reads it with ``taken_over`` continues the conversation."""
        with os.fdopen(fd, "wb") as pipe:
            pipe.write(_STATE.pack(self._key, self._sent, self._received, self._out))

    @classmethod
    def taken_over(cls, conn: Connection, fd: int) -> Channel:
        """The session an agent handed over through ``fd``, on ``conn`` (blocks until the agent
        has written it: it does so after its own last message, so the counters are final)."""
        with os.fdopen(fd, "rb") as pipe:
            data = pipe.read()
        if len(data) != _STATE.size:
            raise FrameError(f"the agent handed over no session ({len(data)} bytes)")
        key, sent, received, direction = _STATE.unpack(data)
        return cls(conn, key, direction, sent, received)
