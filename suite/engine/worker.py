"""Engine process main: build one strategy, then answer probe calls until told to exit.

Run as ``python -m suite.engine.worker --spec S --fd-in A --fd-out B [--worker-index I]``
by the pool (suite/harness/pool/pool.py), over two OS pipes; or by an engine agent
(suite/harness/pool/agent.py) with ``--fd-in S --fd-out S --session-fd P``: one socket to the
pytest process whose messages are authenticated frames (suite/common/authframe.py), and a pipe
on which the agent hands over that connection's session. TensorFlow is imported here and only
here (and in the probe modules this imports), never in the pytest process.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import os
import sys
import threading
import traceback

from ..common import authframe, limits, protocol
from ..common.results import Raised
from ..common.specs import parse_spec

IMPORTS_ENV = "TFDS_ENGINE_IMPORTS"


def _parse_args(argv):
    p = argparse.ArgumentParser(prog="suite.engine.worker")
    p.add_argument("--spec", required=True)
    p.add_argument("--fd-in", type=int, required=True)
    p.add_argument("--fd-out", type=int, required=True)
    p.add_argument("--session-fd", type=int, default=None,
                   help="an agent's pipe with the session of the socket --fd-in (authenticated frames)")
    p.add_argument("--worker-index", type=int, default=0)
    p.add_argument("--collective-timeout", type=float, default=60.0)
    p.add_argument("--serve", action="store_true",
                   help="only run this task's tf.distribute.Server (parameter-server workers and ps)")
    return p.parse_args(argv)


def imports(env) -> list[str]:
    """The modules ``env`` asks every engine process to import at start (``TFDS_ENGINE_IMPORTS``: comma-
    separated, in order), before its strategy is built: a module that registers probes of its own
    (probes/registry.py ``register``) or changes what the engine computes, for the pytest side's tests."""
    return [m.strip() for m in env.get(IMPORTS_ENV, "").split(",") if m.strip()]


def main(argv=None) -> int:
    args = _parse_args(argv)
    limits.apply()  # the memory the pool gives this engine (TFDS_ENGINE_MEMORY), before TensorFlow allocates any
    # every thread's stack to the log on request: the parent asks before it kills an engine that hangs
    faulthandler.register(protocol.STACKS_SIGNAL, file=sys.stderr, all_threads=True)
    if args.session_fd is not None:  # an agent's socket: every message authenticated, both ways
        conn_in = conn_out = authframe.Channel.taken_over(protocol.duplex(args.fd_in), args.session_fd)
    else:
        conn_in = protocol.reader(args.fd_in)
        conn_out = protocol.writer(args.fd_out)
    spec = parse_spec(args.spec)
    try:
        import tensorflow  # noqa: F401
    except ImportError as exc:
        conn_out.send((protocol.FATAL, f"TensorFlow is not installed for {sys.executable} ({exc}); "
                                       "install the project with its TensorFlow extra (see README)"))
        return 3
    try:
        from .context import EngineUnavailableHere, build_context
        from .probes import registry
    except Exception as exc:  # a suite/TF incompatibility: fail once, clearly
        conn_out.send((protocol.FATAL, f"engine set-up failed: {type(exc).__name__}: {exc}"))
        return 4
    for module in imports(os.environ):
        try:
            importlib.import_module(module)
        except Exception as exc:
            conn_out.send((protocol.FATAL, f"engine set-up failed: {IMPORTS_ENV} names {module!r}, which did not "
                                           f"import: {type(exc).__name__}: {exc}"))
            return 4
    from .compat import keep_whole_tracebacks

    keep_whole_tracebacks()  # errors carry every frame they came through (deviations' origins)
    if args.serve:
        return _serve(conn_in, conn_out)
    try:
        ctx = build_context(spec, args.worker_index, args.collective_timeout)
    except EngineUnavailableHere as exc:
        conn_out.send((protocol.FATAL, f"unavailable: {exc}"))
        return 4
    except Exception as exc:  # any TF error while creating the strategy
        conn_out.send((protocol.FATAL, f"could not create the strategy: {type(exc).__name__}: {exc}"))
        return 4
    conn_out.send((protocol.READY, ctx.info()))
    sending = threading.Lock()  # a progress message may come from a thread of TensorFlow's (a traced step's py_function)

    def send(msg):
        with sending:
            conn_out.send(msg)

    def progress(request, text):
        try:
            send((protocol.PROGRESS, request, str(text)))
        except OSError:
            pass  # the parent went away: the call's reply will find out

    while True:
        try:
            msg = conn_in.recv()
        except authframe.FrameError as exc:
            return _refused(exc)
        except (EOFError, OSError):
            return 0  # the parent went away
        if msg[0] == protocol.EXIT:
            return 0
        _, request, name, kwargs = msg
        ctx.progress_sink = lambda text, request=request: progress(request, text)
        limits.limit_call_cpu()  # the CPU time this call may use (SIGXCPU beyond it)
        try:
            result = registry.run(ctx, name, kwargs)
        except Exception as exc:
            where = f"probe {name!r}" + (f" on worker {args.worker_index}" if spec.is_multi_worker else "")
            reply = (protocol.ERROR, request, Raised.of(exc, where, limit=None), traceback.format_exc())
        else:
            reply = (protocol.OK, request, result, {"restart": ctx.restart_requested})
        ctx.progress_sink = None
        try:
            send(reply)
        except protocol.TooLarge as exc:  # nothing written: the reply's error in its place
            where = f"probe {name!r}" + (f" on worker {args.worker_index}" if spec.is_multi_worker else "")
            send((protocol.ERROR, request, Raised("TooLarge", f"the reply was not sent: {exc}", where), ""))


def _serve(conn_in, conn_out) -> int:
    """A parameter-server cluster's worker or ps task: start its server, report ready, then
    wait for the parent to say exit (or go away); probes are not answered here."""
    from .context import start_server

    try:
        info = start_server()
    except Exception as exc:  # a port taken since it was chosen, a bad TF_CONFIG
        conn_out.send((protocol.FATAL, f"could not start the server: {type(exc).__name__}: {exc}"))
        return 4
    conn_out.send((protocol.READY, info))
    while True:
        try:
            msg = conn_in.recv()
        except authframe.FrameError as exc:
            return _refused(exc)
        except (EOFError, OSError):
            return 0
        if msg[0] == protocol.EXIT:
            return 0
        conn_out.send((protocol.ERROR, msg[1], Raised("RuntimeError", f"the {info.task} server answers no probes",
                                                      info.task), ""))


def _refused(exc: authframe.FrameError) -> int:
    """A message on an agent's socket failed authentication: it was not unpickled, and the
    engine ends (the connection is closed; the pytest side sees the engine gone)."""
    print(f"suite.engine.worker: {exc}", file=sys.stderr, flush=True)
    return 5


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # TensorFlow's atexit handlers can block on collective executors; the parent owns
    # the lifetime, so leave without them.
    os._exit(code)
