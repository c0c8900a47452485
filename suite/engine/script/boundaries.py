"""The steps of a watched run and their boundaries: ``strategy.run`` and the script's ``tf.function``
calls (a script that draws inside its step function is stepped by its calls), what each boundary reads
(every variable's local copies), and the ``Stop`` at the boundary after the last step compared."""

from __future__ import annotations

import contextlib
import dataclasses
import sys

import numpy as np
import tensorflow as tf

from ...common.results import example_digests
from .errors import Stop


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


class BoundariesWatch:
    """The watcher's part that tells the steps apart and reads each boundary."""

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
                values[i] = self.store.copies([np.array(tf.convert_to_tensor(c))
                                               for c in self.real.experimental_local_results(v)])
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
