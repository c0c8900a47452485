"""Deliberately wrong implementations, for the meta tests only.

``TFDS_MUTANT=<name>`` in an engine's environment makes one probe compute something wrong
the way a buggy training loop would; tests/meta/test_mutants.py runs the real properties
against such an engine and requires them to fail (and to say why). Unset, nothing changes.
"""

from __future__ import annotations

import os

MUTANTS = {
    "local_batch_denominator": "compute_average_loss replaced by a per-replica mean",
    "unnormalised_multi_dim": "multi-dimensional per-element losses never normalised",
    "scale_reg_not_divided": "scale_regularization_loss returns the sum, not sum / replicas",
    "double_gradient_aggregation": "gradients all-reduced by hand, then summed again by apply_gradients",
    "metric_first_replica": "cross-replica metric result read from the first replica only",
    "reduce_mean_of_means": "MEAN over axis 0 as the mean of per-replica means",
    "reversed_local_results": "local results returned in reverse replica order",
    "keras_loss_times_replicas": "Keras loss values multiplied by the replica count",
    "input_rows_to_first_replica": "every step's rows handed to the first local replica",
    "input_dropped_element": "the first row of the first step lost",
    "ps_step_scheduled_twice": "one parameter-server step scheduled once more than asked",
    "ps_shards_reversed": "a partitioned variable reassembled with its shards in reverse order",
    "ps_loss_times_two": "compute_average_loss doubled inside a scheduled step",
    "ps_gradient_doubled": "parameter-server gradients doubled before apply_gradients",
}

ACTIVE = os.environ.get("TFDS_MUTANT") or None
if ACTIVE is not None and ACTIVE not in MUTANTS:
    raise ValueError(f"TFDS_MUTANT={ACTIVE!r}: choose one of {sorted(MUTANTS)}")


def on(name: str) -> bool:
    return ACTIVE == name
