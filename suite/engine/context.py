"""Engine-side context: the strategy of a spec, built from its source in suite/common/strategies.py,
and what a probe gets to work with (imports TensorFlow)."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import tempfile

import tensorflow as tf

from ..common.results import EngineInfo, ServerInfo
from ..common.specs import Spec
from ..common.strategies import HEARTBEAT_TIMEOUT_MS, strategy_source
from . import compat


class EngineUnavailableHere(RuntimeError):
    """The spec needs hardware this machine lacks (GPUs, a TPU): tests skip, not fail."""


@contextlib.contextmanager
def _patient_heartbeats():
    """While a strategy is built, the coordination service it configures (MultiWorkerMirrored
    calls ``configure_coordination_service`` without a heartbeat timeout, which means 10 s) gets
    ``HEARTBEAT_TIMEOUT_MS``; a timeout the caller sets is kept."""
    from tensorflow.python.eager import context as eager_context  # private: the one way in

    ctx = eager_context.context()
    original = ctx.configure_coordination_service

    def configure(*args, **kwargs):
        if not kwargs.get("heartbeat_timeout_in_ms"):
            kwargs["heartbeat_timeout_in_ms"] = HEARTBEAT_TIMEOUT_MS
        return original(*args, **kwargs)

    ctx.configure_coordination_service = configure
    try:
        yield
    finally:
        del ctx.configure_coordination_service  # the class's method again


def build_strategy(spec: Spec, collective_timeout: float):
    """The strategy of ``spec`` and, for parameter servers, its ClusterCoordinator: the source
    from ``suite.common.strategies`` executed here (the repro snippets print the same source),
    with the coordination service's heartbeats given time (``_patient_heartbeats``)."""
    namespace = {"tf": tf, "Unavailable": EngineUnavailableHere}
    code = compile(strategy_source(spec, collective_timeout), f"<strategy of {spec.text}>", "exec")
    with _patient_heartbeats():
        exec(code, namespace)
    return namespace["strategy"], namespace.get("coordinator")


_SERVERS: list = []  # keeps this process's tf.distribute.Server alive


def start_server() -> ServerInfo:
    """Start the tf.distribute.Server of this process's TF_CONFIG task (a parameter-server
    cluster's worker or ps); it serves until the process exits."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol="grpc", start=True)
    _SERVERS.append(server)
    return ServerInfo(f"{resolver.task_type} {resolver.task_id}", os.getpid(), server.target, tf.__version__)


class EngineContext:
    """What a probe gets: the strategy, its spec, this worker's place, a cache that keeps
    models and traced functions alive across calls, and per-probe trace counters."""

    def __init__(self, spec: Spec, worker_index: int, collective_timeout: float):
        self.spec = spec
        self.worker_index = worker_index
        self.strategy, self.coordinator = build_strategy(spec, collective_timeout)
        self.num_replicas = self.strategy.num_replicas_in_sync
        local = self.num_replicas // max(spec.workers if spec.synchronous else 1, 1)
        self.local_replica_ids = list(range(worker_index * local, (worker_index + 1) * local))
        self.cache: dict = {}
        self.traces: collections.Counter = collections.Counter()
        self.restart_requested = False
        self.progress_sink = None  # set by the worker for each call: sends a progress message to the parent

    def progress(self, text: str) -> None:
        """Tell the parent where the running call is (``text``, e.g. "mirrored:2: step 2 of 3"); the
        parent shows it when the call runs long (suite/harness/pool/pool.py, Engine.on_progress)."""
        if self.progress_sink is not None:
            self.progress_sink(text)

    def request_restart(self):
        """Ask the pool to replace this engine after the current call. A probe that caught a
        TensorFlow runtime error calls this: in a multi-worker cluster a failed collective
        aborts every later one ("Restart your program to reset"); elsewhere it is ignored."""
        if self.spec.is_multi_worker:
            self.restart_requested = True

    def replace_after(self):
        """Ask the pool to replace this engine after the current call, whatever the spec: a run that left
        TensorFlow holding memory of its model's size, which no later run gets back (Snapshots.REPLACE_AFTER)."""
        self.restart_requested = True

    def cached(self, key, factory):
        """Return ``cache[key]``, building it with ``factory()`` on first use."""
        if key not in self.cache:
            self.cache[key] = factory()
        return self.cache[key]

    def info(self) -> EngineInfo:
        return EngineInfo(
            spec=self.spec.text, worker_index=self.worker_index, pid=os.getpid(), tf_version=tf.__version__,
            keras_version=compat.KERAS_VERSION, keras_generation=compat.KERAS_GENERATION,
            num_replicas_in_sync=self.num_replicas, local_replica_ids=self.local_replica_ids,
            strategy=type(self.strategy).__name__, cross_device_ops=compat.cross_device_ops_name(self.strategy),
            tf_config=json.loads(os.environ.get("TF_CONFIG", "null")), tmpdir=tempfile.gettempdir(),
            heartbeat_timeout_ms=_heartbeat_timeout_ms())


def _heartbeat_timeout_ms() -> int | None:
    """The heartbeat timeout of the coordination service this process joined (None: none)."""
    from tensorflow.python.eager import context as eager_context  # private: the one way in

    config = eager_context.context().coordination_service
    return config.heartbeat_timeout_in_ms if config is not None and config.service_type else None


def build_context(spec: Spec, worker_index: int, collective_timeout: float) -> EngineContext:
    return EngineContext(spec, worker_index, collective_timeout)
