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

A message is written by ``send`` and read by ``receive``: its pickle (protocol 5) in one frame of at
most ``CHUNK`` bytes, and its arrays' bytes beside it, out of band (PEP 574): the frame says how many
bytes each array has, and they follow it on the pipe, written from the arrays themselves in pieces of
at most ``CHUNK`` and read into one buffer each, so no copy of a large reply is ever made on either
side and no read is longer than ``CHUNK``. A pickle over ``CHUNK`` (a reply of many small Python
objects) is not sent: ``send`` raises ``TooLarge`` naming its largest parts, and the engine answers
with that error. Connection.send's frames (an agent's channel, which authenticates each frame) carry
the arrays in band, in one frame of at most ``MAX_MESSAGE``.

An engine may keep a run's large arrays in a file of the pool's snapshot folder rather than in its memory
(suite/common/snapshots.py): such an array is sent as the file's name and the array's place in it
(``_mapped``), and the parent maps the file once, read-only, its arrays views of the map, and unlinks it
once the message is read (the map keeps the bytes while an array needs them). Only a pipe whose reading end names that folder
(``PipeEnd(files=...)``) accepts such arrays, and only files directly in it.

Arrays and numpy scalars travel as dtype, shape and bytes (``_array``, ``_scalar``), not as numpy's
own pickles: those name numpy's private modules (``numpy._core`` since numpy 2, ``numpy.core``
before), so a numpy 2 parent's arrays would not unpickle in an engine with numpy < 1.26 (TF 2.12
and 2.13 need numpy <= 1.24.3), and the version matrix runs such engines from one parent.
"""

from __future__ import annotations

import contextlib
import contextvars
import copyreg
import io
import math
import mmap
import os
import pickle
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


def _array(dtype: str, shape: tuple, data):
    """An ndarray rebuilt from its dtype string, shape and C-order bytes (writable): over the bytes
    themselves where they are a writable buffer (an array that came out of band), else a copy."""
    a = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)
    return a if a.flags.writeable else a.copy()


def _scalar(dtype: str, data: bytes):
    return np.frombuffer(data, dtype=np.dtype(dtype))[0]


def _reduce_array(a):
    if a.dtype.hasobject:
        return np.array, (a.tolist(), object)
    return _array, (a.dtype.str, a.shape, a.tobytes())


def _reduce_array_out_of_band(a):
    """As ``_reduce_array``, its bytes a PickleBuffer over the array's own memory: out of band under ``send``."""
    if a.dtype.hasobject:
        return np.array, (a.tolist(), object)
    return _array, (a.dtype.str, a.shape, pickle.PickleBuffer(np.ascontiguousarray(a)))


# the engine's variable naming the folder where its probes keep large arrays (the pool's, for its local engines)
SNAPSHOTS_ENV = "TFDS_SNAPSHOTS"

# while ``receive`` unpickles a message: its pipe's snapshot folder, each file mapped (path -> mmap) and
# the bytes of the arrays taken from them
_RECEIVING: contextvars.ContextVar = contextvars.ContextVar("tfds_receiving", default=None)


def _mapped(path: str, offset: int, dtype: str, shape: tuple):
    """An array an engine kept in a snapshot file (suite/common/snapshots.py), read-only over the file's one
    map (only a file directly in the folder of the pipe's snapshots): its bytes stay in the page cache, and
    the map (with its descriptor) goes when the last of its arrays does."""
    receiving = _RECEIVING.get()
    if receiving is None or receiving[0] is None or os.path.dirname(os.path.abspath(path)) != receiving[0]:
        raise ValueError(f"an array kept in {path}, outside the folder of this pipe's snapshots")
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    if not count:
        return np.zeros(shape, dtype)
    if path not in receiving[1]:
        with open(path, "rb") as f:
            receiving[1][path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    receiving[2] += count * dtype.itemsize
    return np.frombuffer(receiving[1][path], dtype, count, offset).reshape(shape)


def _reduce_scalar(x):
    a = np.asarray(x)
    return _scalar, (a.dtype.str, a.tobytes())


_OUT_OF_BAND: dict = {}  # send's reducers: copyreg's, and numpy's types as below, arrays out of band
if np is not None:
    ForkingPickler.register(np.ndarray, _reduce_array)
    _OUT_OF_BAND[np.ndarray] = _reduce_array_out_of_band
    for _type in {np.dtype(code).type for code in "?bBhHiIlLqQefdgFDG"} | {np.str_, np.bytes_}:
        ForkingPickler.register(_type, _reduce_scalar)
        _OUT_OF_BAND[_type] = _reduce_scalar

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


class PipeEnd:
    """One end of an engine's pipe, as ``send`` writes and ``receive`` reads it (arrays out of band), with
    the ``send``/``recv``/``poll``/``fileno``/``close`` of a ``multiprocessing.connection.Connection``."""

    def __init__(self, conn: Connection, files: str | None = None):
        self.conn, self.files = conn, None if files is None else os.path.abspath(files)
        self.sent = self.received = self.mapped = 0  # bytes: written, read off the pipe, mapped from snapshots

    def send(self, msg) -> int:
        n = send(self.conn, msg)
        self.sent += n
        return n

    def recv(self, deadline: float = float("inf")):
        return receive(self, deadline, CHUNK)

    def poll(self, timeout: float = 0.0) -> bool:
        return self.conn.poll(timeout)

    def fileno(self) -> int:
        return self.conn.fileno()

    def close(self) -> None:
        self.conn.close()


def reader(fd: int, files: str | None = None) -> PipeEnd:
    """``files``: the folder of the snapshots whose arrays may come over it (PipeEnd)."""
    return PipeEnd(Connection(fd, readable=True, writable=False), files)


def writer(fd: int) -> PipeEnd:
    return PipeEnd(Connection(fd, readable=False, writable=True))


def duplex(fd: int) -> Connection:
    """Both ways over one descriptor (an engine agent's socket)."""
    return Connection(fd)


# the longest frame ``send`` writes and ``receive`` reads: a message's pickle, less its arrays (a longer
# length is a garbled frame or a reply of too many small objects)
CHUNK = 64 << 20
# the longest frame of Connection.send (arrays in band: an agent's channel); a longer length is a garbled frame
MAX_MESSAGE = 1 << 30
# a message's arrays out of band, at most: more is a garbled frame (the bytes of a real reply are in memory
# on the engine's side already)
MAX_ARRAYS = 1 << 40
OUT_OF_BAND = b"TFDS-OOB"  # a frame that begins so: "!I" its arrays' count, "!Q" each one's bytes, the pickle


class FrameTimeout(TimeoutError):
    """The deadline passed before a whole message arrived (``got`` bytes of it had)."""

    def __init__(self, message: str, got: int):
        super().__init__(message)
        self.got = got


class BadFrame(ConnectionError):
    """What arrived is not a message: a length over the cap, a frame cut short, a body that does not unpickle."""


class TooLarge(ValueError):
    """A message whose pickle, less its arrays, is over ``CHUNK``: raised by ``send`` before anything is
    written, its text naming the bound and the message's largest parts."""


def _pickled(msg, buffers: list | None) -> bytes:
    f = io.BytesIO()
    p = pickle.Pickler(f, 5, buffer_callback=None if buffers is None else buffers.append)
    p.dispatch_table = {**copyreg.dispatch_table, **_OUT_OF_BAND}
    p.dump(msg)
    return f.getvalue()


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n} bytes"


def largest_parts(obj, top: int = 3, depth: int = 2) -> list:
    """``obj``'s parts by the bytes of their pickles (arrays in band), largest first, as ``(path, bytes)``:
    a record's or object's fields, a dict's keys, a sequence's items (of one of at most 1000); the largest
    part's own parts in its place while it has any and ``depth`` allows (what made a message too large)."""
    if isinstance(obj, dict):
        items = [(f"[{k!r}]", v) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple)):
        items = [(f"[{i}]", v) for i, v in enumerate(obj)]
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = [(f".{k}", v) for k, v in vars(obj).items()]
    else:
        return []
    if len(items) > 1000:  # a long sequence: named whole (by its caller), not item by item
        return []
    sized = sorted(((path, len(_pickled(v, [])), v) for path, v in items), key=lambda t: -t[1])[:top]
    if sized and depth > 0:
        inner = largest_parts(sized[0][2], top, depth - 1)
        if inner:
            return [(sized[0][0] + path, n) for path, n in inner] + [(p, n) for p, n, _ in sized[1:]]
    return [(path, n) for path, n, _ in sized]


def send(conn: Connection, msg) -> int:
    """``msg`` written to ``conn`` (a pipe's writing end) as ``receive`` reads it: its pickle in one frame,
    its arrays' bytes after it in pieces of at most ``CHUNK``; the bytes written. TooLarge, with nothing
    written, if the pickle less its arrays is over ``CHUNK``."""
    buffers: list = []
    body = _pickled(msg, buffers)
    if len(body) > CHUNK:
        parts = ", ".join(f"{path} {_size(n)}" for path, n in largest_parts(msg))
        raise TooLarge(f"a message whose pickle is {_size(len(body))} beside its arrays, over the bound of "
                       f"{_size(CHUNK)}; its largest parts: {parts}")
    views = [b.raw() for b in buffers]
    if views:
        body = OUT_OF_BAND + struct.pack(f"!I{len(views)}Q", len(views), *(v.nbytes for v in views)) + body
    conn.send_bytes(body)
    fd = conn.fileno()
    for view in views:
        for start in range(0, view.nbytes, CHUNK):
            piece = view[start:start + CHUNK]
            while piece.nbytes:
                piece = piece[os.write(fd, piece):]
    return 4 + len(body) + sum(v.nbytes for v in views)


def receive(conn, deadline: float, cap: int = MAX_MESSAGE):
    """The next message on ``conn`` (a pipe Connection; what ``send`` writes, or ``Connection.send``'s
    frame of at most ``cap``), read by ``time.monotonic()`` ``deadline``: FrameTimeout if it has not
    arrived whole by then, EOFError if the writer closed before a message began, BadFrame for anything
    that is not a message."""
    files, end = None, conn if isinstance(conn, PipeEnd) else None
    if end is not None:
        conn, files = end.conn, end.files
    body = receive_bytes(conn, deadline, cap)
    if end is not None:
        end.received += 4 + len(body)
    buffers = []
    if body[:len(OUT_OF_BAND)] == OUT_OF_BAND:
        at = len(OUT_OF_BAND)
        try:
            (n,) = struct.unpack_from("!I", body, at)
            sizes = struct.unpack_from(f"!{n}Q", body, at + 4)
        except struct.error:
            raise BadFrame("a frame of arrays out of band whose sizes are cut short") from None
        if sum(sizes) > MAX_ARRAYS:
            raise BadFrame(f"a message whose arrays have {sum(sizes)} bytes (at most {MAX_ARRAYS} are read)")
        body = body[at + 4 + 8 * n:]
        for size in sizes:
            buffers.append(bytearray(size))
            _read_into(conn.fileno(), memoryview(buffers[-1]), deadline)
            if end is not None:
                end.received += size
    receiving = [files, {}, 0]  # the folder, the files mapped, their arrays' bytes
    token = _RECEIVING.set(receiving)
    try:
        return pickle.loads(body, buffers=buffers)
    except Exception as exc:
        raise BadFrame(f"a message of {len(body)} bytes that does not unpickle ({type(exc).__name__}: {exc})") from None
    finally:
        _RECEIVING.reset(token)
        if end is not None:
            end.mapped += receiving[2]
        for path in receiving[1]:  # its arrays are mapped: the file goes when they do
            with contextlib.suppress(OSError):
                os.unlink(path)


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


def _timeout(remaining: float) -> float | None:
    return None if remaining == float("inf") else remaining


def _read_into(fd: int, view: memoryview, deadline: float) -> None:
    """``view`` filled from ``fd`` by ``deadline`` (an array's bytes after its message's frame), in reads of at
    most ``CHUNK``."""
    got, n = 0, view.nbytes
    while got < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], _timeout(remaining))[0]:
            raise FrameTimeout(f"{got} of an array's {n} bytes arrived before the deadline", got)
        read = os.readv(fd, [view[got:got + CHUNK]])
        if not read:
            raise BadFrame(f"the message was cut short ({got} of an array's {n} bytes, then the end of the pipe)")
        got += read


def _read(fd: int, n: int, deadline: float, start: bool = False) -> bytes:
    """Exactly ``n`` bytes of ``fd`` by ``deadline``. ``start``: the first bytes of a message, where
    an end of file is the writer closing (EOFError), not a message cut short (BadFrame)."""
    chunks, got = [], 0
    while got < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], _timeout(remaining))[0]:
            raise FrameTimeout(f"{got} of {n} bytes arrived before the deadline", got)
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            if start and got == 0:
                raise EOFError
            raise BadFrame(f"the message was cut short ({got} of {n} bytes, then the end of the pipe)")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
