"""Messages between the pytest process and engine processes (no TensorFlow here).

Each side holds a ``multiprocessing.connection.Connection`` over an OS pipe. Requests and
replies are tuples of plain data (numbers, strings, numpy arrays, nested dicts/lists):

    parent -> engine   ("call", probe_name, kwargs) | ("exit",)
    engine -> parent   ("ready", info) | ("ok", result, {"restart": bool}) | ("error", Raised, traceback)
                       | ("fatal", message)   # the engine cannot start (e.g. no TensorFlow)

``info`` is an EngineInfo (a ServerInfo for a process that only serves), ``result`` a record of
suite/common/results.py or plain data, and an exception a probe raised comes back as a ``Raised``
(type name, message, where). ``restart`` asks the parent to replace the engine after this call (its cluster is unusable).

Arrays and numpy scalars travel as dtype, shape and bytes (``_array``, ``_scalar``), not as numpy's
own pickles: those name numpy's private modules (``numpy._core`` since numpy 2, ``numpy.core``
before), so a numpy 2 parent's arrays would not unpickle in an engine with numpy < 1.26 (TF 2.12
and 2.13 need numpy <= 1.24.3), and the version matrix runs such engines from one parent.
"""

from __future__ import annotations

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

CALL = "call"
EXIT = "exit"
READY = "ready"
OK = "ok"
ERROR = "error"
FATAL = "fatal"


def reader(fd: int) -> Connection:
    return Connection(fd, readable=True, writable=False)


def writer(fd: int) -> Connection:
    return Connection(fd, readable=False, writable=True)


def duplex(fd: int) -> Connection:
    """Both ways over one descriptor (an engine agent's socket)."""
    return Connection(fd)
