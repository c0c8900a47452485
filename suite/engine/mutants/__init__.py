"""Deliberately wrong implementations, for the meta tests only.

A mutant makes one probe compute something wrong the way a buggy training loop would;
tests/mutation/test_mutants.py runs the real properties against an engine with the mutant on and
requires them to fail (and to say why). Nothing else in the engine knows of them: an engine imports
this package at start only when the pool names it in ``TFDS_ENGINE_IMPORTS`` (suite/engine/worker.py
imports each module named there); on import it switches to ``TFDS_MUTANT=<name>`` of the engine's
environment and registers its probe ``mutants.switch``, by which the pool switches mutants per call.
A switch drops the engine's cached models and traced functions. Off, nothing changes.

Every mutant is a patch applied from here, replacing one function while it is on and putting the
original back when switched off: the canonical train step's parts (``of_the_step.py``: ``TrainStep``'s
and the optimizer's options, so suite/engine/steps.py reads as the guide's step), TensorFlow's and
Keras' own functions (``of_tensorflow.py``) and the probe registry's results, the small helpers of
the probes and the user's optimizer as the probes take it (``of_the_probes.py``).
"""

from __future__ import annotations

import os

from ...common.catalog import MUTANTS
from ..probes.registry import register


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
    patches = _patches()
    if name in patches:
        _undo = patches[name]()
    return True


def _patches() -> dict:
    """Each mutant's ``apply()``, which applies its patches (a mutant may have one in several files: the
    gradients summed twice in the train step and in the user's optimizer as the probes take it) and
    returns their undo (imported when first asked: they import TensorFlow)."""
    from . import of_tensorflow, of_the_probes, of_the_step

    tables = (of_the_step.PATCHES, of_tensorflow.PATCHES, of_the_probes.PATCHES)
    return {name: _together([t[name] for t in tables if name in t]) for name in {n for t in tables for n in t}}


def _together(applies):
    def apply():
        undos = [a() for a in applies]
        return lambda: [undo() for undo in reversed(undos)]
    return apply


def replace(owner, name: str, make):
    """``owner.name`` replaced by ``make(original)`` (on a class: the attribute as its class or a base
    defines it); returns the undo, which puts back exactly what ``owner`` had."""
    if isinstance(owner, type):
        original = next(c.__dict__[name] for c in owner.__mro__ if name in c.__dict__)
        own = name in owner.__dict__
        setattr(owner, name, make(original))
        return (lambda: setattr(owner, name, original)) if own else (lambda: delattr(owner, name))
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    return lambda: setattr(owner, name, original)


def _switch(ctx, name=None):
    """Probe ``mutants.switch``: make ``name`` the active mutant (None: the real computation). Models and
    traced functions in the cache were built under the previous one: a switch drops them."""
    if switch(name):
        ctx.cache.clear()
    return name


register("mutants.switch", _switch)
switch(os.environ.get("TFDS_MUTANT") or None)
