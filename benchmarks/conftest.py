"""Benchmark options, parametrization and the machine-info hook (the strategy specs, engines
and pool come from the top-level conftest). The pytest process never imports TensorFlow."""

from __future__ import annotations

import os

import pytest

from suite.harness.engines import machine
from suite.harness.loopcheck.usercheck import CheckInputError, validate_target
from suite.harness.plugin import state
from suite.harness.tools import bench

WORKLOAD_BENCH = "bench_workload.py"  # the user's step per spec and TensorFlow version: only with --workload


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """The suite's default ``-n auto`` does not apply here: benchmarks time one step at a time
    in one process (pytest-benchmark switches itself off under pytest-xdist)."""
    return 0


def pytest_addoption(parser):
    group = parser.getgroup("tf-distribute-suite benchmarks")
    group.addoption("--bench-workloads", default=",".join(bench.WORKLOADS),
                    help=f"comma-separated workloads to time (default: all of {', '.join(bench.WORKLOADS)})")
    group.addoption("--bench-scaling", default="weak", choices=("weak", "strong", "both"),
                    help="weak: fixed per-replica batch, the global batch grows with the replicas (default); "
                         "strong: fixed global batch split over the replicas")
    group.addoption("--bench-blocks", default=",".join(bench.BLOCKS),
                    help=f"comma-separated building blocks to time on {' and '.join(bench.BLOCK_WORKLOADS)} "
                         f"(default: all of {', '.join(bench.BLOCKS)}; 'none': no block benchmarks)")
    group.addoption("--workload-batch", type=int, default=32,
                    help="with --workload: the per-replica batch under weak scaling (default 32; strong: 3x it)")
    group.addoption("--bench-trace-rounds", type=int, default=3,
                    help="how many fresh step functions the first-call (trace) benchmark traces (default 3)")


def pytest_configure(config):
    """A ``--workload`` that names no importable module is a usage error (one line) before any
    engine starts: the check's own validation (the module is imported only in engines)."""
    target = config.getoption("--workload")
    if not target:
        return
    try:
        validate_target(target, str(config.invocation_params.dir))
    except CheckInputError as exc:
        raise pytest.UsageError(f"--workload: {exc}") from None
    if config.getoption("--workload-batch") < 1:
        raise pytest.UsageError(f"--workload-batch {config.getoption('--workload-batch')}: must be positive")


def pytest_ignore_collect(collection_path, config):
    """The user's step across specs and versions (bench_workload.py) has nothing to time without
    ``--workload``: not collected then, so the default run is unchanged."""
    if collection_path.name == WORKLOAD_BENCH and not config.getoption("--workload"):
        return True
    return None


def _workloads(config) -> list[bench.Workload]:
    target = config.getoption("--workload")
    if target:  # pytest benchmarks --workload package.module:factory: that workload alone
        return [bench.user_workload(target, config.getoption("--workload-batch"))]
    names = [n.strip() for n in config.getoption("--bench-workloads").split(",") if n.strip()]
    unknown = [n for n in names if n not in bench.WORKLOADS]
    if unknown:
        raise pytest.UsageError(f"--bench-workloads: unknown {', '.join(unknown)}; known: {', '.join(bench.WORKLOADS)}")
    return [bench.WORKLOADS[n] for n in names]


def _blocks(config) -> list[str]:
    names = [n.strip() for n in config.getoption("--bench-blocks").split(",") if n.strip() and n.strip() != "none"]
    unknown = [n for n in names if n not in bench.BLOCKS]
    if unknown:
        raise pytest.UsageError(f"--bench-blocks: unknown {', '.join(unknown)}; known: {', '.join(bench.BLOCKS)}, none")
    return names


def _scalings(config) -> list[str]:
    chosen = config.getoption("--bench-scaling")
    return list(bench.SCALINGS) if chosen == "both" else [chosen]


def pytest_generate_tests(metafunc):
    config = metafunc.config
    if "workload" in metafunc.fixturenames:
        workloads = _workloads(config)
        metafunc.parametrize("workload", workloads, ids=[w.name for w in workloads])
    if "block_workload" in metafunc.fixturenames:  # the block benchmarks' workloads: those chosen of BLOCK_WORKLOADS
        names = [w.name for w in _workloads(config) if w.name in bench.BLOCK_WORKLOADS]
        metafunc.parametrize("block_workload", names, ids=names)
    if "block" in metafunc.fixturenames:
        blocks = _blocks(config)
        metafunc.parametrize("block", blocks, ids=blocks)
    if "scaling" in metafunc.fixturenames:
        scalings = _scalings(config)
        metafunc.parametrize("scaling", scalings, ids=scalings)
    if "workload_spec" in metafunc.fixturenames:  # every selected spec, SPEC@ENV ones included
        no_gpu = pytest.mark.skip(reason="mirrored:gpus: no GPU visible here (nvidia-smi -L, CUDA_VISIBLE_DEVICES)")
        metafunc.parametrize("workload_spec", [pytest.param(s, id=s.text, marks=no_gpu if s.gpus and not s.replicas
                                                            else ()) for s in state.of(config).specs])
    if "plain_batch" in metafunc.fixturenames:  # the plain controls: every batch a spec's step needs
        needed = set()
        workloads = _workloads(config)
        for i, w in enumerate(workloads):
            for scaling in _scalings(config):
                for spec in state.of(config).specs:
                    got = w.batches_or_none(spec.replicas, scaling)
                    if got:
                        needed.add((i, got[0]))  # the same global batch: the overhead ratio
                        needed.add((i, got[1] if spec.synchronous else got[0]))  # one replica's: efficiency
        params = [(workloads[i], b) for i, b in sorted(needed)]
        metafunc.parametrize("plain_batch", params, ids=[f"{w.name}-B{b}" for w, b in params])


@pytest.fixture(scope="session")
def bencher(engines, request):
    config = request.config
    return bench.Bencher(engines, rounds=max(config.getoption("benchmark_min_rounds"), 1),
                         trace_rounds=max(config.getoption("--bench-trace-rounds"), 1),
                         smoke=bool(config.getoption("benchmark_disable")), path=str(config.invocation_params.dir))


@pytest.fixture(scope="session")
def versions_info(request):
    v = state.of(request.config).versions
    return {"tensorflow": v["tensorflow"], "keras": v["keras"]}


@pytest.fixture(scope="session")
def spec_versions(request):
    """``spec -> {"tensorflow", "keras"}`` of the interpreter that runs its engines (package
    metadata): the session's, or for ``SPEC@ENV`` that env's."""
    s = state.of(request.config)

    def of(spec) -> dict:
        v = s.other_versions.get(spec.text, s.versions) if spec.python else s.versions
        return {"tensorflow": v["tensorflow"], "keras": v["keras"]}

    return of


def pytest_benchmark_update_machine_info(config, machine_info):
    s = config.stash.get(state.SUITE, None)
    v = s.versions if s else {}
    machine_info["tensorflow"] = v.get("tensorflow")
    machine_info["keras"] = v.get("keras")
    machine_info["cpu_cores"] = os.cpu_count()
    machine_info["cpu_cores_usable"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    machine_info["gpus"] = machine.gpu_names()
    machine_info["strategy_specs"] = [spec.text for spec in (s.specs if s else [])]
