"""Messages between the pytest process and engine processes (no TensorFlow here).

Each side holds a ``multiprocessing.connection.Connection`` over an OS pipe. Requests and
replies are tuples of plain data (numbers, strings, numpy arrays, nested dicts/lists):

    parent -> engine   ("call", request, probe_name, kwargs) | ("exit",)
    engine -> parent   ("ready", info) | ("ok", request, result, {"restart": bool})
                       | ("error", request, Raised, traceback)
                       | ("fatal", message)   # the engine cannot start (e.g. no TensorFlow)
                       | ("progress", request, text)   # where a long call is, before its reply

``request`` is the call's number, which its reply echoes: the parent takes a reply to another
request as a channel out of step and never uses that engine again. The parent reads each message
with ``receive``: a deadline on the whole frame, its length read (and capped) before its body.

``info`` is an EngineInfo (a ServerInfo for a process that only serves), ``result`` a record of
suite/common/results.py or plain data, and an exception a probe raised comes back as a ``Raised``
(type name, message, where). ``restart`` asks the parent to replace the engine after this call (its cluster is unusable). A
probe may send ``progress`` messages while it runs (EngineContext.progress: a script's run at each
step); the parent shows them and goes on waiting for the reply.

Arrays and numpy scalars travel as dtype, shape and bytes (``_array``, ``_scalar``), not as numpy's
own pickles: those name numpy's private modules (``numpy._core`` since numpy 2, ``numpy.core``
before), so a numpy 2 parent's arrays would not unpickle in an engine with numpy < 1.26 (TF 2.12
and 2.13 need numpy <= 1.24.3), and the version matrix runs such engines from one parent.
"""

from __future__ import annotations

import os
import select
import signal
import struct
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler

try:
    import numpy as np
except ImportError:  # an interpreter without numpy has no TensorFlow either: its engine says so at start
    np = None


def _array(dtype: str, shape: tuple, data: bytes):
    """An ndarray rebuilt from its dtype string, shape and C-order bytes (writable)."""
    return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape).copy()


def _scalar(dtype: str, data: bytes):
    return np.frombuffer(data, dtype=np.dtype(dtype))[0]


def _reduce_array(a):
    if a.dtype.hasobject:
        return np.array, (a.tolist(), object)
    return _array, (a.dtype.str, a.shape, a.tobytes())


def _reduce_scalar(x):
    a = np.asarray(x)
    return _scalar, (a.dtype.str, a.tobytes())


if np is not None:
    ForkingPickler.register(np.ndarray, _reduce_array)
    for _type in {np.dtype(code).type for code in "?bBhHiIlLqQefdgFDG"} | {np.str_, np.bytes_}:
        ForkingPickler.register(_type, _reduce_scalar)

# the signal on which an engine writes every thread's stack to its log (faulthandler), which the
# parent sends before it kills an engine that did not answer in time
STACKS_SIGNAL = signal.SIGUSR1

CALL = "call"
EXIT = "exit"
READY = "ready"
OK = "ok"
ERROR = "error"
FATAL = "fatal"
PROGRESS = "progress"


def reader(fd: int) -> Connection:
    return Connection(fd, readable=True, writable=False)


def writer(fd: int) -> Connection:
    return Connection(fd, readable=False, writable=True)


def duplex(fd: int) -> Connection:
    """Both ways over one descriptor (an engine agent's socket)."""
    return Connection(fd)


# the longest reply the parent reads (a probe's arrays are far smaller): a longer length is a garbled frame
MAX_MESSAGE = 1 << 30


class FrameTimeout(TimeoutError):
    """The deadline passed before a whole message arrived (``got`` bytes of it had)."""

    def __init__(self, message: str, got: int):
        super().__init__(message)
        self.got = got


class BadFrame(ConnectionError):
    """What arrived is not a message: a length over the cap, a frame cut short, a body that does not unpickle."""


def receive(conn: Connection, deadline: float, cap: int = MAX_MESSAGE):
    """The next message on ``conn`` (a pipe Connection; the frames ``Connection.send`` writes), read
    by ``time.monotonic()`` ``deadline``: FrameTimeout if it has not arrived whole by then, EOFError
    if the writer closed before a message began, BadFrame for anything that is not a message."""
    body = receive_bytes(conn, deadline, cap)
    try:
        return ForkingPickler.loads(body)
    except Exception as exc:
        raise BadFrame(f"a message of {len(body)} bytes that does not unpickle ({type(exc).__name__}: {exc})") from None


def receive_bytes(conn: Connection, deadline: float, cap: int = MAX_MESSAGE) -> bytes:
    """The body of the next frame on ``conn`` (a pipe's or a socket's), its length read first and
    capped, the whole by ``deadline`` (the errors of ``receive``, but for unpickling)."""
    fd = conn.fileno()
    header = _read(fd, 4, deadline, start=True)
    (length,) = struct.unpack("!i", header)
    if length == -1:  # Connection's header for a message over 2 GiB: the length follows
        (length,) = struct.unpack("!Q", _read(fd, 8, deadline))
    if not 0 <= length <= cap:
        raise BadFrame(f"a message of {length} bytes (at most {cap} are read)")
    return _read(fd, length, deadline)


def _read(fd: int, n: int, deadline: float, start: bool = False) -> bytes:
    """Exactly ``n`` bytes of ``fd`` by ``deadline``. ``start``: the first bytes of a message, where
    an end of file is the writer closing (EOFError), not a message cut short (BadFrame)."""
    chunks, got = [], 0
    while got < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise FrameTimeout(f"{got} of {n} bytes arrived before the deadline", got)
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            if start and got == 0:
                raise EOFError
            raise BadFrame(f"the message was cut short ({got} of {n} bytes, then the end of the pipe)")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
