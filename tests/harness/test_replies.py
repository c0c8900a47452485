"""Replies matched to requests: every engine call is numbered and its reply echoes the number; a
call interrupted between its request and its reply (a signal handler that raises, Ctrl-C) retires
the engine, so no later call reads an earlier call's reply; a reply to another request, a frame cut
short, a garbled frame and a frame longer than the cap each fail the call at once (or by its
deadline) and the engine is replaced. The faults are injected from outside the engine: a raw
request on its pipe, or bytes written into its reply pipe through /proc."""

from __future__ import annotations

import os
import pickle
import signal
import struct
import time

import pytest

from suite.common import protocol
from suite.common.specs import parse_spec
from suite.harness.judging.judgment import Check
from suite.harness.pool.pool import EngineDied, EngineTimeout
from tests.harness.faults import Interrupted, reply_pipe
from tests.helpers import alive, check_replaced

SPEC = parse_spec("default")


def _raise_interrupted(signum, frame):  # a SIGALRM handler that raises, as pytest-timeout's signal method does
    raise Interrupted("alarm")


def test_an_interrupted_call_retires_the_engine_and_the_next_call_gets_its_own_reply(pool):
    """engine.sleep(seconds=3) interrupted by a SIGALRM handler that raises after 1 s: the call
    ends with that exception, every process of the engine is gone, and the next calls (ping, then
    info) return their own replies from a new engine, not the sleep's 3.0 and the ping's."""
    old = pool.get(SPEC).pids()
    previous = signal.signal(signal.SIGALRM, _raise_interrupted)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        with pytest.raises(Interrupted):
            pool.call(SPEC, "engine.sleep", seconds=3)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    check = Check(SPEC, case={"interrupted": "engine.sleep(seconds=3) after 1 s"})
    check.equal([p for p in old if alive(p)], [], "processes of the interrupted engine still alive")
    ping = pool.call(SPEC, "engine.ping")[0]
    check.equal(type(ping).__name__, "Ping", "what the next call (engine.ping) returned")
    check.that(ping.pid not in old, "the pid the ping reports", ping.pid, f"a new engine's (the old had {old})")
    info = pool.call(SPEC, "engine.info")[0]
    check.equal(type(info).__name__, "EngineInfo", "what the call after it (engine.info) returned")


def test_a_reply_to_another_request_fails_the_call_and_retires_the_engine(pool):
    """A request the pool did not await (sent raw on the engine's pipe, as an interrupted call
    leaves one): its reply arrives where the next call's is awaited; the call fails naming both
    requests and the engine is replaced, where a channel without numbers would hand the ping the
    sleep's result."""
    engine = pool.get(SPEC)
    old = engine.pids()
    engine.procs[0].send_conn.send((protocol.CALL, 10_000, "engine.sleep", {"seconds": 0.2}))
    with pytest.raises(EngineDied) as info:
        pool.call(SPEC, "engine.ping")
    check = Check(SPEC)
    check.contains(str(info.value), ["'default'", "the reply to request 10000", "'engine.ping'", "out of step"],
                   "the error of a reply to another request")
    check_replaced(check, pool, SPEC, old)


# what is written into the reply pipe while the engine sleeps, and what the call must then say
FRAMES = {
    "cut short": (struct.pack("!i", 100) + b"0123456789", EngineTimeout, "did not finish it within 3s"),
    "garbled": (struct.pack("!i", 5) + b"\x00garb", EngineDied, "does not unpickle"),
    "over the cap": (struct.pack("!i", protocol.CHUNK + 1), EngineDied, f"at most {protocol.CHUNK}"),
    # a frame of arrays out of band (protocol.send): one array of 100 bytes said, 10 come; more bytes than are read
    "arrays cut short": ((lambda body: struct.pack("!i", len(body)) + body + b"0123456789")(
        protocol.OUT_OF_BAND + struct.pack("!IQ", 1, 100) + pickle.dumps(None)), EngineTimeout,
        "10 of an array's 100 bytes"),
    "arrays over the cap": ((lambda body: struct.pack("!i", len(body)) + body)(
        protocol.OUT_OF_BAND + struct.pack("!IQ", 1, protocol.MAX_ARRAYS + 1) + pickle.dumps(None)), EngineDied,
        f"at most {protocol.MAX_ARRAYS} are read"),
    "another kind": ((lambda body: struct.pack("!i", len(body)) + body)(pickle.dumps(("ready", None))), EngineDied,
                     "a 'ready' message while request"),
}


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to reach an engine's pipe")
@pytest.mark.parametrize("frame", sorted(FRAMES))
def test_a_bad_frame_fails_the_call_by_its_deadline_and_replaces_the_engine(pool, frame):
    """A frame cut short (its length says 100 bytes, 10 come), a body that does not unpickle, a
    length over the cap, a message of another kind: the call fails (the cut frame by the call's
    deadline, the others at once), saying what arrived, and the next call gets a new engine."""
    data, error, says = FRAMES[frame]
    engine = pool.get(SPEC)
    old = engine.pids()
    fd = reply_pipe(engine.procs[0])
    check = Check(SPEC, case={"frame": frame})
    check.that(fd is not None, "the engine's reply pipe", "not found among its descriptors", "found through /proc")
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    start = time.monotonic()
    with pytest.raises(error) as info:
        pool.call(SPEC, "engine.sleep", seconds=30, timeout=3, retries=0)
    elapsed = time.monotonic() - start
    check.contains(str(info.value), ["'default'", "'engine.sleep'", says], f"the error of a frame {frame}")
    check.that(elapsed < 10, "seconds until the call failed", elapsed, "under 10 (its deadline is 3 s)")
    check_replaced(check, pool, SPEC, old)


DUMP = """Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/usr/lib/python3.11/threading.py", line 975 in run

Current thread 0x00007f0000000001 (most recent call first):
  File "/venv/lib/python3.11/site-packages/tensorflow/python/eager/execute.py", line 53 in quick_execute
  File "/venv/lib/python3.11/site-packages/tensorflow/python/eager/function.py", line 251 in call_flat
  File "/home/me/train.py", line 40 in train_epoch
  File "/home/me/train.py", line 55 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "{suite}/engine/script.py", line 900 in run_script
  File "{suite}/engine/worker.py", line 80 in main
"""


def test_waiting_frames_are_the_probe_threads_user_and_tensorflow_frames():
    """From a faulthandler dump: the thread that runs the engine's main loop, its user frames and
    each run of TensorFlow frames by its innermost, innermost first; the probe's own frame where the
    thread shows neither; nothing from an empty dump."""
    from suite.harness.pool import stacks

    check = Check("stacks.waiting_frames")
    dump = DUMP.format(suite=stacks.SUITE)
    check.equal(stacks.waiting_frames(dump), "tensorflow/python/eager/execute.py:53 in quick_execute <- "
                "/home/me/train.py:40 in train_epoch <- /home/me/train.py:55 in <module>", "where a step waited")
    harness_only = dump.replace("/home/me/train.py", "/usr/lib/python3.11/runpy.py").replace(
        "/venv/lib/python3.11/site-packages/tensorflow", "/venv/lib/python3.11/site-packages/numpy")
    check.equal(stacks.waiting_frames(harness_only), "suite/engine/script.py:900 in run_script",
                "a thread with no user or TensorFlow frame")
    check.equal(stacks.waiting_frames("Fatal Python error: Aborted\n"), "", "a dump without threads")


def test_a_socket_frame_cut_short_fails_by_its_deadline_before_authentication():
    """A remote engine's reply is read the way a local one's is: its length first (capped), the
    body by the call's deadline, and only then checked as an authenticated frame. Half a frame on a
    socket ends in FrameTimeout at the deadline (before, the read waited for the rest with no end);
    a length over the cap is refused unread; a whole frame with a bad tag is refused by ``accept``."""
    import socket
    from multiprocessing.connection import Connection

    from suite.common import authframe

    check = Check("remote frames")
    ours, theirs = socket.socketpair()
    conn = Connection(ours.detach())
    try:
        theirs.sendall(struct.pack("!i", 1000) + b"x" * 100)
        started = time.monotonic()
        with pytest.raises(protocol.FrameTimeout) as cut:
            protocol.receive_bytes(conn, time.monotonic() + 0.5)
        check.that(time.monotonic() - started < 3, "seconds to give up on half a frame", time.monotonic() - started,
                   "the deadline's 0.5, not an endless wait")
        check.contains(str(cut.value), ["before the deadline"], "the cut frame's error")
    finally:
        conn.close()
        theirs.close()
    ours, theirs = socket.socketpair()
    conn = Connection(ours.detach())
    try:
        theirs.sendall(struct.pack("!i", protocol.MAX_MESSAGE + 1))
        with pytest.raises(protocol.BadFrame):
            protocol.receive_bytes(conn, time.monotonic() + 2)
    finally:
        conn.close()
        theirs.close()
    channel = authframe.Channel(None, b"k" * 32, authframe.CLIENT)
    forged = authframe.Channel(None, b"j" * 32, authframe.AGENT).frame(("ok", 1, 2.0, {}))
    genuine = authframe.Channel(None, b"k" * 32, authframe.AGENT).frame(("ok", 1, 2.0, {}))
    channel.close = lambda: None
    with pytest.raises(authframe.FrameError):
        channel.accept(forged)
    check.equal(authframe.Channel(None, b"k" * 32, authframe.CLIENT).accept(genuine), ("ok", 1, 2.0, {}),
                "a genuine frame accepted")


def test_arrays_larger_than_a_frame_go_both_ways_out_of_band_in_pieces(pool):
    """An array of 3 frames' bytes and one of none go to the engine in a request and come back in its
    reply with an array made there of 2.5 frames' bytes: each arrives whole and equal (dtype, shape,
    values), though no frame on the pipe may be longer than protocol.CHUNK; a reply's pickle beside
    its arrays stays small, so the bound is on frames, not on what a reply carries."""
    np = pytest.importorskip("numpy")
    big = np.arange(3 * protocol.CHUNK // 8, dtype=np.float64).reshape(-1, 8)
    empty = np.zeros((0, 3), np.float32)
    reply = pool.call(SPEC, "engine.echo", arrays=[big, empty], make=5 * protocol.CHUNK // 2, timeout=120)[0]
    check = Check(SPEC, case={"sent": "float64 (3 frames' bytes), float32 (0, 3)", "made": "2.5 frames' bytes"})
    got, back = reply["arrays"], reply["made"]
    check.equal([(a.dtype.str, a.shape) for a in got], [(a.dtype.str, a.shape) for a in (big, empty)],
                "the arrays echoed: dtype and shape")
    check.that(np.array_equal(got[0], big), "the large array echoed", "different values", "equal to what was sent")
    check.equal(reply["sums"][0], int(big.astype(np.int64).sum()), "the engine's sum of the large array it received")
    check.equal((back.dtype.str, back.size), ("|u1", 5 * protocol.CHUNK // 2), "the array made in the engine")
    check.that(np.array_equal(back[:1000], np.arange(1000, dtype=np.uint8)), "the made array's first bytes",
               back[:8].tolist(), "0, 1, 2, ... modulo 256")
    check.that(got[0].flags.writeable and back.flags.writeable, "the arrays received", "read-only", "writable")


def test_a_reply_whose_pickle_is_over_the_bound_is_an_error_naming_the_bound_and_its_largest_part(pool):
    """A reply holding a string of 80 million characters (its pickle 80 MB, beside no arrays) is not sent: the call
    fails with the probe's error, which names the pickle's size, the bound and the part that made it
    large, and the engine stays (nothing half-written is on its pipe: the next call is answered)."""
    engine = pool.get(SPEC)
    old = engine.pids()
    with pytest.raises(Exception) as info:
        pool.call(SPEC, "engine.echo", text=80_000_000, timeout=120)
    check = Check(SPEC, case={"text": 80_000_000})
    bound = f"{protocol.CHUNK / (1 << 20):.1f} MiB"
    check.contains(str(info.value), ["TooLarge", "'engine.echo'", f"over the bound of {bound}", "['text'] 76.3 MiB"],
                   "the error of a reply too large to send")
    check.equal(pool.get(SPEC).pids(), old, "the engine's processes after the call (kept: the pipe is in step)")
    check.equal(type(pool.call(SPEC, "engine.ping")[0]).__name__, "Ping", "what the next call returned")
