"""A user's training script run unchanged in an engine (engine side): the script's strategy
constructors give the spec's strategy, its distributed datasets mark the step boundaries, and
every variable it creates is recorded, so that suite/engine/probes/script.py can report the run
as a workload run is reported.

How a run is watched (docs/check.md, "A training script"):

* **Strategies.** ``tf.distribute.MirroredStrategy``, ``OneDeviceStrategy``,
  ``MultiWorkerMirroredStrategy`` and ``experimental.CentralStorageStrategy`` (and their
  ``experimental`` names; ``get_strategy()`` called by the script outside a scope where it builds
  none) are replaced, for the run, by subclasses of the real classes whose
  construction returns the strategy the run checks: the spec's own, or for the reference a
  ``Reference``: one device's strategy that tells the script the spec's ``num_replicas_in_sync``
  (so it computes the same global batch) and forwards everything else. ``isinstance`` with the
  replaced names still answers for the real classes. The arguments the script passed are kept
  for the report.
* **Parameter servers.** A script that builds a ``ParameterServerStrategy`` gets the spec's (on a
  parameter-server spec's cluster) or the reference's, and its ``ClusterCoordinator`` is a
  ``_Coordinator``: each ``schedule`` is a step, joined before it returns; the reference runs each
  closure at once on the iterator of the worker the spec's run recorded for it. A script of the
  other kind than the run's spec raises ``WrongKind`` at its constructor.
* **Step boundaries.** What the checked strategy's ``experimental_distribute_dataset`` and
  ``distribute_datasets_from_function`` return is marked; each element drawn eagerly from it
  (``for``, ``next``, ``get_next``) ends the step before it. A script that draws no element
  eagerly but hands an iterator to a ``tf.function`` that calls ``strategy.run`` (``next(iterator)``
  inside it, as TensorFlow's multi-worker tutorial does) is stepped by its calls instead: each call
  of such a function from the script's code is one step, and the first step's boundary is read
  when that function's trace reaches ``strategy.run`` (lifted out of the trace). The run stops, by
  raising ``Stop``, at the boundary after the last compared step.
* **Variables.** A variable creator scope around the run, and one inside the checked strategy's
  ``scope()`` (so that a distributed variable is recorded whole, not its per-device parts),
  record every variable in creation order; at each boundary every one is read on every local
  replica.
* **Reported values.** ``strategy.reduce`` records what it returned (and each replica's value
  it reduced) in every step, eagerly or, inside a ``tf.function``, through a ``py_function``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import multiprocessing
import multiprocessing.util
import os
import runpy
import shutil
import sys
import tempfile
import threading
import zlib

import numpy as np
import tensorflow as tf

from ..common.results import example_digests
from ..common.source import evaluate_follows
from . import compat

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


class ScriptError(Exception):
    """The script cannot be checked (it does not import, builds no strategy, draws no distributed
    dataset); the message is one line naming the script."""


class Unsupported(BaseException):
    """The script does what the check cannot run (serves as a cluster's task); a BaseException,
    so that the script's ``except Exception`` does not take it for its own error."""


class WrongKind(Unsupported):
    """A parameter-server script (it builds a ParameterServerStrategy or a ClusterCoordinator) run
    for a synchronous spec, or a synchronous one for a parameter-server spec (the harness knows
    the script's kind from the spec's)."""


class Stop(BaseException):
    """Raised at the boundary after the last compared step (a BaseException: a script's
    ``except Exception`` does not catch it)."""


@dataclasses.dataclass
class Boundary:
    """What was read at a step boundary: every recorded variable's local copies (by its place in
    creation order) and what ``reduce`` gave since the previous boundary."""

    values: dict  # creation index -> [each local replica's copy]
    reduced: list  # [(op name, reduced value, [each replica's value])] in call order
    rows: list | None  # each local replica's examples in the element drawn for this step
    local_reads: list = dataclasses.field(default_factory=list)  # [[each replica's value]] the script read by hand
    read_sites: list = dataclasses.field(default_factory=list)  # "file:line" of each of local_reads' calls
    examples: list | None = None  # per local replica, the digests of its examples in this step (example_digests)


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


class _LocalResults(tuple):
    """What ``experimental_local_results`` gives the script's code: its tuple, telling ``on_index`` each
    integer index the script reads of it (``[0]``: replica 0's value). Built again from items alone (as
    ``tf.nest`` rebuilds a sequence), it tells nothing."""

    def __new__(cls, items=(), on_index=None):
        made = super().__new__(cls, items)
        made._on_index = on_index
        return made

    def __getitem__(self, i):
        if isinstance(i, int) and self._on_index is not None:
            self._on_index(i)
        return tuple.__getitem__(self, i)


class _Coordinator:
    """The ClusterCoordinator a parameter-server script builds, as the check runs it: each
    ``schedule`` is one step, joined before it returns (one valid order of the asynchronous
    updates, the same on both sides), with a boundary before the first and after each; the
    closure's output is the step's reported value. ``_Scheduled`` runs on the spec's cluster,
    ``_Local`` in the reference."""

    def __init__(self, watcher, strategy):
        self._watcher, self.strategy = watcher, strategy

    def schedule(self, fn, args=None, kwargs=None):
        w = self._watcher
        if not w.boundaries:
            w.boundary()
        out, fetched = self._schedule(fn, tuple(args or ()), dict(kwargs or {}))
        w.drawn += 1
        w.scheduled(fetched)
        w.boundary()
        return out

    def join(self):
        pass

    def done(self):
        return True


class _Scheduled(_Coordinator):
    """On the spec's cluster: the engine's ClusterCoordinator, joined after each schedule; the
    worker that ran each closure is kept (``Watcher.closure_workers``) for the reference to replay."""

    def __init__(self, watcher, strategy, real):
        super().__init__(watcher, strategy)
        self._real = real

    def _schedule(self, fn, args, kwargs):
        w = self._watcher
        start = len(w.executed)
        remote = self._real.schedule(fn, args=args, kwargs=kwargs)
        self._real.join()
        ran = w.executed[start:]
        w.closure_workers.append(ran[-1] if ran else None)
        return remote, remote.fetch()

    def join(self):
        self._real.join()

    def done(self):
        return self._real.done()

    def fetch(self, val):
        return self._real.fetch(val)

    def create_per_worker_dataset(self, dataset_fn):
        return self._real.create_per_worker_dataset(dataset_fn)

    def __getattr__(self, name):
        return getattr(self._real, name)


class _PerWorker:
    """The reference's per-worker datasets or iterators: one per worker of the spec."""

    def __init__(self, items):
        self.items = list(items)

    def __iter__(self):
        return _PerWorker(iter(item) for item in self.items)

    def __next__(self):
        raise TypeError("next() of a per-worker iterator: pass it to ClusterCoordinator.schedule, whose closure gets "
                        "its worker's iterator")


class _Remote:
    """A closure's output in the reference (``fetch``, ``get``: its values)."""

    def __init__(self, values):
        self._values = values

    def fetch(self):
        return tf.nest.map_structure(_numpy, self._values)

    get = fetch


def _first_batch_rows(x, batch_size) -> int | None:
    """The rows of the first batch ``Model.fit`` draws from ``x``: a ``tf.data.Dataset``'s first
    element (a new iterator of its own, read before fit's), or arrays cut in ``batch_size`` (fit's
    default 32); None where neither tells (a generator, a distributed dataset)."""
    try:
        if isinstance(x, tf.data.Dataset):
            first = tf.nest.flatten(next(iter(x)))[0]
            return int(first.shape[0])
        arrays = tf.nest.flatten(x)
        if arrays and hasattr(arrays[0], "shape") and len(arrays[0].shape):
            return min(int(batch_size or 32), int(arrays[0].shape[0]))
    except Exception:  # noqa: BLE001  (what cannot be read says nothing)
        return None
    return None


def _fit_steps(watcher):
    """A Keras callback (of the Keras the engine runs) whose batch events are the run's step boundaries."""

    class _FitSteps(compat.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if self.model not in watcher.fit_models:
                watcher.fit_models.append(self.model)
            if not watcher.boundaries:
                watcher.boundary()

        def on_train_batch_end(self, batch, logs=None):
            watcher.drawn += 1
            watcher.fitted(logs)
            if watcher.fit_step_rows:  # each local replica's examples of the batch (_fit_step)
                watcher._rows = [watcher.fit_step_rows[r] for r in sorted(watcher.fit_step_rows)]
                watcher.fit_step_rows = {}
            if watcher.fit_step_examples:
                watcher._examples = [watcher.fit_step_examples[r] for r in sorted(watcher.fit_step_examples)]
                watcher.fit_step_examples = {}
            try:
                watcher.boundary()
            except Stop:  # the last step compared: fit ends here, before its epoch's end (its validation, the
                # script's callbacks), and the script with it unless an evaluate follows (Watcher._fit)
                self.model.stop_training = True
                watcher.fit_done = True
                raise

    return _FitSteps()


def _fit_begins(watcher):
    """A Keras callback put before the script's own: a raise from the start of a batch (of an execution) on,
    a callback's of the script's included, is that batch's step (``Watcher.fit_begun``)."""

    class _FitBegins(compat.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            watcher.fit_begun = watcher.drawn + 1

    return _FitBegins()


def flat_metrics(metrics) -> list:
    """``metrics`` (a model's) with Keras 3's container of the compiled metrics (``CompileMetrics``,
    whose result is a dict) replaced by the metrics it holds (none before it is built)."""
    return [m for metric in metrics for m in (metric.metrics if type(metric).__name__ == "CompileMetrics" else [metric])]


def _total_and_count(metric) -> list | None:
    """The [total, count] variables of a metric whose state is those two (a Mean, a MeanMetricWrapper);
    None for another metric."""
    named = {getattr(v, "path", v.name).rsplit("/", 1)[-1].split(":")[0]: v for v in metric.variables}
    return [named["total"], named["count"]] if sorted(named) == ["count", "total"] else None


def mean_state(metric) -> list | None:
    """[total, count] of a metric whose state is those two variables (a Mean, a MeanMetricWrapper),
    each summed over replicas; None for another metric, or a state not readable here."""
    state = _total_and_count(metric)
    if state is None:
        return None
    try:
        return [float(np.sum(np.asarray(tf.convert_to_tensor(v), np.float64))) for v in state]
    except Exception:  # noqa: BLE001  (a state not readable here: none kept)
        return None


def replica_states(metric, strategy) -> list | None:
    """[per local replica, [total, count]] of a metric whose state is those two variables: each
    replica's own copy (a MirroredVariable's copies differ where each replica wrote its own, as Keras
    3.0-3.6 metric state does); None for another metric, one replica, or a state not readable here."""
    state = _total_and_count(metric)
    if state is None or strategy.num_replicas_in_sync < 2:
        return None
    try:
        copies = [compat.local_values(strategy, v) for v in state]
    except Exception:  # noqa: BLE001  (a state not readable here: none kept)
        return None
    return [[float(np.sum(np.asarray(t, np.float64))), float(np.sum(np.asarray(c, np.float64)))]
            for t, c in zip(*copies)]


def _evaluated(watcher):
    """A Keras callback that keeps the results of the evaluate it is given to (its ``on_test_end`` logs)."""

    def states(model) -> dict:
        return {m.name: state for m in flat_metrics(getattr(model, "metrics", [])) if (state := mean_state(m))}

    class _Evaluated(compat.keras.callbacks.Callback):
        """Its results; and each Mean-like metric's (total, count), zero at its start, after each batch
        (``evaluate_states``), whose changes are the increments a deviation's model of the state reads."""

        def on_test_begin(self, logs=None):  # (evaluate resets the metrics after this call: each starts at zero)
            for name in states(self.model):
                watcher.evaluate_states[name] = [[0.0, 0.0]]

        def on_test_batch_end(self, batch, logs=None):
            for name, state in states(self.model).items():
                watcher.evaluate_states.setdefault(name, []).append(state)

        def on_test_end(self, logs=None):
            for name, state in states(self.model).items():  # after the last execution, whose batch end may not come
                kept = watcher.evaluate_states.setdefault(name, [[0.0, 0.0]])
                if kept[-1] != state:
                    kept.append(state)
            strategy = getattr(self.model, "distribute_strategy", None) or tf.distribute.get_strategy()
            for m in flat_metrics(getattr(self.model, "metrics", [])):  # each replica's own copy, where they differ
                if copies := replica_states(m, strategy):
                    watcher.evaluate_copies[m.name] = copies
            for key, value in (logs or {}).items():
                with contextlib.suppress(Exception):  # a result of no single number: not kept
                    watcher.evaluated[key] = float(np.asarray(value, np.float64).reshape(()))

    return _Evaluated()


def _numpy(value):
    return value.numpy() if hasattr(value, "numpy") else value


class _Local(_Coordinator):
    """In the reference: each closure runs here, at once, on the iterator of the worker the spec's
    run gave it (``order``; round robin where none is given: the first reference runs)."""

    def __init__(self, watcher, strategy, workers: int, order=None):
        super().__init__(watcher, strategy)
        self._workers, self._order = max(workers, 1), list(order or [])

    def _schedule(self, fn, args, kwargs):
        w = self._watcher
        k = len(w.closure_workers)
        worker = self._order[k] if k < len(self._order) and self._order[k] is not None else k % self._workers
        w.closure_workers.append(worker)

        def on(value):
            return value.items[worker] if isinstance(value, _PerWorker) else value

        out = fn(*[on(a) for a in args], **{key: on(v) for key, v in kwargs.items()})
        return _Remote(out), tf.nest.map_structure(_numpy, out)

    def fetch(self, val):
        return tf.nest.map_structure(lambda v: v.fetch() if isinstance(v, _Remote) else _numpy(v), val)

    def create_per_worker_dataset(self, dataset_fn):
        """Each worker's dataset: the function's (its Python function: traced, the reference's one
        device could not return a distributed dataset), called once per worker, or the dataset given."""
        if callable(dataset_fn) and not isinstance(dataset_fn, tf.data.Dataset):
            make = getattr(dataset_fn, "python_function", dataset_fn)
            return _PerWorker(make() for _ in range(self._workers))
        return _PerWorker([dataset_fn] * self._workers)


class Watcher:
    """One run of a script: what it built, drew and created (see the module's docstring)."""

    def __init__(self, strategy, steps: int, folder: str, reference_replicas: int | None = None,
                 cluster_resolver=None, coordinated: bool = False, coordinator=None, workers: int = 1, order=None,
                 late_init=None):
        self.real = strategy  # the strategy TensorFlow runs (the spec's, or the default strategy)
        self.steps = steps
        self.folder = os.path.realpath(folder)  # the script's folder: its frames are the user's code
        self.shown = (Reference(strategy, reference_replicas, self, cluster_resolver) if reference_replicas
                      else strategy)
        self.constructed: list = []  # [class name, repr of the arguments] per strategy the script built
        self.device_config: list = []  # the device configuration calls the script made (skipped)
        self.replica_reads: dict = {}  # "file:line" -> times the script read num_replicas_in_sync
        self.variables: list = []  # every variable, in creation order
        self._ids: set = set()
        self.boundaries: list = []  # of Boundary: [0] before the first step, [k] after step k
        self.drawn = 0  # steps begun: elements drawn from marked datasets, or calls of a step function
        # how steps are told apart: None until the first, then "draws" (eager draws) or "calls" (calls of a
        # tf.function that runs strategy.run, where the script draws inside it)
        self.mode = None
        self._step_functions: set = set()  # ids of the script's tf.functions whose trace called strategy.run
        self.on_first_boundary = None  # called at the first boundary (loading initial values)
        self.on_boundary = None  # called at each boundary, before it is read (finding the script's objects)
        self._reduced: list = []
        self._local_reads: list = []
        self._examples = None  # per local replica, the digests of its examples in the step (example_digests)
        self._read_sites: list = []  # "file:line" of each of _local_reads' experimental_local_results calls
        self.indexed: dict = {}  # "file:line" of an experimental_local_results call -> the index the script read of it
        self._rows = None
        self.undistributed: dict = {}  # "file:line" -> a batch passed to strategy.run that was not distributed
        self.runs = 0  # calls of strategy.run (a traced call counts once per trace)
        self.step_graphs: list = []  # the graphs strategy.run was traced in (the steps' tf.functions): random_ops reads them
        self.distributed = False  # whether the script distributed a dataset
        self.feature_shape = None  # per example, of the first element drawn (the stand-in control's data)
        self._unseeded: dict = {}  # id -> (dataset, "file:line"): what the script shuffled without a seed
        # a worker other than the first of a multi-worker spec: a process of its own, whose unseeded shuffles draw
        # another order than worker 0's (and the reference's), as separate processes' do
        self.worker = 0
        self.shuffled_before_sharding: dict = {}  # "file:line" of an unseeded shuffle -> where it was sharded after
        self._local = threading.local()
        self._marked: dict = {}  # id -> object: datasets and iterators whose draws are boundaries
        self._plain: dict = {}  # id -> iterator: of the script's own datasets (boundaries where none is distributed)
        self._patched: list = []  # (owner, attribute, previous value or _ABSENT)
        self._wrapped_types: set = set()
        # a parameter-server spec's run or its reference: the script must build a ParameterServerStrategy and
        # train through a ClusterCoordinator (_Coordinator), on the spec's (``coordinator``) or here, one closure
        # after another on the iterators of ``workers`` workers in ``order`` (the spec's run's)
        self.coordinated = coordinated
        self._coordinator_args = (coordinator, workers, order)
        self._coordinator = None
        self.executed: list = []  # the worker of each closure the spec's coordinator ran, in order
        self.closure_workers: list = []  # per step (schedule), the worker its closure ran on
        self.seeded_shuffles: dict = {}  # "file:line" -> the seed given to an unseeded shuffle (coordinated runs)
        self._scheduled_op = "SUM"  # the reduce op a scheduled function last traced
        self.partitioner = None  # the variable_partitioner the script gave its ParameterServerStrategy
        self.fit_logs: dict = {}  # the logs of fit's last batch, less its loss
        self.fit_models: list = []  # the models fit trains (their compiled optimizer and metrics are the run's)
        self.fit_rows: int | None = None  # the rows of the first batch the script's first fit trains on
        self.fit_step_rows: dict = {}  # replica id -> its examples in fit's last step (_fit_step)
        self.fit_step_examples: dict = {}  # replica id -> the digests of its examples in fit's last step (_fit_step)
        self.fit_done = False  # fit ended at the last step compared (an evaluate the script calls next may follow)
        self.fit_begun = 0  # the batch (execution) of fit that began last, counted as steps are
        # "file:line (Class)" of each fit of a model that trains with no strategy while the script has one (a model it
        # trains to compare with): not stepped, the training compared is the strategy's
        self.fits_skipped: list = []
        self.skipped_models: list = []  # the models of those fits: trained with no strategy, never the checked training
        self.evaluated: dict = {}  # the results of the script's evaluate after that fit (_evaluate)
        self.evaluate_states: dict = {}  # metric name -> its (total, count) at that evaluate's start and each batch
        self.evaluate_copies: dict = {}  # metric name -> at that evaluate's end, each local replica's copy (replica_states)
        self.tf_config_built = _ABSENT  # TF_CONFIG as the script built its first strategy (it may set it itself)
        # variables made after the first boundary: their values at creation (by id), [name, shape, value] of each in
        # creation order (the reference's are a spec's run's ``late_init``, taken by name and shape: _late)
        self.created_late: dict = {}
        self.late_values: list = []
        self.late_init = [list(entry) for entry in late_init or []]

    # -- the script's view ---------------------------------------------------------------------
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

    def coordinate(self, name: str, args, kwargs):
        """``ClusterCoordinator(strategy)``: one coordinator a run (as TensorFlow keeps one a strategy)."""
        if not self.coordinated:
            raise WrongKind("it builds a ClusterCoordinator")
        if self._coordinator is None:
            real, workers, order = self._coordinator_args
            self._coordinator = (_Scheduled(self, self.shown, real) if real is not None
                                 else _Local(self, self.shown, workers, order))
            self.mode = "schedules"
        return self._coordinator

    def scheduled(self, fetched) -> None:
        """A scheduled closure returned ``fetched``: a floating value is the step's reported one."""
        with contextlib.suppress(Exception):  # an output of no single floating value: none reported
            value = np.asarray(fetched)
            if value.dtype.kind == "f":
                self._reduced.append((self._scheduled_op, value, [value]))

    def read_replicas(self, frame, inside: bool = False) -> None:
        while frame is not None and not self._users(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is not None:
            where = f"{os.path.relpath(frame.f_code.co_filename, self.folder)}:{frame.f_lineno}"
            where += " (in the replica function)" if inside else ""
            self.replica_reads[where] = self.replica_reads.get(where, 0) + 1

    def in_replica_function(self) -> bool:
        """Whether this thread is inside the checked strategy's ``run`` (its replica function)."""
        return bool(getattr(self._local, "running", 0))

    def _users(self, filename: str) -> bool:
        """Whether ``filename`` is the script's code: in its folder, and not a library's installed there."""
        return (os.path.realpath(filename).startswith(self.folder + os.sep)
                and not any(part in filename for part in _LIBRARIES))

    def _called_by_user(self, frame) -> bool:
        """Whether ``frame`` (a wrapper's caller) is the script's code, called directly or through
        autograph's conversion of it inside a tf.function (TensorFlow's own calls are not the script's)."""
        while frame is not None and f"{os.sep}autograph{os.sep}" in frame.f_code.co_filename:
            frame = frame.f_back
        if frame is None:
            return False
        name = frame.f_code.co_filename
        if "__autograph_generated_file" in name:  # converted code runs in its module's namespace
            name = frame.f_globals.get("__file__") or name
        return self._users(name)

    def user_frames(self, frame=None) -> list:
        """The frames of the script's own code on the stack, innermost first."""
        frame = frame or sys._getframe(1)
        out = []
        while frame is not None:
            if self._users(frame.f_code.co_filename):
                out.append(frame)
            frame = frame.f_back
        return out

    # -- patching for the run --------------------------------------------------------------------
    def patch(self, owner, name, value):
        """Set ``owner.name`` until the run ends (inside ``installed()``)."""
        self._patch(owner, name, value)

    def _patch(self, owner, name, value):
        """Set ``owner.name`` for the run; a class's or an object's own attribute is put back as it
        was (or removed), a module's by value."""
        own = isinstance(owner, type) or not isinstance(owner, type(sys))
        previous = vars(owner).get(name, _ABSENT) if own else getattr(owner, name, _ABSENT)
        self._patched.append((owner, name, previous))
        setattr(owner, name, value)

    @contextlib.contextmanager
    def installed(self):
        """The stand-in constructors, the skipped device configuration, the wrapped strategy and
        the outer variable creator, for the duration of the run."""
        distribute = tf.distribute
        for names, construct in ((CONSTRUCTORS + COORDINATED, self.construct), (COORDINATORS, self.coordinate),
                                 (("Server",), lambda *_: _Server())):
            for dotted in names:
                real = _attr(distribute, dotted)
                if real is not None:
                    parent = _attr(distribute, dotted.rpartition(".")[0]) if "." in dotted else distribute
                    name = dotted.rpartition(".")[2]
                    self._patch(parent, name, _stand_in_class(real, name, construct))
        self._patch(distribute, "get_strategy", self._get_strategy(distribute.get_strategy))
        if self._coordinator_args[0] is not None:  # which worker runs each closure (private: the one way in)
            from tensorflow.python.distribute.coordinator import cluster_coordinator

            closure = cluster_coordinator.Closure
            execute_on = closure.execute_on

            def executed(closure_, worker):
                if type(closure_) is closure:  # not a per-worker resource's closure
                    self.executed.append(worker.worker_index)
                return execute_on(closure_, worker)

            self._patch(closure, "execute_on", executed)
        for dotted in DEVICE_CONFIG:
            if _attr(tf, dotted) is not None:
                parent = _attr(tf, dotted.rpartition(".")[0])
                self._patch(parent, dotted.rpartition(".")[2], self._skipped(dotted))
        target = self.shown
        for name, wrapper in (("scope", self._scope), ("reduce", self._reduce), ("run", self._run),
                              ("experimental_local_results", self._local_results),
                              ("experimental_distribute_dataset", self._distribute),
                              ("distribute_datasets_from_function", self._distribute)):
            # autograph must call the wrappers as they are (converted, they would see their own frames)
            self._patch(target, name, tf.autograph.experimental.do_not_convert(wrapper(getattr(self.real, name))))
        self._patch(tf.data.Dataset, "__iter__", self._plain_iter(tf.data.Dataset.__iter__))
        self._patch(tf.data.Dataset, "shuffle", self._shuffle(tf.data.Dataset.shuffle))
        self._patch(tf.data.Dataset, "shard", self._shard(tf.data.Dataset.shard))
        for model_class in {compat.keras.Model, tf.keras.Model}:
            self._patch(model_class, "fit", self._fit(model_class.fit))
            self._patch(model_class, "evaluate", self._evaluate(model_class.evaluate))
        function = type(tf.function(lambda: 0))
        self._patch(function, "__call__", self._function_call(function.__call__))
        try:
            with tf.variable_creator_scope(self._outer):
                yield self
        finally:
            for owner, name, previous in reversed(self._patched):
                if previous is _ABSENT:
                    with contextlib.suppress(AttributeError):
                        delattr(owner, name)
                else:
                    setattr(owner, name, previous)
            self._patched.clear()
            self._marked.clear()

    def _fit(self, real_fit):
        """``Model.fit`` for the run: called by the script's code, it gets a callback of the watcher's
        (``_FitSteps``): a boundary before its first batch and at the end of each (of each execution,
        with ``steps_per_execution``), where its logs are read. After the last step compared fit ends at
        once (no epoch end, validation or callback of the script's runs), and so does the run, unless the
        script's next statement calls ``evaluate`` (``evaluate_follows``), which ends it then."""
        watcher = self

        def fit(model, *args, **kwargs):
            caller, done_before = sys._getframe(1), watcher.fit_done
            try:
                return fitted(caller, model, *args, **kwargs)
            except Stop:  # this fit's last step compared: an evaluate the script calls next may run
                if not done_before and watcher.fit_done and evaluate_follows(caller.f_code.co_filename, caller.f_lineno):
                    return getattr(model, "history", None)
                raise

        def fitted(caller, model, *args, **kwargs):
            if not watcher._called_by_user(caller) or watcher.mode not in (None, "fit"):
                return real_fit(model, *args, **kwargs)
            if watcher.fit_done:  # a second fit after the steps compared: the run ends here
                raise Stop
            if watcher.mode is None and not watcher._under_the_strategy(model):
                # a model the script trains with no strategy (made outside every strategy's scope) beside the one it
                # distributes: that training is not the strategy's, and is not compared
                watcher.fits_skipped.append(f"{watcher._where(caller)} ({type(model).__name__})")
                watcher.skipped_models.append(model)
                return real_fit(model, *args, **kwargs)
            watcher.mode = "fit"
            if model not in watcher.fit_models:  # known before its first batch, where fit may raise
                watcher.fit_models.append(model)
            if watcher.fit_rows is None:
                watcher.fit_rows = _first_batch_rows(args[0] if args else kwargs.get("x"),
                                                     args[2] if len(args) > 2 else kwargs.get("batch_size"))
            if "train_step" not in vars(model):  # (once a model)
                watcher._patch(model, "train_step", watcher._fit_step(model.train_step))
            args = list(args)
            if len(args) > 5:  # fit(x, y, batch_size, epochs, verbose, callbacks, ...)
                args[5] = [_fit_begins(watcher), *(args[5] or []), _fit_steps(watcher)]
            else:
                kwargs["callbacks"] = [_fit_begins(watcher), *(kwargs.get("callbacks") or []), _fit_steps(watcher)]
            return real_fit(model, *args, **kwargs)
        return fit

    def _under_the_strategy(self, model) -> bool:
        """Whether ``model`` trains under the run's strategy: Keras' ``distribute_strategy`` (the strategy
        whose scope it was made in, else the current one: the default strategy outside every scope) is it.
        Under the default spec's run and a reference with no strategy every model does."""
        with self._quiet():
            strategy = getattr(model, "distribute_strategy", None)
        return strategy is None or strategy is self.real

    def _evaluate(self, real_evaluate):
        """``Model.evaluate`` for the run: the script's first call after its fit ended at the last step
        compared runs on at most as many batches as steps are compared, its results (the logs of its
        ``on_test_end``) are kept (``evaluated``), and the run ends there. Any other call (before fit,
        fit's own validation) runs as it is."""
        watcher = self

        def evaluate(model, *args, **kwargs):
            if not watcher._called_by_user(sys._getframe(1)) or not watcher.fit_done:
                return real_evaluate(model, *args, **kwargs)
            args = list(args)
            x = args[0] if args else kwargs.get("x")
            steps = args[5] if len(args) > 5 else kwargs.get("steps")
            if isinstance(x, tf.data.Dataset) and steps is None:
                # its first batches by the dataset's own take: Keras 3.6's evaluate(steps=N) under MirroredStrategy
                # evaluates other batches than one device's (measured: a batch skipped), where take does not
                x = x.take(watcher.steps)
                if args:
                    args[0] = x
                else:
                    kwargs["x"] = x
            elif len(args) > 5:  # evaluate(x, y, batch_size, verbose, sample_weight, steps, callbacks, ...)
                args[5] = min(args[5] or watcher.steps, watcher.steps)
            else:
                kwargs["steps"] = min(kwargs.get("steps") or watcher.steps, watcher.steps)
            kept = _evaluated(watcher)
            if len(args) > 6:
                args[6] = [*(args[6] or []), kept]
            else:
                kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), kept]
            real_evaluate(model, *args, **kwargs)
            raise Stop
        return evaluate

    def _fit_step(self, real_step):
        """A model's ``train_step`` while fit trains it: each replica's examples of the step it runs, kept
        (``fit_step_rows``, by replica id) for the boundary at the end of its batch (of its execution:
        the last step's, with steps_per_execution)."""
        watcher = self

        @tf.autograph.experimental.do_not_convert
        def rows_of(data):
            with contextlib.suppress(Exception):  # a batch of no tensor with an example axis: no rows kept
                leaf = next(t for t in tf.nest.flatten(data) if isinstance(t, tf.Tensor) and t.shape.rank)
                context = tf.distribute.get_replica_context()
                replica = context.replica_id_in_sync_group if context is not None else 0

                numeric = [t for t in tf.nest.flatten(data) if isinstance(t, tf.Tensor) and (
                    t.dtype.is_floating or t.dtype.is_integer or t.dtype.is_bool)]

                def keep(r, rows, *parts):
                    watcher.fit_step_rows[int(r)] = int(rows)
                    watcher.fit_step_examples[int(r)] = example_digests([[np.asarray(p) for p in parts]])[0]
                    return 0

                if tf.executing_eagerly():
                    keep(replica, tf.shape(leaf)[0], *numeric)
                elif not watcher.remote():
                    tf.py_function(keep, [replica, tf.shape(leaf)[0], *numeric], [tf.int32])

        def train_step(data):
            rows_of(data)
            return real_step(data)
        return train_step

    def fitted(self, logs) -> None:
        """The logs of a batch of ``fit`` that ended: its loss is the step's reported value (Keras'
        running mean over the epoch), the others are kept as metrics (``fit_logs``)."""
        values = {}
        for key, value in (logs or {}).items():
            with contextlib.suppress(Exception):  # a log of no single number: not kept
                values[key] = float(np.asarray(value, np.float64).reshape(()))
        if "loss" in values:
            loss = np.asarray(values.pop("loss"))
            self._reduced.append(("FIT", loss, [loss]))
        self.fit_logs = values

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

    # -- variables -------------------------------------------------------------------------------
    def _add(self, v, late=None) -> None:
        if id(v) not in self._ids:
            self._ids.add(id(v))
            self.variables.append(v)
            if late is not None:  # made in the first step (a model built by its first call), from this value
                self.created_late[id(v)] = late[2]
                self.late_values.append(late)

    def _late(self, kwargs: dict):
        """A variable made after the first boundary (a model built by its first call in the step, in a
        trace, where its value cannot be read at its creation): its initial value computed here, at
        once, or the reference's of the first one made under the same name with the same shape
        (``late_init``), where one is left, so that both sides start it from the same value. The
        kwargs to make it with, and its [name, shape, value] (None: not one made late)."""
        if not self.boundaries or getattr(self._local, "inner", 0) or kwargs.get("initial_value") is None:
            return kwargs, None
        initial = kwargs["initial_value"]
        try:
            with tf.init_scope():
                value = np.array(tf.convert_to_tensor(initial() if callable(initial) else initial,
                                                      dtype=kwargs.get("dtype")))
        except Exception:  # noqa: BLE001  (a value only its trace can make, a checkpoint's: made as asked)
            return kwargs, None
        name = str(kwargs.get("name"))
        for entry in self.late_init:
            if entry[0] == name and list(entry[1]) == list(value.shape):
                self.late_init.remove(entry)
                value = np.asarray(entry[2])
                break
        return {**kwargs, "initial_value": value}, [name, list(value.shape), value]

    def _outer(self, next_creator, **kwargs):
        kwargs, late = self._late(kwargs)
        v = next_creator(**kwargs)
        if not getattr(self._local, "inner", 0):  # not a part of a distributed variable being made
            self._add(v, late)
        return v

    def _inner(self, next_creator, **kwargs):
        kwargs, late = self._late(kwargs)
        self._local.inner = getattr(self._local, "inner", 0) + 1
        try:
            v = next_creator(**kwargs)
        finally:
            self._local.inner -= 1
        if not self._local.inner:
            self._add(v, late)
        return v

    def _scope(self, real_scope):
        @contextlib.contextmanager
        def scope():
            with real_scope(), tf.variable_creator_scope(self._sharding), tf.variable_creator_scope(self._inner):
                yield
        return scope

    def _sharding(self, next_creator, **kwargs):
        """In the reference of a script whose ParameterServerStrategy has a ``variable_partitioner``,
        a variable made in its scope is sharded as that strategy shards it (a ``ShardedVariable`` of
        "div" parts, ``ParameterServerStrategyV2Extended._create_variable``), so that both sides hold
        the same variables; elsewhere, made as asked."""
        partitioner, initial_value = self.partitioner, kwargs.get("initial_value")
        if (partitioner is None or self._coordinator_args[0] is not None or "colocate_with" in kwargs
                or initial_value is None):
            return next_creator(**kwargs)
        from tensorflow.python.distribute import sharded_variable  # private: the class TensorFlow shards into

        shape, dtype = kwargs.get("shape"), kwargs.get("dtype")
        from_fn = callable(initial_value) and shape is not None and dtype is not None
        if not from_fn:
            initial_value = tf.convert_to_tensor(initial_value() if callable(initial_value) else initial_value,
                                                 dtype=dtype)
            shape, dtype = initial_value.shape, initial_value.dtype
            kwargs["initial_value"] = initial_value
        shape = tf.TensorShape(shape)
        parts = partitioner(shape=shape, dtype=tf.as_dtype(dtype)) if shape.rank else None
        if not parts or parts[0] <= 1:
            return next_creator(**kwargs)
        n = min(parts[0], shape[0])
        offsets = [0]
        for i in range(n):
            offsets.append(offsets[-1] + shape[0] // n + (1 if i < shape[0] % n else 0))

        def shard(i):
            if not from_fn:
                return initial_value[offsets[i]:offsets[i + 1]]
            part = (offsets[i + 1] - offsets[i], *shape[1:])
            try:
                value = initial_value(partition_shape=part, partition_offset=(offsets[i],) + (0,) * (shape.rank - 1))
            except (TypeError, ValueError):  # an initializer that takes no partition: the whole value, sliced
                value = initial_value()
            return value if tuple(value.shape) == part else value[offsets[i]:offsets[i + 1]]

        name, shards = kwargs.get("name"), []
        for i in range(n):
            kwargs["shape"] = (offsets[i + 1] - offsets[i], *shape[1:])
            kwargs["initial_value"] = functools.partial(shard, i)
            if name is not None:
                kwargs["name"] = f"{name}/part_{i}"
            shards.append(next_creator(**kwargs))
        return sharded_variable.ShardedVariable(shards)

    # -- reported values -------------------------------------------------------------------------
    def _reduce(self, real_reduce):
        def reduce(reduce_op, value, axis=None):
            out = real_reduce(reduce_op, value, axis=axis)
            if getattr(self._local, "quiet", False) or not self._called_by_user(sys._getframe(1)):
                return out  # the suite's own read (a metric's result at a boundary), or a library's
            op = getattr(reduce_op, "name", str(reduce_op)).rsplit(".", 1)[-1].upper()
            self._scheduled_op = op
            self._keep([out, *self._parts(value)], lambda values: self._reduced.append((op, values[0], values[1:])))
            return out
        return reduce

    def _parts(self, value) -> list:
        with self._quiet():
            try:
                return list(self.real.experimental_local_results(value))
            except Exception:  # noqa: BLE001  (not a distributed value: one part)
                return [value]

    def remote(self) -> bool:
        """Whether code traced now may run on a parameter-server cluster's worker, where no
        ``py_function`` can call back (in the reference too, so that both keep the same)."""
        return self.mode == "schedules" and not tf.executing_eagerly()

    def _keep(self, tensors, record) -> None:
        """``record([numpy values])`` of ``tensors`` now (eagerly) or when a traced function runs
        (not kept in a scheduled closure: ``remote``)."""
        if tf.executing_eagerly():
            record([np.array(t) for t in tensors])
            return
        if self.remote():
            return

        def keep(*values):
            record([np.array(v) for v in values])  # copies: py_function reuses its arrays once it returns
            return 0

        with contextlib.suppress(Exception):  # values py_function cannot carry: not kept
            tf.py_function(keep, list(tensors), [tf.int32])

    def _local_results(self, real_local_results):
        def experimental_local_results(value):
            out = real_local_results(value)
            if getattr(self._local, "quiet", False) or not self._called_by_user(sys._getframe(1)):
                return out
            site = self._where(sys._getframe(1))
            with contextlib.suppress(Exception):  # values that are not tensors: not kept
                tensors = [tf.convert_to_tensor(v) for v in out]
                if tensors and all(t.dtype.is_floating for t in tensors):
                    def kept(values):  # the lists of the step it runs in
                        self._local_reads.append(values)
                        self._read_sites.append(site)
                    self._keep(tensors, kept)
                    return _LocalResults(out, lambda i: self.indexed.setdefault(site, i))
            return out
        return experimental_local_results

    def _run(self, real_run):
        def run(fn, args=(), kwargs=None, options=None):
            self.runs += 1
            if not tf.executing_eagerly():  # traced: the graph it is traced in holds the step's ops
                graph = tf.compat.v1.get_default_graph()
                if not any(g is graph for g in self.step_graphs):
                    self.step_graphs.append(graph)
            calling = getattr(self._local, "calling", None)
            if calling is not None and not tf.executing_eagerly() and self.mode != "draws":
                self._traced_step(calling, args, kwargs)
            if self.real.num_replicas_in_sync > 1 and self._called_by_user(sys._getframe(1)):
                for leaf in tf.nest.flatten((args, kwargs or {})):
                    if isinstance(leaf, tf.Tensor) and leaf.shape.rank:
                        self.undistributed.setdefault(self._where(sys._getframe(1)), list(leaf.shape))
                        break
            self._local.running = getattr(self._local, "running", 0) + 1
            try:
                return real_run(fn, args=args, kwargs=kwargs, options=options)
            finally:
                self._local.running -= 1
        return run

    # -- step boundaries -------------------------------------------------------------------------
    def _function_call(self, original):
        """``__call__`` of ``tf.function``s for the run: a call from the script's code (not nested in
        another) of a function whose trace called ``strategy.run`` is a step where the script steps by
        calls (``_traced_step`` decides that in the first such trace)."""
        watcher = self

        def __call__(self_, *args, **kwargs):
            if (getattr(watcher._local, "calling", None) is not None or watcher.mode in ("draws", "schedules", "fit")
                    or not tf.executing_eagerly() or not watcher._called_by_user(sys._getframe(1))):
                return original(self_, *args, **kwargs)
            watcher._local.calling = id(self_)
            done = False
            try:
                out = original(self_, *args, **kwargs)
                done = True
            finally:
                watcher._local.calling = None
                if watcher.mode == "calls" and id(self_) in watcher._step_functions:
                    watcher.drawn += 1
            if done and watcher.mode == "calls" and id(self_) in watcher._step_functions:
                watcher.boundary()
            return out
        return __call__

    def _traced_step(self, function_id, args, kwargs) -> None:
        """``strategy.run`` traced inside a call of the script's ``tf.function`` ``function_id``: with no
        step drawn eagerly before, the script steps by calls of that function; the first step's
        boundary is read here, out of the trace (the variables as they are before its first run)."""
        if self.mode is None and not self.drawn:
            self.mode = "calls"
            with tf.init_scope():
                self.boundary()
        if self.mode != "calls":
            return
        self._step_functions.add(function_id)
        self._element_facts((args, kwargs or {}), static=True)

    def _element_facts(self, element, static: bool = False) -> None:
        """The features' shape (the first floating tensor with an example axis) and each local
        replica's examples of ``element``: now, or (``static``, inside a trace) when the step runs."""
        with contextlib.suppress(Exception), self._quiet():  # an optional, or an element of no tensors
            leaves = [parts for parts in map(self._parts, tf.nest.flatten(element))
                      if parts and all(isinstance(p, tf.Tensor) for p in parts)]
            if self.feature_shape is None:
                self.feature_shape = next((
                    [int(d) for d in t.shape[1:]] for t in (parts[0] for parts in leaves)
                    if t.dtype.is_floating and t.shape.rank and t.shape.rank >= 2 and None not in t.shape[1:]), None)
            parts = leaves[0]
            numeric = [leaf for leaf in leaves if leaf[0].dtype.is_floating or leaf[0].dtype.is_integer
                       or leaf[0].dtype.is_bool]
            flat = [leaf[r] for r in range(len(parts)) for leaf in numeric]

            def examples(values):  # per replica, its parts' values in the order of ``numeric``
                k = len(numeric)
                self._examples = example_digests([values[r * k:(r + 1) * k] for r in range(len(parts))])
            if not static:
                self._rows = [int(tf.shape(p)[0]) if p.shape.rank else 1 for p in parts]
                if numeric:
                    examples([np.asarray(t) for t in flat])
                return
            sizes = [tf.shape(p)[0] if p.shape.rank else tf.constant(1) for p in parts]
            self._keep(sizes, lambda values: setattr(self, "_rows", [int(v) for v in values]))
            if numeric:
                self._keep(flat, examples)

    def _where(self, frame) -> str:
        frames = self.user_frames(frame)
        return f"{os.path.relpath(frames[0].f_code.co_filename, self.folder)}:{frames[0].f_lineno}" if frames else "?"

    def _made_at(self, op) -> str:
        """The script's innermost line in ``op``'s traceback, or "?"."""
        try:
            frames = [f for f in op.traceback if self._users(f.filename)]
        except Exception:  # noqa: BLE001  (a traceback TensorFlow did not keep: no line, not an error)
            frames = []
        return f"{os.path.relpath(frames[-1].filename, self.folder)}:{frames[-1].lineno}" if frames else "?"

    def random_ops(self, pattern) -> list | None:
        """The random ops (types ``pattern`` matches) in the graphs strategy.run was traced in, and in the
        functions those graphs call, each with the script's line that made it (its innermost frame in the
        op's traceback, which autograph maps back to the script's source): ``"RngReadAndSkip at
        train.py:17"``. None where no step was traced (an eager step's draws leave no graph to read)."""
        if not self.step_graphs:
            return None
        found, seen, graphs = set(), set(), list(self.step_graphs)
        while graphs:
            graph = graphs.pop()
            if id(graph) in seen:
                continue
            seen.add(id(graph))
            for op in graph.get_operations():
                if pattern.fullmatch(op.type):
                    found.add(f"{op.type} at {self._made_at(op)}")
            # the functions the step calls (a tf.function of the script's inside it): private, read where it is
            for function in getattr(graph, "_functions", {}).values():
                inner = getattr(function, "graph", None)
                if inner is not None:
                    graphs.append(inner)
        return sorted(found)

    def accessed_in_steps(self) -> set | None:
        """The ids of the variables the graphs strategy.run was traced in read or wrote (each graph's
        watched variables, which TensorFlow propagates to the graphs that trace it), and of each one's
        per-device parts; None where no step was traced (an eager step) or this TensorFlow keeps no such
        record (private: read where it is)."""
        if not self.step_graphs or not all(hasattr(g, "_watched_variables") for g in self.step_graphs):
            return None
        found = set()
        for graph in self.step_graphs:
            for v in list(graph._watched_variables):
                found.add(id(v))
        return found

    def _shuffle(self, original):
        """``Dataset.shuffle`` for the run: a shuffle the script's code asks for without a seed is kept."""
        watcher = self

        def shuffle(self_, buffer_size, seed=None, *args, **kwargs):
            users = seed is None and watcher._called_by_user(sys._getframe(1))
            if users and watcher.coordinated:
                # each parameter-server worker would draw an order of its own: both runs get one seed per line
                where = watcher._where(sys._getframe(1))
                seed = watcher.seeded_shuffles.setdefault(where, zlib.crc32(where.encode()) % 2**31)
                return original(self_, buffer_size, seed, *args, **kwargs)
            if users and watcher.worker:  # another process draws another order (a seed of this worker's own)
                seed = 7919 * watcher.worker + len(watcher._unseeded)
            out = original(self_, buffer_size, seed, *args, **kwargs)
            if users:
                watcher._unseeded[id(out)] = (out, watcher._where(sys._getframe(1)))
            return out
        return shuffle

    def _upstream_unseeded(self, dataset) -> str | None:
        """Where an unseeded shuffle upstream of ``dataset`` was made (following ``_input_dataset``)."""
        for _ in range(64):
            if dataset is None:
                return None
            if id(dataset) in self._unseeded and self._unseeded[id(dataset)][0] is dataset:
                return self._unseeded[id(dataset)][1]
            dataset = getattr(dataset, "_input_dataset", None)
        return None

    def _shard(self, original):
        """``Dataset.shard`` for the run: a shard of a dataset shuffled without a seed is kept."""
        watcher = self

        def shard(self_, *args, **kwargs):
            shuffled = watcher._upstream_unseeded(self_)
            if shuffled is not None:
                watcher.shuffled_before_sharding.setdefault(shuffled, f"shard at {watcher._where(sys._getframe(1))}")
            return original(self_, *args, **kwargs)
        return shard

    def _distribute(self, real_distribute):
        def distribute(*args, **kwargs):
            if args and isinstance(args[0], tf.data.Dataset):  # auto-sharded per worker after the whole pipeline
                shuffled = self._upstream_unseeded(args[0])
                if shuffled is not None:
                    self.shuffled_before_sharding.setdefault(shuffled, "auto-sharded by experimental_distribute_dataset")
            out = real_distribute(*args, **kwargs)
            self.distributed = True
            self._mark(out)
            return out
        return distribute

    def _mark(self, obj) -> None:
        self._marked[id(obj)] = obj
        cls = type(obj)
        if ("iter", cls) in self._wrapped_types:
            return
        self._wrapped_types.add(("iter", cls))
        original = cls.__iter__
        watcher = self

        def __iter__(self_):
            it = original(self_)
            if id(self_) in watcher._marked and tf.executing_eagerly():
                watcher._mark_iterator(it)
            return it

        self._patch(cls, "__iter__", __iter__)

    def _plain_iter(self, original):
        """``tf.data.Dataset.__iter__`` for the run: an iterator the script makes eagerly of a dataset
        it did not distribute is kept, so that where it distributes none, its draws are the boundaries."""
        watcher = self

        def __iter__(self_):
            it = original(self_)
            if tf.executing_eagerly() and id(self_) not in watcher._marked and watcher._called_by_user(sys._getframe(1)):
                watcher._mark_iterator(it, plain=True)
            return it
        return __iter__

    def _mark_iterator(self, it, plain: bool = False) -> None:
        (self._plain if plain else self._marked)[id(it)] = it
        cls = type(it)
        if ("next", cls) in self._wrapped_types:
            return
        self._wrapped_types.add(("next", cls))
        watcher = self
        for name in ("__next__", "get_next", "get_next_as_optional"):
            original = getattr(cls, name, None)
            if original is None:
                continue

            def drawing(self_, *args, _original=original, **kwargs):
                if not watcher._counts(self_) or getattr(watcher._local, "drawing", False) \
                        or not tf.executing_eagerly() or watcher.mode in ("calls", "schedules", "fit"):
                    return _original(self_, *args, **kwargs)
                watcher.mode = "draws"
                watcher.boundary()
                watcher._local.drawing = True
                try:
                    element = _original(self_, *args, **kwargs)
                finally:
                    watcher._local.drawing = False
                watcher.drew(element)
                return element

            self._patch(cls, name, drawing)

    def _counts(self, iterator) -> bool:
        """Whether a draw from ``iterator`` is a step boundary: it is a distributed dataset's, or the
        script distributes none and this is one of its own datasets', drawn once variables exist."""
        if id(iterator) in self._marked:
            return True
        return id(iterator) in self._plain and bool(self.variables) and not self._marked

    def step_running(self) -> int:
        """The step a raise came from: as many as the script drew (a custom loop raises in the step of its
        last draw), or fit's batch (execution) that began and did not end; 0 before the first."""
        return max(self.drawn, self.fit_begun)

    def boundary(self) -> None:
        """The script is about to draw an element: the previous step (if any) has ended."""
        if len(self.boundaries) > self.drawn:
            return  # read already (a draw that raised, then another)
        with self._quiet():
            if self.on_boundary is not None:
                self.on_boundary(self)
            if not self.boundaries and self.on_first_boundary is not None:
                self.on_first_boundary(self)
        self.read()
        if len(self.boundaries) > self.steps:
            raise Stop

    @contextlib.contextmanager
    def _quiet(self):
        before = getattr(self._local, "quiet", False)
        self._local.quiet = True
        try:
            yield
        finally:
            self._local.quiet = before

    def drew(self, element) -> None:
        self.drawn += 1
        self._element_facts(element)

    def read(self) -> None:
        with self._quiet():
            self._read()

    def _read(self) -> None:
        values = {}
        for i, v in enumerate(self.variables):
            try:
                values[i] = [np.array(tf.convert_to_tensor(c)) for c in self.real.experimental_local_results(v)]
            except Exception:  # noqa: BLE001  (a variable not readable here: an uninitialized one)
                continue
        self.boundaries.append(Boundary(values, self._reduced, self._rows, self._local_reads, self._read_sites,
                                        self._examples))
        self._reduced, self._rows, self._local_reads, self._read_sites, self._examples = [], None, [], [], None

    def finish(self) -> None:
        """The script ended (or raised): the step of the last element drawn has ended there."""
        if self.mode == "draws" and len(self.boundaries) == self.drawn:
            if self.on_boundary is not None:
                with contextlib.suppress(Exception), self._quiet():
                    self.on_boundary(self)
            self.read()


_ABSENT = object()
# where the libraries a script calls through live (their frames are passed over to find the caller)
_LIBRARIES = (f"{os.sep}tensorflow{os.sep}", f"{os.sep}keras{os.sep}", f"{os.sep}tf_keras{os.sep}", "<frozen ",
              f"{os.sep}contextlib.py", f"{os.sep}threading.py", os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def isolated(argv: list, folder: str, root: str | None = None, environ: dict | None = None):
    """``sys.argv``, ``sys.path`` (``root`` first: the script's folder, or for an entry function the
    folder its package is found from), the working folder (a fresh one, removed after), the
    temporary folder (``tempfile``'s, ``TMPDIR`` and ``multiprocessing.util.get_temp_dir()``: one
    inside the working folder), the environment (``environ`` set over it; what the script sets is
    undone) and the modules imported from ``folder``, as in a process of its own: files the script
    writes at relative or temporary paths neither reach another run nor stay behind."""
    saved = list(sys.argv), list(sys.path), os.getcwd(), set(sys.modules)
    saved_environ, saved_tempdir = dict(os.environ), tempfile.tempdir
    mp_config = getattr(multiprocessing.current_process(), "_config", {})  # get_temp_dir()'s cache (private)
    saved_mp_tempdir = mp_config.pop("tempdir", _ABSENT)
    work = tempfile.mkdtemp(prefix="tfds-script-")
    temp = os.path.join(work, ".tmp")
    os.mkdir(temp)
    sys.argv[:] = argv
    sys.path.insert(0, root or folder)
    os.environ.update(environ or {})
    os.environ["TMPDIR"] = tempfile.tempdir = temp
    os.chdir(work)
    try:
        yield work
    finally:
        sys.argv[:], sys.path[:] = saved[0], saved[1]
        os.chdir(saved[2])
        for key in set(os.environ) - set(saved_environ):
            del os.environ[key]
        os.environ.update(saved_environ)
        tempfile.tempdir = saved_tempdir
        made = mp_config.pop("tempdir", None)
        if saved_mp_tempdir is not _ABSENT:
            mp_config["tempdir"] = saved_mp_tempdir
        if made:  # the folder goes with the working folder: its exit-time removal is not needed
            for finalizer in list(getattr(multiprocessing.util, "_finalizer_registry", {}).values()):
                if made in (getattr(finalizer, "_args", None) or ()):
                    finalizer.cancel()
        for name in set(sys.modules) - saved[3]:
            module = sys.modules.get(name)
            if getattr(module, "__file__", None) and os.path.realpath(module.__file__).startswith(
                    os.path.realpath(folder) + os.sep):
                del sys.modules[name]
        shutil.rmtree(work, ignore_errors=True)


def execute(path: str | None, entry: str | None) -> None:
    """Run the script at ``path`` as ``python path ARGS`` would (``__name__ == "__main__"``), or
    call the entry function ``entry`` (``pkg.module:function``); ``sys.argv`` is set already."""
    if path is not None:
        runpy.run_path(path, run_name="__main__")
        return
    target = entry
    module_name, _, attr = entry.partition(":")
    sys.modules.pop(module_name, None)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ScriptError(f"script {target!r}: module {module_name!r} does not import "
                          f"({type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''})"
                          ) from None
    entry = getattr(module, attr, None)
    if not callable(entry):
        raise ScriptError(f"script {target!r}: module {module_name!r} has no function {attr!r}")
    entry()
