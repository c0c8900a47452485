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
                                (TF_CONFIG), R CPUs each (R>1 is not supported yet, issue #4)
  tpu                           TPUStrategy (skipped where no TPU exists)
N, W, R are whole numbers from 1 to 8."""

DEFAULT_SPECS = (
    "default",
    "one_device",
    "mirrored:1",
    "mirrored:2",
    "mirrored:3",
    "mirrored:4:reduce_to_one",
    "central_storage:2",
    "multi_worker:2x1",
)

MAX_DEVICES = 8


class SpecError(ValueError):
    """A strategy spec that does not parse; the message shows the grammar."""


@dataclasses.dataclass(frozen=True)
class Spec:
    """One parsed strategy spec.

    ``replicas`` is ``num_replicas_in_sync``; ``workers`` is the number of engine processes;
    ``devices`` the number of logical CPUs each process configures.
    """

    text: str
    kind: str  # default | one_device | mirrored | central_storage | multi_worker | tpu
    replicas: int = 1
    workers: int = 1
    devices: int = 1
    cross_device_ops: str | None = None  # None (TF's default) | "reduce_to_one"
    communication: str = "auto"  # multi_worker only: auto | ring
    gpus: bool = False

    @property
    def replicas_per_worker(self) -> int:
        return self.replicas // self.workers

    @property
    def is_multi_worker(self) -> bool:
        return self.workers > 1 or self.kind == "multi_worker"

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
        if r > 1:
            # MultiWorkerMirroredStrategy gives each worker a single CPU device
            # (collective_all_reduce_strategy._initialize_local_devices).
            raise SpecError(f"{s!r}: R>1 CPUs per worker is not supported yet (issue #4); "
                            f"MultiWorkerMirroredStrategy uses one CPU per worker\n{GRAMMAR}")
        return Spec(s, "multi_worker", replicas=w * r, workers=w, devices=r,
                    communication=m.group(3) or "auto")
    if re.fullmatch(r"parameter_server:\d+w\d+ps", s):
        raise SpecError(f"{s!r}: parameter_server specs are not implemented yet "
                        f"(tracked in issue #4)\n{GRAMMAR}")
    raise SpecError(f"unknown strategy spec {s!r}\n{GRAMMAR}")


def parse_specs(text: str) -> list[Spec]:
    """Parse a comma-separated list of specs, rejecting duplicates."""
    specs = [parse_spec(part) for part in text.split(",") if part.strip()]
    if not specs:
        raise SpecError(f"no strategy spec given\n{GRAMMAR}")
    seen = set()
    for spec in specs:
        if spec.text in seen:
            raise SpecError(f"strategy spec {spec.text!r} given twice")
        seen.add(spec.text)
    return specs
