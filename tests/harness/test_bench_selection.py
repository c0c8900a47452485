"""What ``pytest benchmarks`` selects by default and with ``--bench-full``, and the estimate it
prints before the first benchmark (benchmarks/conftest.py, suite/harness/tools/bench.py).
Collection only: no engine starts, no TensorFlow."""

from __future__ import annotations

import json
import os
import re

import pytest

from suite.common.specs import DEFAULT_SPECS, parse_specs
from suite.harness.judging.judgment import Check
from suite.harness.pool import machine
from suite.harness.tools import bench
from tests.helpers import run_pytest

NO_GPU = pytest.mark.skipif(bool(machine.gpu_names()), reason="this machine has GPUs (nvidia-smi -L)")
ESTIMATE = re.compile(r"^benchmarks: (\d+) selected \((the default selection|the full sweep)[^)]*\), "
                      r"estimated (.+?) \((.*)\)$", re.M)


def _collect(*args: str, **env) -> tuple[list[str], str]:
    done = run_pytest(["benchmarks", "--collect-only", *args], timeout=120, **env)
    Check("pytest benchmarks --collect-only", case={"options": list(args)}).equal(
        done.returncode, 0, "exit status of the collection", done.stdout[-3000:] + done.stderr[-2000:])
    return [line for line in done.stdout.splitlines() if line.startswith("benchmarks/")], done.stdout


SIZE = "benchmarks/bench_check_size.py::test_check_size[%s]"
DEFAULT_SIZES = ("mlp-1e4", "mlp-1e6", "mlp-1e7")  # bench_check_size.DEFAULT_SIZES, as benchmarks/README.md says


@pytest.fixture(scope="module")
def default_run():
    return _collect()


@pytest.fixture(scope="module")
def full_run():
    return _collect("--bench-full")


@NO_GPU
def test_the_default_selection_leaves_out_mixed_precision_without_a_gpu(default_run):
    ids, _ = default_run
    check = Check("pytest benchmarks (default selection, no GPU)")
    check.equal([i for i in ids if "mixed_precision" in i], [], "mixed-precision benchmarks selected")
    blocks = {i.split("[", 1)[1].split("-")[1] for i in ids if "::test_block_step[" in i}
    check.equal(blocks, set(bench.default_blocks(gpus=False)), "the blocks timed")


def test_the_default_selection_times_every_strategy_kind_on_every_workload(default_run):
    ids, _ = default_run
    kinds = {s.kind for s in parse_specs(",".join(DEFAULT_SPECS))}
    timed = {(i.split("[", 1)[1].split("-")[0], i.split("-weak-", 1)[1].rstrip("]"))
             for i in ids if "::test_train_step[" in i}
    check = Check("pytest benchmarks (default selection)")
    for w in bench.WORKLOADS:
        check.equal({parse_specs(s)[0].kind for wl, s in timed if wl == w}, kinds, f"the strategy kinds timed on {w}")
    check.that(len(ids) < 60, "benchmarks in the default selection", len(ids), "a few dozen (minutes on 2 cores)")


def test_the_full_sweep_selects_everything_including_mixed_precision(default_run, full_run):
    ids, _ = full_run
    specs = list(DEFAULT_SPECS)
    check = Check("pytest benchmarks --bench-full")
    # what the default selected before the default selection: every block and kind on every spec
    expected = (len(specs) * (1 + 2 * len(bench.WORKLOADS)) + len(bench.BLOCK_WORKLOADS) * len(bench.BLOCKS) * len(specs))
    check.equal(len([i for i in ids if "::test_plain_step[" not in i and "bench_check.py" not in i
                     and "bench_check_size.py" not in i]), expected, "step benchmarks beside the plain controls")
    checks = ["benchmarks/bench_check.py::test_check[guide]", "benchmarks/bench_check.py::test_check[mistake]"]
    for selection, selected in (("the full sweep", ids), ("the default selection", default_run[0])):
        check.equal([i for i in selected if "bench_check.py" in i], checks, f"the check's benchmarks in {selection}")
        # the check by model size: the MLPs up to 1e7 (a minute); larger ones only when --bench-sizes names them
        check.equal([i for i in selected if "bench_check_size.py" in i], [SIZE % s for s in DEFAULT_SIZES],
                    f"the check-by-size benchmarks in {selection}")
    check.equal(len([i for i in ids if "mixed_precision" in i]), len(bench.BLOCK_WORKLOADS) * len(specs),
                "mixed-precision benchmarks (every block workload and spec)")
    check.equal(sorted(set(default_run[0]) - set(ids)), [], "default benchmarks the full sweep lacks")


def test_smoke_mode_and_named_blocks_keep_what_they_name():
    smoke, _ = _collect("--benchmark-disable", "--strategies", "mirrored:2")
    named, _ = _collect("--bench-blocks", "mixed_precision", "--strategies", "mirrored:2")
    check = Check("pytest benchmarks --benchmark-disable / --bench-blocks")
    check.equal([i for i in smoke if "bench_check_size.py" in i], [SIZE % "mlp-1e4"],
                "the check-by-size benchmarks in smoke mode (CI: that it runs)")
    check.that(any("mixed_precision" in i for i in smoke), "smoke mode (CI) selects mixed precision", smoke[-4:],
               "the full sweep")
    check.equal([i.split("[")[1] for i in named if "::test_block_step[" in i],
                ["mlp-mixed_precision-mirrored:2]", "cnn-mixed_precision-mirrored:2]"], "the blocks --bench-blocks names")


def test_the_estimate_is_printed_before_the_run(default_run, full_run):
    check = Check("pytest benchmarks: the estimate line")
    for (ids, out), selection in ((default_run, "the default selection"), (full_run, "the full sweep")):
        found = ESTIMATE.search(out)
        check.that(found is not None, "the estimate line", out[-1500:], "benchmarks: N selected (...), estimated ...")
        if found:
            check.equal((int(found.group(1)), found.group(2)), (len(ids), selection), "what it counts")
            check.contains(found.group(4), ["from the count"], "where the estimate comes from")


def test_the_estimate_reads_the_last_runs_json(tmp_path, default_run):
    ids, _ = default_run
    last = tmp_path / "out.json"
    last.write_text(json.dumps({"benchmarks": [{"fullname": ids[0], "extra_info": {"wall_s": 600.0}},
                                               {"fullname": ids[1], "extra_info": {}}]}))
    _, out = _collect("--benchmark-json", str(last))
    found = ESTIMATE.search(out)
    check = Check("pytest benchmarks --benchmark-json EXISTING: the estimate")
    check.that(found is not None, "the estimate line", out[-1500:], "benchmarks: N selected (...), estimated ...")
    if found:
        check.contains(found.group(4), [f"1 of them as timed in {last}"], "where the estimate comes from")
        seconds, known = bench.estimate_seconds(ids, {ids[0]: 600.0})
        check.equal((found.group(3), known), (bench.duration_text(seconds), 1), "the estimate")


def test_the_estimate_sums_the_last_run_and_the_per_kind_figures():
    ids = ["benchmarks/bench_train_step.py::test_train_step[mlp-weak-default]",
           "benchmarks/bench_train_step.py::test_harness_floor[default]"]
    check = Check("bench.estimate_seconds")
    check.equal(bench.estimate_seconds(ids, {}), (bench.SECONDS_PER_KIND["train_step"] + bench.SECONDS_PER_KIND["floor"], 0),
                "from the count")
    check.equal(bench.estimate_seconds(ids, {ids[0]: 30.0}), (30.0 + bench.SECONDS_PER_KIND["floor"], 1),
                "with an earlier run")
    check.equal(bench.previous_wall_seconds({"benchmarks": [{"fullname": ids[0], "extra_info": {"wall_s": 2.5}},
                                                            {"fullname": ids[1], "extra_info": {}}]}),
                {ids[0]: 2.5}, "the earlier run's figures")
    check.equal([s.text for s in bench.representative_specs(parse_specs(",".join(DEFAULT_SPECS)))],
                ["default", "one_device", "mirrored:2", "central_storage:2", "multi_worker:2x1",
                 "parameter_server:2w1ps"], "one spec per strategy kind")


def test_a_gpu_puts_mixed_precision_back_in_the_default(tmp_path):
    """A stand-in ``nvidia-smi`` that lists one GPU: the mixed-precision blocks are in the default."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: Stand-in (UUID: GPU-0)'\n")
    fake.chmod(0o755)
    ids, _ = _collect(PATH=f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    check = Check("pytest benchmarks (default selection, a GPU)")
    check.that(any("mixed_precision" in i for i in ids), "mixed-precision benchmarks selected", ids[-6:], "some")
