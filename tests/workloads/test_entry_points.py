"""The ways a user runs the check, end to end in child processes: ``python -m suite.check`` (its
exit status, verdict table, diagnosis and JSON), ``pytest tests --workload`` and the plugin's
``distribution_check`` fixture in a user's own test suite (installed with the package)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from suite.harness.judging.judgment import Check
from tests.helpers import ROOT, run_pytest


def _env() -> dict:
    return {k: v for k, v in dict(os.environ, PYTHONPATH=str(ROOT)).items() if not k.startswith("PYTEST_XDIST_")}


def test_the_cli_passes_a_right_loop_and_diagnoses_a_wrong_one(tmp_path):
    check = Check("python -m suite.check")
    out = tmp_path / "verdicts.json"
    right = subprocess.run([sys.executable, "-m", "suite.check", "examples.mistakes:right", "--strategies",
                            "default,mirrored:2", "--json", str(out)], cwd=ROOT, env=_env(),
                           capture_output=True, text=True, timeout=300)
    check.equal(right.returncode, 0, "exit status for a right loop", right.stdout[-2000:] + right.stderr[-1000:])
    check.contains(right.stdout, ["PASS: every spec trains what one device trains"], "the verdict")
    check.contains(right.stderr, ["[1/2] default: PASS", "[2/2] mirrored:2: PASS"], "progress lines")
    data = json.loads(out.read_text())
    check.equal([(s["spec"], s["status"], s["steps"]) for s in data["specs"]],
                [("default", "PASS", 3), ("mirrored:2", "PASS", 3)], "the JSON verdicts")
    # compute_average_loss's default denominator: on one device it weighs the short last batch
    # (23 of 48) unlike the guide's canonical step (global_batch_size=48), which the notes say
    wrong = subprocess.run([sys.executable, "-m", "suite.check", "examples.mistakes:short_batch_weighted_differently",
                            "--strategies", "mirrored:2", "--json", "-", "-q"], cwd=ROOT, env=_env(),
                           capture_output=True, text=True, timeout=300)
    check.equal(wrong.returncode, 1, "exit status for a wrong loop", wrong.stdout[-2000:] + wrong.stderr[-1000:])
    data = json.loads(wrong.stdout)
    spec = data["specs"][0]
    check.equal((spec["status"], spec["first_diverging_step"], [d["cause"] for d in spec["diagnoses"]]),
                ("FAIL", 3, ["short_batch_weighted_differently"]), "the JSON verdict of a wrong loop")
    check.contains(" ".join(data["notes"]), ["on one device your step differs from the guide's canonical step",
                                             "from step 3"], "the notes")


def _without_timings(report: dict) -> dict:
    """A check's JSON less what measures time (the only fields that may differ between two runs)."""
    report = {k: v for k, v in report.items() if k != "timings"}
    report["specs"] = [{k: v for k, v in s.items() if k not in ("seconds", "engine_start_seconds")}
                       for s in report["specs"]]
    return report


@pytest.mark.parametrize("target, status", [("examples.mistakes:right", 0),
                                            ("examples.mistakes:loss_averaged_per_replica", 1)])
def test_the_report_is_the_same_whatever_order_the_specs_finish_in(target, status):
    """One spec at a time (-j 1) and all three at once (-j 3) give the same JSON but its timings,
    the same exit status (0 for the right loop, 1 for the mistake: a FAIL), and the specs in the order
    given; with progress on, ``--json -`` keeps stdout one JSON document and the progress on
    stderr names the specs still running."""
    specs = "mirrored:2,default,multi_worker:2x1"
    runs = {}
    for jobs in (["-j", "1"], ["-j", "3"]):
        runs[jobs[1]] = subprocess.run([sys.executable, "-m", "suite.check", target, "--strategies", specs,
                                        "--json", "-", *jobs], cwd=ROOT, env=_env(), capture_output=True,
                                       text=True, timeout=300)
    check = Check(specs, case={"workload": target})
    reports = {}
    for jobs, proc in runs.items():
        try:
            reports[jobs] = json.loads(proc.stdout)
        except json.JSONDecodeError as exc:
            check.that(False, f"stdout of --json - with -j {jobs} and progress on", proc.stdout[-500:],
                       f"one JSON document ({exc})")
    check.equal((runs["1"].returncode, runs["3"].returncode), (status, status), "exit status with -j 1 and -j 3",
                runs["3"].stderr[-1000:])
    check.equal([s["spec"] for s in reports["3"]["specs"]], specs.split(","), "the specs' order in the JSON")
    check.equal(_without_timings(reports["3"]), _without_timings(reports["1"]), "the JSON with -j 3 less timings")
    check.contains(runs["3"].stderr, ["reference (no strategy)", "[3/3] ", "; running: "],
                   "progress on stderr with specs at once")
    check.that("; running: " not in runs["1"].stderr, "progress with -j 1", runs["1"].stderr[-500:],
               "no specs said to be running beside the one that finished")


def test_pytest_workload_option_runs_only_the_check_of_that_workload():
    """One test per selected spec and nothing else (a passing run: the fixture's test below)."""
    check = Check("pytest tests --workload")
    wrong = run_pytest(["tests", "--workload", "examples.mistakes:regularization_not_scaled", "--strategies",
                        "default,mirrored:2"], timeout=300)
    check.equal(wrong.returncode, 1, "exit status for a wrong loop", wrong.stdout[-2000:])
    check.contains(wrong.stdout, ["diagnosis: regularization not scaled", "1 failed, 1 passed", " deselected",
                                  "FAILED tests/workloads/test_user_workload.py::"
                                  "test_workload_trains_as_on_one_device[mirrored:2]"], "the report")


def test_the_plugin_fixture_checks_a_loop_and_a_script_in_a_users_own_tests(tmp_path):
    (tmp_path / "test_my_loop.py").write_text(textwrap.dedent('''
        def test_right_loop(distribution_check):
            report = distribution_check("examples.mistakes:right", strategies="mirrored:2")
            assert report.passed

        def test_wrong_loop(distribution_check):
            distribution_check("examples.mistakes:reduce_mean_for_sum", strategies="mirrored:2")

        def test_right_script(distribution_check):
            report = distribution_check(SCRIPTS + "/mistakes.py", strategies="mirrored:2", args=["--case", "right"])
            assert report.passed and report.kind == "script"

        def test_wrong_script(distribution_check):
            distribution_check(SCRIPTS + "/mistakes.py", strategies="mirrored:2",
                               args=["--case", "batch_not_distributed"])
    ''').replace("SCRIPTS", repr(str(ROOT / "examples" / "scripts"))))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "test_my_loop.py"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    check = Check("the distribution_check fixture")
    check.equal(done.returncode, 1, "exit status", done.stdout[-3000:])
    check.contains(done.stdout, ["2 failed, 2 passed", "diagnosis: strategy.reduce MEAN where SUM was meant",
                                 "FAILED test_my_loop.py::test_wrong_loop", "diagnosis: batches not distributed",
                                 "FAILED test_my_loop.py::test_wrong_script"], "the user's pytest report")


def test_benchmarks_time_a_user_workload_with_the_controls():
    done = run_pytest(["benchmarks", "--workload", "examples.mistakes:right", "--strategies", "mirrored:2",
                       "--benchmark-disable", "--bench-blocks", "none", "-rA"], timeout=300)
    check = Check("pytest benchmarks --workload")
    check.equal(done.returncode, 0, "exit status", done.stdout[-3000:])
    check.contains(done.stdout, ["PASSED benchmarks/bench_train_step.py::test_plain_step[examples.mistakes:right-B32]",
                                 "PASSED benchmarks/bench_train_step.py::test_train_step[examples.mistakes:right-weak-"
                                 "mirrored:2]"], "the user workload's benchmarks")


KERAS34 = ROOT / ".tox" / "tf217-keras34" / "bin" / "python"  # TF 2.17 with the Keras of its release


@pytest.mark.skipif(not KERAS34.exists(), reason="no TF 2.17 / Keras 3.4 env: tox run --notest -e tf217-keras34 "
                                                 "(.ci/run builds it)")
def test_on_tf217_keras34_the_guides_loop_is_keras_and_a_wrong_loop_is_its_own():
    """TF 2.17 with Keras 3.4, as its users ran it: Keras does not sum the replicas' gradients
    (known deviation keras3-gradients-not-summed-before-3.5). The guide's right loop diverges
    exactly as the control (the suite's canonical step) does, and the verdict names the recorded
    deviation, not the loop; a loop with a mistake of its own diverges from the control and
    stays FAIL with its cause, and the cause the control shows too (replicas that differ) is not
    blamed on it."""
    check = Check("python -m suite.check on TF 2.17 / Keras 3.4")

    def run(target):
        done = subprocess.run([sys.executable, "-m", "suite.check", target, "--strategies", "mirrored:2",
                               "--engine-python", str(KERAS34), "--json", "-", "-q"], cwd=ROOT, env=_env(),
                              capture_output=True, text=True, timeout=600)
        return done, json.loads(done.stdout) if done.stdout.strip().startswith("{") else {"specs": [{}]}

    right, data = run("examples.guide:workload")
    spec = data["specs"][0]
    check.equal(right.returncode, 4, "exit status of the guide's loop (4: known deviations only)",
                right.stdout[-2000:] + right.stderr[-1000:])
    named = {d["id"] for d in spec.get("known_deviations", [])}
    # its train_accuracy differs too: Keras 3.0-3.6 metric state is per replica, which no recorded model
    # predicts in the loop check (the control does not update the workload's metrics); reported unrecorded
    check.equal((spec.get("status"), "keras3-gradients-not-summed-before-3.5" in named, named <= {
        "keras3-gradients-not-summed-before-3.5", "unrecorded"}), ("DEVIATION", True, True),
        "the verdict of the guide's loop (DEVIATION, naming the recorded entry)")
    wrong, data = run("examples.mistakes:loss_averaged_per_replica")
    spec = data["specs"][0]
    check.equal(wrong.returncode, 1, "exit status of a loop that averages per replica",
                wrong.stdout[-2000:] + wrong.stderr[-1000:])
    check.equal((spec.get("status"), [d["cause"] for d in spec.get("diagnoses", [])]),
                ("FAIL", ["loss_averaged_per_replica"]), "the verdict of a loop that averages per replica")
