"""The ``Watcher`` of one run: its state (``__init__`` says what each attribute holds), the script's
frames (which code is the user's), and ``installed()``, which puts every wrapper of the package's
parts in place for the run and takes them out after. Each concern is a part of its own module
(constructors, coordination, fit, variables, reported, datasets, boundaries)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading

import tensorflow as tf

from ...common.snapshots import Snapshots
from .. import compat
from .boundaries import BoundariesWatch
from .constructors import (
    CONSTRUCTORS,
    COORDINATED,
    COORDINATORS,
    DEVICE_CONFIG,
    ConstructorsWatch,
    Reference,
    _attr,
    _Server,
    _stand_in_class,
)
from .coordination import CoordinationWatch
from .datasets import DatasetsWatch
from .fit import FitWatch
from .isolation import _ABSENT
from .reported import ReportedWatch
from .variables import VariablesWatch

# where the libraries a script calls through live (their frames are passed over to find the caller): the
# engine's own code among them (suite/engine, this package's parent)
_LIBRARIES = (f"{os.sep}tensorflow{os.sep}", f"{os.sep}keras{os.sep}", f"{os.sep}tf_keras{os.sep}", "<frozen ",
              f"{os.sep}contextlib.py", f"{os.sep}threading.py",
              os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Watcher(ConstructorsWatch, CoordinationWatch, FitWatch, VariablesWatch, ReportedWatch, DatasetsWatch,
              BoundariesWatch):
    """One run of a script: what it built, drew and created (see the module's docstring)."""

    def __init__(self, strategy, steps: int, folder: str, reference_replicas: int | None = None,
                 cluster_resolver=None, coordinated: bool = False, coordinator=None, workers: int = 1, order=None,
                 late_init=None):
        self.real = strategy  # the strategy TensorFlow runs (the spec's, or the default strategy)
        self.store = Snapshots()  # where the run's variables and gradients are kept (suite/common/snapshots.py)
        self.callbacks: list = []  # what the run's py_functions call (ReportedWatch.py_function)
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

    @contextlib.contextmanager
    def _quiet(self):
        before = getattr(self._local, "quiet", False)
        self._local.quiet = True
        try:
            yield
        finally:
            self._local.quiet = before

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
