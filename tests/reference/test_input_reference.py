"""reference/input.py against the examples observed on TF 2.15.1 and 2.21.0
(docs/research/input_distribution.md, section 1)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference import input as ref_input

OBSERVED = [  # R, L, B, drop, policy, steps
    (2, 10, 4, False, "AUTO", [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8], [9]]]),
    (2, 10, 4, False, "OFF", [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], []]]),
    (3, 8, 4, False, "DATA", [[[0, 1], [2, 3], []], [[4, 5], [6, 7], []]]),
    (3, 8, 4, True, "OFF", [[[0, 1], [2], [3]], [[4, 5], [6], [7]]]),
    (3, 7, 4, False, "AUTO", [[[0, 1], [2, 3], []], [[4], [5], [6]]]),
    (3, 7, 4, False, "OFF", [[[0, 1], [2], [3]], [[4, 5], [6], []]]),
    (3, 2, 4, True, "AUTO", []),
    (4, 11, 5, False, "OFF", [[[0, 1], [2], [3], [4]], [[5, 6], [7], [8], [9]], [[10], [], [], []]]),
    (4, 6, 6, False, "AUTO", [[[0, 1], [2, 3], [4, 5], []]]),
]


@pytest.mark.parametrize("replicas, length, batch, drop, policy, steps", OBSERVED)
def test_reference_reproduces_observed_splits(replicas, length, batch, drop, policy, steps):
    assert ref_input.distribute(length, batch, drop, replicas, policy) == steps


def test_unknown_batch_size_uses_the_legacy_rule_under_every_policy():
    legacy = ref_input.distribute(10, 4, False, 3, "AUTO")
    assert ref_input.distribute(10, 4, False, 3, "OFF", batch_size_known=False) == legacy


@given(st.integers(0, 30), st.integers(1, 7), st.booleans(), st.integers(1, 4), st.sampled_from(ref_input.POLICIES))
def test_every_kept_element_is_delivered_once(length, batch, drop, replicas, policy):
    steps = ref_input.distribute(length, batch, drop, replicas, policy)
    delivered = [e for step in steps for part in step for e in part]
    kept = length - (length % batch if drop else 0)
    assert sorted(delivered) == list(range(kept))
    assert all(len(step) == replicas and any(step) for step in steps)


FILES = [[100 * j + i for i in range(n)] for j, n in enumerate([5, 3, 6, 2, 4])]  # the research's files

# observed on local MultiWorkerMirrored clusters (docs/research/multi_worker_input.md, section 2.2, and
# docs/research/multi_worker_input_tables.md):
# source, B, drop, W, R, policy, per worker: steps of local replica batches
OBSERVED_MULTI_WORKER = [
    (8, 4, False, 2, 2, "DATA", [[[[0], [2]], [[4], [6]]], [[[1], [3]], [[5], [7]]]]),
    (6, 6, False, 2, 2, "DATA", [[[[0, 1], [4, 5]]], [[[2, 3], []]]]),
    (1, 1, False, 2, 2, "OFF", [[[[0], []], [[], []], [[], []]], [[[], []], [[0], []], [[], []]]]),
    (FILES[:2], 4, False, 2, 2, "FILE", [[[[0], [1]], [[2], [3]], [[4], []]], [[[100], [101]], [[102], []], [[], []]]]),
    (FILES[:3], 4, True, 2, 1, "FILE", [[[[0, 1]], [[2, 3]], [[4, 200]], [[201, 202]]], [[[]], [[]], [[]], [[]]]]),
    (FILES[:3], 4, True, 2, 1, "DATA", [[[[0, 1]], [[4, 100]], [[200, 201]]], [[[2, 3]], [[101, 102]], [[202, 203]]]]),
]


@pytest.mark.parametrize("source, batch, drop, workers, per_worker, policy, steps", OBSERVED_MULTI_WORKER)
def test_reference_reproduces_observed_multi_worker_splits(source, batch, drop, workers, per_worker, policy, steps):
    assert ref_input.distribute_workers(source, batch, drop, workers, per_worker, policy) == steps


def test_file_sharding_errors_follow_the_observations():
    with pytest.raises(ref_input.InputError) as info:
        ref_input.distribute_workers(FILES[:1], 4, False, 3, 1, "AUTO")  # AUTO picks FILE: no fallback
    assert info.value.raised == {0: ("InvalidArgumentError", "Could not apply FILE based sharding")}
    assert info.value.blocked == [1, 2]
    with pytest.raises(ref_input.InputError) as info:
        ref_input.distribute_workers(5, 2, False, 2, 1, "FILE")
    assert set(info.value.raised) == {0, 1} and info.value.raised[0][0] == "NotFoundError"
    assert ref_input.distribute_workers(5, 2, False, 1, 2, "FILE") == ref_input.distribute_workers(5, 2, False, 1, 2, "OFF")


@pytest.mark.parametrize("example", ref_input.GUIDE_EXAMPLES, ids=lambda e: e.name)
def test_reference_reproduces_the_input_guides_worked_examples(example):
    """The guide's examples are documented: the reference gives what the guide lists (its step
    boundaries where they are the contract, each worker's elements in order everywhere)."""
    got = ref_input.distribute_workers(example.source, example.batch, False, example.workers,
                                       example.replicas_per_worker, example.policy)
    assert example.elements(got) == example.elements(example.steps)
    # an inexact example stays inexact: if the reference ever agrees, its note is out of date
    assert (got == example.steps) is example.exact
