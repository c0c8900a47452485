"""How a strategy is built from a spec, written once as Python source (no TensorFlow here).

``strategy_source(spec)`` is the code that configures the devices and binds ``strategy`` (and,
for parameter servers, ``coordinator``) given ``tf`` and an exception class ``Unavailable`` (the
spec's hardware is missing). An engine executes it (suite/engine/context.py) and a failure's
repro snippet prints it (suite/harness/judging/repro.py), so the snippet builds exactly what the engine
ran.
"""

from __future__ import annotations

from .specs import Spec, parse_spec

_CPUS = """\
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * {n})
"""
_DEVICES = 'devices = [f"/job:localhost/replica:0/task:0/device:CPU:{{i}}" for i in range({n})]\n'

# A private hook: without GPUs CollectiveAllReduceExtended._initialize_local_devices always
# returns the one device <worker>/device:CPU:0 (collective_all_reduce_strategy.py, TF 2.15 and
# 2.21 alike). The wrapper returns CPU:0..R-1 instead; the collective group then has W x R
# members, and everything downstream (input workers, all-reduce) follows the device list.
_WORKER_CPUS = """\
from tensorflow.python.distribute import collective_all_reduce_strategy as cars

_local_devices = cars.CollectiveAllReduceExtended._initialize_local_devices


def _with_cpus(self, cluster_resolver, worker_device):
    devices, device_type = _local_devices(self, cluster_resolver, worker_device)
    if device_type == "CPU":
        devices = tuple(f"{{worker_device}}/device:CPU:{{i}}" for i in range({n}))
    return devices, device_type


cars.CollectiveAllReduceExtended._initialize_local_devices = _with_cpus
"""

_TPU = """\
try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
except Exception as exc:  # no TPU: TF raises ValueError/NotFoundError
    raise Unavailable(f"no TPU found ({type(exc).__name__})") from exc
strategy = tf.distribute.TPUStrategy(resolver)
"""


# How long the coordination service of a cluster waits for a task's heartbeat before it aborts
# every collective (engines set it when they build a strategy: suite/engine/context.py).
# TensorFlow's default, 10 s, is for machines that never pause a process that long; here a
# cluster's workers share 2 cores with the rest of a test session, and a task starved for 10 s
# was declared failed ("Task /job:worker/replica:0/task:0 heartbeat timeout", TF 2.15, a
# fresh-clone .ci/run). A worker that dies is still seen at once (the pool watches its process),
# one that hangs by the collective timeout.
HEARTBEAT_TIMEOUT_MS = 120_000


def strategy_source(spec: Spec, collective_timeout: float | None = None) -> str:
    """Source that builds ``spec``'s strategy in a fresh process (one copy per task, with its
    TF_CONFIG, for clusters). ``collective_timeout`` bounds a multi-worker collective."""
    if spec.kind == "cluster":
        return strategy_source(parse_spec(spec.cluster["engine_spec"]), collective_timeout)
    if spec.kind == "default":
        return "strategy = tf.distribute.get_strategy()\n"
    if spec.kind == "one_device":
        return 'strategy = tf.distribute.OneDeviceStrategy("/cpu:0")\n'
    if spec.kind == "tpu":
        return _TPU
    if spec.kind == "mirrored" and spec.gpus:
        return ('if not tf.config.list_physical_devices("GPU"):\n'
                '    raise Unavailable("mirrored:gpus needs GPUs and TensorFlow sees none")\n'
                "strategy = tf.distribute.MirroredStrategy()\n")
    cpus = _CPUS.format(n=spec.devices) if spec.devices > 1 else ""
    if spec.kind == "mirrored":
        ops = "tf.distribute.ReductionToOneDevice()" if spec.cross_device_ops == "reduce_to_one" else "None"
        return (cpus + _DEVICES.format(n=spec.devices)
                + f"strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops={ops})\n")
    if spec.kind == "central_storage":
        return cpus + _DEVICES.format(n=spec.devices) + (
            'strategy = tf.distribute.experimental.CentralStorageStrategy(compute_devices=devices, '
            'parameter_device="/cpu:0")\n')
    if spec.kind == "parameter_server":
        return ("# run in the chief (the coordinator); every worker and ps task runs a tf.distribute.Server\n"
                "resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()\n"
                "strategy = tf.distribute.ParameterServerStrategy(resolver)\n"
                "coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)\n")
    if spec.kind == "multi_worker":
        impl = f"tf.distribute.experimental.CommunicationImplementation.{spec.communication.upper()}"
        timeout = f", timeout_seconds={collective_timeout!r}" if collective_timeout else ""
        return ("# run one copy per worker, each with its TF_CONFIG (see suite/harness/pool/topology.py)\n"
                + (cpus + _WORKER_CPUS.format(n=spec.devices) if spec.devices > 1 else "")
                + f"options = tf.distribute.experimental.CommunicationOptions(implementation={impl}{timeout})\n"
                "strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)\n")
    raise ValueError(f"no strategy source for spec kind {spec.kind!r}")
