"""``Model.fit`` and ``Model.evaluate`` in a watched run: fit's batches are its steps (a callback of the
watcher's marks a boundary at the end of each), its logs are read, fit ends at the last step compared,
and an ``evaluate`` the script calls next runs on as many batches; the metrics' state each replica keeps."""

from __future__ import annotations

import contextlib
import sys

import numpy as np
import tensorflow as tf

from ...common.results import example_digests
from ...common.source import evaluate_follows
from .. import compat
from .errors import Stop


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


class FitWatch:
    """The watcher's part that wraps ``fit``, ``evaluate`` and each fitted model's ``train_step``."""

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
                    watcher.py_function(keep, [replica, tf.shape(leaf)[0], *numeric], [tf.int32])

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
