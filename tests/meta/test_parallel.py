"""Specs in parallel (suite/harness/parallel.py): under pytest-xdist every test of a spec runs
in the one worker that has that spec's engine, and the terminal summary gathers the workers'
draws and engine counts."""

from __future__ import annotations

import re

from suite.harness.check import Check
from suite.harness.parallel import scope_of
from suite.harness.profiles import PROFILES
from tests.helpers import run_pytest

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
    ]:
        check.equal(scope_of(nodeid, SPECS), want or nodeid, f"scope of {nodeid}")


def test_two_workers_start_each_engine_once_and_report_every_draw():
    r = run_pytest(["-n", "2", "tests/properties/test_reduce.py", "--strategies", "default,mirrored:2"], timeout=600,
                   HYPOTHESIS_PROFILE="ci")
    check = Check("pytest -n 2", case={"output": r.stdout[-3000:]})
    check.equal(r.returncode, 0, "exit status")
    starts = re.findall(r"^(\S+) \((gw\d)\): started (\d+)x$", r.stdout, re.M)
    check.equal(sorted((spec, n) for spec, _, n in starts), [("default", "1"), ("mirrored:2", "1")],
                "engine starts per spec over both workers")
    check.equal(len({w for _, w, _ in starts}), 2, "workers that ran a spec")
    # the ci profile's max_examples per item (this property has no @example and draws no rejects)
    n = PROFILES["ci"]
    check.that(f"test_experimental_local_results_are_in_replica_order: {2 * n} accepted, 0 rejected" in r.stdout
               and f"    default {n}/0, mirrored:2 {n}/0" in r.stdout,
               "draws of test_experimental_local_results_are_in_replica_order",
               re.findall(r"^    default .*$", r.stdout, re.M),
               "both specs' draws, gathered from both workers")
