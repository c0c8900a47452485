"""The block benchmarks time what they name: the engine builds each building block into both the
strategy's step and the plain control (read back from the built model, optimizer and step), and
a state without a block has none. Built, not run (the benchmarks run them)."""

from __future__ import annotations

import pytest

from suite.common.specs import parse_spec
from suite.harness.judging.judgment import Check
from suite.harness.tools import bench


@pytest.mark.parametrize("workload", bench.BLOCK_WORKLOADS)
def test_each_block_state_is_built_with_its_block(engines, workload):
    spec = parse_spec("mirrored:2")
    check = Check(spec, case={"workload": workload})
    batch = bench.WORKLOADS[workload].per_replica_batch * 2
    for plain in (False, True):
        where = bench.Bencher.PLAIN_SPEC_TEXT if plain else spec.text
        for block in (None, *bench.BLOCKS):
            info = engines.call(parse_spec(where), "bench.prepare", workload=workload, global_batch=batch,
                                key=f"built-{block}-{plain}", plain=plain, block=block)[0]
            check.equal(info.block, bench.BLOCK_BUILT.get(block), f"what the {'plain ' if plain else ''}state with "
                        f"block {block} reports built")
