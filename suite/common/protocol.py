"""Messages between the pytest process and engine processes (no TensorFlow here).

Each side holds a ``multiprocessing.connection.Connection`` over an OS pipe. Requests and
replies are tuples of plain data (numbers, strings, numpy arrays, nested dicts/lists):

    parent -> engine   ("call", probe_name, kwargs) | ("exit",)
    engine -> parent   ("ready", info) | ("ok", result, {"restart": bool}) | ("error", Raised, traceback)
                       | ("fatal", message)   # the engine cannot start (e.g. no TensorFlow)

``info`` is an EngineInfo (a ServerInfo for a process that only serves), ``result`` a record of
suite/common/results.py or plain data, and an exception a probe raised comes back as a ``Raised``
(type name, message, where). ``restart`` asks the parent to replace the engine after this call (its cluster is unusable).
"""

from __future__ import annotations

from multiprocessing.connection import Connection

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
