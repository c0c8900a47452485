"""The train step of each workload under each strategy spec, with its controls.

In file order (pytest keeps it): the harness floor per spec (an empty engine call), the plain
``tf.function`` step with no strategy on each global batch the specs use, the first call of
the step (its trace) per workload and spec, the step itself, then the step with each Keras
building block switched on (``bench.BLOCKS``). Step times are a round's
time over its K steps; see ``suite/harness/tools/bench.py`` for the method and benchmarks/README.md for the
fields of ``extra_info``."""

from __future__ import annotations

import os

import pytest

from suite.harness.tools import bench


def _common(spec, workload, info: dict, versions: dict) -> dict:
    return {"workload": workload.name, "spec": spec.text, "strategy": info.strategy,
            "replicas": info.replicas, "workers": spec.workers, "global_batch": info.global_batch,
            "per_replica_batch": info.per_replica_batch, "parameters": info.parameters,
            "cross_device_ops": info.cross_device_ops, "tensorflow": info.tf_version,
            "keras": info.keras_version, "virtual_devices": spec.devices > 1 and not spec.gpus,
            "shares_cores": bench.shares_cores(spec), "devices": bench.devices_label(spec, os.cpu_count()),
            "engine_versions": versions}


def _batches(bencher, spec, workload, scaling) -> tuple[int, int]:
    replicas = bencher.replicas(spec)
    got = workload.batches_or_none(replicas, scaling)
    if got is None:
        pytest.skip(f"{workload.name}: global batch {workload.global_batch} does not split over {replicas} replicas")
    return got


def _check(benchmark):
    missing = bench.missing_extra_info(benchmark.extra_info)
    assert not missing, f"extra_info lacks {missing}"


def test_harness_floor(benchmark, bencher, any_spec):
    """An empty engine call (``engine.ping``) to the spec's engine: what the harness adds to
    every round. Multi-worker specs answer from every worker."""
    bencher.engines.call(any_spec, "engine.ping")  # start the engine outside the timing
    benchmark.pedantic(bencher.engines.call, args=(any_spec, "engine.ping"), rounds=max(bencher.rounds, 30),
                       warmup_rounds=3)
    floor = bencher.floor(any_spec) if benchmark.disabled else benchmark.stats.stats.median
    bencher.floors[any_spec.text] = floor
    benchmark.extra_info.update({"kind": "floor", "spec": any_spec.text, "floor_s": floor,
                                 "devices": bench.devices_label(any_spec, os.cpu_count())})
    assert floor > 0


def test_plain_step(benchmark, bencher, plain_batch, versions_info):
    """The control: the same model, optimizer and data, a plain ``tf.function`` step (mean
    loss plus regularization, ``apply_gradients``) with no strategy, on one global batch."""
    workload, global_batch = plain_batch
    name = workload.name
    spec = bencher.plain_spec
    key, info = bencher.traced_state(spec, name, global_batch, plain=True)
    measured = bencher.measure(benchmark, spec, key)
    figures = bench.round_summary(measured, bencher.floor(spec))
    bencher.plain[(spec.text, name, global_batch, None)] = (spec, key, measured["steps"], figures["step_time_s"])
    benchmark.extra_info.update(_common(spec, workload, info, versions_info), kind="plain_step", spec="plain",
                                devices=bench.devices_label(spec, os.cpu_count()))
    benchmark.extra_info.update(figures, **bench.step_figures(figures["step_time_s"], global_batch, 1))


def test_first_call(benchmark, bencher, any_spec, workload, scaling, versions_info):
    """The step's first call: tracing (and graph optimisation) plus one step, each round on a
    freshly built step function; building the model and pipeline is set-up, not timed."""
    batches = _batches(bencher, any_spec, workload, scaling)
    states = []

    def setup():
        states.append(bencher.prepare(any_spec, workload.name, batches[0]))
        return (any_spec, states[-1][0], 1), {}

    engine_seconds = []
    benchmark.pedantic(lambda *a: engine_seconds.append(bencher.run(*a).seconds), setup=setup,
                       rounds=bencher.trace_rounds)
    info = states[-1][1]
    benchmark.extra_info.update(_common(any_spec, workload, info, versions_info), kind="first_call",
                                scaling=scaling, first_call_engine_s=bench.median(engine_seconds))


def test_train_step(benchmark, bencher, any_spec, workload, scaling, versions_info):
    """K train steps per round under the spec's strategy, synchronised by fetching the loss."""
    global_batch, per_replica = _batches(bencher, any_spec, workload, scaling)
    key, info = bencher.traced_state(any_spec, workload.name, global_batch)
    control = bencher.plain_control(workload.name, global_batch, any_spec)
    measured = bencher.measure(benchmark, any_spec, key, control=control[:3])
    figures = bench.round_summary(measured, bencher.floor(any_spec))
    step = figures["step_time_s"]
    bencher.steps[(any_spec.text, workload.name, global_batch)] = step
    rates = bench.step_figures(step, global_batch, info.replicas)
    plain_same = bench.median(measured["control"]) / control[2]  # interleaved with this benchmark's rounds
    ref_batch = per_replica if (scaling == "weak" and any_spec.synchronous) else global_batch
    plain_ref = bencher.plain_step_seconds(workload.name, ref_batch, any_spec)
    units = info.replicas if any_spec.synchronous else any_spec.workers
    benchmark.extra_info.update(_common(any_spec, workload, info, versions_info), kind="train_step")
    benchmark.extra_info.update(figures, **rates)
    benchmark.extra_info.update(
        scaling=scaling, asynchronous=not any_spec.synchronous, plain_step_time_s=plain_same,
        plain_control="interleaved: one plain round before each round", overhead_ratio=step / plain_same,
        scaling_efficiency=bench.scaling_efficiency(rates["examples_per_s"], units, ref_batch / plain_ref),
        scaling_reference=f"{units} x plain step on batch {ref_batch}",
        scaling_label=bench.scaling_label(any_spec, scaling, bench.shares_cores(any_spec)))
    _check(benchmark)


def test_block_step(benchmark, bencher, any_spec, block_workload, block, versions_info):
    """K train steps under the spec's strategy with one building block switched on (weak
    scaling), against the same block on the plain step (interleaved, as for ``train_step``):
    ``overhead_ratio`` is what the strategy costs the block's step. ``block_cost_ratio`` divides
    by this spec's step without the block (its ``train_step`` result, when it ran in this session):
    what the block costs under the strategy. A block TensorFlow does not support under the spec
    is skipped with TensorFlow's error (``bench.BLOCK_UNSUPPORTED``); any other error fails."""
    workload = bench.WORKLOADS[block_workload]
    global_batch, _ = _batches(bencher, any_spec, workload, "weak")
    try:
        key, info = bencher.traced_state(any_spec, workload.name, global_batch, block=block)
    except bench.StepRaised as exc:
        reason = bench.block_unsupported(block, exc.raised)
        if reason:
            pytest.skip(f"{block} unsupported under {any_spec.text}: {exc.raised.type}: ...{reason}...")
        raise
    assert info.block == bench.BLOCK_BUILT[block], f"the {block} step as built: {info.block}"
    control = bencher.plain_control(workload.name, global_batch, any_spec, block=block)
    measured = bencher.measure(benchmark, any_spec, key, control=control[:3])
    figures = bench.round_summary(measured, bencher.floor(any_spec))
    step = figures["step_time_s"]
    plain_same = bench.median(measured["control"]) / control[2]
    without = bencher.steps.get((any_spec.text, workload.name, global_batch))
    benchmark.extra_info.update(_common(any_spec, workload, info, versions_info), kind="block_step", block=block,
                                block_description=bench.BLOCKS[block])
    benchmark.extra_info.update(figures, **bench.step_figures(step, global_batch, info.replicas))
    benchmark.extra_info.update(
        scaling="weak", asynchronous=not any_spec.synchronous, plain_step_time_s=plain_same,
        plain_control=f"interleaved: the plain step with {block}, one round before each round",
        overhead_ratio=step / plain_same, step_without_block_s=without,
        block_cost_ratio=step / without if without else None)
    missing = bench.missing_extra_info(benchmark.extra_info, bench.REQUIRED_BLOCK_INFO)
    assert not missing, f"extra_info lacks {missing}"
