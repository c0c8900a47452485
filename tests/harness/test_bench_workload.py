"""``pytest benchmarks --workload package.module:factory``: the user's own step timed per spec and
per TensorFlow version (benchmarks/bench_workload.py), its usage errors, and the report's table of
a spec's versions side by side (suite/harness/reporting/workload_versions.py)."""

from __future__ import annotations

import json

import pytest

from suite.harness.judging.judgment import Check
from suite.harness.reporting import benchmark_results, run_report
from tests.helpers import ROOT, run_pytest

OLDER_ENV = "tf219-keras39"  # a tox env of another TensorFlow (TF 2.19, the Keras of its release)
OLDER = ROOT / ".tox" / OLDER_ENV / "bin" / "python"


def test_smoke_runs_the_workloads_own_step_per_spec():
    done = run_pytest(["benchmarks", "--workload", "examples.guide:workload", "--strategies", "default",
                       "--benchmark-disable", "--bench-blocks", "none", "-rA"], timeout=300)
    check = Check("pytest benchmarks --workload (smoke)")
    check.equal(done.returncode, 0, "exit status", done.stdout[-3000:] + done.stderr[-2000:])
    check.contains(done.stdout, ["PASSED benchmarks/bench_workload.py::test_workload_step[default]",
                                 "PASSED benchmarks/bench_train_step.py::test_train_step[examples.guide:workload-weak-"
                                 "default]"], "the workload's benchmarks")


@pytest.mark.parametrize("target, message", [
    ("examples.guide", "expected 'package.module:factory'"),
    ("no_such_package.training:workload", "no module named 'no_such_package'"),
])
def test_a_bad_workload_is_a_one_line_usage_error_before_any_engine(target, message):
    done = run_pytest(["benchmarks", "--workload", target, "--strategies", "default", "--benchmark-disable"],
                      timeout=120)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    check = Check("pytest benchmarks --workload BAD")
    check.equal(done.returncode, 4, "exit status (pytest's usage error)", done.stdout[-2000:] + done.stderr[-2000:])
    check.equal(len(lines), 1, "lines of output", lines)
    check.contains(lines[0], [f"--workload: workload {target!r}", message], "the error")
    check.that("engines" not in done.stdout, "engines started", done.stdout[-500:], "none")


@pytest.mark.skipif(not OLDER.exists(), reason=f"no .tox/{OLDER_ENV}: tox run --notest -e {OLDER_ENV}")
def test_a_spec_is_timed_on_both_versions_and_reported_side_by_side(tmp_path):
    """Timed for real (one counted round each): the default spec on the session's TensorFlow and
    on TF 2.19; the SPEC@ENV result interleaves the session's rounds; the report's row has both."""
    out = tmp_path / "wl.json"
    done = run_pytest(["benchmarks", "--workload", "examples.guide:workload", "--strategies",
                       f"default,default@{OLDER_ENV}", "-k", "workload_step", "--benchmark-min-rounds", "1",
                       "--benchmark-json", str(out)], timeout=600)
    check = Check("pytest benchmarks --workload across versions")
    check.equal(done.returncode, 0, "exit status", done.stdout[-3000:] + done.stderr[-2000:])
    infos = {b["extra_info"]["spec"]: b["extra_info"] for b in json.loads(out.read_text())["benchmarks"]}
    check.equal(sorted(infos), ["default", f"default@{OLDER_ENV}"], "the results")
    older = infos[f"default@{OLDER_ENV}"]
    check.equal((older["kind"], older["spec_base"], older["env"], older["tensorflow"].startswith("2.19"),
                 older["engine_versions"]["tensorflow"] == older["tensorflow"], older["versus_spec"]),
                ("workload_step", "default", OLDER_ENV, True, True, "default"), "the older version's result")
    check.that(older["versus_ratio"] > 0 and infos["default"]["env"] is None, "the interleaved ratio",
               older.get("versus_ratio"), "positive")
    text = run_report.write_report([out], tmp_path / "report").read_text()
    row = next((line for line in text.splitlines() if line.startswith("| `default` |")), "")
    check.contains(text, ["## `examples.guide:workload`: your step across versions",
                          f"TF {older['tensorflow']} / Keras {older['keras']} step ms (IQR)"], "the report")
    check.that(row.count("(x") == 1 and row.count("| x") == 1, "the spec's row: the ratio and the interleaved ratio",
               row, "one each")


def _result(spec, tf, keras, round_s, iqr, env=None, **extra):
    info = dict(kind="workload_step", workload="pkg.mod:wl", spec=spec, spec_base=spec.split("@")[0], env=env,
                tensorflow=tf, keras=keras, replicas=2, global_batch=64, steps_per_round=100, **extra)
    stats = {"median": round_s, "q1": round_s - iqr / 2, "q3": round_s + iqr / 2, "rounds": 5}
    return {"name": f"test_workload_step[{spec}]", "stats": stats, "extra_info": info}


def test_the_report_sets_versions_side_by_side_with_ratio_noise_and_drift(tmp_path):
    path = tmp_path / "wl.json"
    path.write_text(json.dumps({"machine_info": {"tensorflow": "2.21.0", "keras": "3.13.2"}, "benchmarks": [
        _result("mirrored:2", "2.21.0", "3.13.2", 1.2, 0.01),
        # the older version: 1.0 s a round, the session's interleaved rounds 1.26 s (5% above its own 1.2 s)
        _result("mirrored:2@tf219", "2.19.1", "3.9.2", 1.0, 0.01, env="tf219", versus_ratio=1.0 / 1.26,
                versus_step_time_s=0.0126, versus_versions=["2.21.0", "3.13.2"]),
        _result("default", "2.21.0", "3.13.2", 0.5, 0.2),
        _result("default@tf219", "2.19.1", "3.9.2", 0.52, 0.2, env="tf219"),
    ]}))
    text = run_report.write_report([path], tmp_path / "out").read_text()
    lines = text.splitlines()
    check = Check("the report's versions side by side")
    header = next(line for line in lines if line.startswith("| spec | replicas"))
    check.that(header.index("TF 2.19.1 / Keras 3.9.2") < header.index("TF 2.21.0 / Keras 3.13.2"),
               "the version columns", header, "the oldest first")

    def cells(spec):
        return [c.strip() for c in next(line for line in lines if line.startswith(f"| `{spec}` |")).strip("|").split("|")]

    # per step: 10 ms on 2.19, 12 ms on 2.21 (x1.20, outside the IQRs); interleaved 1.26; drift 5%
    check.equal(cells("mirrored:2")[3:], ["10.00 (0.100)", "12.00 (0.100) (x1.20)", "x1.26", "5.0%"],
                "mirrored:2: both versions, the ratio, the interleaved ratio and the drift")
    check.equal(cells("default")[4:], [f"5.000 (2.000) (x0.96 {benchmark_results.NOISE_MARK})", "–", "–"],
                "default: within noise (the IQRs overlap), nothing interleaved")
