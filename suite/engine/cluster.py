"""Local clusters for multi-worker specs: free loopback ports and one TF_CONFIG per worker."""

from __future__ import annotations

import json
import socket

from suite.specs import Spec


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that were free on 127.0.0.1 a moment ago."""
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


def tf_config(workers: list[str], index: int) -> str:
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def worker_envs(spec: Spec, base_env: dict) -> list[dict]:
    """One environment per engine process: a single one, or one per worker with TF_CONFIG."""
    if spec.kind != "multi_worker":
        return [dict(base_env)]
    addresses = [f"127.0.0.1:{p}" for p in free_ports(spec.workers)]
    return [dict(base_env, TF_CONFIG=tf_config(addresses, i)) for i in range(spec.workers)]
