"""Deliberately wrong implementations, for the meta tests only.

A mutant makes one probe compute something wrong the way a buggy training loop would;
tests/mutation/test_mutants.py runs the real properties against an engine with the mutant on and
requires them to fail (and to say why). The pool switches mutants per call (probe
``engine.mutant``; ``TFDS_MUTANT=<name>`` in an engine's environment sets the first). A switch
drops the engine's cached models and traced functions. Off, nothing changes.

Two ways in. Most are patches applied from here, each replacing one function while it is on and
putting the original back when switched off: the canonical train step's parts
(``of_the_step.py``: ``TrainStep``'s and the optimizer's options, so suite/engine/steps.py reads
as the guide's step), TensorFlow's and Keras' own functions (``of_tensorflow.py``) and the probe
registry's results and the small helpers of the probes (``of_the_probes.py``). The others are still branches in their probes
(``on(name)``).
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
    patches = _patches()
    if name in patches:
        _undo = patches[name]()
    return True


def _patches() -> dict:
    """Each patched mutant's ``apply()``, which returns its undo (imported when first asked: they
    import TensorFlow)."""
    from . import of_tensorflow, of_the_probes, of_the_step

    return {**of_the_step.PATCHES, **of_tensorflow.PATCHES, **of_the_probes.PATCHES}


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


def on(name: str) -> bool:
    return ACTIVE == name


switch(os.environ.get("TFDS_MUTANT") or None)
