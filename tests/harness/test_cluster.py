"""The real-cluster mode: engine agents (``python -m suite.harness.pool.agent``), each given its task's
TF_CONFIG, run the engines of the ``cluster`` spec. Here the "hosts" are local agent processes
on loopback with TF_CONFIGs naming chief, worker, ps and evaluator tasks, and the suite runs
against them in a child pytest, as a user would run it against their own machines."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from suite.harness.judging.judgment import Check
from suite.harness.pool.agent import new_key
from suite.harness.pool.topology import free_ports
from tests.helpers import ROOT, alive, run_pytest

KEY = new_key()  # a fresh key per session, as `python -m suite.harness.pool.agent --new-key` prints


class Agents:
    """Agent processes for one TF_CONFIG cluster, killed at teardown."""

    def __init__(self, log_dir: Path):
        self.procs: list[subprocess.Popen] = []
        self.log_dir = log_dir  # engine logs; a SIGKILLed agent cannot remove a folder of its own

    def start(self, tasks: dict[str, int], **options) -> tuple[dict, list[str]]:
        """One agent per task of a cluster with ``tasks`` = {"chief": 1, "worker": 2, ...};
        returns the cluster and the agents' addresses."""
        names = [(t, i) for t, n in tasks.items() for i in range(n)]
        ports = iter(free_ports(len(names)))
        cluster = {t: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for t, n in tasks.items()}
        return cluster, [self.agent(cluster, t, i, **options) for t, i in names]

    def agent(self, cluster, task_type, index, key=KEY, extra=()) -> str:
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}}),
                   TFDS_AGENT_KEY=key)
        log_dir = self.log_dir / f"{task_type}{index}-{len(self.procs)}"
        proc = subprocess.Popen([sys.executable, "-m", "suite.harness.pool.agent", "--listen", "127.0.0.1:0",
                                 "--log-dir", str(log_dir), *extra],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        self.procs.append(proc)
        check = Check(f"agent for {task_type} {index}")
        check.that(bool(select.select([proc.stdout], [], [], 30)[0]), "the agent's output", "nothing in 30 s",
                   "a first line")
        line = proc.stdout.readline()
        check.contains(line, ["listening on "], "the agent's first line")
        return re.search(r"listening on (\S+)", line).group(1)

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # the agent kills its engines, then exits
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@pytest.fixture
def agents(tmp_path):
    a = Agents(tmp_path / "agent-logs")
    try:
        yield a
    finally:
        a.stop()


def _pytest(args: list[str], agents: list[str], key: str = KEY, timeout: float = 900) -> subprocess.CompletedProcess:
    return run_pytest([*args, "--strategies", "cluster", "--cluster-agents", ",".join(agents)], timeout,
                      TFDS_AGENT_KEY=key, HYPOTHESIS_PROFILE="ci")


def test_multi_worker_properties_run_on_a_tf_config_cluster(agents):
    """A chief, a worker and an evaluator: the cluster spec resolves to MultiWorkerMirrored
    over chief + worker (2 replicas), the reduce and loss properties pass on both tasks, a
    user's loop checked against one device passes (python -m suite.check's comparison), the
    evaluator restores the chief's checkpoint, and the engines end with the run."""
    _, addresses = agents.start({"chief": 1, "worker": 1, "evaluator": 1})
    proc = _pytest(["tests/properties/test_reduce.py",
                    "tests/properties/test_losses.py::test_compute_average_loss_matches_reference",
                    "tests/workloads/test_examples.py::test_the_right_loop_of_the_mistakes_passes",
                    "tests/harness/test_cluster.py::test_evaluator_restores_the_chiefs_checkpoint"], addresses)
    out = proc.stdout + proc.stderr
    check = Check("cluster", case={"tasks": "chief, worker, evaluator"})
    check.equal(proc.returncode, 0, "the child pytest's exit code", out[-4000:])
    check.contains(out, ["cluster: started 1x", " passed"], "the child pytest's output")
    check.that("skipped" not in out.strip().splitlines()[-1], "the child pytest's summary", out.strip().splitlines()[-1],
               "without skips")


def test_parameter_server_properties_run_on_a_tf_config_cluster(agents):
    """A chief (the coordinator), two workers and a ps: the cluster spec resolves to
    ParameterServerStrategy and the exactly-once and partitioning properties pass."""
    _, addresses = agents.start({"chief": 1, "worker": 2, "ps": 1})
    proc = _pytest(["tests/properties/test_parameter_server.py::test_every_scheduled_step_is_applied_exactly_once",
                    "tests/properties/test_parameter_server.py::test_partitioned_variables_reassemble"], addresses)
    out = proc.stdout + proc.stderr
    check = Check("cluster", case={"tasks": "chief, 2 workers, ps"})
    check.equal(proc.returncode, 0, "the child pytest's exit code", out[-4000:])
    summary = out.strip().splitlines()[-1]
    check.that(re.search(r"\b3 passed", summary) is not None, "the child pytest's summary", summary, "3 passed")


@pytest.mark.specs(lambda spec: spec.kind == "cluster" and spec.cluster["evaluators"] > 0)
def test_evaluator_restores_the_chiefs_checkpoint(pool, spec, tmp_path):
    """The side-car evaluator of the TF_CONFIG (a local strategy, one replica) restores the
    checkpoint the chief saved after a training step and sees the chief's variables."""
    arch = {"input_dim": 2, "hidden": [], "outputs": 1, "head": "linear", "l2": 0.0}
    params = [np.array([[0.5], [-0.25]], np.float32), np.array([0.125], np.float32)]
    g = spec.replicas
    x = np.arange(2 * g, dtype=np.float32).reshape(g, 2) / 4
    y = np.ones((g, 1), np.float32)
    saved = pool.call(spec, "checkpoint.save", arch=arch, optimizer="sgd", dtype="float32", params=params,
                      steps=[(x, y, [1] * g)], directory=str(tmp_path))
    engine = pool.get(spec)
    info = engine.call("engine.info", evaluator=True)[0]
    check = Check(spec, "float32")
    check.equal(info.num_replicas_in_sync, 1, f"replicas of the evaluator's {info.strategy}")
    check.equal(info.tf_config["task"]["type"], "evaluator", "the evaluator engine's TF_CONFIG task")
    restored = engine.call("checkpoint.restore", evaluator=True, arch=arch, optimizer="sgd", dtype="float32",
                           path=saved[0].path, steps=[])[0].restored
    for v, (got, want) in enumerate(zip(restored.params, saved[0].params)):
        check.exact(got[0], want[0], f"variable {v} the evaluator restored vs the chief saved")


def test_agent_and_cluster_errors_are_one_line(agents, tmp_path):
    """A wrong key, an address where no agent listens, agents that leave a task uncovered, and
    an agent without TF_CONFIG each give one clear line, before any engine starts."""
    cluster, addresses = agents.start({"worker": 2})
    check = Check("cluster")
    dead = f"127.0.0.1:{free_ports(1)[0]}"
    for what, agents_given, key, phrase in [
            ("a wrong key", addresses, new_key(), "refused the key"),
            ("an unreachable agent", [addresses[0], dead], KEY, f"agent {dead} could not be reached"),
            ("an uncovered task", addresses[:1], KEY, "no agent for task(s) worker 1")]:
        proc = _pytest(["tests/units/test_specs.py"], agents_given, key=key, timeout=120)
        check.equal(proc.returncode, 4, f"pytest's exit code with {what} (a usage error)", proc.stderr[-2000:])
        check.contains(proc.stderr, [phrase], f"pytest's error with {what}")
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    bare = subprocess.run([sys.executable, "-m", "suite.harness.pool.agent", "--listen", "127.0.0.1:0"], cwd=ROOT,
                          env=dict(env, TFDS_AGENT_KEY=KEY), capture_output=True, text=True, timeout=60)
    check.equal(bare.returncode, 2, "the exit code of an agent without TF_CONFIG", bare.stderr)
    check.contains(bare.stderr, ["TF_CONFIG is not set"], "the error of an agent without TF_CONFIG")
    check.equal(bare.stderr.strip().count("\n"), 0, "line breaks in that error")


def test_agent_engines_end_with_their_agent(agents):
    """An agent's engines die with it: SIGTERM kills them, and a SIGKILLed agent takes them
    along (PR_SET_PDEATHSIG), so a cluster host is left clean."""
    from suite.harness.pool import agent as agent_mod

    _, addresses = agents.start({"worker": 1})
    host, port = addresses[0].rsplit(":", 1)
    os.environ["TFDS_AGENT_KEY"] = KEY
    try:
        conn = agent_mod.connect((host, int(port)), KEY.encode(), 20)
        conn.send(("start", ["--spec", "default"]))
        check = Check("agent")
        check.that(conn.poll(20), "the agent's reply to a start", "nothing in 20 s", "('started', pid)")
        pid = conn.recv()[1]
        check.that(conn.poll(180), "the engine's first message", "nothing in 180 s", "'ready'")
        check.equal(conn.recv()[0], "ready", "the engine's first message")
        os.killpg(agents.procs[0].pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        check.that(not alive(pid), f"engine {pid} 15 s after its agent was SIGKILLed", "alive", "gone")
        conn.close()
    finally:
        os.environ.pop("TFDS_AGENT_KEY", None)


def test_a_hung_cluster_engine_says_where_each_worker_waits(agents, monkeypatch):
    """A call that outlives its deadline on agents' engines: ERROR (EngineTimeout) quoting, per
    worker, the frame it waited in, which each agent had its engine dump (the ``stacks`` request);
    the engines are killed and the next call gets its own reply from new ones. Before, a remote
    engine's stacks were not fetched, and a reply cut short on its socket was waited for without end."""
    from suite.harness.pool.agent import resolve_cluster
    from suite.harness.pool.pool import EnginePool, EngineTimeout
    from tests.helpers import check_replaced

    _, addresses = agents.start({"worker": 2})
    monkeypatch.setenv("TFDS_AGENT_KEY", KEY)
    spec = resolve_cluster(addresses)
    pool = EnginePool(call_timeout=6.0)
    check = Check(spec, case={"probe": "engine.sleep(60)", "deadline": 6.0})
    try:
        old = pool.get(spec).pids()
        with pytest.raises(EngineTimeout) as hung:
            pool.call(spec, "engine.sleep", seconds=60.0)
        message = str(hung.value)
        check.contains(message, ["where it waited", "worker 0: suite/engine/probes/engine.py",
                                 "worker 1: suite/engine/probes/engine.py", "in sleep"], "the timeout's error")
        check.that("Thread 0x" not in message, "the timeout's error", message, "the frames, not the raw dump")
        check_replaced(check, pool, spec, old)
    finally:
        pool.close()
