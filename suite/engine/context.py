"""Engine-side context: configure devices, build the strategy of a spec (imports TensorFlow)."""

from __future__ import annotations

import collections
import json
import os
import tempfile

import tensorflow as tf

from suite.common.specs import Spec
from suite.engine import compat


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
    if spec.kind == "parameter_server":
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.ParameterServerStrategy(resolver)
    if spec.kind == "multi_worker":
        if spec.devices > 1:
            _configure_cpus(spec.devices)
            _multi_worker_uses_cpus(spec.devices)
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


def _multi_worker_uses_cpus(n: int):
    """Make MultiWorkerMirroredStrategy use ``n`` logical CPUs per worker.

    A private hook: without GPUs ``CollectiveAllReduceExtended._initialize_local_devices``
    always returns the one device ``<worker>/device:CPU:0`` (collective_all_reduce_strategy.py,
    TF 2.15 and 2.21 alike). The wrapper returns CPU:0..n-1 instead; the collective group then
    has workers*n members, and everything downstream (input workers, all-reduce) follows the
    device list, as it does for GPUs."""
    from tensorflow.python.distribute import collective_all_reduce_strategy as cars

    original = cars.CollectiveAllReduceExtended._initialize_local_devices

    def with_cpus(self, cluster_resolver, worker_device):
        devices, device_type = original(self, cluster_resolver, worker_device)
        if device_type == "CPU":
            devices = tuple(f"{worker_device}/device:CPU:{i}" for i in range(n))
        return devices, device_type

    cars.CollectiveAllReduceExtended._initialize_local_devices = with_cpus


_SERVERS: list = []  # keeps this process's tf.distribute.Server alive


def start_server() -> dict:
    """Start the tf.distribute.Server of this process's TF_CONFIG task (a parameter-server
    cluster's worker or ps); it serves until the process exits."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol="grpc", start=True)
    _SERVERS.append(server)
    return {"task": f"{resolver.task_type} {resolver.task_id}", "pid": os.getpid(), "target": server.target,
            "tf_version": tf.__version__}


class EngineContext:
    """What a probe gets: the strategy, its spec, this worker's place, a cache that keeps
    models and traced functions alive across calls, and per-probe trace counters."""

    def __init__(self, spec: Spec, worker_index: int, collective_timeout: float):
        self.spec = spec
        self.worker_index = worker_index
        self.strategy = _build_strategy(spec, collective_timeout)
        self.coordinator = None
        if spec.strategy == "parameter_server":
            self.coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)
        self.num_replicas = self.strategy.num_replicas_in_sync
        local = self.num_replicas // max(spec.workers if spec.synchronous else 1, 1)
        self.local_replica_ids = list(range(worker_index * local, (worker_index + 1) * local))
        self.cache: dict = {}
        self.traces: collections.Counter = collections.Counter()
        self.restart_requested = False

    def request_restart(self):
        """Ask the pool to replace this engine after the current call. A probe that caught a
        TensorFlow runtime error calls this: in a multi-worker cluster a failed collective
        aborts every later one ("Restart your program to reset"); elsewhere it is ignored."""
        if self.spec.is_multi_worker:
            self.restart_requested = True

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
            "tmpdir": tempfile.gettempdir(),
        }


def build_context(spec: Spec, worker_index: int, collective_timeout: float) -> EngineContext:
    return EngineContext(spec, worker_index, collective_timeout)
