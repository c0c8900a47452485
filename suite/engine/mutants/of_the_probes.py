"""Mutants of what the engine reports, applied from outside: ``foreign_result`` wraps the probe
registry's ``run`` so that every result comes back moved off its value; ``optimizer_names_extra``
lists one built-in optimizer more. ``PATCHES[name]()``
applies a mutant's patch and returns the function that puts the original back."""

from __future__ import annotations

import dataclasses

import numpy as np

from ...common.results import Raised
from .. import compat
from ..probes import registry
from . import replace


def foreign(x):
    """Every number of a result moved off its value (floats by 0.1% + 0.001, integers by 1), every
    list of names given one more, every caught exception renamed: a wrong value that no known
    deviation's signature describes (tests/units/test_deviations.py)."""
    if isinstance(x, Raised):
        return dataclasses.replace(x, type="ForeignError")
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return type(x)(**{f.name: foreign(getattr(x, f.name)) for f in dataclasses.fields(x)})
    if isinstance(x, dict):
        return {k: foreign(v) for k, v in x.items()}
    if isinstance(x, list):
        names = bool(x) and all(isinstance(v, str) for v in x)
        return [foreign(v) for v in x] + (["foreign"] if names else [])  # a list of names gains one
    if isinstance(x, bool) or isinstance(x, str) or x is None:
        return x
    if isinstance(x, float):
        return x * 1.001 + 0.001
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        return (x * 1.001 + 0.001).astype(x.dtype)
    if isinstance(x, int) or isinstance(x, np.ndarray) and x.dtype.kind in "iu":
        return x + 1
    return x


def _moved(original):
    def run(ctx, name, kwargs):
        return foreign(original(ctx, name, kwargs))
    return run


def _one_more_name(original):
    """Keras' built-in optimizers as the engine lists them, with one the suite's catalogue lacks."""
    return lambda: original() + ["Prodigy"]


PATCHES = {"foreign_result": lambda: replace(registry, "run", _moved),
           "optimizer_names_extra": lambda: replace(compat, "builtin_optimizer_names", _one_more_name)}
