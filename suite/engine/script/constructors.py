"""The strategies a script builds (docs/check.md, "A training script"): the constructors replaced
for the run, so that the script gets the spec's strategy or, for the reference, a ``Reference`` (one
device's, telling the spec's ``num_replicas_in_sync``); ``get_strategy()`` and the device configuration
calls the script makes."""

from __future__ import annotations

import os
import sys

import tensorflow as tf

from .errors import Unsupported, WrongKind
from .isolation import _ABSENT

# the strategy names a script may build, by the attribute path under ``tf.distribute``
CONSTRUCTORS = ("MirroredStrategy", "OneDeviceStrategy", "MultiWorkerMirroredStrategy",
                "experimental.CentralStorageStrategy", "experimental.MultiWorkerMirroredStrategy")


# what a parameter-server script builds, under ``tf.distribute``: its strategy (the spec's where the spec is a
# parameter-server cluster's, or the reference's one device) and its ClusterCoordinator (_Coordinator)
COORDINATED = ("ParameterServerStrategy", "experimental.ParameterServerStrategy")


COORDINATORS = ("coordinator.ClusterCoordinator", "experimental.coordinator.ClusterCoordinator")


# configuration calls that raise once the engine has set its devices up: recorded and skipped
DEVICE_CONFIG = ("config.set_logical_device_configuration", "config.experimental.set_virtual_device_configuration",
                 "config.set_visible_devices", "config.experimental.set_visible_devices")


def _attr(root, dotted: str):
    obj = root
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


class _Server:
    """What ``tf.distribute.Server`` gives a script under the check: the spec's cluster runs already
    (the tutorial's in-process cluster is not started); serving (``join``) is not the coordinator's
    code, the only code the check runs."""

    target = "grpc://localhost:0"
    server_def = None

    def start(self):
        pass

    def join(self):
        raise Unsupported("it serves as a worker or ps task (tf.distribute.Server.join): under the check only the "
                          "coordinator's code runs, on the spec's cluster; run it as the chief (TF_CONFIG's task) "
                          "or build the cluster in process, as TensorFlow's tutorial does")


def _stand_in_class(real, name: str, construct):
    """A subclass of ``real`` (known to the script as ``name``) whose construction returns
    ``construct(name, args, kwargs)`` and for which ``isinstance``/``issubclass`` answer as for ``real``."""
    def call(cls, *args, **kwargs):
        return construct(name, args, kwargs)

    meta = type(f"_{real.__name__}Meta", (type(real),), {
        "__call__": call,
        "__instancecheck__": lambda cls, obj: isinstance(obj, real),
        "__subclasscheck__": lambda cls, sub: issubclass(sub, real)})
    return meta(real.__name__, (real,), {"__module__": real.__module__, "__doc__": real.__doc__,
                                         "__qualname__": real.__qualname__})


class Reference:
    """The reference's strategy as the script sees it: one device's (``real``), with the spec's
    ``num_replicas_in_sync``; everything else is the real strategy's, so TensorFlow and Keras
    inside see one device. Each read of the replica count from the script's code is kept."""

    def __init__(self, real, replicas: int, watcher, cluster_resolver=None):
        self._real, self._replicas, self._watcher = real, replicas, watcher
        self._cluster_resolver = cluster_resolver

    @property
    def cluster_resolver(self):
        """For a multi-worker spec's reference, a resolver of the TF_CONFIG the run was given (the
        spec's cluster, this process its chief), as the spec's strategy answers; otherwise one device's."""
        return self._cluster_resolver or self._real.cluster_resolver

    @property
    def num_replicas_in_sync(self) -> int:
        """The spec's count; inside the replica function (in ``run``) one device's, as
        ``get_replica_context().num_replicas_in_sync`` answers there."""
        inside = self._watcher.in_replica_function()
        self._watcher.read_replicas(sys._getframe(1), inside)
        return self._real.num_replicas_in_sync if inside else self._replicas

    def __getattr__(self, name):
        return getattr(self._real, name)


class ConstructorsWatch:
    """The watcher's part that answers the script's strategy constructors and ``get_strategy``."""

    def construct(self, name: str, args, kwargs):
        coordinated = name in [c.rpartition(".")[2] for c in COORDINATED]
        if coordinated != self.coordinated:
            raise WrongKind(f"it builds a {name}")
        shown = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
        self.constructed.append([name, shown[:200]])
        if self.tf_config_built is _ABSENT:
            self.tf_config_built = os.environ.get("TF_CONFIG")
        if coordinated and (kwargs.get("variable_partitioner") or (args[1:2] or [None])[0]) is not None:
            self.partitioner = kwargs.get("variable_partitioner") or args[1]
            if self._coordinator_args[0] is not None:  # the spec's strategy shards as the script's would (private)
                self._patch(self.real.extended, "_variable_partitioner", self.partitioner)
        return self.shown

    def _get_strategy(self, real_get_strategy):
        """``tf.distribute.get_strategy()`` called by the script outside any scope, where it builds no
        strategy of its own: the checked strategy (the script runs on the default strategy's API)."""
        def get_strategy():
            if (not tf.distribute.has_strategy() and self._called_by_user(sys._getframe(1))
                    and all(name == "get_strategy" for name, _ in self.constructed)):
                if not self.constructed:
                    self.constructed.append(["get_strategy", ""])
                return self.shown
            return real_get_strategy()
        return get_strategy

    def _skipped(self, dotted):
        def skipped(*args, **kwargs):
            self.device_config.append(f"tf.{dotted}")
        return skipped
