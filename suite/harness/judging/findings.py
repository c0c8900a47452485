"""Figures that properties measure (not pass/fail): e.g. the factor by which the summed
scaled loss differs from the global mean under uneven splits. Shown in the terminal summary."""

from __future__ import annotations

import collections


class Findings:
    def __init__(self):
        self._values = collections.defaultdict(list)

    def record(self, name: str, spec, value: float):
        self._values[(name, str(spec))].append(float(value))

    def dump(self) -> list:
        """Plain data (to send from a pytest-xdist worker to the controller)."""
        return [[name, spec, vals] for (name, spec), vals in self._values.items()]

    def merge(self, dumped: list):
        for name, spec, vals in dumped:
            self._values[(name, spec)].extend(vals)

    def lines(self) -> list[str]:
        out = []
        for (name, spec), vals in sorted(self._values.items()):
            out.append(f"{name} [{spec}]: n={len(vals)}, min={min(vals):.4g}, max={max(vals):.4g}")
        return out
