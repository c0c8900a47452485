"""The pytest side's handle on the engines: calls that turn "no such hardware" into skips."""

from __future__ import annotations

import pytest

from ...common.specs import Spec
from .pool import EnginePool, EngineUnavailable


class EngineHandle:
    """Session-wide access to engines by spec (wraps an EnginePool): the ``engines`` fixture."""

    def __init__(self, pool: EnginePool):
        self.pool = pool

    def call(self, spec: Spec, probe: str, **kwargs) -> list:
        """Run a probe under ``spec``; one result per worker (a list of length 1 for
        single-process specs). Skips the test where the spec's hardware is missing."""
        try:
            return self.pool.call(spec, probe, **kwargs)
        except EngineUnavailable as exc:
            pytest.skip(str(exc))


