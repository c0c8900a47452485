"""Installed TensorFlow/Keras versions of the engine interpreter, read without importing
TensorFlow (package metadata only), for the report header and the known-deviations file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ... import layout

_SCRIPT = r"""
import importlib.metadata as m, json, os
def v(*names):
    for n in names:
        try:
            return m.version(n)
        except m.PackageNotFoundError:
            pass
    return None
legacy = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
tf = v("tensorflow-cpu", "tensorflow", "tensorflow-macos", "tf-nightly", "tensorflow-intel")
keras = v("tf-keras", "tf_keras") if legacy else None
if keras is None:
    keras = v("keras")
print(json.dumps({"tensorflow": tf, "keras": keras}))
"""


# Each TensorFlow 2.16+ minor with the Keras minor that was current when it was released (tox.ini's
# as-shipped envs say where the dates come from; tests/units/test_measured.py keeps the two in step)
AS_SHIPPED = {"2.16": "3.0", "2.17": "3.4", "2.18": "3.6", "2.19": "3.9", "2.20": "3.11", "2.21": "3.13"}


def as_shipped(tensorflow: str | None, keras: str | None) -> bool:
    """Whether ``keras`` is the Keras minor ``tensorflow`` was released with (AS_SHIPPED)."""
    tf, k = as_tuple(tensorflow)[:2], as_tuple(keras)[:2]
    return len(tf) == 2 and AS_SHIPPED.get(f"{tf[0]}.{tf[1]}") == ".".join(map(str, k))


def interpreter(env: str) -> tuple[str, dict]:
    """The interpreter a ``SPEC@ENV`` names and what its engines' environment changes: a tox env
    name is ``.tox/ENV/bin/python`` of this checkout (installed: of the current directory), with
    ``TF_USE_LEGACY_KERAS=1`` where the env has the ``legacy`` factor (and without it elsewhere);
    a path is that Python, environment as is."""
    if os.sep in env:
        return env, {}
    legacy = "1" if "legacy" in env.split("-") else ""
    return str(layout.project_dir() / ".tox" / env / "bin" / "python"), {"TF_USE_LEGACY_KERAS": legacy}


def environment(changes: dict) -> dict:
    """This process's environment with ``changes`` applied (an empty value removes the variable)."""
    env = dict(os.environ)
    for key, value in changes.items():
        if value:
            env[key] = value
        else:
            env.pop(key, None)
    return env


def engine_versions(python: str | None = None, changes: dict | None = None) -> dict:
    """``{"tensorflow": "2.21.0", "keras": "3.15.1"}`` (None where not installed) of ``python``
    run with the environment ``changes`` (``interpreter``)."""
    python = python or sys.executable
    try:
        out = subprocess.run([python, "-c", _SCRIPT], capture_output=True, text=True, timeout=60,
                             env=environment(changes or {}), check=True).stdout
        return json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError):
        return {"tensorflow": None, "keras": None}


def as_tuple(version: str | None) -> tuple:
    """'3.15.1' -> (3, 15, 1); pre-release tails are dropped."""
    if not version:
        return ()
    parts = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
        if not piece.isdigit():
            break
    return tuple(parts)
