"""Deliberately wrong implementations, for the meta tests only.

A mutant makes one probe compute something wrong the way a buggy training loop would;
tests/meta/test_mutants.py runs the real properties against an engine with the mutant on and
requires them to fail (and to say why). The pool switches mutants per call (probe
``engine.mutant``; ``TFDS_MUTANT=<name>`` in an engine's environment sets the first). Every
mutant is a branch taken while a probe builds or traces its function, so a switch drops the
engine's cached models and traced functions. Off, nothing changes.
"""

from __future__ import annotations

import os

from ..common.catalog import MUTANTS


def _valid(name: str | None) -> str | None:
    if name is not None and name not in MUTANTS:
        raise ValueError(f"mutant {name!r}: choose one of {sorted(MUTANTS)}")
    return name


ACTIVE = _valid(os.environ.get("TFDS_MUTANT") or None)


def switch(name: str | None) -> bool:
    """Make ``name`` (None: none) the active mutant; whether that changed it."""
    global ACTIVE
    changed = _valid(name) != ACTIVE
    ACTIVE = name
    return changed


def on(name: str) -> bool:
    return ACTIVE == name
