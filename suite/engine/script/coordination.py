"""Parameter-server coordination: the script's ``ClusterCoordinator`` is a ``_Coordinator`` for the run:
each ``schedule`` is a step, joined before it returns; on the spec's cluster (``_Scheduled``) the
spec's coordinator runs it, in the reference (``_Local``) it runs at once on the iterator of the worker
the spec's run recorded for it."""

from __future__ import annotations

import contextlib

import numpy as np
import tensorflow as tf

from .errors import WrongKind
from .reported import _numpy


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


class CoordinationWatch:
    """The watcher's part that builds the run's coordinator and records what its closures return."""

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
