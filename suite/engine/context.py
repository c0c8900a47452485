"""Engine-side context: configure devices, build the strategy of a spec (imports TensorFlow)."""

from __future__ import annotations

import collections
import json
import os

import tensorflow as tf

from suite import compat
from suite.specs import Spec


class EngineUnavailableHere(RuntimeError):
    """The spec needs hardware this machine lacks (GPUs, a TPU): tests skip, not fail."""


def _configure_cpus(n: int) -> list[str]:
    cpu = tf.config.list_physical_devices("CPU")[0]
    if n > 1:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
    return [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(n)]


def _build_strategy(spec: Spec, collective_timeout: float):
    if spec.kind == "default":
        return tf.distribute.get_strategy()
    if spec.kind == "one_device":
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    if spec.kind == "mirrored" and spec.gpus:
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            raise EngineUnavailableHere("mirrored:gpus needs GPUs and TensorFlow sees none")
        return tf.distribute.MirroredStrategy()
    if spec.kind == "mirrored":
        devices = _configure_cpus(spec.devices)
        ops = tf.distribute.ReductionToOneDevice() if spec.cross_device_ops == "reduce_to_one" else None
        return tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
    if spec.kind == "central_storage":
        devices = _configure_cpus(spec.devices)
        return tf.distribute.experimental.CentralStorageStrategy(
            compute_devices=devices, parameter_device="/cpu:0")
    if spec.kind == "multi_worker":
        impl = {"auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
                "ring": tf.distribute.experimental.CommunicationImplementation.RING}[spec.communication]
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=impl, timeout_seconds=collective_timeout)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if spec.kind == "tpu":
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except Exception as exc:  # no TPU: TF raises ValueError/NotFoundError
            raise EngineUnavailableHere(f"no TPU found ({type(exc).__name__})") from exc
        return tf.distribute.TPUStrategy(resolver)
    raise AssertionError(f"unhandled spec kind {spec.kind}")


class EngineContext:
    """What a probe gets: the strategy, its spec, this worker's place, a cache that keeps
    models and traced functions alive across calls, and per-probe trace counters."""

    def __init__(self, spec: Spec, worker_index: int, collective_timeout: float):
        self.spec = spec
        self.worker_index = worker_index
        self.strategy = _build_strategy(spec, collective_timeout)
        self.num_replicas = self.strategy.num_replicas_in_sync
        local = self.num_replicas // max(spec.workers, 1)
        self.local_replica_ids = list(range(worker_index * local, (worker_index + 1) * local))
        self.cache: dict = {}
        self.traces: collections.Counter = collections.Counter()

    def cached(self, key, factory):
        """Return ``cache[key]``, building it with ``factory()`` on first use."""
        if key not in self.cache:
            self.cache[key] = factory()
        return self.cache[key]

    def info(self) -> dict:
        return {
            "spec": self.spec.text,
            "worker_index": self.worker_index,
            "pid": os.getpid(),
            "tf_version": tf.__version__,
            "keras_version": compat.KERAS_VERSION,
            "keras_generation": compat.KERAS_GENERATION,
            "num_replicas_in_sync": self.num_replicas,
            "local_replica_ids": self.local_replica_ids,
            "strategy": type(self.strategy).__name__,
            "cross_device_ops": compat.cross_device_ops_name(self.strategy),
            "tf_config": json.loads(os.environ.get("TF_CONFIG", "null")),
        }


def build_context(spec: Spec, worker_index: int, collective_timeout: float) -> EngineContext:
    return EngineContext(spec, worker_index, collective_timeout)
