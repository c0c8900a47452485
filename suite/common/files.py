"""Files the suite writes for later reading (results folders, ``--json``, reports): written to a
temporary name in the same folder and renamed over the target, so a run killed mid-write leaves
the previous file or the new one, never half of one. JSON is strict (RFC 8259): a non-finite
number is written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path


def write_atomically(path, data: str | bytes) -> Path:
    """``data`` to ``path`` through a temporary file beside it, flushed to disk, then renamed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def save_figure(fig, path, **kwargs) -> Path:
    """A matplotlib figure saved to ``path`` as ``write_atomically`` writes (its format from the suffix)."""
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format=Path(path).suffix.lstrip(".") or "png", **kwargs)
    return write_atomically(path, buffer.getvalue())


def finite(obj):
    """``obj`` with every non-finite float (numpy's included) replaced by its name as a string."""
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if isinstance(obj, float) or type(obj).__name__ in ("float16", "float32", "float64"):
        value = float(obj)
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    return obj


def dumps_strict(obj, **kwargs) -> str:
    """Strict JSON of ``obj`` (non-finite numbers as strings: ``finite``)."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)


def write_json(path, obj, **kwargs) -> Path:
    """Strict JSON of ``obj`` to ``path``, atomically."""
    return write_atomically(path, dumps_strict(obj, **kwargs) + "\n")
