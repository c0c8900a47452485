"""A probe's large arrays kept in a file, not in the engine's memory nor in its reply.

A script's run reads every variable's every local copy at every step boundary, and each replica's
gradients at every step: for a model of 100M float32 parameters trained with Adam, some 5 GB in three
steps. ``Snapshots.keep`` writes an array of at least ``least`` bytes (``TFDS_SNAPSHOT_MIN``, 64 KiB) to
the call's file in the pool's snapshot folder (``TFDS_SNAPSHOTS``, set by the pool for its local engines)
and hands back a ``Kept``: the file, the array's place in it, its dtype and shape. The engine's memory
holds none of it once written (the page cache does); ``np.asarray(kept)`` reads it back where the engine
needs the values; pickled, a Kept is that place (suite/common/protocol.py), and the parent maps the file.
Smaller arrays, and every array where no folder is given (an engine on another host), stay as they are.

``copies`` keeps a variable's local copies: a copy equal bit for bit to the first is the first's Kept, so
a mirrored variable whose replicas agree is written, sent and compared once (the parent's list names it
once per replica). Arrays keep their dtype (float32 stays float32). Engines use it (the script and workload
probes); it is here, in common, for tests to reach without TensorFlow. numpy is imported where it is used:
an engine imports this package before it can say that its interpreter lacks numpy.
"""

from __future__ import annotations

import math
import os
import tempfile
import threading

from . import protocol
from .protocol import SNAPSHOTS_ENV as FOLDER_ENV

LEAST_ENV = "TFDS_SNAPSHOT_MIN"
LEAST = 64 << 10  # bytes: a smaller array stays in memory and goes in the reply
# bytes a run kept beyond which its engine is replaced after the call (EngineContext.replace_after): TensorFlow
# holds on to memory of the run's size once its objects are gone (its allocators' pools; measured: a reference
# of a 100M-parameter MLP kept 2.4 GB after its run, and its second run in the same engine peaked 1.5 GB
# higher), and a fresh engine forks from its fork server in about a second
REPLACE_AFTER = 256 << 20


def _c_order(a):
    """``a`` as a C-ordered array of its own shape (np.ascontiguousarray makes a 0-d array 1-d)."""
    import numpy as np

    a = np.asarray(a)
    return a if a.flags.c_contiguous else a.copy(order="C")


def same_bits(a, b) -> bool:
    """Whether two arrays have the same dtype, shape and bytes (NaNs of the same bits are the same)."""
    import numpy as np

    a, b = _c_order(a), _c_order(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.hasobject:
        return bool(np.array_equal(a, b))
    return bool(np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)))


class Kept:
    """An array written to a snapshot file: ``path``, the byte ``offset`` it begins at, its ``dtype`` (a
    numpy dtype string) and ``shape``. ``np.asarray`` reads its values (a copy); pickled, it is its place."""

    __slots__ = ("path", "offset", "dtype", "shape")

    def __init__(self, path: str, offset: int, dtype: str, shape: tuple):
        self.path, self.offset, self.dtype, self.shape = path, offset, dtype, tuple(shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        import numpy as np

        return self.size * np.dtype(self.dtype).itemsize

    def __array__(self, dtype=None, copy=None):
        import numpy as np

        a = np.fromfile(self.path, np.dtype(self.dtype), self.size, offset=self.offset).reshape(self.shape)
        return a if dtype is None else a.astype(dtype)

    def __reduce__(self):
        return protocol._mapped, (self.path, self.offset, self.dtype, self.shape)

    def __repr__(self) -> str:
        return f"Kept({self.path!r}, {self.offset}, {self.dtype!r}, {self.shape})"


class Snapshots:
    """One probe call's kept arrays (one file, made at the first kept). ``folder``/``least``: as the
    engine's environment says unless given (folder None or "": keep nothing)."""

    def __init__(self, folder: str | None = None, least: int | None = None):
        self.folder = (os.environ.get(FOLDER_ENV) if folder is None else folder) or None
        self.least = int(os.environ.get(LEAST_ENV) or LEAST) if least is None else least
        self.path: str | None = None
        self.written = 0  # bytes
        self._file = None
        self._lock = threading.Lock()  # gradients are kept from TensorFlow's threads (a traced step's py_function)

    def keep(self, array):
        """``array`` as the run keeps it: written to the file, as a Kept, where it has at least ``least`` bytes
        and a folder is given; else itself (C-ordered)."""
        import numpy as np

        a = _c_order(array)
        if self.folder is None or a.nbytes < self.least or a.dtype.hasobject:
            return a
        with self._lock:
            if self._file is None:
                fd, self.path = tempfile.mkstemp(suffix=".bin", prefix=f"{os.getpid()}-", dir=self.folder)
                self._file = os.fdopen(fd, "wb")
            offset = self._file.tell()
            self._file.write(a.reshape(-1).view(np.uint8).data)
            self._file.flush()
            self.written += a.nbytes
        return Kept(self.path, offset, a.dtype.str, a.shape)

    def copies(self, arrays: list) -> list:
        """A variable's local copies, kept: each copy equal bit for bit to the first is the first's array."""
        if not arrays:
            return []
        first = self.keep(arrays[0])
        return [first] + [first if same_bits(a, arrays[0]) else self.keep(a) for a in arrays[1:]]

    def large(self) -> bool:
        """Whether the run kept so much that its engine is better replaced after it (``REPLACE_AFTER``)."""
        return self.written >= REPLACE_AFTER

    def close(self) -> None:
        """No more arrays (the parent unlinks the file once it has mapped it)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
