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
    if re.search(r"/lib/python3\.\d+/", path) or path.startswith("<"):
        return "other"  # the standard library, frozen modules
    return "user"


def _show(path: str, line: int, func: str) -> str:
    parts = Path(path).parts
    if "site-packages" in parts or "dist-packages" in parts:
        path = "/".join(parts[max(i for i, p in enumerate(parts) if p in ("site-packages", "dist-packages")) + 1:])
    elif path.startswith(SUITE + "/"):
        path = "suite/" + path[len(SUITE) + 1:]
    return f"{path}:{line} in {func}"


def waiting_frames(dump: str) -> str:
    """The frames of the thread that runs the probe (the one whose outermost frames are the engine
    worker's main loop; else the current thread), innermost first: the user's frames and
    TensorFlow's (each run of TensorFlow frames shown by its innermost), the probe's own when
    neither appears; "" for a dump with no frames."""
    found = threads(dump)
    if not found:
        return ""
    main = [frames for _, frames in found if any(p.endswith("suite/engine/worker.py") and f == "main"
                                                  for p, _, f in frames)]
    frames = main[0] if main else next((fr for current, fr in found if current), found[0][1])
    shown, last = [], None
    for path, line, func in frames:
        kind = _kind(path)
        if kind in ("user", "tf") and not (kind == "tf" and last == "tf"):
            shown.append(_show(path, line, func))
        if kind in ("user", "tf"):
            last = kind
    if not shown:  # no user or TensorFlow frame: the probe's own, innermost
        shown = [_show(p, n, f) for p, n, f in frames if _kind(p) == "suite"][:1]
    return " <- ".join(shown[:MAX_FRAMES])


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
