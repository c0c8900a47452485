"""The pytest plugin that runs the suite (the root conftest.py loads it): the options, the
strategy specs each test is parametrized by, the engine pool, the known deviations in scope of
each test and the outcome they give it, hypothesis' profiles and seeds, xdist scheduling by
spec, and the terminal summary. State lives in ``config.stash`` (state.py). The pytest process
never imports TensorFlow."""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import tempfile
import time
import zlib
from pathlib import Path

import hypothesis
import pytest

from ...common.specs import DEFAULT_SPECS, SpecError, parse_specs
from ..drawing import profiles, tally
from ..judging import deviations
from ..pool import agent, cost, interrupts, machine, memo, topology, versions
from ..pool.handle import EngineHandle
from ..pool.pool import EnginePool
from ..reporting import results_dir
from . import scheduling, state
from .internals import SpecScheduling, junit_suite_property

PROFILE = profiles.load()
MEMO_DIR = pytest.StashKey[str]()  # the session's memo folder (the controller's, or -n 0's)


def pytest_addoption(parser):
    group = parser.getgroup("tf-distribute-suite")
    group.addoption("--strategies", default=None,
                    help=f"comma-separated strategy specs (default: {','.join(DEFAULT_SPECS)}; "
                         "mirrored:gpus joins where GPUs exist)")
    group.addoption("--engine-python", default=None,
                    help="Python interpreter (with TensorFlow) that runs the engines "
                         "(default: this one)")
    group.addoption("--engine-timeout", type=float, default=float(os.environ.get("TFDS_ENGINE_TIMEOUT", 120)),
                    help="seconds a probe call may take before its engine is killed (default 120)")
    group.addoption("--engine-retries", type=int, default=1,
                    help="times a call whose engine timed out or crashed is asked again of a fresh engine "
                         "before the test fails, each retry a warning quoting the error (default 1; 0: the "
                         "first timeout or crash fails the test)")
    group.addoption("--engine-start-timeout", type=float, default=180.0,
                    help="seconds an engine may take to start (default 180)")
    group.addoption("--deep", action="store_true", default=False,
                    help="run what the default selection leaves out: the properties marked budget "
                         "(the building blocks of tests/properties/test_blocks.py and the costliest "
                         "end-to-end properties) draw the hypothesis profile's examples per spec, like "
                         "every other property (default: the fewer their budget marker gives), and tests "
                         "marked deep run (the mutation matrix; .ci/run runs it)")
    group.addoption("--workload", default=None, metavar="PACKAGE.MODULE:FACTORY",
                    help="check this training loop (the workload protocol: README, docs/check.md) under "
                         "every selected spec against itself with no strategy; only that test runs "
                         "(tests/workloads/test_user_workload.py). With pytest benchmarks: time its train step "
                         "instead of the built-in workloads")
    group.addoption("--workload-steps", type=int, default=3, help="steps --workload trains and compares (default 3)")
    group.addoption("--results-dir", default=None, metavar="DIR",
                    help="write this run's results under DIR/tf<TF>-keras<Keras>/ (named by the engines' "
                         "versions): conformance.xml (JUnit) and versions.json; the benchmarks' bench.json. "
                         "python -m suite.report DIR reads them")
    group.addoption("--cluster-agents", default=os.environ.get("TFDS_CLUSTER_AGENTS"),
                    help="HOST:PORT,... of the engine agents of a real cluster, for the 'cluster' spec "
                         "(python -m suite.harness.pool.agent on each host; see docs/running.md)")


@pytest.hookimpl(tryfirst=True)  # before junitxml and pytest-benchmark read the paths --results-dir sets
def pytest_configure(config):
    text = config.getoption("--strategies")
    agents = config.getoption("--cluster-agents")
    resolve = (lambda: agent.resolve_cluster(agents.split(","))) if agents else None
    try:
        if text:
            specs = parse_specs(text, resolve)
        else:
            specs = parse_specs(",".join(DEFAULT_SPECS + (("mirrored:gpus",) if machine.gpu_names() else ())))
    except SpecError as exc:
        raise pytest.UsageError(f"--strategies: {exc}") from None
    except agent.AgentError as exc:
        raise pytest.UsageError(f"--cluster-agents: {exc}") from None
    # mirrored:gpus learns its replica count from the GPUs visible here, so cases are drawn for it
    gpus = machine.gpu_count() if any(s.gpus for s in specs) else 0
    specs = [dataclasses.replace(s, replicas=gpus, devices=gpus) if s.gpus else s for s in specs]
    python = config.getoption("--engine-python")
    if python and not shutil.which(python) and not os.path.exists(python):
        raise pytest.UsageError(f"--engine-python: {python!r} is not an executable")
    here = versions.engine_versions(python)
    # SPEC@ENV: engines of another TensorFlow, for the tests that compare two versions
    others = {}
    for spec in specs:
        if spec.python:
            path, changes = versions.interpreter(spec.python)
            if not os.path.exists(path):
                raise pytest.UsageError(f"--strategies {spec.text}: no interpreter {path} (build the env first: "
                                        f"tox -e {spec.python} --notest)")
            found = versions.engine_versions(path, changes)
            if not found["tensorflow"]:
                raise pytest.UsageError(f"--strategies {spec.text}: {path} has no TensorFlow")
            others[spec.text] = found
    try:
        entries = deviations.load()
    except (ValueError, OSError) as exc:
        raise pytest.UsageError(f"known_deviations.toml: {exc}") from None
    # what the terminal summary shows too; under pytest-xdist each worker sends its part to the
    # controller (pytest_sessionfinish below, XdistController)
    config.stash[state.SUITE] = s = state.SuiteState(specs, here, others, entries)
    # Ctrl-C and SIGTERM: every engine killed at once, the session unwinds as interrupted (its JUnit
    # and results written, its pools' folders removed) and exits 128 + the signal (pytest_sessionfinish)

    def interrupted(signum):
        s.interrupted = signum
        if signum == signal.SIGTERM and not hasattr(config, "workeroutput"):
            interrupts.terminate_children()  # pytest-xdist's workers: a SIGTERM reaches this process only

    s.restore_signals = interrupts.install(lambda: s.pools, interrupted)
    s.results_run = results_dir.configure(config, config.getoption("--results-dir"), here)
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistController(), "tfds-xdist")
    config.pluginmanager.register(CostProperties(), "tfds-cost")
    # the check's one-device runs, computed once in the session and shared by its xdist workers
    # (suite/harness/pool/memo.py): the controller's folder, which it removes at the end
    shared = getattr(config, "workerinput", {}).get("tfds_memo")
    if shared is None:
        shared = config.stash[MEMO_DIR] = tempfile.mkdtemp(prefix="tfds-memo-", dir=memo.scratch())
    memo.MEMO.enable(Path(shared))


def pytest_unconfigure(config):
    memo.MEMO.disable()
    if MEMO_DIR in config.stash:
        shutil.rmtree(config.stash[MEMO_DIR], ignore_errors=True)
    s = config.stash.get(state.SUITE, None)
    if s is not None and s.restore_signals is not None:
        s.restore_signals()


def pytest_report_header(config):
    s = state.of(config)
    v = s.versions
    return [f"tf-distribute-suite: TensorFlow {v['tensorflow']}, Keras {v['keras']}, "
            f"hypothesis profile {PROFILE!r}",
            "strategy specs: " + ", ".join(spec.text for spec in s.specs)] + [
            f"{text}: TensorFlow {o['tensorflow']}, Keras {o['keras']}" for text, o in s.other_versions.items()]


# Which selected specs a test gets, by the name of its argument: ``spec`` the synchronous
# strategies (the properties call strategy.run directly), ``ps_spec`` the parameter-server
# ones (steps go through a ClusterCoordinator), ``any_spec`` every one (the harness tests),
# ``layout_spec`` one per engine layout (the first selected one-process spec, and every spec
# of several processes: the harness tests that kill and replace an engine, whose code path
# is the layout's, not the strategy's). ``versioned_spec`` takes the synchronous SPEC@ENV specs,
# engines of another TensorFlow (tests/properties/test_across_versions.py); no other argument does.
SPEC_ARGUMENTS = {"spec": lambda s: s.synchronous and not s.python,
                  "ps_spec": lambda s: not s.synchronous and not s.python,
                  "any_spec": lambda s: not s.python, "layout_spec": lambda s: not s.python,
                  "versioned_spec": lambda s: s.synchronous and s.python is not None}


def one_per_layout(specs: list) -> list:
    """The first one-process spec of ``specs`` and every spec of several processes."""
    single = [s for s in specs if len(topology.tasks(s)) == 1][:1]
    return [s for s in specs if s in single or len(topology.tasks(s)) > 1]


def pytest_generate_tests(metafunc):
    for name, wanted in SPEC_ARGUMENTS.items():
        if name not in metafunc.fixturenames:
            continue
        specs = [s for s in state.of(metafunc.config).specs if wanted(s)]
        marker = metafunc.definition.get_closest_marker("specs")
        if marker:  # @pytest.mark.specs(lambda spec: ...) narrows the selected specs
            specs = [s for s in specs if marker.args[0](s)]
            if "without_deep" in marker.kwargs and not metafunc.config.getoption("--deep"):
                specs = [s for s in specs if marker.kwargs["without_deep"](s)]  # fewer without --deep
        if name == "layout_spec":
            specs = one_per_layout(specs)
        no_gpu = pytest.mark.skip(reason="mirrored:gpus: no GPU visible here (nvidia-smi -L, CUDA_VISIBLE_DEVICES)")
        metafunc.parametrize(name, [pytest.param(s, id=s.text, marks=no_gpu if s.gpus and not s.replicas else ())
                                    for s in specs])


USER_WORKLOAD_TEST = "tests/workloads/test_user_workload.py::"


def pytest_collection_modifyitems(config, items):
    # A known deviation never marks a test: it gives the test a ledger of the entries in scope,
    # and only a mismatch that an entry's signature explains is tolerated (suite/harness/judging/judgment.py).
    s = state.of(config)
    v = s.versions
    active = [d for d in s.deviations if d.applies_to(v["tensorflow"], v["keras"])]
    per_spec = collections.Counter()  # (test function, spec) -> items
    budgets = {}  # test function -> examples per spec, without --deep (profiles.py)
    if config.getoption("--workload"):  # pytest tests --workload X: only the check of X (benchmarks: time X)
        chosen = [i for i in items if i.nodeid.startswith(USER_WORKLOAD_TEST) or not i.nodeid.startswith("tests/")]
        config.hook.pytest_deselected(items=[i for i in items if i not in chosen])
        items[:] = chosen
    deep_only = pytest.mark.skip(reason="runs with --deep (.ci/run runs it as a step of its own)")
    for item in items:
        if item.get_closest_marker("deep") and not config.getoption("--deep"):
            item.add_marker(deep_only)
        budget = item.get_closest_marker("budget")
        if budget and not config.getoption("--deep"):
            budgets[item.obj] = budget.args[0]
            s.budgets[item.obj.__name__] = budget.args[0]
        params = getattr(getattr(item, "callspec", None), "params", {})
        spec = next((params[name] for name in SPEC_ARGUMENTS if name in params), None)
        # a test comparing two versions (SPEC@ENV) has in scope the entries of either side's versions
        other = s.other_versions.get(getattr(spec, "text", None), {})
        item.stash[state.IN_SCOPE] = tuple(d for d in s.deviations if d.matches(item.nodeid) and (
            d in active or d.applies_to(other.get("tensorflow"), other.get("keras"))))
        if hasattr(spec, "text"):  # not NOTSET (a test whose specs are all deselected)
            per_spec[(item.obj, spec.text)] += 1
    # each property draws the profile's examples per spec, spread over its items (profiles.py)
    items_of: dict = {}
    for (fn, _), n in per_spec.items():
        items_of[fn] = min(n, items_of.get(fn, n))
    profiles.allot(items_of, budgets)


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (the default, pyproject addopts): the usable cores over the mean processes of the
    selected specs' engines, rounded up, at most one worker per spec and one more (scheduling.auto_workers). It
    runs before pytest_configure, so it reads --strategies itself."""
    text = config.getoption("--strategies") or ",".join(DEFAULT_SPECS)
    return scheduling.auto_workers(scheduling.usable_cores(), scheduling.engine_processes(text))


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` (the default): the scope of a test is its strategy spec; scopes go out
    costliest first by the checkout's committed cost table (docs/cost_table.json)."""
    if config.getoption("dist") == "loadscope":
        return SpecScheduling(config, [s.text for s in state.of(config).specs], log, scheduling.committed_table())
    return None


@contextlib.contextmanager
def running(test, nodeid: str, in_scope: tuple, counted: tally.Tally):
    """Around a test's call: its hypothesis seed, its ledger in force (yielded), its draws counted."""
    if getattr(test, "is_hypothesis_test", False) and hypothesis.settings.default.derandomize:
        # derandomized draws would otherwise be seeded by the function alone: every spec with the
        # same replica count would see the same cases. The test id (spec included) seeds them.
        hypothesis.seed(zlib.crc32(nodeid.encode()))(test)
    with deviations.in_force(deviations.Ledger(in_scope, scope=nodeid)) as ledger, tally.counting(test, counted):
        yield ledger


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # what the test's engines cost is counted from here to its teardown, its command-line children's
    # too (the process that runs tests collects their totals: cost.adopt)
    cost.adopt()
    cost.absorb()
    item.stash[state.COST_AT] = cost.COUNTED.snapshot(), time.process_time()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    counted = state.of(item.config).draws.setdefault(item.nodeid, tally.Tally())
    with running(item.obj, item.nodeid, item.stash.get(state.IN_SCOPE, ()), counted) as ledger:
        item.stash[state.LEDGER] = ledger
        yield


def root_causes(exc: BaseException, limit: int = 300) -> list[str]:
    """``exc``'s root causes, a line each: the members of exception groups (a hypothesis
    FlakyFailure holds the failure it could not repeat), else the exception itself."""
    if isinstance(exc, BaseExceptionGroup):
        return [line for sub in exc.exceptions for line in root_causes(sub, limit)]
    text = " ".join(str(exc).split())
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return [line if len(line) <= limit else line[:limit - 3] + "..."]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A passed test whose mismatches were all explained by known deviations is an expected
    failure naming them. Rounding bands are counted for the session (pytest_sessionfinish)."""
    outcome = yield
    ledger = item.stash.get(state.LEDGER, None)
    s = state.of(item.config)
    bands = s.bands
    rep = outcome.get_result()
    if call.when == "teardown" and state.COST_AT in item.stash:  # JUnit writes the teardown's properties
        cost.absorb()
        at, cpu_at = item.stash[state.COST_AT]
        spent = cost.COUNTED.minus(at)
        spent.harness_cpu_s += time.process_time() - cpu_at  # this process's own (its children's: absorbed)
        rep.user_properties.append(("tfds_cost", spent.text()))
    retried = [error for p in s.pools for error in p.take_retried()]
    if retried:  # a call of this phase whose engine hung or crashed, asked again: in JUnit and the summary
        # JUnit writes the properties of a test's last report, its teardown's, which copies the item's
        (rep.user_properties if call.when == "teardown" else item.user_properties).append(
            ("tfds_retried", "\n".join(retried)))
        s.engines["retried"].extend(f"{item.nodeid}: {error}" for error in retried)
    if (rep.failed and call.when == "call" and ledger is not None and call.excinfo is not None
            and ledger.explains_error(call.excinfo.value)):  # a probe raised what a known deviation raises
        rep.outcome, rep.wasxfail = "skipped", ledger.expected_failure()
        deviations.merge_bands(bands, ledger.band_counts())
        return
    if rep.failed and call.excinfo is not None:  # carried to the controller with the report
        rep.user_properties.append(("tfds_causes", root_causes(call.excinfo.value)))
    if call.when != "call" or ledger is None:
        return
    deviations.merge_bands(bands, ledger.band_counts())
    stale = ledger.stale_raises() if rep.passed else []
    if stale:  # a probe returned where its deviation's condition held and the entry predicts a raise
        rep.outcome, rep.longrepr = "failed", "\n".join(stale)
        return
    if rep.passed and ledger.expected_failure():
        rep.outcome, rep.wasxfail = "skipped", ledger.expected_failure()


@pytest.fixture(scope="session")
def pool(request):
    cfg = request.config
    p = EnginePool(python=cfg.getoption("--engine-python"),
                   start_timeout=cfg.getoption("--engine-start-timeout"),
                   call_timeout=cfg.getoption("--engine-timeout"),
                   retries=cfg.getoption("--engine-retries"))
    atexit.register(p.close)  # backstop if the session is interrupted
    state.of(cfg).pools.append(p)
    yield p
    p.close()
    counts = state.of(cfg).engines
    for key, n in p.starts.items():
        counts["starts"][key] = counts["starts"].get(key, 0) + n
    counts["traces"].update(p.trace_report)


@pytest.fixture(scope="session")
def engines(pool):
    return EngineHandle(pool)


@pytest.fixture(scope="session")
def findings(request):
    return state.of(request.config).findings


@pytest.fixture(scope="session")
def suite_state(request) -> state.SuiteState:
    """The session's selected specs, engine versions (and SPEC@ENV's), known deviations."""
    return state.of(request.config)


@pytest.fixture(scope="session")
def engine_versions(request):
    v = state.of(request.config).versions
    return {"tensorflow": versions.as_tuple(v["tensorflow"]), "keras": versions.as_tuple(v["keras"])}


class CostProperties:
    """The session's engine cost per probe (calls, seconds, traces) as a JUnit property of the run,
    ``tfds_probes``: its own and its xdist workers' (tools/cost_table.py reads it)."""

    @pytest.hookimpl(tryfirst=True)  # before junitxml writes its file
    def pytest_sessionfinish(self, session):
        s = state.of(session.config)
        if not hasattr(session.config, "workeroutput"):
            cost.absorb()
            s.cost.add(cost.COUNTED)
            if s.cost.probes:
                junit_suite_property(session.config, "tfds_probes", json.dumps(s.cost.dump()["probes"]))


@pytest.hookimpl(trylast=True)  # after junitxml and pytest-benchmark wrote their files: finish renames them
def pytest_sessionfinish(session):
    config = session.config
    s = state.of(config)
    results_dir.finish(s.results_run)  # the controller's (or a run without pytest-xdist's); None elsewhere
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker: hand the summary to the controller
        cost.absorb()  # the commands its last test ran
        config.workeroutput["tfds"] = {
            "draws": {k: t.dump() for k, t in s.draws.items() if t.examples},
            "budgets": s.budgets, "findings": s.findings.dump(), "engines": s.engines,
            "cost": cost.COUNTED.dump(),
            "bands": [[*key, *v] for key, v in s.bands.items()]}
        return
    if s.interrupted:  # Ctrl-C or SIGTERM, through the handlers pytest_configure installed
        session.exitstatus = 128 + s.interrupted
        return
    # a rounding band that never showed over the session's comparisons: the entry is stale
    s.stale = deviations.stale_bands(s.bands)
    if s.stale and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


class XdistController:
    """Gives the workers the session's memo folder; gathers their draws, findings and engine counts
    for the terminal summary."""

    def pytest_configure_node(self, node):
        node.workerinput["tfds_memo"] = node.config.stash[MEMO_DIR]

    def pytest_testnodedown(self, node, error):
        s = state.of(node.config)
        part = getattr(node, "workeroutput", {}).get("tfds")
        if not part:
            return
        for nodeid, counts in part["draws"].items():
            s.draws[nodeid] = tally.Tally(*counts)
        s.budgets.update(part["budgets"])
        s.findings.merge(part["findings"])
        deviations.merge_bands(s.bands, part["bands"])
        worker = node.gateway.id
        for key, n in part["engines"]["starts"].items():
            s.engines["starts"][f"{key} ({worker})"] = n
        for key, counts in part["engines"]["traces"].items():
            s.engines["traces"][f"{key} ({worker})"] = counts
        s.engines["retried"].extend(part["engines"].get("retried", ()))
        s.cost.add(part.get("cost", {}))


def pytest_terminal_summary(terminalreporter, config):
    tr = terminalreporter
    s = state.of(config)
    stale = s.stale
    if stale:
        tr.section("tf-distribute-suite stale known deviations (the run fails)")
        for line in stale:
            tr.write_line(line, red=True)
    tallies = {k: t for k, t in s.draws.items() if t.examples}
    if tallies:
        tr.section("tf-distribute-suite draws (accepted/rejected per property and spec)")
        for line in tally.table(tallies, hypothesis.settings.default.max_examples, s.budgets):
            tr.write_line(line)
    if s.findings.lines():
        tr.section("tf-distribute-suite findings")
        for line in s.findings.lines():
            tr.write_line(line)
    engines = s.engines
    if engines["starts"]:
        tr.section("tf-distribute-suite engines")
        for key, n in sorted(engines["starts"].items()):
            tr.write_line(f"{key}: started {n}x")
        for key, counts in sorted(engines["traces"].items()):
            if counts:
                tr.write_line(f"traces under {key}: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
        # a call whose engine hung or crashed, asked again of a fresh one (--engine-retries): the test
        # kept the outcome of the second call; each error whole is in the warnings summary
        for line in engines["retried"]:
            text = " ".join(line.split())
            tr.write_line(f"retried: {text if len(text) <= 300 else text[:297] + '...'}", yellow=True)
    # last, so that a log cut to its head and tail still shows it: each failed test's root
    # causes, a line each (a hypothesis FlakyFailure's or an exception group's members too)
    failed = [rep for rep in tr.stats.get("failed", ()) if rep.when in ("setup", "call", "teardown")]
    causes = [f"{rep.nodeid} ({rep.when}): {cause}" for rep in failed
              for key, values in rep.user_properties if key == "tfds_causes" for cause in values]
    if causes:
        tr.section("tf-distribute-suite failure causes")
        for line in causes:
            tr.write_line(line, red=True)
