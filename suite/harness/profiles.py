"""Hypothesis profiles, chosen by HYPOTHESIS_PROFILE: ``ci`` (derandomized, sized for the
15-minute CI budget on 2 cores), ``dev`` (the default) and ``thorough``. No deadlines: an
example's time includes a round trip to an engine process."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

PROFILES = {"ci": 10, "dev": 20, "thorough": 200}

_common = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])
# ci does not shrink: its failures are reproducible (derandomized) and shrinking a failure
# of a costly property would cost more than the rest of the run.
settings.register_profile("ci", max_examples=PROFILES["ci"], derandomize=True, database=None,
                          phases=(Phase.explicit, Phase.reuse, Phase.generate), **_common)
settings.register_profile("dev", max_examples=PROFILES["dev"], **_common)
settings.register_profile("thorough", max_examples=PROFILES["thorough"], **_common)


def load() -> str:
    name = os.environ.get("HYPOTHESIS_PROFILE", "dev")
    if name not in PROFILES:
        raise ValueError(f"HYPOTHESIS_PROFILE={name!r}: choose one of {sorted(PROFILES)}")
    settings.load_profile(name)
    return name


def examples(weight: float = 1.0):
    """``@examples(0.5)``: this property's share of the active profile's max_examples
    (for properties whose examples cost many engine calls)."""
    return settings(max_examples=max(2, int(settings().max_examples * weight)))
