"""Local clusters: free loopback ports and one TF_CONFIG per task (no TensorFlow here).

A multi_worker spec is W workers, each an engine that answers probes. A parameter_server spec
is a chief (the coordinator, which answers probes) plus W worker and P ps tasks that only run a
``tf.distribute.Server``. Every task gets the same cluster and its own ``task`` in TF_CONFIG.
"""

from __future__ import annotations

import dataclasses
import json
import socket

from suite.common.specs import Spec


@dataclasses.dataclass(frozen=True)
class Task:
    """One process of an engine: its TF_CONFIG task, and whether it answers probes
    (``serves=False``) or only runs a tf.distribute.Server (``serves=True``)."""

    type: str  # "" (no cluster) | "worker" | "chief" | "ps" | "evaluator"
    index: int
    serves: bool = False

    @property
    def name(self) -> str:
        return f"{self.type} {self.index}" if self.type != "chief" else "chief"


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


def tasks(spec: Spec) -> list[Task]:
    """The processes of a local engine for ``spec``, those that answer probes first."""
    if spec.kind == "multi_worker":
        return [Task("worker", i) for i in range(spec.workers)]
    if spec.kind == "parameter_server":
        return ([Task("chief", 0)] + [Task("worker", i, serves=True) for i in range(spec.workers)]
                + [Task("ps", i, serves=True) for i in range(spec.ps)])
    return [Task("", 0)]


def cluster_dict(task_list: list[Task], ports: list[int]) -> dict:
    out: dict = {}
    for task, port in zip(task_list, ports):
        out.setdefault(task.type, []).append(f"127.0.0.1:{port}")
    return out


def tf_config(cluster: dict, task: Task) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task.type, "index": task.index}})


def local_envs(spec: Spec, base_env: dict, ports: list[int] | None = None) -> list[tuple[Task, dict]]:
    """Each task of ``spec`` with its environment: TF_CONFIG on free loopback ports (or on
    ``ports``) for a cluster, the base environment for a single process."""
    task_list = tasks(spec)
    if task_list[0].type == "":
        return [(task_list[0], dict(base_env))]
    cluster = cluster_dict(task_list, ports or free_ports(len(task_list)))
    return [(t, dict(base_env, TF_CONFIG=tf_config(cluster, t))) for t in task_list]
