"""strategy.reduce (SUM/MEAN, axis=None and axis=0, uneven and empty replicas) and
experimental_local_results ordering, against reference.distribute."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference import distribute as ref
from reference.rules import Rule
from suite.harness.drawing import cases
from suite.harness.judging import repro
from suite.harness.judging.judgment import Check


@pytest.mark.parametrize("dtype", cases.DTYPES)
@given(data=st.data())
def test_reduce_sum_and_mean_over_uneven_replicas(engines, spec, dtype, data):
    """axis=0 reduces over every replica's rows (MEAN divides by the total row count);
    axis=None reduces element-wise across replicas (MEAN divides by the replica count)."""
    sizes = data.draw(cases.splits(spec.replicas, min_total=1), label="sizes")
    width = data.draw(st.integers(1, 3), label="width")
    rows = data.draw(cases.floats(dtype, (sum(sizes), width)), label="rows")
    results = engines.call(spec, "reduce.reduce", rows=rows, sizes=sizes)
    per_replica = ref.split(rows, sizes)
    row_sums = [r.astype(np.float64).sum(axis=0) if len(r) else np.zeros(width) for r in per_replica]
    n = sum(sizes)
    snippet = repro.snippet(spec, {"rows": rows, "sizes": sizes},
                            "mine = tf.function(lambda: strategy.run(lambda: my_slice(rows)[0]))()\n"
                            "for op in ('SUM', 'MEAN'):\n"
                            "    print(op, strategy.reduce(op, mine, axis=0).numpy())\n")
    check = Check(spec, dtype, {"sizes": sizes}, snippet, rule=ref.reduce)
    check.on_workers(results, "sum_axis0", ref.reduce(per_replica, "SUM", axis=0), "reduce(SUM, axis=0)", n_terms=n)
    check.on_workers(results, "mean_axis0", ref.reduce(per_replica, "MEAN", axis=0), "reduce(MEAN, axis=0)", n_terms=n)
    check.on_workers(results, "sum_none", ref.reduce(row_sums, "SUM"), "reduce(SUM, axis=None)", n_terms=n)
    check.on_workers(results, "mean_none", ref.reduce(row_sums, "MEAN"), "reduce(MEAN, axis=None)", n_terms=n)
    check.per_replica(results, row_sums, "local row sums", n_terms=n, rule=ref.local_results)


@given(data=st.data())
def test_experimental_local_results_are_in_replica_order(engines, spec, data):
    """Each worker's local results list its own replicas, in replica-id order."""
    sizes = data.draw(cases.splits(spec.replicas), label="sizes")
    results = engines.call(spec, "reduce.reduce", rows=np.ones((sum(sizes), 1)), sizes=sizes)
    check = Check(spec, "float64", {"sizes": sizes}, rule=ref.local_results)
    for w, r in enumerate(results):
        check.equal(r.replica_ids, ref.local_results(list(range(spec.replicas)), w, len(results)),
                    f"replicas the local results come from (worker {w})")
    check.per_replica(results, [[float(s)] for s in sizes], "local row count")


# The worked examples of the ``reduce`` docstrings (Strategy.reduce in distribute_lib.py, quoted
# by CentralStorageStrategy; OneDeviceStrategy.reduce): (name, replicas, rows [N, D], sizes,
# {result: the docstring's value}). A replica's value is its slice of rows; axis=None reduces
# the replicas' row sums, so a one-row slice is the docstring's per-replica vector.
DOCSTRING_EXAMPLES = [
    # "values for examples [0, 1, 2, 3] will be on replica 0 and [4, 5, 6, 7] on replica 1. By
    # default, reduce will just aggregate across replicas, returning [0+4, 1+5, 2+6, 3+7]"
    ("global_batch_8_axis_none", 2, [[0, 1, 2, 3], [4, 5, 6, 7]], [1, 1], {"sum_none": [4, 6, 8, 10]}),
    # "specifying the batch dimension as the axis, typically axis=0 ... a scalar 0+1+...+7"
    ("global_batch_8_axis_0", 2, [[i] for i in range(8)], [4, 4], {"sum_axis0": [28]}),
    # "the last batch has size 6 and it is divided into [0, 1, 2, 3] and [4, 5] ... MEAN, using
    # axis=0 will use the correct denominator of 6" (15 / 6, not the mean of means 3)
    ("partial_batch_6_mean_axis_0", 2, [[i] for i in range(6)], [4, 2], {"mean_axis0": [2.5]}),
    # OneDeviceStrategy.reduce: "t = tf.range(10) ... SUM, t, axis=None: [0, ..., 9]; axis=0: 45"
    ("one_device_range_10_axis_none", 1, [list(range(10))], [1], {"sum_none": list(range(10))}),
    ("one_device_range_10_axis_0", 1, [[i] for i in range(10)], [10], {"sum_axis0": [45]}),
]


@pytest.mark.specs(lambda spec: spec.replicas in {e[1] for e in DOCSTRING_EXAMPLES})
def test_reduce_docstrings_worked_examples(engines, spec):
    """The reduce docstrings' numbers, under every spec with their replica count."""
    for name, _, rows, sizes, expected in (e for e in DOCSTRING_EXAMPLES if e[1] == spec.replicas):
        results = engines.call(spec, "reduce.reduce", rows=np.asarray(rows, np.float64), sizes=sizes)
        check = Check(spec, "float64", {"example": name, "rows": rows, "sizes": sizes},
                      rule=Rule("documented", f"the reduce docstrings' worked example {name}"))
        for attr, value in expected.items():
            check.on_workers(results, attr, np.asarray(value, np.float64), f"the docstring's {name}: {attr}",
                             n_terms=len(rows))
