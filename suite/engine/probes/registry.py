"""Find a probe by name (``"<area>.<name>"``) and convert its result to plain data.

The probes of this package register under their module's name (``probe``); a module outside it,
imported by the engine at start (``TFDS_ENGINE_IMPORTS``, suite/engine/worker.py), registers its
own under an area it names (``register``)."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np

_PROBES: dict = {}


def probe(fn):
    """Register ``fn(ctx, **kwargs)`` under ``"<module area>.<function name>"``."""
    area = fn.__module__.rsplit(".", 1)[-1]
    _PROBES[f"{area}.{fn.__name__}"] = fn
    return fn


def register(name: str, fn):
    """Register ``fn(ctx, **kwargs)`` as probe ``name`` (``"<area>.<name>"``), in an area no module of
    this package has (the caller's own); returns ``fn``."""
    area = name.split(".", 1)[0]
    if "." not in name or area in _package_areas():
        raise ValueError(f"probe {name!r}: not '<area>.<name>' in an area of its own ({area!r} is a module "
                         f"of {__package__} or no area)")
    if _PROBES.get(name, fn) is not fn:
        raise ValueError(f"probe {name!r} is registered already")
    _PROBES[name] = fn
    return fn


def _package_areas() -> set[str]:
    import pkgutil

    return {m.name for m in pkgutil.iter_modules(importlib.import_module(__package__).__path__)}


def to_plain(x):
    """Tensors and numpy scalars become numpy arrays/Python numbers; tuples become lists; result
    records (suite/common/results.py) keep their type with their fields converted."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return type(x)(**{f.name: to_plain(getattr(x, f.name)) for f in dataclasses.fields(x)})
    if isinstance(x, dict):
        return {k: to_plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_plain(v) for v in x]
    if hasattr(x, "numpy"):
        x = x.numpy()
    if isinstance(x, np.generic):
        return x.item()
    return x


def run(ctx, name: str, kwargs: dict):
    if name not in _PROBES:
        area = name.split(".", 1)[0]
        try:
            importlib.import_module(f".{area}", __package__)
        except ModuleNotFoundError as exc:
            raise KeyError(f"no probe area {area!r} (probe {name!r}; an area of a module outside {__package__} "
                           "is there when the engine imports that module: TFDS_ENGINE_IMPORTS)") from exc
    if name not in _PROBES:
        raise KeyError(f"unknown probe {name!r}; known: {sorted(_PROBES)}")
    return to_plain(_PROBES[name](ctx, **kwargs))
