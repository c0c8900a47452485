"""Random draws inside ``strategy.run`` (no numbers: which draws must differ and which agree).

With a seed, a run repeats exactly (every source below is deterministic given its seed); a
stateful source gives new numbers every step; and whether the replicas' draws differ depends on
the source, as its documentation states (below). Philox streams are not reproduced here: the
properties compare the draws with each other, not with values.
"""

from __future__ import annotations

from .rules import documented

RULES = {
    "dropout": (True, "the custom-training contract (a strategy's step equals one device's on the global batch): "
                      "each replica's examples get their own mask, as one device's global batch would; a mask "
                      "shared by the replicas drops the same units of example i on every replica"),
    "generator": (True, "tf.random.Generator guide, 'Interaction with distribution strategies': a generator created "
                        "in a strategy's scope gives each replica a different and independent stream"),
    "values_from_function": (True, "tf.random.Generator guide: one generator per replica, each from its own seed "
                                   "(experimental_distribute_values_from_function)"),
    "stateless_fold_in": (True, "tf.random.experimental.stateless_fold_in: a new seed for each folded-in value "
                                "(the replica id)"),
    "stateless": (False, "tf.random.stateless_uniform: the same seed gives the same numbers, on every replica"),
}


@documented("the sources quoted in RULES")
def replicas_draw_their_own(kind: str) -> tuple[bool, str]:
    """Whether the replicas' draws of ``kind`` must differ (False: must agree), and why."""
    return RULES[kind]
