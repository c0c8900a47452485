"""Engine fork server: import TensorFlow, Keras and the probes once, then fork each engine.

Run as ``python -m suite.engine.forkserver --fd S`` by the pool (suite/harness/pool/pool.py),
one per interpreter and import-time environment, with S one end of an AF_UNIX SOCK_SEQPACKET
socket pair. Importing TensorFlow costs seconds of CPU; starting its runtime (devices, logical
CPUs, gRPC) happens at first use, not at import. So this process imports and never uses it, and
each engine is a fork that configures its own devices and builds its own strategy, as a freshly
started ``suite.engine.worker`` would: the child runs that module's ``main`` with the request's
arguments, environment, working folder and log file. Requests and replies are pickled tuples:

    pool -> server   ("fork", worker_args, env, log_path, cwd) with the engine's two pipe ends
                     (its input, its output) as SCM_RIGHTS fds | ("poll", pid)
    server -> pool   ("ready", preload) | ("pid", pid) | ("code", exit code or None)

``preload`` says what was imported and whether TensorFlow's runtime stayed unstarted (if a
module had started it, forks could not configure their devices: the pool then starts engines as
plain processes). A failed import is not fatal here: each fork imports again in ``worker.main``
and reports the failure to the pool in its usual one line. The children are this process's, so
it reaps them and answers ``poll``; each asks the kernel to kill it when this process dies, and
this process dies with the pool's (``PR_SET_PDEATHSIG`` at both links).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import socket
import sys
import traceback

MAX_MESSAGE = 1 << 20


def _preload() -> dict:
    """Import what every engine imports; whether TensorFlow's runtime is still unstarted."""
    try:
        import tensorflow  # noqa: F401
        from tensorflow.python.eager import context as eager_context

        from . import compat, context  # noqa: F401
        from .probes import registry  # noqa: F401
    except Exception as exc:  # each fork imports again and reports it (worker.main)
        return {"imported": False, "error": f"{type(exc).__name__}: {exc}"}
    # private: the eager context's handle is made when the runtime starts (context.ensure_initialized)
    started = getattr(eager_context.context(), "_context_handle", None) is not None
    return {"imported": True, "runtime_started": started}


def _set_pdeathsig():
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _child(server_pid: int, sock: socket.socket, worker_args: list, env: dict, log_path: str, cwd: str) -> int:
    """In the fork: become a fresh engine process (own session, log, environment), run the worker."""
    sock.close()
    os.setsid()  # its own process group: the pool kills engines as groups
    _set_pdeathsig()
    if os.getppid() != server_pid:  # the server died before the line above
        return 1
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)  # putenv too: TensorFlow's C++ reads the engine's own variables
    import tempfile

    tempfile.tempdir = None  # gettempdir() caches; this engine's TMPDIR is its own
    from . import worker

    sys.argv = ["suite.engine.worker", *worker_args]
    return worker.main(worker_args)


def _fork(sock: socket.socket, request: tuple, fds: list[int]) -> int:
    _, worker_args, env, log_path, cwd = request
    worker_args = ["--fd-in", str(fds[0]), "--fd-out", str(fds[1]), *worker_args]  # their numbers here
    server_pid = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _child(server_pid, sock, worker_args, env, log_path, cwd)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)  # as worker.py's own main: TensorFlow's atexit handlers can block
    for fd in fds:  # the engine's ends of its pipes are the engine's alone now
        os.close(fd)
    return pid


def _exit_code(pid: int, codes: dict) -> int | None:
    """``pid``'s exit code in Popen's convention (negative: killed by that signal), None while it runs."""
    if pid not in codes:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return codes.get(pid, -int(signal.SIGKILL))
        if done == 0:
            return None
        codes[pid] = os.waitstatus_to_exitcode(status)
    return codes[pid]


def serve(sock: socket.socket) -> int:
    sock.send(pickle.dumps(("ready", _preload())))
    codes: dict[int, int] = {}
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
        except OSError:
            return 0
        if not data:
            return 0  # the pool closed its end, or its process died: the forks die with this one
        request = pickle.loads(data)
        if request[0] == "fork":
            reply = ("pid", _fork(sock, request, fds))
        elif request[0] == "poll":
            reply = ("code", _exit_code(request[1], codes))
        else:
            reply = ("error", f"unknown request {request[0]!r}")
        sock.send(pickle.dumps(reply))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "--fd":
        print("usage: python -m suite.engine.forkserver --fd S", file=sys.stderr)
        return 2
    return serve(socket.socket(fileno=int(argv[1])))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
