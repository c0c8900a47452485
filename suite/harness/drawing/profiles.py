"""Hypothesis profiles, chosen by HYPOTHESIS_PROFILE: ``ci`` (derandomized), ``dev`` (the
default: the same size, random seeds, so each run explores new cases) and ``thorough``. No
deadlines: an example's time includes a round trip to an engine process.

A profile's number is the examples **per property per spec**: a property parametrized by a
strategy spec and by K other parameters (optimizers, dtypes, ...) gets ``per_item(K)`` examples
for each of its K items under a spec, so it sees at least that many cases under every spec
whatever its parametrization (conftest.py applies it at collection; draws.table reports the
counts). A hypothesis test with no spec parameter gets the profile's number itself.

A property marked ``@pytest.mark.budget(n)`` (the Keras building blocks of tests/properties/
test_blocks.py, whose every drawn case traces a new step, and the costliest end-to-end
properties: tests/helpers.py COSTLY) draws ``n`` per spec instead, unless the run asks for depth
(``pytest --deep``): then it draws the profile's number like the rest.
"""

from __future__ import annotations

import math
import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import InvalidArgument

PROFILES = {"ci": 25, "dev": 25, "thorough": 250, "quick": 4}

# Every item draws at least this many: its first derandomized draw is hypothesis's simplest
# case, the same for every item, so one example per item would test little.
MIN_PER_ITEM = 2

_common = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])
# ci does not shrink: its failures are reproducible (derandomized) and shrinking a failure
# of a costly property would cost more than the rest of the run.
settings.register_profile("ci", max_examples=PROFILES["ci"], derandomize=True, database=None,
                          phases=(Phase.explicit, Phase.reuse, Phase.generate), **_common)
settings.register_profile("dev", max_examples=PROFILES["dev"], **_common)
# the version matrix's quick selection on every release but the two of the full ci run (.ci/run, tox
# quick-*): derandomized as ci, a few examples per property per spec
settings.register_profile("quick", max_examples=PROFILES["quick"], derandomize=True, database=None,
                          phases=(Phase.explicit, Phase.reuse, Phase.generate), **_common)
settings.register_profile("thorough", max_examples=PROFILES["thorough"], **_common)


def load() -> str:
    name = os.environ.get("HYPOTHESIS_PROFILE", "dev")
    if name not in PROFILES:
        raise ValueError(f"HYPOTHESIS_PROFILE={name!r}: choose one of {sorted(PROFILES)}")
    settings.load_profile(name)
    return name


def per_item(items: int, per_spec: int | None = None) -> int:
    """Examples for each of a property's ``items`` test items under one spec, so that together
    they draw at least ``per_spec`` (the active profile's number)."""
    per_spec = settings.default.max_examples if per_spec is None else per_spec
    return max(MIN_PER_ITEM, math.ceil(per_spec / max(items, 1)))


def allot(functions: dict, budgets: dict | None = None) -> dict:
    """``{test function: items per spec}`` -> ``{test function: max_examples}``, applied as a
    ``settings`` decorator to each hypothesis test not decorated with settings of its own;
    ``budgets``: ``{test function: examples per spec}`` for those that draw fewer than the
    profile's number (their ``budget`` marker, without ``--deep``)."""
    budgets = budgets or {}
    out = {}
    for fn, items in functions.items():
        if not getattr(fn, "is_hypothesis_test", False):
            continue
        n = per_item(items, min(budgets.get(fn, settings.default.max_examples), settings.default.max_examples))
        try:
            settings(max_examples=n)(fn)
        except InvalidArgument:  # its own @settings (or allotted already in this process)
            continue
        out[fn] = n
    return out
