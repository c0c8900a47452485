"""Where a hung engine waits: the frames worth quoting from the stacks an engine's faulthandler
writes to its log (suite/engine/worker.py registers it on protocol.STACKS_SIGNAL)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from ...common import protocol

FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):", re.MULTILINE)
# the packages whose frames say where TensorFlow waits
TF_PACKAGES = ("tensorflow", "keras", "tf_keras")
SUITE = str(Path(__file__).resolve().parents[2])  # the suite package's folder: its frames are the harness's
MAX_FRAMES = 6
AUTOGRAPH = "__autograph_generated_file"  # the modules autograph writes its conversions to


def threads(dump: str) -> list[tuple[bool, list[tuple[str, int, str]]]]:
    """Per thread of a faulthandler dump: whether it is the current thread, and its frames
    (path, line, function), innermost first."""
    heads = list(THREAD.finditer(dump))
    out = []
    for head, after in zip(heads, heads[1:] + [None]):
        body = dump[head.end():after.start() if after else len(dump)]
        frames = [(m["path"], int(m["line"]), m["func"]) for m in map(FRAME.match, body.splitlines()) if m]
        out.append((head[1] == "Current thread", frames))
    return out


def _kind(path: str) -> str:
    """``tf``, ``user``, ``suite`` or ``other`` (the standard library, other installed packages)."""
    parts = Path(path).parts
    if "site-packages" in parts or "dist-packages" in parts:
        below = parts[max(i for i, p in enumerate(parts) if p in ("site-packages", "dist-packages")) + 1:]
        return "tf" if below and below[0] in TF_PACKAGES else "other"
    if path.startswith(SUITE + "/") or "/suite/engine/" in path:
        return "suite"
    if re.search(r"/lib/python3\.\d+/", path) or path.startswith("<") or AUTOGRAPH in Path(path).name:
        return "other"  # the standard library, frozen modules, autograph's conversions of the user's code
    return "user"


def _show(path: str, line: int, func: str) -> str:
    parts = Path(path).parts
    if "site-packages" in parts or "dist-packages" in parts:
        path = "/".join(parts[max(i for i, p in enumerate(parts) if p in ("site-packages", "dist-packages")) + 1:])
    elif path.startswith(SUITE + "/"):
        path = "suite/" + path[len(SUITE) + 1:]
    return f"{path}:{line} in {func}"


def _quoted(frames) -> list[str]:
    """Of one thread's frames, innermost first: the user's and TensorFlow's (each run of TensorFlow
    frames shown by its innermost)."""
    shown, last = [], None
    for path, line, func in frames:
        kind = _kind(path)
        if kind in ("user", "tf") and not (kind == "tf" and last == "tf"):
            shown.append(_show(path, line, func))
        if kind in ("user", "tf"):
            last = kind
    return shown


def _replica_thread(frames) -> bool:
    """Whether a thread is one of the replica threads MirroredStrategy and CentralStorageStrategy
    run the replica function in (``mirrored_run._MirroredReplicaThread.run`` is its outermost
    TensorFlow frame)."""
    return any(p.endswith(os.path.join("distribute", "mirrored_run.py")) and f == "run" for p, _, f in frames)


def waiting_frames(dump: str) -> str:
    """Where a process waits, innermost first: first each other thread that holds a frame of the
    user's (the replica threads of MirroredStrategy and CentralStorageStrategy, named so; threads
    with the same frames quoted once, with their count; threads apart by " | "), then the thread that runs the probe (the
    one whose outermost frames are the engine worker's main loop; else the current thread). Each
    thread by the user's frames and TensorFlow's, the probe's own when neither appears; "" for a
    dump with no frames."""
    found = threads(dump)
    if not found:
        return ""
    main = [frames for _, frames in found if any(p.endswith("suite/engine/worker.py") and f == "main"
                                                  for p, _, f in frames)]
    frames = main[0] if main else next((fr for current, fr in found if current), found[0][1])
    shown = _quoted(frames)
    if not shown:  # no user or TensorFlow frame: the probe's own, innermost
        shown = [_show(p, n, f) for p, n, f in frames if _kind(p) == "suite"][:1]
    text = " <- ".join(shown[:MAX_FRAMES])
    others: dict[tuple, list[str]] = {}  # each other thread's quote -> the kinds of thread quoted so
    for _, fr in found:
        if fr is not frames and any(_kind(p) == "user" for p, _, _ in fr):
            quote = " <- ".join(_quoted(fr)[:MAX_FRAMES])
            others.setdefault(quote, []).append("replica thread" if _replica_thread(fr) else "thread")
    if not others:
        return text
    parts = []
    for quote, kinds in others.items():
        kind = "replica thread" if all(k == "replica thread" for k in kinds) else "thread"
        parts.append(f"{'a ' + kind if len(kinds) == 1 else f'{len(kinds)} {kind}s'}: {quote}")
    return " | ".join(parts + [f"the main thread: {text}"])


def dump(pid: int, log_path: Path, wait: float = 2.0) -> tuple[int | None, str]:
    """Ask process ``pid``, whose output goes to ``log_path``, for its stacks (protocol.STACKS_SIGNAL):
    where in the log they begin (None: the process or its log is gone) and what it wrote within
    ``wait`` seconds, once the dump stopped growing."""
    try:
        start = log_path.stat().st_size
        os.kill(pid, protocol.STACKS_SIGNAL)
    except OSError:
        return None, ""
    deadline, size, settled = time.monotonic() + wait, start, 0.0
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = log_path.stat().st_size
        if now > size:
            size, settled = now, time.monotonic()
        elif size > start and time.monotonic() - settled > 0.2:
            break  # the dump has stopped growing
    with open(log_path, "rb") as log:
        log.seek(start)
        return start, log.read(size - start).decode(errors="replace")
