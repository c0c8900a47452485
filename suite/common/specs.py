"""Strategy spec grammar: parse and validate strategy specs in pure Python (no TensorFlow).

A spec is a short string naming one tf.distribute strategy and its devices, usable on the
command line (``--strategies default,mirrored:2``). Parsing happens before any engine
starts, so a bad spec is a usage error, not a crashed engine.
"""

from __future__ import annotations

import dataclasses
import re

GRAMMAR = """\
strategy spec grammar:
  default                       the default (no-op) strategy, 1 replica
  one_device                    OneDeviceStrategy on /cpu:0, 1 replica
  mirrored:N                    MirroredStrategy over N virtual CPUs (default cross-device ops)
  mirrored:N:reduce_to_one      ... with ReductionToOneDevice cross-device ops
  mirrored:gpus                 MirroredStrategy over every local GPU (only where GPUs exist)
  central_storage:N             CentralStorageStrategy, N virtual CPUs compute, variables on /cpu:0
  multi_worker:WxR[:auto|:ring] MultiWorkerMirroredStrategy, W local worker processes on loopback
                                (TF_CONFIG), R virtual CPUs each, AUTO (default) or RING collectives
  parameter_server:WwPps        ParameterServerStrategy: W worker and P ps servers on loopback,
                                driven by a ClusterCoordinator in the chief process
  cluster                       the cluster of the engine agents named by --cluster-agents, each
                                with the TF_CONFIG its host gives it (see docs/running.md, "A real cluster")
  tpu                           TPUStrategy (skipped where no TPU exists)
  SPEC@ENV                      any spec above but cluster, its engines run by another TensorFlow:
                                the interpreter of tox env ENV (.tox/ENV/bin/python; a -legacy
                                env with TF_USE_LEGACY_KERAS=1), or the Python at path ENV; only
                                the tests that compare two versions take it
                                (tests/properties/test_across_versions.py)
N, W, R, P are whole numbers from 1 to 8."""

DEFAULT_SPECS = (
    "default",
    "one_device",
    "mirrored:1",
    "mirrored:2",
    "mirrored:3",
    "mirrored:4:reduce_to_one",
    "central_storage:2",
    "multi_worker:2x1",
    "parameter_server:2w1ps",
)

MAX_DEVICES = 8


class SpecError(ValueError):
    """A strategy spec that does not parse; the message shows the grammar."""


@dataclasses.dataclass(frozen=True)
class Spec:
    """One parsed strategy spec.

    ``replicas`` is ``num_replicas_in_sync``; ``workers`` is the number of workers that
    compute (engine processes answering probes for synchronous strategies, worker servers for
    parameter_server); ``devices`` the number of logical CPUs each computing process configures;
    ``ps`` the number of parameter servers. ``cluster`` (kind ``cluster`` only) is the resolved
    cluster of a real cluster: ``{"strategy": "multi_worker" | "parameter_server",
    "agents": [[host, port], ...], "tasks": [[type, index], ...], "evaluators": n}``.
    """

    text: str
    kind: str  # default | one_device | mirrored | central_storage | multi_worker | parameter_server | cluster | tpu
    replicas: int = 1
    workers: int = 1
    devices: int = 1
    cross_device_ops: str | None = None  # None (TF's default) | "reduce_to_one"
    communication: str = "auto"  # multi_worker only: auto | ring
    gpus: bool = False
    ps: int = 0
    python: str | None = None  # SPEC@ENV: the tox env or interpreter path whose TensorFlow runs it
    cluster: dict | None = dataclasses.field(default=None, compare=False, hash=False)

    @property
    def strategy(self) -> str:
        """The tf.distribute strategy family: the kind, or for a real cluster the one its
        TF_CONFIG implies (parameter_server when it has ps tasks, else multi_worker)."""
        return self.cluster["strategy"] if self.kind == "cluster" else self.kind

    @property
    def synchronous(self) -> bool:
        """Properties that call ``strategy.run`` directly apply (everything but parameter
        servers, whose steps are scheduled through a ClusterCoordinator)."""
        return self.strategy != "parameter_server"

    @property
    def replicas_per_worker(self) -> int:
        return self.replicas // self.workers

    @property
    def is_multi_worker(self) -> bool:
        return self.workers > 1 or self.strategy == "multi_worker"

    @property
    def base(self) -> Spec:
        """The same spec run by the session's own interpreter (``mirrored:2`` for ``mirrored:2@tf215``)."""
        return parse_spec(self.text.split("@", 1)[0]) if self.python else self

    def __str__(self) -> str:
        return self.text


def _count(text: str, what: str, spec: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_DEVICES:
        raise SpecError(f"{what}={value} in {spec!r} is outside 1..{MAX_DEVICES}\n{GRAMMAR}")
    return value


def parse_spec(text: str) -> Spec:
    """Parse one spec string; raise SpecError (with the grammar) if it is not valid."""
    s = text.strip()
    if "@" in s:
        base, env = s.split("@", 1)
        if not re.fullmatch(r"[\w.+/-]+", env):
            raise SpecError(f"{s!r}: after '@' a tox env name or an interpreter path\n{GRAMMAR}")
        if base.strip() == "cluster":
            raise SpecError(f"{s!r}: the cluster spec runs the agents' interpreters; it takes no '@'")
        return dataclasses.replace(parse_spec(base), text=f"{base.strip()}@{env}", python=env)
    if s in ("default", "one_device", "tpu"):
        return Spec(s, s)
    m = re.fullmatch(r"mirrored:(\d+)(:reduce_to_one)?", s)
    if m:
        n = _count(m.group(1), "N", s)
        return Spec(s, "mirrored", replicas=n, devices=n,
                    cross_device_ops="reduce_to_one" if m.group(2) else None)
    if s == "mirrored:gpus":
        return Spec(s, "mirrored", replicas=0, gpus=True)
    m = re.fullmatch(r"central_storage:(\d+)", s)
    if m:
        n = _count(m.group(1), "N", s)
        return Spec(s, "central_storage", replicas=n, devices=n)
    m = re.fullmatch(r"multi_worker:(\d+)x(\d+)(?::(auto|ring))?", s)
    if m:
        w = _count(m.group(1), "W", s)
        r = _count(m.group(2), "R", s)
        return Spec(s, "multi_worker", replicas=w * r, workers=w, devices=r,
                    communication=m.group(3) or "auto")
    m = re.fullmatch(r"parameter_server:(\d+)w(\d+)ps", s)
    if m:
        w = _count(m.group(1), "W", s)
        p = _count(m.group(2), "P", s)
        # num_replicas_in_sync is the replicas of one worker: 1 on a CPU worker
        # (parameter_server_strategy_v2.py, _num_replicas_in_sync)
        return Spec(s, "parameter_server", replicas=1, workers=w, ps=p)
    if s == "cluster":
        raise SpecError("the 'cluster' spec needs --cluster-agents HOST:PORT,... (see docs/running.md, "
                        "\"A real cluster\")")
    raise SpecError(f"unknown strategy spec {s!r}\n{GRAMMAR}")


ENV_FACTOR = re.compile(r"legacy|keras\d+")  # the factors of the tox envs' names after tfNNN (tox.ini)


def id_parts(params: str) -> list[str]:
    """A test id's parameters (``mirrored:2@tf216-legacy-float32``) split at ``-``, with a
    ``SPEC@ENV`` of a tox env with factors (``@tf216-legacy``, ``@tf218-keras37``: the tox env's
    name) kept whole."""
    out: list[str] = []
    for part in params.split("-"):
        if ENV_FACTOR.fullmatch(part) and out and "@" in out[-1]:
            out[-1] += f"-{part}"
        else:
            out.append(part)
    return out


def parse_specs(text: str, resolve_cluster=None) -> list[Spec]:
    """Parse a comma-separated list of specs, rejecting duplicates; ``cluster`` becomes
    ``resolve_cluster()`` (which asks the agents of a real cluster) when that is given."""
    specs = [resolve_cluster() if part.strip() == "cluster" and resolve_cluster else parse_spec(part)
             for part in text.split(",") if part.strip()]
    if not specs:
        raise SpecError(f"no strategy spec given\n{GRAMMAR}")
    seen = set()
    for spec in specs:
        if spec.text in seen:
            raise SpecError(f"strategy spec {spec.text!r} given twice")
        seen.add(spec.text)
    return specs
