"""Cluster topology, local and real, in one place (no TensorFlow here): which processes an
engine has, what each runs, and the TF_CONFIG each gets.

A multi_worker spec is W workers, each an engine that answers probes. A parameter_server spec
is a chief (the coordinator, which answers probes) plus W worker and P ps tasks that only run a
``tf.distribute.Server``. Local clusters get free loopback ports and one TF_CONFIG per task. A
real cluster (the ``cluster`` spec) is described by its agents' TF_CONFIGs:
``cluster_spec`` checks that they cover one cluster and derives the spec, and ``tasks`` maps
its tasks onto engine processes the same way as a local cluster's.
"""

from __future__ import annotations

import dataclasses
import json
import socket

from ...common.specs import Spec

ROLES = ("chief", "worker", "ps", "evaluator")


class TopologyError(ValueError):
    """TF_CONFIGs that do not describe one usable cluster."""


@dataclasses.dataclass(frozen=True)
class Task:
    """One process of an engine: its TF_CONFIG task, the spec its engine builds, the index it
    answers probes as, and whether it only runs a tf.distribute.Server (``serves``)."""

    type: str  # "" (no cluster) | "worker" | "chief" | "ps" | "evaluator"
    index: int
    serves: bool = False
    engine_spec: str = ""  # the spec text the engine process parses ("" for a local spec: the spec itself)
    worker_index: int = 0

    @property
    def name(self) -> str:
        return f"{self.type} {self.index}" if self.type != "chief" else "chief"

    @property
    def answers_probes(self) -> bool:
        """Probes go to every task that neither only serves nor evaluates (evaluators answer
        only calls addressed to them)."""
        return not self.serves and self.type != "evaluator"

    def worker_args(self, spec: Spec, collective_timeout: float) -> list[str]:
        """The engine worker's command-line arguments for this task."""
        args = ["--spec", self.engine_spec or spec.text, "--worker-index", str(self.worker_index),
                "--collective-timeout", str(collective_timeout)]
        return args + (["--serve"] if self.serves else [])


def tasks(spec: Spec) -> list[Task]:
    """The processes of the engine for ``spec``, in the order their replies are reported: a
    local cluster's probe-answering tasks first; a real cluster's in ROLES order."""
    if spec.kind == "cluster":
        info = spec.cluster
        ps_cluster = info["strategy"] == "parameter_server"
        n_chief = sum(1 for t, _ in info["tasks"] if t == "chief")
        out = []
        for task_type, index in info["tasks"]:
            evaluator = task_type == "evaluator"
            out.append(Task(task_type, index, serves=ps_cluster and task_type in ("worker", "ps"),
                            engine_spec="default" if evaluator else info["engine_spec"],
                            worker_index=0 if task_type in ("chief", "evaluator")
                            else index + (0 if ps_cluster else n_chief)))
        return out
    if spec.kind == "multi_worker":
        return [Task("worker", i, worker_index=i) for i in range(spec.workers)]
    if spec.kind == "parameter_server":
        return ([Task("chief", 0)] + [Task("worker", i, serves=True, worker_index=i) for i in range(spec.workers)]
                + [Task("ps", i, serves=True, worker_index=i) for i in range(spec.ps)])
    return [Task("", 0)]


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that were free on 127.0.0.1 a moment ago (another process can
    still take one before TensorFlow binds it; the pool retries a start that hits that)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def cluster_dict(task_list: list[Task], ports: list[int]) -> dict:
    out: dict = {}
    for task, port in zip(task_list, ports):
        out.setdefault(task.type, []).append(f"127.0.0.1:{port}")
    return out


def tf_config(cluster: dict, task: Task) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task.type, "index": task.index}})


def local_envs(spec: Spec, base_env: dict, ports: list[int] | None = None) -> list[tuple[Task, dict]]:
    """Each task of a local ``spec`` with its environment: TF_CONFIG on free loopback ports (or
    on ``ports``) for a cluster, the base environment for a single process."""
    task_list = tasks(spec)
    if task_list[0].type == "":
        return [(task_list[0], dict(base_env))]
    cluster = cluster_dict(task_list, ports or free_ports(len(task_list)))
    return [(t, dict(base_env, TF_CONFIG=tf_config(cluster, t))) for t in task_list]


def cluster_spec(described: list[tuple[tuple[str, int], dict]]) -> Spec:
    """The ``cluster`` Spec of agents that described themselves as ``(address, info)`` with
    ``info = {"tf_config": ..., "virtual_cpus": R}``: they must share one TF_CONFIG cluster and
    cover each of its tasks exactly once. Chief + workers make MultiWorkerMirrored (W x R
    replicas); a cluster with ps tasks makes ParameterServer (one replica per step)."""
    first = described[0][0]
    cluster = described[0][1]["tf_config"]["cluster"]
    by_task: dict = {}
    for address, info in described:
        if info["tf_config"]["cluster"] != cluster:
            raise TopologyError(f"agents {first[0]}:{first[1]} and {address[0]}:{address[1]} "
                                "have different TF_CONFIG clusters")
        task = (info["tf_config"]["task"]["type"], int(info["tf_config"]["task"]["index"]))
        if task in by_task:
            raise TopologyError(f"two agents claim task {task[0]} {task[1]}: {by_task[task]} and {address}")
        by_task[task] = address
    missing = [f"{t} {i}" for t in cluster for i in range(len(cluster[t])) if (t, i) not in by_task]
    if missing:
        raise TopologyError(f"no agent for task(s) {', '.join(missing)} of the TF_CONFIG cluster")
    unknown = sorted(set(cluster) - set(ROLES))
    if unknown:
        raise TopologyError(f"TF_CONFIG cluster has jobs {unknown}; the suite knows {list(ROLES)}")
    cpus = {info["virtual_cpus"] for _, info in described}
    if len(cpus) != 1:
        raise TopologyError(f"agents disagree on --virtual-cpus: {sorted(cpus)}")
    r = cpus.pop()
    order = [(t, i) for t in ROLES for i in range(len(cluster.get(t, [])))]
    n_chief, n_worker, n_ps = (len(cluster.get(t, [])) for t in ("chief", "worker", "ps"))
    if n_ps:
        if n_chief != 1 or not n_worker:
            raise TopologyError("a parameter-server cluster needs one chief (the coordinator) and at least one worker")
        engine_spec, workers, replicas = f"parameter_server:{n_worker}w{n_ps}ps", n_worker, 1
    else:
        if n_chief > 1 or not n_chief + n_worker:
            raise TopologyError("a multi-worker cluster needs at most one chief and at least one worker")
        workers = n_chief + n_worker
        engine_spec, replicas = f"multi_worker:{workers}x{r}", workers * r
    return Spec("cluster", "cluster", replicas=replicas, workers=workers, devices=r, ps=n_ps,
                cluster={"strategy": "parameter_server" if n_ps else "multi_worker", "engine_spec": engine_spec,
                         "agents": [list(by_task[t]) for t in order], "tasks": [list(t) for t in order],
                         "evaluators": len(cluster.get("evaluator", []))})
