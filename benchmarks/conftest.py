"""Benchmark options, parametrization and the machine-info hook (the strategy specs, engines
and pool come from the top-level conftest). The pytest process never imports TensorFlow."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from suite.harness.loopcheck.usercheck import CheckInputError, validate_target
from suite.harness.plugin import state
from suite.harness.pool import machine, memo
from suite.harness.tools import bench, suite_bench

WORKLOAD_BENCH = "bench_workload.py"  # the user's step per spec and TensorFlow version: only with --workload
CHECK_BENCH = "bench_check.py"  # the check of the suite's own examples: not with --workload
SUITE_BENCH = "bench_suite.py"  # the suite's own test files, timed: only with --bench-suite, and then alone


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
    group.addoption("--bench-full", action="store_true", default=False,
                    help="the full sweep: every building block in every dtype (mixed precision included) on "
                         "every spec, however long it takes (default: the selection below, which ends within "
                         "minutes on 2 cores; smoke mode, --benchmark-disable, always runs the full sweep)")
    group.addoption("--bench-blocks", default=None,
                    help=f"comma-separated building blocks to time on {' and '.join(bench.BLOCK_WORKLOADS)} "
                         f"(default: {', '.join(bench.default_blocks(gpus=False))}, and "
                         f"{', '.join(bench.GPU_ONLY_BLOCKS)} where a GPU is present or with --bench-full; "
                         f"'none': no block benchmarks)")
    group.addoption("--workload-batch", type=int, default=32,
                    help="with --workload: the per-replica batch under weak scaling (default 32; strong: 3x it)")
    group.addoption("--bench-suite", default=None, metavar="TARGETS",
                    help="time the suite's own tests instead (benchmarks/bench_suite.py): comma-separated test "
                         "files or folders run as the README runs them (HYPOTHESIS_PROFILE=ci pytest TARGET; "
                         "'tests': the whole command), or slowest:N, the N costliest files of docs/cost_table.json")
    group.addoption("--bench-sizes", default=None,
                    help="comma-separated model sizes the check's cost is timed at (bench_check_size.py), or 'all': "
                         "mlp-1e4, mlp-1e6, mlp-1e7, mlp-1e8, resnet50v2, transformer-110m (default: the MLPs up to 1e7; "
                         "smoke mode: mlp-1e4)")
    group.addoption("--bench-trace-rounds", type=int, default=3,
                    help="how many fresh step functions the first-call (trace) benchmark traces (default 3)")


def pytest_configure(config):
    """A ``--workload`` that names no importable module is a usage error (one line) before any
    engine starts: the check's own validation (the module is imported only in engines). Benchmarks
    time real runs: the session memo of the check's one-device runs (suite/harness/pool/memo.py),
    which the suite's plugin enabled, is off. A ``--bench-suite`` naming no tests is a usage error too."""
    memo.MEMO.disable()
    target = config.getoption("--workload")
    if target:
        try:
            validate_target(target, str(config.invocation_params.dir))
        except CheckInputError as exc:
            raise pytest.UsageError(f"--workload: {exc}") from None
    if config.getoption("--bench-suite") is not None:
        try:
            config.stash[_SUITE_TARGETS] = suite_bench.targets(config.getoption("--bench-suite"), config.rootpath)
        except suite_bench.SuiteBenchError as exc:
            raise pytest.UsageError(str(exc)) from None
    if config.getoption("--workload-batch") < 1:
        raise pytest.UsageError(f"--workload-batch {config.getoption('--workload-batch')}: must be positive")


def pytest_ignore_collect(collection_path, config):
    """The user's step across specs and versions (bench_workload.py) has nothing to time without
    ``--workload``: not collected then, so the default run is unchanged; with it, the run times
    that workload alone (not the check of the suite's examples, bench_check.py). The suite's own
    tests (bench_suite.py) are timed only with ``--bench-suite``, and then alone."""
    if collection_path.name == WORKLOAD_BENCH and not config.getoption("--workload"):
        return True
    if collection_path.name == CHECK_BENCH and config.getoption("--workload"):
        return True
    suite = config.getoption("--bench-suite") is not None
    if collection_path.suffix == ".py" and collection_path.name.startswith("bench_") and \
            (collection_path.name == SUITE_BENCH) != suite:
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


def _full(config) -> bool:
    """The full sweep: ``--bench-full``, or smoke mode (each benchmark once: CI runs every one)."""
    return bool(config.getoption("--bench-full") or config.getoption("benchmark_disable"))


def _blocks(config) -> list[str]:
    """The blocks parametrized: those named by ``--bench-blocks``, else every block (the default
    selection then deselects the GPU-only ones on a machine without GPUs: ``_default_selection``)."""
    chosen = config.getoption("--bench-blocks")
    if chosen is None:
        return list(bench.BLOCKS)
    names = [n.strip() for n in chosen.split(",") if n.strip() and n.strip() != "none"]
    unknown = [n for n in names if n not in bench.BLOCKS]
    if unknown:
        raise pytest.UsageError(f"--bench-blocks: unknown {', '.join(unknown)}; known: {', '.join(bench.BLOCKS)}, none")
    return names


def _sizes(config) -> list[str]:
    """The model sizes of bench_check_size.py: ``--bench-sizes``, else the default (smoke mode: the smallest)."""
    from bench_check_size import DEFAULT_SIZES, SIZES, SMOKE_SIZES

    chosen = config.getoption("--bench-sizes")
    if chosen is None:
        return list(SMOKE_SIZES if config.getoption("benchmark_disable") else DEFAULT_SIZES)
    names = list(SIZES) if chosen.strip() == "all" else [n.strip() for n in chosen.split(",") if n.strip()]
    unknown = [n for n in names if n not in SIZES]
    if unknown:
        raise pytest.UsageError(f"--bench-sizes: unknown {', '.join(unknown)}; known: {', '.join(SIZES)}, all")
    return names


def _scalings(config) -> list[str]:
    chosen = config.getoption("--bench-scaling")
    return list(bench.SCALINGS) if chosen == "both" else [chosen]


def pytest_generate_tests(metafunc):
    config = metafunc.config
    if "suite_target" in metafunc.fixturenames:
        chosen = config.stash.get(_SUITE_TARGETS, [])
        metafunc.parametrize("suite_target", chosen, ids=[t.path for t in chosen])
    if "workload" in metafunc.fixturenames:
        workloads = _workloads(config)
        metafunc.parametrize("workload", workloads, ids=[w.name for w in workloads])
    if "block_workload" in metafunc.fixturenames:  # the block benchmarks' workloads: those chosen of BLOCK_WORKLOADS
        names = [w.name for w in _workloads(config) if w.name in bench.BLOCK_WORKLOADS]
        metafunc.parametrize("block_workload", names, ids=names)
    if "block" in metafunc.fixturenames:
        blocks = _blocks(config)
        metafunc.parametrize("block", blocks, ids=blocks)
    if "size" in metafunc.fixturenames:
        sizes = _sizes(config)
        metafunc.parametrize("size", sizes, ids=sizes)
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
                for spec in _bench_specs(config):
                    got = w.batches_or_none(spec.replicas, scaling)
                    if got:
                        needed.add((i, got[0]))  # the same global batch: the overhead ratio
                        needed.add((i, got[1] if spec.synchronous else got[0]))  # one replica's: efficiency
        params = [(workloads[i], b) for i, b in sorted(needed)]
        metafunc.parametrize("plain_batch", params, ids=[f"{w.name}-B{b}" for w, b in params])


def _trim_specs(config) -> bool:
    """Whether the default selection narrows the specs: not with ``--bench-full`` (or smoke mode),
    ``--strategies`` or ``--workload`` (a selection the user made, timed as asked)."""
    return not _full(config) and not config.getoption("--strategies") and not config.getoption("--workload")


def _bench_specs(config) -> list:
    """The specs the benchmarks run on: every selected spec, or in the default selection one per
    strategy kind (``bench.representative_specs``)."""
    specs = state.of(config).specs
    return bench.representative_specs(specs) if _trim_specs(config) else list(specs)


def _default_selection(config, items) -> list:
    """What the default run leaves out of the full sweep (``--bench-full``, what the default was
    before): the blocks whose cost on a CPU means nothing (``bench.GPU_ONLY_BLOCKS``: mixed
    precision) where no GPU is present, unless ``--bench-blocks`` names them; and unless
    ``--strategies`` or ``--workload`` is given, the specs beyond one per strategy kind, the first
    calls (traces), and the blocks on any workload but the MLP (``bench.DEFAULT_BLOCK_WORKLOADS``)
    or under any spec but one (``bench.block_spec``: mirrored:2)."""
    if _full(config):
        return []
    out = []
    left_out = set()
    if config.getoption("--bench-blocks") is None:
        left_out = set(bench.BLOCKS) - set(bench.default_blocks(gpus=bool(machine.gpu_names())))
    trim = _trim_specs(config)
    kept = {s.text for s in _bench_specs(config)}
    under = bench.block_spec(_bench_specs(config))
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        spec = params.get("any_spec")
        kind = bench.kind_of(item.nodeid)
        if params.get("block") in left_out:
            out.append(item)
        elif trim and spec is not None and (spec.text not in kept or kind == "first_call" or (
                kind == "block_step" and (spec is not under
                                          or params.get("block_workload") not in bench.DEFAULT_BLOCK_WORKLOADS))):
            out.append(item)
    return out


def pytest_collection_modifyitems(config, items):
    out = _default_selection(config, items)
    if out:
        config.hook.pytest_deselected(items=out)
        items[:] = [i for i in items if i not in set(out)]
        config.stash[_LEFT_OUT] = len(out)


_LEFT_OUT = pytest.StashKey[int]()
_SUITE_TARGETS = pytest.StashKey[list]()
_SETUP_S = pytest.StashKey[float]()


def _previous_run(config) -> tuple[str | None, dict]:
    """The last run's JSON: the ``--benchmark-json`` file when it already exists, else the newest
    run in pytest-benchmark's storage (``.benchmarks``, ``--benchmark-save``/``--benchmark-autosave``)."""
    path = config.getoption("benchmark_json")
    if path and Path(path).is_file():
        try:
            return str(path), json.loads(Path(path).read_text())
        except (OSError, ValueError):
            pass
    bs = getattr(config, "_benchmarksession", None)
    try:
        runs = list(bs.storage.load()) if bs is not None else []
    except Exception:  # storage is pytest-benchmark's: an unreadable one gives no estimate, not an error
        runs = []
    if runs:
        found, data = runs[-1]
        return str(found), data
    return None, {}


def pytest_collection_finish(session):
    """Before the first benchmark: how many were selected and how long they should take (from
    the last run's JSON where it timed them, else per kind, ``bench.SECONDS_PER_KIND``)."""
    config = session.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    ids = [i.nodeid for i in session.items if i.nodeid.startswith("benchmarks/")]
    if reporter is None or not ids:
        return
    source, data = _previous_run(config)
    by_table = {i.nodeid: i.callspec.params["suite_target"].estimate_s for i in session.items
                if "suite_target" in getattr(getattr(i, "callspec", None), "params", {})}
    seconds, known = bench.estimate_seconds(ids, bench.previous_wall_seconds(data),
                                            smoke=bool(config.getoption("benchmark_disable")), fallback=by_table)
    how = (f"{known} of them as timed in {source}, the rest at the per-kind figures" if known
           else "from the count, at the per-kind figures measured on 2 cores")
    selection = "the full sweep" if _full(config) else "the default selection"
    left_out = config.stash.get(_LEFT_OUT, 0)
    extra = f", {left_out} left out here: --bench-full runs the full sweep" if left_out else ""
    reporter.write_line(f"benchmarks: {len(ids)} selected ({selection}{extra}), estimated "
                        f"{bench.duration_text(seconds)} ({how})")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each benchmark's wall time (set-up and call: engine starts, calibration, controls) in its
    ``extra_info["wall_s"]``, so the next run's estimate can read it from this run's JSON."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "setup":
        item.stash[_SETUP_S] = report.duration
    elif report.when == "call":
        fixture = getattr(item, "funcargs", {}).get("benchmark")
        info = getattr(fixture, "extra_info", None)
        if isinstance(info, dict):
            info["wall_s"] = item.stash.get(_SETUP_S, 0.0) + report.duration


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
