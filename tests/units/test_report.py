"""The report command on synthetic result files (no engines): tables, the comparison columns
with their ratio and noise mark, the plots, the conformance grid and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from suite.harness.reporting import benchmark_results, run_report

REPO = Path(__file__).resolve().parents[2]


def _bench(name, kind, median, iqr=None, **info):
    iqr = median * 0.02 if iqr is None else iqr
    stats = {"median": median, "q1": median - iqr / 2, "q3": median + iqr / 2, "iqr": iqr, "rounds": 5}
    return {"name": name, "stats": stats, "extra_info": {"kind": kind, **info}}


def _step(spec, replicas, round_s, k=100, iqr=None, workload="cnn", **extra):
    info = dict(workload=workload, spec=spec, scaling="weak", replicas=replicas, workers=1,
                global_batch=32 * replicas, per_replica_batch=32, steps_per_round=k, round_s=round_s,
                examples_per_s=32 * replicas * k / round_s, examples_per_s_per_replica=32 * k / round_s,
                overhead_ratio=1.5, scaling_efficiency=0.5, cross_device_ops="CollectiveAllReduce",
                harness_vs_engine=0.001, shares_cores=replicas > 1)
    info.update(extra)
    return _bench(f"test_train_step[{workload}-weak-{spec}]", "train_step", round_s, iqr, **info)


def _write(tmp_path, name, benchmarks, tf="2.21.0", keras="3.15.1"):
    path = tmp_path / name
    path.write_text(json.dumps({"machine_info": {"tensorflow": tf, "keras": keras, "cpu_cores": 2, "gpus": []},
                                "benchmarks": benchmarks}))
    return path


def _results(round_scale=1.0, iqr=None):
    return [
        _bench("test_harness_floor[default]", "floor", 0.0001, spec="default"),
        _bench("test_plain_step[cnn-B32]", "plain_step", 0.5, workload="cnn", global_batch=32, per_replica_batch=32,
               steps_per_round=100, examples_per_s=6400.0, harness_vs_engine=0.0),
        _bench("test_first_call[cnn-weak-default]", "first_call", 0.3, workload="cnn", spec="default", scaling="weak"),
        _step("default", 1, 0.5 * round_scale, iqr=iqr),
        _step("mirrored:2", 2, 1.0 * round_scale, iqr=iqr),
        _step("parameter_server:2w1ps", 1, 0.8 * round_scale, iqr=iqr, workers=2, asynchronous=True),
    ]


def test_single_file_gives_tables_floor_and_plots(tmp_path):
    path = _write(tmp_path, "a.json", _results())
    md = run_report.write_report([path], tmp_path / "out")
    text = md.read_text()
    assert "## cnn, weak scaling" in text
    row = next(line for line in text.splitlines() if line.startswith("| `mirrored:2`"))
    assert "| 10.00 (" in row  # 1.0 s per round of 100 steps: 10 ms per step
    assert "| 1.50 |" in row and "CollectiveAllReduce" in row
    assert "plain (no strategy), batch 32" in text
    floor_row = next(line for line in text.splitlines() if line.startswith("| `default` | 100 "))
    assert "0.02%" in floor_row  # 100 us against the smallest round of the spec, 0.5 s
    pngs = sorted(p.name for p in (tmp_path / "out").glob("*.png"))
    assert pngs == ["cnn-weak-tf-2.21.0-keras-3.15.1.png"]
    assert (tmp_path / "out" / pngs[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"]({pngs[0]})" in text


def test_comparison_columns_ratio_and_noise_mark(tmp_path):
    a = _write(tmp_path, "a.json", _results(iqr=0.02))
    b = _write(tmp_path, "b.json", _results(round_scale=1.5, iqr=0.02), tf="2.15.1", keras="2.15.0")
    c = _write(tmp_path, "c.json", _results(round_scale=1.01, iqr=0.04), tf="2.15.1", keras="2.15.0")
    text = run_report.write_report([a, b, c], tmp_path / "out").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| spec | TF 2.21.0"))
    assert "TF 2.15.1 / Keras 2.15.0 (b) step ms" in header and "(c) step ms" in header  # same versions: file names
    row = next(line for line in text.splitlines() if line.startswith("| `mirrored:2` | 10.00 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "15.00 (x1.50)"  # 50% slower, far outside the 2% IQRs: no mark
    assert cells[3] == f"10.10 (x1.01 {benchmark_results.NOISE_MARK})"  # 1% slower, IQRs overlap
    assert (tmp_path / "out" / "cnn-weak-comparison.png").exists()


def test_within_noise_is_overlap_of_interquartile_ranges():
    e = lambda q1, q3: benchmark_results.Entry("x", {}, (q1 + q3) / 2, q1, q3, 5)  # noqa: E731
    assert benchmark_results.within_noise(e(1.0, 2.0), e(1.9, 3.0))
    assert benchmark_results.within_noise(e(1.0, 2.0), e(1.2, 1.5))
    assert not benchmark_results.within_noise(e(1.0, 2.0), e(2.1, 3.0))
    assert not benchmark_results.within_noise(e(2.1, 3.0), e(1.0, 2.0))
    # 10% apart with tight IQRs: outside the rounds' noise, inside a 15% run-to-run allowance
    assert not benchmark_results.within_noise(e(0.99, 1.01), e(1.09, 1.11))
    assert benchmark_results.within_noise(e(0.99, 1.01), e(1.09, 1.11), noise=0.15)
    assert not benchmark_results.within_noise(e(0.99, 1.01), e(1.09, 1.11), noise=0.05)


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="7">
<testcase classname="tests.test_losses" name="test_average[mirrored:2-sgd]" time="0.1"/>
<testcase classname="tests.test_losses" name="test_average[mirrored:2-adam]" time="0.1">
  <failure message="AssertionError">boom</failure></testcase>
<testcase classname="tests.test_losses" name="test_average[default-sgd]" time="0.1"/>
<testcase classname="tests.test_metrics" name="test_mean[central_storage:2]" time="0.1">
  <skipped type="pytest.xfail" message="known deviation keras3-central-storage-metric-accumulation"/></testcase>
<testcase classname="tests.test_metrics" name="test_mean[default]" time="0.1"/>
<testcase classname="tests.test_metrics" name="test_mean[tpu]" time="0.1">
  <skipped type="pytest.skip" message="no TPU"/></testcase>
<testcase classname="tests.units.test_specs" name="test_grammar" time="0.1"/>
</testsuite></testsuites>
"""


def test_conformance_grid_shows_the_worst_outcome_per_property_and_spec(tmp_path):
    xml = tmp_path / "results.xml"
    xml.write_text(JUNIT)
    grid = run_report.load_conformance(xml)
    assert run_report.cell(grid[("test_losses::test_average", "mirrored:2")]) == "fail"  # one pass, one fail
    assert run_report.cell(grid[("test_losses::test_average", "default")]) == "pass"
    assert run_report.cell(grid[("test_metrics::test_mean", "central_storage:2")]) == "deviation"
    assert run_report.cell(grid[("test_metrics::test_mean", "tpu")]) == "skip"
    assert run_report.cell(grid[("test_specs::test_grammar", "-")]) == "pass"
    text = run_report.write_report([xml], tmp_path / "out").read_text()
    assert "7 test items: 1 fail, 1 deviation, 4 pass, 1 skip" in text
    row = next(line for line in text.splitlines() if line.startswith("| `test_metrics::test_mean`"))
    header = next(line for line in text.splitlines() if line.startswith("| property"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    cells = dict(zip(cols, [c.strip() for c in row.strip("|").split("|")]))
    assert cells["`central_storage:2`"] == "dev" and cells["`default`"] == "✓" and cells["`tpu`"] == "skip"
    assert cells["`mirrored:2`"] == ""  # not run there
    assert cols[1:] == ["`mirrored:2`", "`default`", "`central_storage:2`", "`tpu`", "`-`"]  # run order
    row = next(line for line in text.splitlines() if line.startswith("| `test_losses::test_average`"))
    assert "| **FAIL** 1/2 |" in row  # one of the two mirrored:2 items failed


@pytest.mark.parametrize("content, message", [
    ("{not json", "not a readable JSON file"),
    (json.dumps({"hello": 1}), "not pytest-benchmark output"),
    (json.dumps({"benchmarks": []}), "no timed tf-distribute-suite benchmarks"),
])
def test_bad_result_files_give_one_line_errors(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    out = subprocess.run([sys.executable, "-m", "suite.report", str(path), "-o", str(tmp_path / "out")],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "bad.json" in lines[0]


def test_missing_file_is_a_usage_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "suite.report", str(tmp_path / "nope.json"), "-o", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 2 and "no such file" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_run_to_run_noise_is_measured_from_files_of_the_same_versions(tmp_path):
    """Two runs of the same versions (A/A) give the machine's variation; it becomes the noise
    allowance of the comparison with another version unless --noise says otherwise."""
    a = _write(tmp_path, "a.json", _results(iqr=0.001))
    a2 = _write(tmp_path, "a2.json", _results(round_scale=1.10, iqr=0.001))  # this machine drifts by 10%
    b = _write(tmp_path, "b.json", _results(round_scale=1.08, iqr=0.001), tf="2.15.1", keras="2.15.0")
    noise, pairs = benchmark_results.run_to_run_noise([benchmark_results.load_benchmarks(p) for p in (a, a2, b)])
    assert noise == pytest.approx(0.10) and pairs == 4  # 3 train steps and 1 plain step in both runs
    assert benchmark_results.run_to_run_noise([benchmark_results.load_benchmarks(p) for p in (a, b)]) is None  # no A/A pair
    text = run_report.write_report([a, b, a2], tmp_path / "out").read_text()
    assert "differ by up to 10% in step time (90th percentile of 4 pairs)" in text
    row = next(line for line in text.splitlines() if line.startswith("| `mirrored:2` | 10.00 |"))
    assert f"10.80 (x1.08 {benchmark_results.NOISE_MARK})" in row  # 8% is inside the measured 10%
    text = run_report.write_report([a, b, a2], tmp_path / "out2", noise=0.0).read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `mirrored:2` | 10.00 |"))
    assert "10.80 (x1.08) " in row + " "  # with no allowance the tight IQRs do not overlap


def test_block_steps_get_a_table_with_overhead_and_block_cost(tmp_path):
    block = dict(workload="mlp", spec="mirrored:2", block="xla", block_description="the replica's pass compiled",
                 replicas=2, global_batch=128, steps_per_round=100, plain_step_time_s=0.004, overhead_ratio=1.25,
                 step_without_block_s=0.008, block_cost_ratio=0.625)
    path = _write(tmp_path, "a.json", _results() + [_bench("test_block_step[mlp-xla-mirrored:2]", "block_step", 0.5,
                                                           **block)])
    text = run_report.write_report([path], tmp_path / "out").read_text()
    assert "## Building blocks" in text and "- `xla`: the replica's pass compiled" in text
    row = next(line for line in text.splitlines() if line.startswith("| `xla` | `mirrored:2`"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # 0.5 s per round of 100 steps: 5 ms per step, against 4 ms plain with XLA and 8 ms without XLA
    assert cells[4].startswith("5.000 (") and cells[5:] == ["4.000", "1.25", "8.000", "0.62"]
