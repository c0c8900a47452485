"""What a test hands a comparison for the known deviations' models and conditions, declared once.

A property test (``tests/properties/``) or the check of a user's loop (``suite/harness/loopcheck/``)
hands ``check.close(..., given=Given(...))`` (``exact``, ``equal``, ``returned``, ``given_for`` alike;
``per_replica`` and ``on_workers`` take a list of them) the inputs a deviation's model or condition
(``suite/harness/judging/signatures.py``) needs to say what TensorFlow computes instead. A misspelt
field is a TypeError where the test builds it (the record is a dataclass, frozen) where it used to
be a dict key read as None, late, only on a TensorFlow run; each model declares the fields it reads
(``signatures.reads``), checked when that module loads.

Every field defaults to None: not handed, and a model that needs it predicts nothing. Values are
plain data (numbers, lists, arrays, specs). Some fields are also facts the engine saw of a user's
loop (``suite/common/facts.py``, the same names), which the conditions read.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Given:
    """A comparison's inputs to the deviation models and conditions (every field: None, not handed)."""

    # -- another rule's value --------------------------------------------------------------------------
    alternative: Any = None  # the value under the rule the deviation states TensorFlow follows instead
    unsummed: Any = None  # the value when each replica applies its own gradient (True/False: whether it changed)
    unscaled: Any = None  # the value when each replica's loss is not divided by the replicas, then summed
    averaged: Any = None  # the mean over the replicas of each one's own value (a copy assigned in replica context)
    per_worker: list | None = None  # per replica after the first: whether it draws what replica 0 draws
    empty: bool | None = None  # the value divided by an empty replica's batch

    # -- metric state ------------------------------------------------------------------------------------
    kind: str | None = None  # the metric ("mean", "accuracy", ...)
    increments: list | None = None  # per batch (update): (total, count) summed over replicas, or each variable's increment
    unscaled_increments: list | None = None  # the same on the weights of the unscaled steps
    replica_increments: list | None = None  # per update, each replica's increment of each variable
    unsummed_replica_increments: list | None = None  # the same, each replica's losses on its own (unsummed) copy
    replica_states: list | None = None  # each replica's own (total, count), or the run's copies after the step
    batch_states: list | None = None  # per update, each replica's (total, count) of its slice
    replica: int | None = None  # the replica (copy) read: a worker's first one in cross-replica context
    start: list | None = None  # the state variables' initial values
    under: list | None = None  # per update, the spec it ran under
    restored_after: int | None = None  # the updates before a checkpoint's restore (None: no restore)

    # -- fit's logs -----------------------------------------------------------------------------------------
    replica_logs: list | None = None  # per replica, its own loss tracker's running mean
    unscaled_replica_logs: list | None = None  # the same on the weights of the unscaled steps
    replica_step_means: list | None = None  # per step so far, per replica, its batch's mean loss (NaN for no rows)

    # -- input ----------------------------------------------------------------------------------------------
    partial: bool | None = None  # the reference's last step needs dummy (empty) batches for some replicas
    dropped: list | None = None  # the element ids of that last step (on every worker), or []

    # -- optimizers, races, batch normalization --------------------------------------------------------
    variables: list | None = None  # names of every model and optimizer variable
    steps: list | None = None  # per scheduled step, [worker, value its assign(iterations + 1) wrote]
    one_pass: tuple | None = None  # (low, high): the one-pass variance's rounding bounds around the reference
    skipped: tuple | None = None  # (low, high): the reference with an empty replica's update skipped
    # the float32 one-pass inputs: batches, sizes, momentum, epsilon, keras, step, replica, name
    float32_one_pass: dict | None = None

    # -- what the conditions read (some are also facts of suite/common/facts.py) --------------------------
    poison: list | None = None  # per step, each replica's factor on its gradients
    workers: int | None = None  # the workers of the spec (None: one)
    worker_rows: list | None = None  # per step, the rows each worker got
    control_copies_differ: bool | None = None  # the control's replica copies of some variable differ after the step
    optimizer_built: bool | None = None  # the optimizer had made its variables when the first step began
    optimizer_variables_before_step: int | None = None  # the optimizer's variables when the first step began
    optimizer_variables_after: int | None = None  # and after the steps
    optimizer_clips: bool | None = None  # the optimizer was given clipnorm, global_clipnorm or clipvalue
    steps_per_execution: int | None = None  # fit's steps_per_execution
    step_mode: str | None = None  # how the run stepped ("fit": Model.fit; "calls", "schedules", ...)
    fit_first_split: list | None = None  # the rows per replica of fit's first global batch


FIELDS = frozenset(f.name for f in dataclasses.fields(Given))


def handed(given, where: str, many: bool = False):
    """``given`` if it is a Given or None (``many``: or a list of them); else a one-line TypeError."""
    ok = given is None or isinstance(given, Given) or (
        many and isinstance(given, list) and all(g is None or isinstance(g, Given) for g in given))
    if not ok:
        raise TypeError(f"{where}: given must be a suite.common.given.Given{', a list of them' if many else ''} "
                        f"or None, not {type(given).__name__}")
    return given


def fields_named(names, where: str) -> frozenset[str]:
    """``names`` if each is a field of Given; else a one-line ValueError naming the unknown ones."""
    unknown = sorted(set(names) - FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown given fields {unknown}: not fields of suite.common.given.Given")
    return frozenset(names)
