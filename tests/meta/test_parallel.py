"""Specs in parallel (suite/harness/plugin/scheduling.py): under pytest-xdist every test of a spec runs
in the one worker that has that spec's engine, and the terminal summary gathers the workers'
draws and engine counts."""

from __future__ import annotations

import re

from suite.harness.drawing.profiles import PROFILES
from suite.harness.plugin.scheduling import CROSS_SPEC, scope_of
from suite.harness.verdict.judgment import Check
from tests.helpers import ROOT, run_pytest

SPECS = frozenset({"default", "mirrored:2", "parameter_server:2w1ps"})


def test_scope_is_the_spec_of_a_test_else_the_test_itself():
    check = Check("scheduling")
    for nodeid, want in [
        ("tests/properties/test_reduce.py::test_p[mirrored:2-float64]", "spec mirrored:2"),
        ("tests/properties/test_training.py::test_t[mirrored:2-mlp_softmax-sgd-float32]", "spec mirrored:2"),
        ("tests/harness/test_engine.py::test_e[default]", "spec default"),
        ("tests/properties/test_parameter_server.py::test_q[parameter_server:2w1ps-keras]",
         "spec parameter_server:2w1ps"),
        # not a selected spec, or no parameters: a scope of its own
        ("tests/properties/test_reduce.py::test_p[mirrored:3-float64]", None),
        ("tests/meta/test_mutants.py::test_m[float32-sgd]", None),
        ("tests/meta/test_check.py::test_c", None),
        # a property that restores under every spec: one scope for all its specs
        (CROSS_SPEC[0] + "[mirrored:2]", "cross-spec"),
        (CROSS_SPEC[0] + "[default]", "cross-spec"),
    ]:
        check.equal(scope_of(nodeid, SPECS), want or nodeid, f"scope of {nodeid}")


def test_the_cross_spec_scope_is_every_property_that_calls_other_specs():
    """CROSS_SPEC lists exactly the properties whose arguments include ``restore_specs`` (the
    fixture of every selected spec), so none of them splits by spec again."""
    takes = sorted(f"{p.relative_to(ROOT)}::{name}" for p in sorted((ROOT / "tests" / "properties").glob("test_*.py"))
                   for name, args in re.findall(r"^def (test_\w+)\(([^)]*)\)", p.read_text(), re.M)
                   if "restore_specs" in args)
    Check("scheduling").equal(sorted(CROSS_SPEC), takes, "the cross-spec scope's tests")


def test_two_workers_start_each_engine_once_and_report_every_draw():
    r = run_pytest(["-n", "2", "tests/properties/test_reduce.py", "--strategies", "default,mirrored:2"], timeout=600,
                   HYPOTHESIS_PROFILE="ci")
    check = Check("pytest -n 2", case={"output": r.stdout[-3000:]})
    check.equal(r.returncode, 0, "exit status")
    starts = re.findall(r"^(\S+) \((gw\d)\): started (\d+)x$", r.stdout, re.M)
    check.equal(sorted((spec, n) for spec, _, n in starts), [("default", "1"), ("mirrored:2", "1")],
                "engine starts per spec over both workers")
    check.equal(len({w for _, w, _ in starts}), 2, "workers that ran a spec")
    # the ci profile's examples per spec, gathered from the worker that ran each spec
    lines = r.stdout.splitlines()
    at = [i for i, ln in enumerate(lines) if ln.startswith("test_reduce_sum_and_mean_over_uneven_replicas: ")]
    cells = dict(re.findall(r"(\S+) (\d+)/0", lines[at[0] + 1])) if at else {}
    check.equal(sorted(cells), ["default", "mirrored:2"], "specs in the reduce property's draws")
    check.that(all(int(n) >= PROFILES["ci"] for n in cells.values()), "accepted draws per spec", cells,
               f"at least {PROFILES['ci']} (the ci profile's examples per spec)")


def test_the_summary_ends_with_each_failure_cause_from_every_worker():
    """A log cut to its head and tail still says why each test failed: the last section has a
    line per failed test, gathered from both workers (here engines that cannot start)."""
    test = "tests/properties/test_reduce.py::test_experimental_local_results_are_in_replica_order"
    r = run_pytest(["-n", "2", test, "--strategies", "default,mirrored:2", "--engine-python", "/bin/false"],
                   timeout=300, HYPOTHESIS_PROFILE="ci")
    check = Check("pytest -n 2", case={"output": r.stdout[-3000:]})
    check.equal(r.returncode, 1, "exit status")
    section = r.stdout.rsplit("tf-distribute-suite failure causes", 1)[-1].split("short test summary info")[0]
    for spec in ("default", "mirrored:2"):
        check.contains(section, [f"{test}[{spec}] (call): EngineStartError: engine '{spec}' exited with code 1"],
                       "the failure causes section")


def test_failure_causes_unpack_exception_groups():
    from suite.harness.plugin.suite_plugin import root_causes

    flaky = ExceptionGroup("unreliable", [ValueError("first\n  call"), ExceptionGroup("g", [KeyError("k")])])
    Check("causes").equal(root_causes(flaky), ["ValueError: first call", "KeyError: 'k'"], "one line per root cause")
    Check("causes").equal(root_causes(RuntimeError("x" * 400))[0][-3:], "...", "a long cause is cut")
