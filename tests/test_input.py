"""experimental_distribute_dataset: each step's replica batches follow reference/input.py, every
element arrives exactly once, and the iteration styles deliver the same stream and end as
documented."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from reference import distribute as ref
from reference import input as ref_input
from suite.assertions import PropertyFailure

STYLES = ("for", "iter_next", "get_next_as_optional", "tf_function_for")
AFTER_END = {"iter_next": "StopIteration", "get_next_as_optional": "has_value=False"}


@st.composite
def input_cases(draw, spec):
    case = {
        "length": draw(st.integers(0, 20), label="dataset length"),
        "batch": draw(st.integers(1, 7), label="global batch"),
        "drop_remainder": draw(st.booleans(), label="drop_remainder"),
        "policy": draw(st.sampled_from(ref_input.POLICIES), label="auto-shard policy"),
        "batch_size_known": draw(st.booleans(), label="no map after batch"),
        "feature_shape": draw(st.sampled_from([(), (2,), (2, 3)]), label="element shape"),
        "dtype": draw(st.sampled_from(["float32", "float64", "int32", "int64"]), label="dtype"),
    }
    assume(not (spec.workers > 1 and case["policy"] == "OFF"))  # multi-worker OFF: issue #4
    return case


def _ids(part) -> list[int]:
    """Element ids of a replica batch (each row is its element id broadcast)."""
    a = np.asarray(part)
    return [int(row.flat[0]) if row.size else None for row in a] if a.ndim else [int(a)]


def _check_rows(part, ids, feature_shape, dtype, where):
    __tracebackhide__ = True
    a = np.asarray(part)
    expected = np.zeros((len(ids), *feature_shape), dtype=dtype) + np.asarray(ids, dtype=dtype).reshape(
        (-1,) + (1,) * len(feature_shape))
    if a.dtype != np.dtype(dtype) or a.shape != expected.shape or not np.array_equal(a, expected):
        raise PropertyFailure(f"{where}: got {a.dtype.name}{list(a.shape)} rows {_ids(a)}, but should be "
                              f"{np.dtype(dtype).name}{list(expected.shape)} rows {ids}")


@pytest.mark.parametrize("style", STYLES)
@given(data=st.data())
def test_replica_batches_follow_the_split_rule(engines, spec, style, data):
    case = data.draw(input_cases(spec), label="case")
    results = engines.call(spec, "input.distribute", style=style, **case)
    known = ref_input.batch_size_known(not case["batch_size_known"], case["drop_remainder"])
    expected = ref_input.distribute(case["length"], case["batch"], case["drop_remainder"], spec.replicas,
                                    case["policy"], known, spec.workers)
    rule = ref_input.split_rule(case["policy"], known)
    for w, result in enumerate(results):
        where = f"[{spec}] {style}, rule {rule}, {case}" + (f", worker {w}" if len(results) > 1 else "")
        if len(result["steps"]) != len(expected):
            raise PropertyFailure(f"{where}: {len(result['steps'])} steps, but should be {len(expected)} "
                                  f"(got {[[_ids(p) for p in s] for s in result['steps']]}, expected {expected})")
        for s, (got, want) in enumerate(zip(result["steps"], expected)):
            mine = ref.local_results(want, w, len(results))
            if len(got) != len(mine):
                raise PropertyFailure(f"{where}: step {s} has {len(got)} local replica batches, not {len(mine)}")
            for r, (part, ids) in enumerate(zip(got, mine)):
                _check_rows(part, ids, case["feature_shape"], case["dtype"],
                            f"{where}: step {s} replica {w * len(mine) + r}")
        if style in AFTER_END and result["after_end"] != AFTER_END[style]:
            raise PropertyFailure(f"{where}: after the last step the iterator gave {result['after_end']}, "
                                  f"but should give {AFTER_END[style]}")


@given(data=st.data())
def test_every_element_is_delivered_exactly_once(engines, spec, data):
    """Conservation, measured on TensorFlow's output alone: over all steps, replicas and workers
    each element arrives once; only drop_remainder's short global batch is missing."""
    case = data.draw(input_cases(spec), label="case")
    results = engines.call(spec, "input.distribute", style="for", **case)
    delivered = sorted(i for r in results for step in r["steps"] for part in step for i in _ids(part))
    kept = case["length"] - (case["length"] % case["batch"] if case["drop_remainder"] else 0)
    if delivered != list(range(kept)):
        missing = sorted(set(range(kept)) - set(delivered))
        extra = sorted(i for i in set(delivered) if delivered.count(i) > 1 or i >= kept)
        raise PropertyFailure(f"[{spec}] {case}: elements missing {missing}, duplicated or unexpected {extra}")


@given(data=st.data())
def test_iteration_styles_deliver_the_same_stream(engines, spec, data):
    case = data.draw(input_cases(spec), label="case")
    streams = {style: [[[_ids(p) for p in step] for step in r["steps"]]
                       for r in engines.call(spec, "input.distribute", style=style, **case)]
               for style in STYLES}
    first = streams["for"]
    for style, stream in streams.items():
        if stream != first:
            raise PropertyFailure(f"[{spec}] {case}: iterating with {style!r} gives {stream}, but 'for' gives {first}")


@given(length=st.integers(0, 20), global_batch=st.integers(1, 8))
def test_distribute_datasets_from_function_follows_input_context(engines, spec, length, global_batch):
    """The input function is called once per worker with InputContext(workers, worker, replicas);
    get_per_replica_batch_size divides the global batch (or raises when it does not divide);
    the per-worker dataset's elements reach the worker's replicas one whole element each."""
    results = engines.call(spec, "input.from_function", length=length, global_batch=global_batch)
    for w, r in enumerate(results):
        where = f"[{spec}] length={length}, global_batch={global_batch}, worker {w}"
        if r["contexts"] != [[spec.workers, w, spec.replicas]]:
            raise PropertyFailure(f"{where}: input contexts {r['contexts']}, but should be "
                                  f"{[[spec.workers, w, spec.replicas]]} (num_input_pipelines, id, replicas)")
        try:
            expected = ref_input.datasets_from_function(length, global_batch, spec.replicas, spec.workers)[w]
        except ValueError as exc:
            if r.get("raised") != "ValueError" or r["message"] != str(exc):
                raise PropertyFailure(f"{where}: got {r.get('raised')}: {r.get('message')!r}, but should "
                                      f"raise ValueError: {str(exc)!r}") from None
            continue
        got = [[_ids(p) for p in step] for step in r["steps"]]
        if got != expected:
            raise PropertyFailure(f"{where}: steps {got}, but should be {expected}")


def test_values_from_function_sees_each_replica_context(engines, spec):
    results = engines.call(spec, "input.values_from_function")
    for w, r in enumerate(results):
        expected = ref.local_results([[i, spec.replicas] for i in range(spec.replicas)], w, len(results))
        got = [np.asarray(v).tolist() for v in r["local"]]
        if got != expected:
            raise PropertyFailure(f"[{spec}] worker {w}: ValueContexts (replica id, replicas) {got}, "
                                  f"but should be {expected}")
