"""Runnable plain-TensorFlow snippets that reproduce a failing case (attached to failures)."""

from __future__ import annotations

import numpy as np

from suite.specs import Spec


def strategy_lines(spec: Spec) -> str:
    """Code that builds the strategy of ``spec`` in a fresh process."""
    head = "import numpy as np\nimport tensorflow as tf\n"
    if spec.kind == "default":
        return head + "strategy = tf.distribute.get_strategy()\n"
    if spec.kind == "one_device":
        return head + 'strategy = tf.distribute.OneDeviceStrategy("/cpu:0")\n'
    if spec.kind == "multi_worker":
        return head + ("# run one copy per worker with TF_CONFIG set (see suite/engine/cluster.py)\n"
                       "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n")
    n = spec.devices
    lines = head + ('cpu = tf.config.list_physical_devices("CPU")[0]\n'
                    f"tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * {n})\n"
                    f'devices = [f"/cpu:{{i}}" for i in range({n})]\n')
    if spec.kind == "central_storage":
        return lines + ('strategy = tf.distribute.experimental.CentralStorageStrategy(devices, '
                        'parameter_device="/cpu:0")\n')
    ops = "tf.distribute.ReductionToOneDevice()" if spec.cross_device_ops == "reduce_to_one" else "None"
    return lines + f"strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops={ops})\n"


def array(name: str, value) -> str:
    a = np.asarray(value)
    return f"{name} = np.array({a.tolist()!r}, dtype=np.{a.dtype.name})\n"


SLICE = """\
def my_slice(*tensors):
    rid = tf.distribute.get_replica_context().replica_id_in_sync_group
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [t[offsets[rid]:offsets[rid + 1]] for t in tensors]
"""


def snippet(spec: Spec, arrays: dict, body: str) -> str:
    """Strategy set-up, the case's arrays, the slicing helper and a body using them."""
    return strategy_lines(spec) + "".join(array(k, v) for k, v in arrays.items()) + SLICE + body
