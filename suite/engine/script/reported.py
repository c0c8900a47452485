"""What a watched run reports: ``strategy.reduce``'s results (and each replica's value it reduced) in
every step, eagerly or inside a ``tf.function`` through a ``py_function``, and what the script reads
by hand with ``experimental_local_results``."""

from __future__ import annotations

import contextlib
import sys
import weakref

import numpy as np
import tensorflow as tf


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


def _numpy(value):
    return value.numpy() if hasattr(value, "numpy") else value


class ReportedWatch:
    """The watcher's part that records what the script reduces and reads per replica."""

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

    def py_function(self, fn, inputs: list, tout: list):
        """``tf.py_function(fn, inputs, tout)`` (``fn`` returns 0) that does not keep the run alive: TensorFlow
        holds every py_function's callable as long as the outermost graph it was traced under, for a
        tf.function the process's global graph, so a callable that reached the run (this watcher, the
        script's model and optimizer, its kept arrays) kept every run an engine ever made in its memory (a
        100M-parameter reference ran twice held both). TensorFlow is handed a trampoline that holds ``fn``
        weakly; the watcher holds it for the run."""
        self.callbacks.append(fn)
        ref = weakref.ref(fn)

        def call(*args):
            f = ref()
            return 0 if f is None else f(*args)

        return tf.py_function(call, inputs, tout)

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
            self.py_function(keep, list(tensors), [tf.int32])

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
