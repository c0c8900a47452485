"""Deliberately wrong implementations, for the meta tests only.

``TFDS_MUTANT=<name>`` in an engine's environment makes one probe compute something wrong
the way a buggy training loop would; tests/meta/test_mutants.py runs the real properties
against such an engine and requires them to fail (and to say why). Unset, nothing changes.
"""

from __future__ import annotations

import os

from suite.common.catalog import MUTANTS

ACTIVE = os.environ.get("TFDS_MUTANT") or None
if ACTIVE is not None and ACTIVE not in MUTANTS:
    raise ValueError(f"TFDS_MUTANT={ACTIVE!r}: choose one of {sorted(MUTANTS)}")


def on(name: str) -> bool:
    return ACTIVE == name
