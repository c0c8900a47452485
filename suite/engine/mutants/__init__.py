"""Deliberately wrong implementations, for the meta tests only.

A mutant makes one probe compute something wrong the way a buggy training loop would;
tests/meta/test_mutants.py runs the real properties against an engine with the mutant on and
requires them to fail (and to say why). The pool switches mutants per call (probe
``engine.mutant``; ``TFDS_MUTANT=<name>`` in an engine's environment sets the first). A switch
drops the engine's cached models and traced functions. Off, nothing changes.

Two ways in: the mutants of the canonical train step (suite/engine/steps.py) are patches applied
from here (``of_the_step.PATCHES``: each replaces a part of ``TrainStep`` or the optimizer's
options while it is on, and puts the original back when switched off), so the step reads as
the guide's step; the others are still branches in their probes (``on(name)``).
"""

from __future__ import annotations

import os

from ...common.catalog import MUTANTS


def _valid(name: str | None) -> str | None:
    if name is not None and name not in MUTANTS:
        raise ValueError(f"mutant {name!r}: choose one of {sorted(MUTANTS)}")
    return name


ACTIVE: str | None = None
_undo = None  # puts back what the active mutant's patches replaced


def switch(name: str | None) -> bool:
    """Make ``name`` (None: none) the active mutant, its patches applied and the previous one's
    undone; whether that changed it."""
    global ACTIVE, _undo
    name = _valid(name)
    if name == ACTIVE:
        return False
    if _undo is not None:
        _undo()
        _undo = None
    ACTIVE = name
    from . import of_the_step  # it imports the step, and TensorFlow

    if name in of_the_step.PATCHES:
        _undo = of_the_step.PATCHES[name]()
    return True


def on(name: str) -> bool:
    return ACTIVE == name


switch(os.environ.get("TFDS_MUTANT") or None)
