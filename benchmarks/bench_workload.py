"""A user's own train step (``pytest benchmarks --workload package.module:factory``) under every
selected spec, ``SPEC@ENV`` ones included: is my step slower after the upgrade?

The step is the loop check's: the workload's ``step`` in ``strategy.run`` inside a
``tf.function``, or the suite's canonical step on its model, optimizer and loss where it has none
(the engine side is ``bench.prepare`` of suite/engine/probes/bench.py). It is timed by the
method of the built-in train step (suite/harness/tools/bench.py: K steps a round, K calibrated,
a warm-up round, ``--benchmark-min-rounds`` counted rounds, the engine's own clock beside the
harness's) on ``--workload-batch`` examples per replica. A ``SPEC@ENV`` result whose ``SPEC`` ran
in this session interleaves one round of ``SPEC`` (the session's TensorFlow) before each of its
rounds, so its ratio to the other version compares rounds seconds apart, not minutes. The report
(``python -m suite.report``) sets the versions of each spec side by side."""

from __future__ import annotations

import os

from suite.harness.tools import bench


def test_workload_step(benchmark, bencher, workload_spec, spec_versions, request):
    """K steps a round of the user's step under ``workload_spec``, in the engines of its TensorFlow."""
    spec = workload_spec
    target = request.config.getoption("--workload")
    workload = bench.user_workload(target, request.config.getoption("--workload-batch"))
    global_batch, per_replica = workload.batches(bencher.replicas(spec), "weak")
    key, info = bencher.traced_state(spec, target, global_batch)
    versus = bencher.workload_steps.get((spec.base.text, target, global_batch)) if spec.python else None
    measured = bencher.measure(benchmark, spec, key, control=versus[:3] if versus else None)
    figures = bench.round_summary(measured, bencher.floor(spec))
    step = figures["step_time_s"]
    bencher.workload_steps[(spec.text, target, global_batch)] = (spec, key, measured["steps"], step,
                                                                 [info.tf_version, info.keras_version])
    benchmark.extra_info.update(
        kind="workload_step", workload=target, spec=spec.text, spec_base=spec.base.text, env=spec.python,
        strategy=info.strategy, replicas=info.replicas, workers=spec.workers, global_batch=global_batch,
        per_replica_batch=per_replica, parameters=info.parameters, cross_device_ops=info.cross_device_ops,
        tensorflow=info.tf_version, keras=info.keras_version, engine_versions=spec_versions(spec),
        shares_cores=bench.shares_cores(spec), devices=bench.devices_label(spec, os.cpu_count()))
    benchmark.extra_info.update(figures, **bench.step_figures(step, global_batch, info.replicas))
    if versus and measured["control"]:  # the session's TensorFlow on the same spec, one round before each of this one's
        versus_step = bench.median(measured["control"]) / versus[2]
        benchmark.extra_info.update(versus_spec=spec.base.text, versus_versions=versus[4], versus_step_time_s=versus_step,
                                    versus_ratio=step / versus_step,
                                    versus_control="interleaved: one round of the session's spec before each round")
    missing = bench.missing_extra_info(benchmark.extra_info, bench.REQUIRED_WORKLOAD_INFO)
    assert not missing, f"extra_info lacks {missing}"
