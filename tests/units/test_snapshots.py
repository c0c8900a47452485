"""The arrays an engine keeps in a snapshot file (suite/common/snapshots.py) and how they cross the pipe
(suite/common/protocol.py): kept arrays are the file's bytes, of their own dtype and shape; a local copy
equal bit for bit to the first is the first; a kept array crosses as its file and place, and the reading
side's array is a read-only view of the file's one map, whose file is unlinked once read; only a pipe that
names the folder takes them."""

from __future__ import annotations

import os

import numpy as np
import pytest

from suite.common import protocol
from suite.common.snapshots import Snapshots, same_bits
from suite.harness.judging.judgment import Check


def _pipe(files=None):
    r, w = os.pipe()
    return protocol.reader(r, files), protocol.writer(w)


def _root(a):
    """The buffer an array's views end in."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a.obj if isinstance(a, memoryview) else a


def test_kept_arrays_are_the_files_bytes_in_their_own_dtype_and_shape(tmp_path):
    store = Snapshots(str(tmp_path), least=64)
    big = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    small = np.arange(3, dtype=np.float32)  # 12 bytes: under ``least``, kept as it is
    halves = np.arange(64, dtype=np.float16)
    kept = [store.keep(a) for a in (big, small, halves, np.asfortranarray(big))]
    store.close()
    check = Check("snapshots")
    check.equal([type(k).__name__ for k in kept], ["Kept", "ndarray", "Kept", "Kept"], "what keep returned")
    for k, a in zip(kept, (big, small, halves, big)):
        got = np.asarray(k)
        check.equal((got.dtype.str, got.shape, k.nbytes), (a.dtype.str, a.shape, a.nbytes),
                    "a kept array's dtype, shape and bytes")
        check.that(np.array_equal(got, a), "a kept array's values", got.ravel()[:4].tolist(), "those given")
    check.equal(os.path.getsize(store.path), big.nbytes * 2 + halves.nbytes, "the file's bytes (the kept arrays')")
    check.equal(store.written, big.nbytes * 2 + halves.nbytes, "the bytes the store says it wrote")
    check.equal(Snapshots(None).keep(big).__class__.__name__, "ndarray", "keep without a folder (an engine elsewhere)")


def test_a_copy_equal_bit_for_bit_to_the_first_is_the_first(tmp_path):
    store = Snapshots(str(tmp_path), least=0)
    a = np.linspace(0, 1, 50, dtype=np.float32)
    b = a.copy()
    c = a.copy()
    c[7] = np.nextafter(c[7], np.float32(2))  # one ulp apart
    nan = np.array([np.nan, 1.0], np.float64)
    copies = store.copies([a, b, c])
    check = Check("snapshots")
    check.that(copies[1] is copies[0], "the second copy (the same bits)", "another array", "the first's array")
    check.that(copies[2] is not copies[0] and np.array_equal(np.asarray(copies[2]), c), "the third copy (one ulp apart)",
               "the first's array", "its own, equal to it")
    check.equal(store.written, 2 * a.nbytes, "bytes written for three copies, two of them the same")
    check.that(same_bits(nan, nan.copy()), "two NaN arrays of the same bits", False, "the same bits")
    check.that(not same_bits(a, a.astype(np.float64)), "float32 against float64 of the same values", True,
               "not the same bits")
    check.that(not same_bits(a, a.reshape(5, 10)), "two shapes of the same bytes", True, "not the same bits")
    check.equal(store.copies([]), [], "no copies")


def test_a_kept_array_crosses_the_pipe_as_its_place_and_its_file_goes_once_read(tmp_path):
    store = Snapshots(str(tmp_path), least=0)
    source = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
    weights = store.keep(source)
    kept = store.copies([np.ones((2, 3)), np.ones((2, 3))])
    store.close()
    inline = np.arange(5)
    reading, writing = _pipe(str(tmp_path))
    sent = writing.send({"w": weights, "copies": kept, "inline": inline})
    got = reading.recv(deadline=float("inf"))
    check = Check("snapshots", case={"file": "kept under the pipe's folder"})
    check.that(sent < 2000, "bytes written to the pipe for 1 MiB kept", sent, "a few hundred (the places, not the bytes)")
    check.equal(reading.received, sent, "bytes read off the pipe")
    check.equal(reading.mapped, weights.nbytes + kept[0].nbytes, "bytes mapped from the file (the copies once)")
    check.that(np.array_equal(got["w"], source) and got["w"].dtype == np.float32,
               "the kept array received", got["w"][:3].tolist(), "its values, float32")
    with pytest.raises(ValueError):
        got["w"][0] = 1.0  # read-only: a reader cannot change what another reads
    check.that(type(_root(got["w"])).__name__ == "mmap" and _root(got["w"]) is _root(got["copies"][0]),
               "the arrays received from one file", "over buffers of their own", "views of one map")
    check.that(got["copies"][0] is got["copies"][1], "the two copies received", "two arrays", "one array twice")
    check.that(np.array_equal(got["inline"], inline), "the array not kept", got["inline"].tolist(), "sent in its bytes")
    check.equal(os.listdir(tmp_path), [], "the folder once the message was read (its file unlinked)")
    check.equal(float(got["w"][-1]), float((1 << 18) - 1), "the last value, read after the unlink (the map holds it)")


def test_a_pipe_takes_kept_arrays_only_from_its_own_folder(tmp_path):
    store = Snapshots(str(tmp_path / "engine"), least=0)
    (tmp_path / "engine").mkdir()
    kept = store.keep(np.ones(4))
    store.close()
    for files in (None, str(tmp_path / "elsewhere")):
        reading, writing = _pipe(files)
        writing.send(kept)
        with pytest.raises(protocol.BadFrame, match="outside the folder of this pipe's snapshots"):
            reading.recv(deadline=float("inf"))
    Check("snapshots").equal(os.listdir(tmp_path / "engine"), [os.path.basename(store.path)],
                             "the folder after two refusals (nothing unlinked)")
