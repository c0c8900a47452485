"""experimental_distribute_dataset: each step's replica batches follow reference/input.py, every
element arrives exactly once, and the iteration styles deliver the same stream and end as
documented."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference import distribute as ref
from reference import input as ref_input
from reference.rules import Rule
from suite.common.given import Given
from suite.common.results import Raised
from suite.harness.judging.judgment import Check
from suite.harness.judging.quantity import Quantity
from suite.harness.pool.pool import ProbeError
from tests.helpers import COSTLY

STYLES = ("for", "iter_next", "get_next_as_optional", "tf_function_for")
AFTER_END = {"iter_next": "StopIteration", "get_next_as_optional": "has_value=False"}
# what an exhausted iterator does (docs/research/input_distribution.md, section 5)
EXHAUSTED = Rule("documented", "tf.distribute.DistributedIterator.get_next_as_optional docstring: 'If the "
                               "tf.distribute.DistributedIterator has reached the end of the sequence, the returned "
                               "tf.experimental.Optional will have no value'; next() of an exhausted Python iterator "
                               "raises StopIteration")
# the iteration styles a user may pick for one distributed dataset
STYLES_AGREE = Rule("documented", "https://www.tensorflow.org/tutorials/distribute/custom_training, 'Alternate ways "
                                  "of iterating over a dataset': a for loop, an iterator with iter and next, and a "
                                  "for loop inside a tf.function over the same distributed dataset; "
                                  "DistributedIterator.get_next_as_optional: 'the next value for all replicas'")
# the input function's contexts: one input pipeline per worker
CONTEXTS = Rule("documented", "Strategy.distribute_datasets_from_function docstring: 'dataset_fn will be called on the "
                              "CPU device of each of the workers' with a tf.distribute.InputContext; InputContext: "
                              "'num_input_pipelines: the number of input pipelines in a cluster', 'input_pipeline_id: "
                              "the current input pipeline id', 'num_replicas_in_sync: the number of replicas that are "
                              "in sync'")


@st.composite
def input_cases(draw, spec, files: bool = True, whole_steps: bool = False):
    """A batched dataset: ``Dataset.range(length)`` or, for a file reader (when ``files``), K
    text files of ids 100*j + i (at least one file per worker, where FILE sharding would
    otherwise fail on some workers and hang the others: that is its own test). Without files
    a multi-worker spec draws no FILE policy (FILE on a range fails; tested elsewhere).
    ``whole_steps``: under CentralStorage, only cases whose last step needs no dummy batches."""
    policies = ref_input.FILE_POLICIES if files or spec.workers == 1 else \
        tuple(p for p in ref_input.FILE_POLICIES if p != "FILE")
    case = {
        "batch": draw(st.integers(1, 7), label="global batch"),
        "drop_remainder": draw(st.booleans(), label="drop_remainder"),
        "policy": draw(st.sampled_from(policies), label="auto-shard policy"),
        "batch_size_known": draw(st.booleans(), label="no map after batch"),
        "feature_shape": draw(st.sampled_from([(), (2,), (2, 3)]), label="element shape"),
        "dtype": draw(st.sampled_from(["float32", "float64", "int32", "int64"]), label="dtype"),
        "length": draw(st.integers(0, 20), label="dataset length"),
        "files": None,
    }
    if files and draw(st.booleans(), label="text files"):
        k = draw(st.integers(spec.workers, spec.workers + 3), label="files")
        lines = draw(st.lists(st.integers(0, 6), min_size=k, max_size=k), label="lines per file")
        case["files"] = [[100 * j + i for i in range(n)] for j, n in enumerate(lines)]
        case["length"] = 0
    if whole_steps and spec.kind == "central_storage":
        # CentralStorage drops a last step that needs dummy batches in some iteration styles
        # (known deviation central-storage-drops-partial-step, covered by the tests above):
        # draw whole steps, global batches that split evenly with the short one dropped
        r = spec.replicas
        case["batch"], case["drop_remainder"] = r * -(-case["batch"] // r), True
    return case


def _partial(spec, case) -> bool:
    """Whether the reference's last step needs dummy (empty) batches for some replicas."""
    known = ref_input.batch_size_known(not case["batch_size_known"], case["drop_remainder"])
    return ref_input.needs_dummies(_source(case), case["batch"], case["drop_remainder"], spec.workers,
                                   spec.replicas // spec.workers, case["policy"], known)


def _source(case):
    return case["files"] if case["files"] is not None else case["length"]


def _expected(spec, case):
    """Per worker, per step, per local replica: the reference's element ids, or InputError."""
    known = ref_input.batch_size_known(not case["batch_size_known"], case["drop_remainder"])
    return ref_input.distribute_workers(_source(case), case["batch"], case["drop_remainder"], spec.workers,
                                        spec.replicas // spec.workers, case["policy"], known)


def _check_raised(results, exc, check, where):
    """Where the reference says every worker raises while distributing (FILE on a source
    without files), every worker must have raised that error."""
    __tracebackhide__ = True
    for w, r in enumerate(results):
        want_type, want_prefix = exc.raised[w]
        check.raises(r, want_type, f"{where}, worker {w}", want_prefix)


def _ids(part) -> list[int]:
    """Element ids of a replica batch (each row is its element id broadcast)."""
    a = np.asarray(part)
    return [int(row.flat[0]) if row.size else None for row in a] if a.ndim else [int(a)]


def _rows(ids, feature_shape, dtype) -> np.ndarray:
    """The replica batch of elements ``ids``: each row its id broadcast to the element shape."""
    return np.zeros((len(ids), *feature_shape), dtype=dtype) + np.asarray(ids, dtype=dtype).reshape(
        (-1,) + (1,) * len(feature_shape))


@COSTLY
@pytest.mark.parametrize("style", STYLES)
@given(data=st.data())
def test_replica_batches_follow_the_split_rule(engines, spec, style, data):
    case = data.draw(input_cases(spec), label="case")
    results = engines.call(spec, "input.distribute", style=style, **case)
    known = ref_input.batch_size_known(not case["batch_size_known"], case["drop_remainder"])
    rule = ref_input.split_rule(case["policy"], known, case["files"] is not None, spec.workers)
    check = Check(spec, case=dict(case, style=style, rule=rule), rule=ref_input.distribute_workers)
    try:
        per_worker = _expected(spec, case)
    except ref_input.InputError as exc:
        _check_raised(results, exc, check, "experimental_distribute_dataset")
        return
    for w, result in enumerate(results):
        expected = per_worker[w]
        who = f" (worker {w})" if len(results) > 1 else ""
        check.returned(result, f"distributing and iterating{who}")
        check.equal([[_ids(p) for p in step] for step in result.steps], expected,
                    Quantity.of("element ids of the replica batches", f"element ids of every step's local replica "
                                f"batches{who}", **({"worker": w} if who else {})),
                    given=Given(partial=_partial(spec, case)))
        for s, (got, mine) in enumerate(zip(result.steps, expected)):
            for r, (part, ids) in enumerate(zip(got, mine)):
                check.exact(part, _rows(ids, case["feature_shape"], case["dtype"]),
                            f"step {s} replica {w * len(mine) + r}{who}")
        if style in AFTER_END:
            check.equal(result.after_end, AFTER_END[style], f"the exhausted iterator{who}", rule=EXHAUSTED)


def _guide_examples(spec) -> list:
    """The input guide's worked examples shaped like ``spec`` (its workers and replicas)."""
    return [e for e in ref_input.GUIDE_EXAMPLES
            if spec.kind != "parameter_server" and (e.workers, e.replicas) == (spec.workers, spec.replicas)]


@pytest.mark.specs(lambda spec: bool(_guide_examples(spec)))
def test_the_input_guides_worked_examples(engines, spec):
    """The distributed input guide's examples (reference/input.py GUIDE_EXAMPLES), run as the
    guide writes them where a selected spec has their shape; the expected ids are the guide's
    (for its FILE example, each worker's elements in order: its step boundaries contradict
    its own batching rule, see the example's note)."""
    for example in _guide_examples(spec):
        files = example.source if isinstance(example.source, list) else None
        case = {"length": 0 if files else example.source, "batch": example.batch, "drop_remainder": False,
                "policy": example.policy, "files": files}
        results = engines.call(spec, "input.distribute", style="for", **case)
        check = Check(spec, case=dict(case, example=example.name), rule=example.rule)
        if not all([check.returned(r, f"the guide's {example.name} (worker {w})") for w, r in enumerate(results)]):
            continue  # a known deviation raised, as its signature predicts
        got = [[[_ids(p) for p in step] for step in r.steps] for r in results]
        if example.exact:
            check.equal(got, example.steps, f"the guide's {example.name}: every worker's steps of replica batches")
        else:
            check.equal(example.elements(got), example.elements(example.steps),
                        f"the guide's {example.name}: every worker's elements in order")


@COSTLY
@given(data=st.data())
def test_every_element_is_delivered_exactly_once(engines, spec, data):
    """Conservation, measured on TensorFlow's output alone: over all steps, replicas and workers
    each element of a range arrives once (W times under OFF, where every worker reads
    everything); only drop_remainder's short global batch is missing. (For files, whose
    batches are cut per worker under FILE, the split property above covers what is kept.)"""
    case = data.draw(input_cases(spec, files=spec.workers == 1), label="case")
    results = engines.call(spec, "input.distribute", style="for", **case)
    check = Check(spec, case=case, rule=ref_input.global_batches)
    for w, r in enumerate(results):
        check.returned(r, f"distributing and iterating (worker {w})")
    delivered = sorted(i for r in results for step in r.steps for part in step for i in _ids(part))
    everything = sorted(i for f in case["files"] for i in f) if case["files"] is not None else list(range(case["length"]))
    kept = everything[:len(everything) - (len(everything) % case["batch"] if case["drop_remainder"] else 0)]
    copies = spec.workers if ref_input.shard_policy(case["policy"], case["files"] is not None,
                                                     spec.workers) == "OFF" else 1
    # deviation models may read the elements of a last step that needs dummy batches
    last = sorted(i for steps in _expected(spec, case) if _partial(spec, case) and steps
                  for part in steps[-1] for i in part)
    check.equal(sorted(set(kept) - set(delivered)), [], Quantity.of("elements missing"), given=Given(dropped=last))
    check.equal(sorted(i for i in set(delivered) if delivered.count(i) != copies or i not in kept), [],
                f"elements delivered other than {copies}x, or not in the dataset", rule=ref_input.shard_policy)


@COSTLY
@given(data=st.data())
def test_iteration_styles_deliver_the_same_stream(engines, spec, data):
    case = data.draw(input_cases(spec, whole_steps=True), label="case")
    Check(spec, case=case, rule=ref_input.needs_dummies).that(
        not (spec.kind == "central_storage" and _partial(spec, case)), "the drawn case", case,
        "whole steps only (the reference needs no dummy batch)")
    per_worker = engines.call(spec, "input.distribute_styles", styles=list(STYLES), **case)
    streams = {style: [r.type if isinstance(r, Raised) else [[_ids(p) for p in step] for step in r.steps]
                       for r in (results[i] for results in per_worker)]
               for i, style in enumerate(STYLES)}
    check = Check(spec, case=case, rule=STYLES_AGREE)
    for style, stream in streams.items():
        check.equal(stream, streams["for"], f"the stream iterating with {style!r} vs with 'for'")


@given(length=st.integers(0, 20), global_batch=st.integers(1, 8))
def test_distribute_datasets_from_function_follows_input_context(engines, spec, length, global_batch):
    """The input function is called once per worker with InputContext(workers, worker, replicas);
    get_per_replica_batch_size divides the global batch (or raises when it does not divide);
    the per-worker dataset's elements reach the worker's replicas one whole element each."""
    results = engines.call(spec, "input.from_function", length=length, global_batch=global_batch)
    check = Check(spec, case={"length": length, "global_batch": global_batch}, rule=ref_input.datasets_from_function)
    for w, r in enumerate(results):
        check.equal(r.contexts, [[spec.workers, w, spec.replicas]],
                    f"input contexts (num_input_pipelines, input_pipeline_id, num_replicas_in_sync) of worker {w}",
                    rule=CONTEXTS)
        try:
            expected = ref_input.datasets_from_function(length, global_batch, spec.replicas, spec.workers)[w]
        except ValueError as exc:
            message = " ".join(str(exc).split())
            check.raises(r.raised or r, "ValueError", f"get_per_replica_batch_size on worker {w}", message,
                         rule=ref_input.per_replica_batch_size)
            continue
        check.equal([[_ids(p) for p in step] for step in r.steps], expected,
                    Quantity.of("element ids of every step", f"element ids of every step on worker {w}", worker=w),
                    given=Given(partial=bool(expected) and any(len(part) == 0 for part in expected[-1])))


def test_values_from_function_sees_each_replica_context(engines, spec):
    results = engines.call(spec, "input.values_from_function")
    for w, r in enumerate(results):
        expected = ref.local_results([[i, spec.replicas] for i in range(spec.replicas)], w, len(results))
        Check(spec, rule=ref.local_results).equal([np.asarray(v).tolist() for v in r.local], expected,
                          f"ValueContexts (replica id, replicas) on worker {w}")


@pytest.mark.specs(lambda spec: spec.replicas > 1 and spec.workers == 1)
@pytest.mark.parametrize("style", STYLES)
def test_partial_last_step_is_delivered(engines, spec, style):
    """``range(15).batch(7)`` under OFF (the V2 rule) ends part-way through a step on 2, 3 or 4
    replicas of one worker; that last step is still delivered, its missing replicas given empty
    batches ("a step exists while any replica has data"), in every iteration style. (Across
    workers the drawn cases above cover it: multi-worker input always pads.)"""
    case = {"length": 15, "batch": 7, "drop_remainder": False, "policy": "OFF", "batch_size_known": True,
            "feature_shape": (), "dtype": "int64", "files": None}
    per_worker = _expected(spec, case)
    check = Check(spec, case=dict(case, style=style), rule=ref_input.needs_dummies)
    check.that(ref_input.needs_dummies(15, 7, False, spec.workers, spec.replicas // spec.workers, "OFF"),
               "the reference's last step", per_worker[0][-1], "a step that needs empty batches")
    for w, result in enumerate(engines.call(spec, "input.distribute", style=style, **case)):
        check.equal([[_ids(p) for p in step] for step in result.steps], per_worker[w],
                    Quantity.of("element ids of every step", f"element ids of every step on worker {w}", worker=w),
                    given=Given(partial=True))


@pytest.mark.specs(lambda spec: spec.workers > 1)
@pytest.mark.parametrize("policy", ["FILE", "AUTO"])
def test_file_sharding_with_fewer_files_than_workers_fails(pool, spec, policy):
    """FILE sharding (and AUTO, which picks FILE for a file reader) of fewer files than workers
    does not fall back to DATA: the workers that have a file raise InvalidArgumentError at the
    first step while the others wait in the cross-worker all-reduce; the call fails naming
    that error, and the pool replaces the cluster."""
    files = [[100 * j + i for i in range(3)] for j in range(spec.workers - 1)]
    with pytest.raises(ref_input.InputError) as expected:
        ref_input.distribute_workers(files, 2, False, spec.workers, spec.replicas // spec.workers, policy)
    old = pool.get(spec).pids()
    try:
        outcome = pool.call(spec, "input.distribute", length=0, files=files, batch=2, drop_remainder=False,
                            policy=policy, style="for")
    except ProbeError as exc:
        outcome = exc.raised
    want_type, want_prefix = expected.value.raised[0]
    check = Check(spec, case={"files": files, "policy": policy}, rule=ref_input.distribute_workers)
    check.raises(outcome, want_type, "distributing fewer files than workers", want_prefix)
    new = pool.get(spec).pids()
    check.that(set(new).isdisjoint(old), "the cluster's processes after the failure", new,
               f"all new (the pool replaces the cluster of {old})")
