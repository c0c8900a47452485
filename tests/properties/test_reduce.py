"""strategy.reduce (SUM/MEAN, axis=None and axis=0, uneven and empty replicas) and
experimental_local_results ordering, against reference.distribute."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference import distribute as ref
from suite.harness import cases, repro
from suite.harness.check import Check


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
    check = Check(spec, dtype, {"sizes": sizes}, snippet)
    check.on_workers(results, "sum_axis0", ref.reduce(per_replica, "SUM", axis=0), "reduce(SUM, axis=0)", n_terms=n)
    check.on_workers(results, "mean_axis0", ref.reduce(per_replica, "MEAN", axis=0), "reduce(MEAN, axis=0)", n_terms=n)
    check.on_workers(results, "sum_none", ref.reduce(row_sums, "SUM"), "reduce(SUM, axis=None)", n_terms=n)
    check.on_workers(results, "mean_none", ref.reduce(row_sums, "MEAN"), "reduce(MEAN, axis=None)", n_terms=n)
    check.per_replica(results, row_sums, "local row sums", n_terms=n)


@given(data=st.data())
def test_experimental_local_results_are_in_replica_order(engines, spec, data):
    """Each worker's local results list its own replicas, in replica-id order."""
    sizes = data.draw(cases.splits(spec.replicas), label="sizes")
    results = engines.call(spec, "reduce.reduce", rows=np.ones((sum(sizes), 1)), sizes=sizes)
    check = Check(spec, "float64", {"sizes": sizes})
    for w, r in enumerate(results):
        check.equal(r.replica_ids, ref.local_results(list(range(spec.replicas)), w, len(results)),
                    f"replicas the local results come from (worker {w})")
    check.per_replica(results, [[float(s)] for s in sizes], "local row count")
