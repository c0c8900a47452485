"""Specs in parallel (suite/harness/plugin/scheduling.py): under pytest-xdist every test of a spec runs
in the one worker that has that spec's engine, and the terminal summary gathers the workers'
draws and engine counts."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import OrderedDict
from types import SimpleNamespace

import pytest

from suite.common.specs import DEFAULT_SPECS
from suite.harness.drawing.profiles import PROFILES
from suite.harness.judging.judgment import Check
from suite.harness.plugin import scheduling, suite_plugin
from suite.harness.plugin.internals import SpecScheduling
from suite.harness.plugin.scheduling import CROSS_SPEC, auto_workers, engine_processes, scope_of
from suite.harness.tools import cost_table
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
        ("tests/mutation/test_mutants.py::test_m[float32-sgd]", None),
        ("tests/units/test_check.py::test_c", None),
        # a property that restores under every spec: one scope for all its specs
        (CROSS_SPEC[0] + "[mirrored:2]", "cross-spec"),
        (CROSS_SPEC[0] + "[default]", "cross-spec"),
        # tests of a module that share a costly module-scoped set-up: one scope
        ("tests/workloads/test_hangs.py::test_h[the reference]", "module tests/workloads/test_hangs.py"),
        ("tests/workloads/test_hangs.py::test_h[a one-process spec]", "module tests/workloads/test_hangs.py"),
        # tests of a module that run engines of other envs from the session's pool: one scope
        ("tests/workloads/test_upgrade.py::test_u[tf215]", "module tests/workloads/test_upgrade.py"),
        ("tests/workloads/test_upgrade.py::test_u[tf219-keras39]", "module tests/workloads/test_upgrade.py"),
        ("tests/workloads/test_other_versions.py::test_o", "module tests/workloads/test_other_versions.py"),
    ]:
        check.equal(scope_of(nodeid, SPECS), want or nodeid, f"scope of {nodeid}")


def test_scopes_go_out_costliest_first_by_the_committed_table():
    """Longest first: a scope's seconds are its tests' in the cost table (a listed slow test's own, else
    its file's mean per test, else the mean of all tests), so a scope of few slow tests goes out before
    one of many quick ones; without a table, xdist's order (most tests first). The committed table
    reads, and orders the slowest test it lists before a scope of ten quick unit tests."""
    table = {"tests": 4, "tests_s": 40.0,
             "files": [{"file": "tests/units/test_q.py", "tests": 10, "wall_s": 5.0},
                       {"file": "tests/workloads/test_w.py", "tests": 2, "wall_s": 60.0}],
             "slowest_tests": [{"test": "tests/workloads/test_w.py::test_slow", "wall_s": 50.0}]}
    scopes = {"quick": [f"tests/units/test_q.py::test_{i}" for i in range(10)],  # 10 x 0.5 s
              "slow": ["tests/workloads/test_w.py::test_slow"],  # 50 s, listed
              "mean": ["tests/workloads/test_w.py::test_other"],  # 30 s, its file's mean
              "unknown": ["tests/units/test_new.py::test_n"] * 2}  # 2 x 10 s, the mean of all
    check = Check("scheduling")
    check.equal(scheduling.by_cost(scopes, table), ["slow", "mean", "unknown", "quick"], "the order by cost")
    check.equal(scheduling.by_cost(scopes, None), ["quick", "unknown", "slow", "mean"], "the order without a table")
    committed = scheduling.committed_table()
    slowest = committed["slowest_tests"][0]["test"]
    check.equal(scheduling.by_cost({"units": [f"tests/units/test_cost.py::t{i}" for i in range(10)],
                                    "slowest": [slowest]}, committed), ["slowest", "units"],
                "the committed table's order of its slowest test and ten unit tests")


def test_the_scheduler_sends_the_costliest_scope_first():
    """SpecScheduling (internals.py) puts xdist's queue in by_cost's order before the first unit goes out:
    the first worker gets the one slow test, though the quick scope was queued first and is larger."""
    class Node:
        def __init__(self):
            self.sent = []

        def send_runtest_some(self, indices):
            self.sent.append(indices)

    table = {"tests": 2, "tests_s": 2.0, "files": [],
             "slowest_tests": [{"test": "tests/workloads/test_w.py::test_slow", "wall_s": 50.0}]}
    collection = [f"tests/units/test_q.py::test_{i}" for i in range(3)] + ["tests/workloads/test_w.py::test_slow"]
    sched = SpecScheduling.__new__(SpecScheduling)  # its state as xdist's schedule() leaves it
    sched.specs, sched.table, sched._ordered = frozenset(), table, False
    sched.workqueue = OrderedDict([("quick", dict.fromkeys(collection[:3], False)), ("slow", {collection[3]: False})])
    node = Node()
    sched.assigned_work, sched.registered_collections = {}, {node: collection}
    sched._assign_work_unit(node)
    Check("scheduling").equal((node.sent, list(sched.workqueue)), ([[3]], ["quick"]),
                              "the indices sent to the first worker, and the scopes left")


def test_the_cross_spec_scope_is_every_property_that_calls_other_specs():
    """CROSS_SPEC lists exactly the properties whose arguments include ``restore_specs`` (the
    fixture of every selected spec), so none of them splits by spec again."""
    takes = sorted(f"{p.relative_to(ROOT)}::{name}" for p in sorted((ROOT / "tests" / "properties").glob("test_*.py"))
                   for name, args in re.findall(r"^def (test_\w+)\(([^)]*)\)", p.read_text(), re.M)
                   if "restore_specs" in args)
    Check("scheduling").equal(sorted(CROSS_SPEC), takes, "the cross-spec scope's tests")


def test_each_module_of_shared_setup_has_a_module_scoped_fixture():
    """SHARED_SETUP names modules that exist and define a module-scoped fixture (the set-up their
    tests share), and every module whose module-scoped fixture runs child processes is listed."""
    from suite.harness.plugin.scheduling import SHARED_SETUP

    check = Check("scheduling")
    shared = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        text = path.read_text()
        bodies = re.findall(r'^@pytest\.fixture\(scope="module"\)\ndef \w+\(.*?(?=^(?:@|def |class |[A-Z_]+ =))', text,
                            re.M | re.S)
        if any(re.search(r"subprocess|_run\(|run_pytest|check_cli|_collect\(|venv", body) for body in bodies):
            shared.append(str(path.relative_to(ROOT)))
    check.equal(sorted(SHARED_SETUP), shared, "the modules whose module-scoped fixture runs child processes")


def test_the_modules_that_run_other_envs_engines_are_one_scope_each():
    """OTHER_ENVS names exactly the test modules that hand the session's pool another env's
    interpreter (a loop or script checker with ``env=``, the upgrade check), so that each env's
    TensorFlow is imported and its engines started in one worker."""
    from suite.harness.plugin.scheduling import OTHER_ENVS

    runs = sorted(str(p.relative_to(ROOT)) for p in sorted((ROOT / "tests").rglob("test_*.py"))
                  if re.search(r"Checker\(pool\b[^\n]*\benv=|upgrade\.run\([^\n]*\bpool\b", p.read_text()))
    Check("scheduling").equal(sorted(OTHER_ENVS), runs, "the modules that run other envs' engines from the pool")


def test_two_workers_start_each_engine_once_and_report_every_draw(tmp_path):
    junit = tmp_path / "run.xml"
    r = run_pytest(["-n", "2", "tests/properties/test_reduce.py", "--strategies", "default,mirrored:2",
                    f"--junitxml={junit}"], timeout=600, HYPOTHESIS_PROFILE="ci")
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
    # the cost of each test in its JUnit: each engine's start filed under the one test that began it,
    # every call under the test that made it, and the run's probes (their traces read as engines close)
    table = cost_table.read([junit])
    tests = table["slowest_tests"]
    check.equal(sum(t["engine_starts"] for t in tests), 2, "engine starts over the JUnit's tests (one per spec)")
    check.that(all(t["calls"] >= 1 for t in tests), "probe calls of each test", [(t["test"], t["calls"]) for t in tests],
               "at least one")
    probes = {p["probe"]: p for p in table["probes"]}
    check.equal(sum(p["calls"] for p in probes.values()), sum(t["calls"] for t in tests),
                "the calls of the run's probes and of its tests")
    check.that(all(probes[p]["traces"] >= 1 for p in probes if p.startswith("reduce.")), "traces of the reduce probes",
               probes, "at least one each")


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


def test_auto_workers_divide_the_cores_by_the_engines_processes():
    """``-n auto``: the usable cores over the mean processes per selected spec's engine, rounded up, at
    least 1, at most one worker per spec and one more (scheduling.auto_workers)."""
    check = Check("-n auto")
    default = engine_processes(",".join(DEFAULT_SPECS))
    check.equal(default, [1, 1, 1, 1, 1, 1, 1, 2, 4], "the default specs' engine processes")
    check.equal(engine_processes("multi_worker:3x2, parameter_server:2w3ps,mirrored:2@tf215,cluster,tpu,nonsense:1"),
                [3, 6, 1, 1, 1], "engine processes (W; 1 + W + P; SPEC@ENV as SPEC; a cluster's are remote; "
                "a spec that does not parse left out)")
    for cores, processes, want in [
        (2, default, 2), (4, default, 3), (8, default, 6), (12, default, 9), (64, default, 10),  # 13 over 9 specs
        (1, default, 1),
        (2, [4], 1), (8, [4], 2), (2, [1], 2), (64, [1], 2),  # one spec: its worker and one for the rest
        (2, [2, 2, 3, 4], 1), (8, [2, 2, 3, 4], 3), (64, [2, 2, 3, 4], 5),  # tox -e clusters' specs
        (3, [1, 1, 1, 1], 3), (0, [1, 1], 1), (4, [], 4),
    ]:
        check.equal(auto_workers(cores, processes), want, f"workers for {cores} cores and engines of {processes}")


def test_the_auto_hook_reads_strategies_and_usable_cores(monkeypatch):
    """The xdist hook runs before pytest_configure: it parses --strategies itself (the default specs
    without it) and counts the cores this process may use."""
    monkeypatch.setattr(scheduling, "usable_cores", lambda: 8)
    check = Check("pytest_xdist_auto_num_workers")
    for strategies, want in [(None, 6), ("mirrored:2,mirrored:3", 3), ("parameter_server:2w1ps,multi_worker:2x1", 3),
                             ("multi_worker:8x1", 1)]:
        config = SimpleNamespace(getoption=lambda name, s=strategies: s if name == "--strategies" else None)
        check.equal(suite_plugin.pytest_xdist_auto_num_workers(config), want, f"-n auto with --strategies {strategies}")


def test_usable_cores_are_the_affinity_not_the_machines_count():
    """Under ``taskset -c 0`` (one core allowed) the suite counts one core, whatever the machine has."""
    if not shutil.which("taskset"):
        pytest.skip("no taskset here")
    proc = subprocess.run(["taskset", "-c", "0", sys.executable, "-c",
                           "from suite.harness.plugin.scheduling import usable_cores; print(usable_cores())"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    Check("usable_cores").equal(proc.stdout.strip(), "1", "usable cores under taskset -c 0", proc.stderr[-1000:])
