"""A user's training script run unchanged under the engine's strategy (suite/engine/script/
watches it), reported as a workload run is (suite/common/results.py: WorkloadRun), so that the
check compares and judges it as it does a workload.

The reference is the same probe in the ``default`` engine with ``replicas`` set: the script's
strategy is then one device's, telling the script the spec's ``num_replicas_in_sync``. A spec's
run loads the reference's initial values into the model's variables at the first step boundary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import linecache
import os
import sys
import threading

import numpy as np
import tensorflow as tf

from ...common import matching
from ...common.facts import Facts
from ...common.results import LOCAL_READ, SCRIPT_RAISED, WorkloadRun, WorkloadStep
from .. import compat, remedies, workload
from ..script import (
    ScriptError,
    Stop,
    Unsupported,
    Watcher,
    WrongKind,
    execute,
    flat_metrics,
    isolated,
    mean_state,
    replica_states,
)
from ..workloads import stand_in as stand_ins
from .common import failed
from .registry import probe
from .workload import RANDOM_OP, _Capture, _keras_own, _layers, _random_attr, _regularization, fresh_start

keras = compat.keras


class _Gradients:
    """``optimizer.apply_gradients`` wrapped (outermost: what the script hands over) so that each
    replica's gradients, in the order of ``variables``, are kept for the step they are applied in:
    eagerly, or from a traced replica function through a ``py_function`` (keyed by the replica id);
    applied twice in a step (a GAN's discriminator steps), their sum. ``seen``: the variables it was
    handed (which model it trains)."""

    def __init__(self, optimizer, variables, watcher):
        self.index = {id(compat.tf_variable(v)): i for i, v in enumerate(variables)}
        self.variables, self.watcher = variables, watcher
        self.step: dict = {}  # replica id -> its gradients, this step
        self.seen: set = set()
        original = optimizer.apply_gradients

        def apply_gradients(grads_and_vars, *args, **kwargs):
            pairs = list(grads_and_vars)
            self.seen.update(id(compat.tf_variable(v)) for _, v in pairs)
            try:
                self._keep(pairs)
            except Exception:  # noqa: BLE001  (gradients that cannot be carried: none kept)
                pass
            return original(pairs, *args, **kwargs)

        optimizer.apply_gradients = apply_gradients

    def _keep(self, pairs) -> None:
        context = tf.distribute.get_replica_context()
        if context is None or self.watcher.remote():
            return
        given = {self.index.get(id(compat.tf_variable(v))): g for g, v in pairs}
        grads = [tf.zeros_like(tf.convert_to_tensor(v)) if given.get(i) is None else tf.convert_to_tensor(given[i])
                 for i, v in enumerate(self.variables)]

        def keep(replica, *values):
            # copies (py_function reuses its arrays), kept one at a time (snapshots.py)
            before = self.step.get(int(replica))
            self.step[int(replica)] = [
                self.watcher.store.keep(np.array(v) if before is None else np.asarray(before[j]) + np.array(v))
                for j, v in enumerate(values)]
            return 0

        if tf.executing_eagerly():
            keep(context.replica_id_in_sync_group, *grads)
        else:
            self.watcher.py_function(keep, [context.replica_id_in_sync_group, *grads], [tf.int32])

    def take(self) -> list | None:
        """Each replica's gradients of the step just ended, in replica order (None: none applied)."""
        step, self.step = self.step, {}
        return [step[r] for r in sorted(step)] if step else None


def _route_apply(optimizer) -> None:
    """Keras 3's ``optimizer.apply(grads, variables)`` (what the Keras guide's custom train_step calls)
    routed through ``apply_gradients`` as the probe wrapped it, which calls ``apply`` in turn (Keras 3's
    apply_gradients does): the gradients of either call are handed over, and kept, once."""
    real_apply = getattr(optimizer, "apply", None)
    if real_apply is None or not hasattr(type(optimizer), "stateless_apply"):  # Keras 2 has apply_gradients alone
        return
    local = threading.local()

    def apply(grads, trainable_variables=None):
        if getattr(local, "inside", False):  # apply_gradients' own call
            return real_apply(grads, trainable_variables)
        variables = trainable_variables if trainable_variables is not None else optimizer._trainable_variables
        local.inside = True
        try:
            optimizer.apply_gradients(zip(grads, variables))
        finally:
            local.inside = False

    optimizer.apply = apply


class _Found:
    """The Keras models, optimizers and metrics the script's frames hold, by the name they are held
    under (a global's or a local's; ``name[i]`` in a list, ``name.attr`` on an object of the script's)."""

    def __init__(self):
        self.models: dict = {}
        self.optimizers: dict = {}
        self.metrics: dict = {}
        self.losses: dict = {}  # Keras loss objects (their reduction is evidence)

    def _seen(self, obj) -> bool:
        return any(obj is o for group in (self.models, self.optimizers, self.metrics, self.losses) for o in group.values())

    def _take(self, name: str, obj, depth: int = 0) -> None:
        if isinstance(obj, keras.Model):
            group = self.models
        elif isinstance(obj, keras.metrics.Metric):
            group = self.metrics
        elif isinstance(obj, keras.losses.Loss):
            group = self.losses
        elif hasattr(obj, "apply_gradients") and hasattr(obj, "variables") and not isinstance(obj, type):
            group = self.optimizers
        elif depth == 0 and isinstance(obj, (list, tuple)):
            for i, o in enumerate(obj[:32]):
                self._take(f"{name}[{i}]", o, 1)
            return
        elif depth == 0 and isinstance(obj, dict):
            for k, o in list(obj.items())[:32]:
                self._take(f"{name}[{k!r}]", o, 1)
            return
        elif depth == 0 and type(obj).__module__ == "__main__" and hasattr(obj, "__dict__"):
            for k, o in list(vars(obj).items())[:32]:
                self._take(f"{name}.{k}", o, 1)
            return
        else:
            return
        if not self._seen(obj) and name not in group:
            group[name] = obj

    def update(self, frames) -> None:
        for frame in frames:
            for space in (frame.f_locals, frame.f_globals):
                for name, obj in list(space.items()):
                    if not name.startswith("__"):
                        self._take(name, obj)

    def fitted(self, models) -> None:
        """The optimizer and the compiled metrics (its loss tracker's included) of each model ``fit``
        trains, under the name the script holds the model by (``model.optimizer``, ``model.metrics[name]``)."""
        for model in models:
            held = next((name for name, m in self.models.items() if m is model), getattr(model, "name", "model"))
            optimizer = getattr(model, "optimizer", None)
            if optimizer is not None and not self._seen(optimizer):
                self.optimizers[f"{held}.optimizer"] = optimizer
            # a custom train_step's own parts, held by the model (the Keras guide's GAN: model.d_optimizer,
            # model.generator, model.loss_fn): its optimizers, the models it holds and its loss objects
            for attr, obj in [(a, o) for a, o in vars(model).items() if not a.startswith("_")][:64]:
                if self._seen(obj):
                    continue
                if isinstance(obj, keras.Model):
                    self.models[f"{held}.{attr}"] = obj
                elif hasattr(obj, "apply_gradients") and hasattr(obj, "variables") and not isinstance(obj, type):
                    self.optimizers[f"{held}.{attr}"] = obj
                elif isinstance(obj, keras.losses.Loss):
                    self.losses[f"{held}.{attr}"] = obj
            for m in flat_metrics(getattr(model, "metrics", [])):
                if isinstance(m, keras.metrics.Metric) and not self._seen(m):
                    self.metrics[f"{held}.metrics[{m.name}]"] = m
        self._containers_out()

    def _containers_out(self) -> None:
        """A model that holds other models the script holds, and no trainable variable of its own (a
        GAN's model around its discriminator and generator), is left out: its variables are theirs, each
        named after the model it is held in, and an optimizer trains one of them."""
        for name, model in list(self.models.items()):
            inner = [m for m in self.models.values() if m is not model and any(m is layer for layer in _layers(model))]
            own = {id(compat.tf_variable(v)) for v in _variables_of(model, trainable=True)}
            held = {id(compat.tf_variable(v)) for m in inner for v in _variables_of(m, trainable=True)}
            if inner and own and own <= held:
                del self.models[name]

    def variables(self, group: dict) -> list:
        return [(name, v) for name, o in group.items()
                for v in (_optimizer_state(o) if group is self.optimizers else _variables_of(o))]


def _optimizer_state(optimizer) -> list:
    """An optimizer's variables and, for a Keras 2 legacy optimizer (OptimizerV2), its hyper-parameters
    made variables in its first step (``_hyper``: learning rate, decay, momentum), which ``variables()`` omits."""
    out = compat.optimizer_variables(optimizer)
    hyper = getattr(optimizer, "_hyper", None)
    ids = {id(v) for v in out}
    return out + [v for v in (hyper.values() if isinstance(hyper, dict) else ())
                  if isinstance(v, tf.Variable) and id(v) not in ids]


class _Targets:
    """``tf.GradientTape.gradient`` wrapped for the run: what the script's own code takes the gradient
    of, each replica's value (summed) with the variables it is taken against, kept for the step it
    runs in, so that a loss ``strategy.reduce`` was given can be told to be a model's (the same value
    on every replica)."""

    def __init__(self, watcher):
        self.step: list = []  # (the source variables' ids, replica id, value), this step
        original = tf.GradientTape.gradient
        targets = self
        self.watcher = watcher

        def gradient(tape, target, sources, *args, **kwargs):
            out = original(tape, target, sources, *args, **kwargs)
            if watcher._called_by_user(sys._getframe(1)):
                with contextlib.suppress(Exception):  # a target that is no tensor, a nest of them: not kept
                    targets._keep(target, sources)
            return out

        watcher.patch(tf.GradientTape, "gradient", gradient)

    def _keep(self, target, sources) -> None:
        if self.watcher.remote():
            return
        ids = frozenset(id(compat.tf_variable(v)) for v in tf.nest.flatten(sources))
        context = tf.distribute.get_replica_context()
        replica = context.replica_id_in_sync_group if context is not None else 0
        value = tf.reduce_sum(tf.cast(tf.convert_to_tensor(target), tf.float64))

        def keep(r, v):
            self.step.append((ids, int(r), float(v)))
            return 0

        if tf.executing_eagerly():
            keep(replica, value)
        else:
            self.watcher.py_function(keep, [replica, value], [tf.int32])

    def take(self) -> list:
        step, self.step = self.step, []
        return step


def _variables_of(model, trainable: bool = False) -> list:
    """A model's (trainable) variables; none for a model not built yet (Keras 2 raises where Keras 3
    gives an empty list: a model with no Input before its first call)."""
    try:
        return list(model.trainable_variables if trainable else model.variables)
    except ValueError:
        return []


def _optimizer_state_of(model) -> list:
    """The state of a compiled model's optimizer (none where it has none)."""
    optimizer = getattr(model, "optimizer", None)
    return _optimizer_state(optimizer) if optimizer is not None and not isinstance(optimizer, str) else []


def _ids(pairs) -> set:
    return {id(compat.tf_variable(v)) for _, v in pairs}


def _keras_names(found: _Found, trains: dict | None = None) -> dict:
    """id of a tf.Variable -> its name in the check: the Keras variable's path (or name), after the
    model's name where the script holds several models (an optimizer's, after the model it trains:
    ``trains``, optimizer name -> model name)."""
    names = {}
    several = len(found.models) > 1
    for group in (found.models, found.optimizers):
        for owner, v in found.variables(group):
            base = getattr(v, "path", None) or compat.tf_variable(v).name.split(":")[0]
            prefix = owner if group is found.models else (trains or {}).get(owner)
            named = several and prefix and not base.startswith(f"{prefix}/")  # a model named as it is held: as is
            names.setdefault(id(compat.tf_variable(v)), f"{prefix}/{base}" if named else base)
    return names


def _trains(found: _Found, handed: dict) -> dict:
    """Optimizer name -> the name of the model whose variables it was handed most of (several
    models only; an optimizer handed none of any model's is left out)."""
    if len(found.models) < 2:
        return {}
    out = {}
    for name, gradients in handed.items():
        overlap = {m: len(gradients.seen & {id(compat.tf_variable(v)) for v in _variables_of(model, trainable=True)})
                   for m, model in found.models.items()}
        best = max(overlap, key=overlap.get, default=None)
        if best is not None and overlap[best]:
            out[name] = best
    return out


def _parts(watcher: Watcher, found: _Found, idle: dict | None = None):
    """The recorded variables split into (model, optimizer) index lists, metrics and the ``idle``
    optimizers' variables left out: a variable no model, optimizer or metric of the script holds counts
    as the model's."""
    optimizer, metric = _ids(found.variables(found.optimizers)), _ids(found.variables(found.metrics))
    left_out = metric | _ids(found.variables(idle or {}))
    model, opt = [], []
    for i, v in enumerate(watcher.variables):
        if id(v) in left_out:
            continue
        (opt if id(v) in optimizer else model).append(i)
    return model, opt


def _name(v, names: dict) -> str:
    if _shards(v):  # a ShardedVariable (a parameter-server script's partitioned variable): its first part's, less the part
        return _name(_shards(v)[0], names).removesuffix("/part_0")
    return names.get(id(v)) or v.name.split(":")[0]


def _shards(v) -> list:
    """The parts of a ShardedVariable (a variable a ParameterServerStrategy's partitioner split), else []."""
    return list(v.variables) if type(v).__name__ == "ShardedVariable" else []


def _trainable(v) -> bool:
    return all(p.trainable for p in _shards(v)) if _shards(v) else bool(v.trainable)


def _at_every_boundary(per_boundary: list, zero) -> dict:
    """Each metric's values at every boundary (``per_boundary``: a dict per boundary), for the metrics
    read at each; a metric first read after the first boundary (Keras builds a compiled metric in the
    first step, after it with steps_per_execution) starts from ``zero(its first value)``, its state
    before it updated anything."""
    if not per_boundary:
        return {}
    names = set.intersection(*(set(st) for st in per_boundary[1:])) if len(per_boundary) > 1 else set(per_boundary[0])
    return {name: [st[name] if name in st else zero(per_boundary[-1][name]) for st in per_boundary]
            for name in sorted(names)}


def _mean_states(found: _Found) -> dict:
    """(total, count) of each Mean-like metric (``mean_state``): what the check takes each step's increments from."""
    return {name: state for name, m in found.metrics.items() if (state := mean_state(m))}


def _metric_results(found: _Found) -> dict:
    out = {}
    for name, m in found.metrics.items():
        try:
            value = np.asarray(m.result(), np.float64)
        except Exception:  # noqa: BLE001  (a metric with nothing to report yet)
            continue
        if value.size == 1:
            out[name] = float(value.ravel()[0])
    return out


@probe
def kind(ctx, target, path):
    """Whether ``package.module:attribute`` (found from ``path``) is an entry function to run as a
    script (it takes no argument) or a workload factory (it takes the context): "entry" or
    "factory"; "factory" too where it does not resolve (the workload check says why)."""
    try:
        attribute = workload.resolve(target, path)
        required = [p for p in inspect.signature(attribute).parameters.values()
                    if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (workload.WorkloadError, TypeError, ValueError):
        return "factory"
    return "entry" if not required else "factory"


@probe
def run(ctx, target, folder, path=None, entry=None, args=(), steps=3, seed=0, replicas=None, init=None,
        init_names=None, init_trainable=None, root=None, workers=None, ps=0, order=None, late_init=None,
        scaled_keras_losses=False, global_batch_loss=False):
    """Run the script ``path`` (or the entry function ``entry``) with ``args`` until ``steps``
    step boundaries, and report each step. ``replicas``: the reference (this engine's strategy is
    one device's; the script is told ``replicas``). ``init``, ``init_names``, ``init_trainable``:
    the reference's initial model values, loaded at the first boundary (suite/common/matching.py);
    ``late_init``: the reference's ``late_values`` (a variable made in the first step starts from them).
    ``workers``: the reference of a multi-worker spec: the run gets a TF_CONFIG of that many workers
    (this process the first), as each of the spec's workers gets its own. ``ps``: the reference of a
    parameter-server spec (``workers`` workers, ``ps`` parameter servers, this process the chief): the
    script's ClusterCoordinator runs each closure here, on the iterator of the worker ``order`` gives.
    ``scaled_keras_losses``: the run with that remedy (suite/engine/remedies.py: Keras 3.8's loss
    scaling in an earlier Keras 3); ``global_batch_loss``: the run with each replica's compiled loss divided
    by the global batch's rows (the remedy of fit-loss-mean-per-replica-on-uneven-split)."""
    strategy = ctx.strategy
    fresh_start(seed)
    environ, resolver = {}, None
    if workers:
        cluster = {"worker": [f"localhost:{i + 1}" for i in range(workers)]}
        task = {"type": "worker", "index": 0}
        if ps:
            cluster.update(chief=["localhost:0"], ps=[f"localhost:{workers + i + 1}" for i in range(ps)])
            task = {"type": "chief", "index": 0}
        environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": task})
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), task_type=task["type"], task_id=0, rpc_layer="grpc")
    on_cluster = ctx.spec.kind == "parameter_server"
    watcher = Watcher(strategy, steps, folder, reference_replicas=replicas, cluster_resolver=resolver,
                      coordinated=on_cluster or bool(ps), coordinator=ctx.coordinator if on_cluster else None,
                      workers=workers or ctx.spec.workers, order=order, late_init=late_init)
    if ctx.spec.kind == "multi_worker" and ctx.worker_index:
        watcher.worker = ctx.worker_index  # its unseeded shuffles draw an order of their own (Watcher._shuffle)
    found = _Found()
    seen = _Seen()
    facts = Facts(script=True, user_step=True)

    who = f"reference (one device, told {replicas} replicas)" if replicas is not None else ctx.spec.text

    def on_boundary(w):
        if len(w.boundaries) < steps:  # the step about to run; the last boundary ends the run
            ctx.progress(f"{who}: step {len(w.boundaries) + 1} of {steps}")
        found.update(w.user_frames())
        found.fitted(w.fit_models)
        seen.metrics.append({**_metric_results(found), **{f"fit {k}": v for k, v in w.fit_logs.items()}})
        seen.states.append(_mean_states(found))
        seen.replica_states.append({name: copies for name, m in found.metrics.items()
                                    if (copies := replica_states(m, strategy))})
        seen.gradients.append({name: g.take() for name, g in seen.handed.items()})
        seen.targets.append(seen.tape.take() if seen.tape else [])
        seen.penalties.append({k: _regularization(m) for k, m in found.models.items()})

    def on_first(w):
        layers = [layer for m in found.models.values() for layer in _layers(m)]
        for layer in layers:
            attr = _random_attr(layer)
            if attr and float(getattr(layer, attr, 0) or 0) > 0:
                facts.random_layers.append(layer.name)
                setattr(layer, attr, 0.0)
        facts.random_layers_keras = all(type(layer).__module__.startswith(("keras", "tf_keras"))
                                           for layer in layers if _random_attr(layer))
        # each optimizer's apply_gradients wrapped as the workload probe wraps it (what it hands over is what a loop applies)
        trainable = [v for m in found.models.values() for v in _variables_of(m, trainable=True)]
        for o in found.optimizers.values():
            _route_apply(o)
            _Capture(o, trainable, record=False)
        for name, o in found.optimizers.items():  # each replica's gradients as evidence
            seen.handed[name] = _Gradients(o, trainable, w)
        seen.trainable = trainable
        model, _ = _parts(w, found)
        # per optimizer, whether it was built and how many variables it had (the facts: of those the script applies)
        seen.built = {name: (getattr(getattr(o, "inner_optimizer", o), "built", None), len(_optimizer_state(o)))
                      for name, o in found.optimizers.items()}
        if init is not None:
            names = _keras_names(found)
            mine = [(_name(w.variables[i], names), tuple(w.variables[i].shape), _trainable(w.variables[i]))
                    for i in model]
            theirs = [(n, tuple(np.shape(x)), t) for n, x, t in zip(init_names, init, init_trainable)]
            for i, j in zip(model, matching.match(theirs, mine)):
                if j is not None:
                    w.variables[i].assign(np.asarray(init[j]))

    watcher.on_boundary, watcher.on_first_boundary = on_boundary, on_first
    raised = None
    argv = [path or entry.partition(":")[0], *args]
    remedy = remedies.applied([name for name, on in (("scaled_keras_losses", scaled_keras_losses),
                                                     ("global_batch_loss", global_batch_loss)) if on])
    with isolated(argv, folder, root, environ), watcher.installed(), remedy:
        given = os.environ.get("TF_CONFIG")  # the spec's worker's, the reference's, or none
        seen.tape = _Targets(watcher)
        try:
            execute(path, entry)
        except Stop:
            pass
        except ScriptError:
            raise
        except WrongKind as exc:
            raise OtherKind(f"script {target!r}: {exc}") from None
        except Unsupported as exc:
            raise ScriptError(f"script {target!r}: {exc}") from None
        except SystemExit as exc:
            if exc.code not in (None, 0) and not watcher.drawn:
                raise ScriptError(f"script {target!r}: it exited with status {exc.code} before its first step") from None
            watcher.finish()
        except Exception as exc:  # noqa: BLE001  (the script's outcome: judged by the known deviations)
            step = watcher.step_running()
            raised = _said(watcher, exc, failed(ctx, exc, f"step {step}" if step else SCRIPT_RAISED))
        else:
            watcher.finish()
    watcher.store.close()
    if watcher.store.large():
        ctx.replace_after()
    built = watcher.tf_config_built
    if isinstance(built, str) and built != given:  # the script set TF_CONFIG itself before building its strategy
        facts.tf_config_set = _cluster_of(built)
    return _report(ctx, watcher, found, seen, facts, raised)


def _said(watcher, exc: BaseException, raised):
    """``raised`` with the script's innermost line in ``exc``'s traceback (its file relative to the script's
    folder, its number and its code) and the function that line called, where the exception came from
    inside one (the watcher's own wrappers of fit and evaluate are named as those)."""
    tb, mine, called = exc.__traceback__, None, ""
    while tb is not None:
        if watcher._users(tb.tb_frame.f_code.co_filename):
            mine, called = tb, ""
        elif mine is not None and not called:
            called = tb.tb_frame.f_code.co_name
        tb = tb.tb_next
    if mine is None:
        return raised
    code = mine.tb_frame.f_code
    text = " ".join(linecache.getline(code.co_filename, mine.tb_lineno).split())
    where = f"{os.path.relpath(code.co_filename, watcher.folder)}:{mine.tb_lineno}"
    return dataclasses.replace(raised, at=f"{where} ({text})" if text else where, call=called)


def _cluster_of(tf_config: str) -> str:
    """A TF_CONFIG the script set, in short: its tasks per job and its own task."""
    try:
        config = json.loads(tf_config)
        jobs = ", ".join(f"{len(hosts)} {job}" for job, hosts in config.get("cluster", {}).items())
        task = config.get("task", {})
        return f"{jobs}; task {task.get('type')} {task.get('index')}"
    except (ValueError, AttributeError, TypeError):
        return "not JSON"


class OtherKind(ScriptError):
    """The script is a parameter-server one and the run's spec synchronous, or the other way round:
    the spec does not run it (its reply's type names this class: scriptcheck.OtherKindError)."""


class _Seen:
    """What the probe reads at each boundary (index k: at the end of step k, 0 before the first)."""

    def __init__(self):
        self.metrics: list = []  # the metrics' results
        self.gradients: list = []  # optimizer name -> each replica's gradients handed over in the step it ends
        self.targets: list = []  # what the script took gradients of in that step (_Targets)
        self.penalties: list = []  # model name -> add_n of its losses (weight penalties), None if unreadable
        self.handed: dict = {}  # optimizer name -> its _Gradients
        self.tape: _Targets | None = None
        self.trainable: list = []  # every model's trainable variables, the order of the gradients kept
        self.built: dict = {}  # optimizer name -> (whether it was built, its variables) at the first boundary
        self.states: list = []  # per boundary, each Mean-like metric's (total, count) (_mean_states)
        self.replica_states: list = []  # per boundary, each one's [per local replica, its copy's (total, count)]

    def regularization(self, k: int):
        penalties = list(self.penalties[k].values()) if k < len(self.penalties) else [None]
        return None if None in penalties else sum(penalties)


def _groups(found: _Found, seen: _Seen, trains: dict) -> list:
    """(optimizer name, model name, indices of the model's trainable variables in ``seen.trainable``)
    per optimizer that trains one of several models; [] with one model."""
    out = []
    index = {id(compat.tf_variable(v)): i for i, v in enumerate(seen.trainable)}
    for name in found.optimizers:
        model = trains.get(name)
        if model is not None:
            out.append((name, model, [index[id(compat.tf_variable(v))]
                                      for v in _variables_of(found.models[model], trainable=True)]))
    return out


def _step_gradients(seen: _Seen, k: int, groups: list):
    """Each replica's gradients of step ``k``: the one optimizer's over every trainable variable, or
    with several models each optimizer's over its model's, one after another (None: not every
    optimizer was applied)."""
    taken = seen.gradients[k] if k < len(seen.gradients) else {}
    if not groups:
        return next(iter(taken.values()), None) if len(taken) == 1 else None
    per = [taken.get(name) for name, _, _ in groups]
    if any(g is None for g in per) or len({len(g) for g in per}) != 1:
        return None
    return [[g[r][i] for (_, _, indices), g in zip(groups, per) for i in indices] for r in range(len(per[0]))]


def _named(found: _Found, seen: _Seen, k: int, reduced: list, groups: list, fit: bool = False) -> dict | None:
    """Step ``k``'s loss per model, where the script reduced, for every model an optimizer trains, a
    value whose replicas equal what it took that model's gradients of (``_Targets``). A custom
    train_step run by ``fit`` (``fit``) reduces no loss of its own (fit reduces what it returns): each
    replica's loss for a model is what it took that model's gradients of (summed over its calls)."""
    if not groups or k >= len(seen.targets):
        return None
    out = {}
    for _, model, _ in groups:
        ids = {id(compat.tf_variable(v)) for v in _variables_of(found.models[model], trainable=True)}
        per_replica: dict = {}
        for sources, replica, value in seen.targets[k]:
            if sources & ids:
                per_replica.setdefault(replica, []).append(value)
        calls = list(zip(*(per_replica[r] for r in sorted(per_replica)))) if per_replica else []
        penalty = seen.penalties[k - 1].get(model) if k - 1 < len(seen.penalties) else None
        if fit:
            if not calls:
                return None
            replicas = [float(sum(call[j] for call in calls)) for j in range(len(calls[0]))]
            out[model] = {"loss": float(sum(replicas)), "replicas": replicas, "regularization": penalty}
            continue
        match = next(((reported, parts) for _, reported, parts in reversed(reduced)
                      if any(_sums(parts) == list(call) for call in calls)), None)
        if match is None:
            return None
        out[model] = {"loss": float(np.sum(np.asarray(match[0], np.float64))), "replicas": _sums(match[1]),
                      "regularization": penalty}
    return out


def _sums(parts) -> list:
    return [float(np.sum(np.asarray(p, np.float64))) for p in parts]


def _own_train_step(models) -> list:
    """The classes of ``models`` (those fit trains) whose train_step is the script's own, not Keras'."""
    keras_own = compat.keras.Model.train_step
    return sorted({type(m).__name__ for m in models if getattr(type(m), "train_step", None) is not keras_own})


def _script_code(watcher: Watcher, models) -> list:
    """The model and layer classes, compiled losses and compiled metrics of ``models`` (those fit trains)
    defined in the script's own files: the script's code inside what Keras' own train step runs."""
    found = set()

    def files(t) -> list:  # a function's file; a class's: its and its bases' methods' (a script's run has no module)
        if inspect.isfunction(t):
            return [t.__code__.co_filename]
        if isinstance(t, type):
            return [f.__code__.co_filename for c in t.__mro__ for f in vars(c).values() if inspect.isfunction(f)]
        return []

    def check(obj):
        for t in [obj] if isinstance(obj, type) or inspect.isfunction(obj) else [type(obj), getattr(obj, "fn", None)]:
            if any(watcher._users(path) for path in files(t)):
                found.add(getattr(t, "__qualname__", getattr(t, "__name__", repr(t))))

    for m in models:
        flatten = getattr(m, "_flatten_layers", None)
        for layer in (flatten(include_self=True, recursive=True) if flatten else [m, *getattr(m, "layers", [])]):
            check(layer)
        container = getattr(m, "_compile_metrics", None) or getattr(m, "compiled_metrics", None)
        for compiled in [*tf.nest.flatten(getattr(m, "loss", None)),
                         *tf.nest.flatten(getattr(container, "_user_metrics", None))]:
            if compiled is not None and not isinstance(compiled, str):
                check(compiled)
    return sorted(found)


def _idle(watcher: Watcher, found: _Found, seen: _Seen) -> dict:
    """The optimizers a custom train_step never applies, taken out of ``found.optimizers`` (the one
    ``compile()`` makes by default, RMSprop, beside a GAN's own two): Keras builds it before fit's first
    batch under a strategy and in the trace without one, so its slots exist on one side only, and they
    never move."""
    if not (watcher.mode == "fit" and _own_train_step(watcher.fit_models)):
        return {}
    idle = {name: o for name, o in found.optimizers.items()
            if name in seen.handed and not seen.handed[name].seen and len(seen.handed) > 1}
    if len(idle) == len(found.optimizers):
        return {}
    for name in idle:
        del found.optimizers[name]
        del seen.handed[name]
    return idle


def _stand_in(found: _Found, shape) -> dict | None:
    """The stand-in control's description of the script's optimizers, where they have one (None:
    none, or several that differ in class or configuration)."""
    described = [stand_ins.described(o, shape) for o in found.optimizers.values()]
    if not described or described[0] is None:
        return None
    unnamed = [None if d is None else {**d, "config": {k: v for k, v in d["config"].items() if k != "name"}}
               for d in described]
    return described[0] if all(d == unnamed[0] for d in unnamed) else None


def _report(ctx, watcher, found, seen, facts: Facts, raised) -> WorkloadRun:
    strategy = ctx.strategy
    idle = _idle(watcher, found, seen)
    built = [b for name, (b, _) in seen.built.items() if name not in idle]
    facts.optimizer_built = False if False in built else built[0] if built else None
    if seen.built:
        facts.optimizer_variables_before_step = sum(n for name, (_, n) in seen.built.items() if name not in idle)
    trains = _trains(found, seen.handed)
    groups = _groups(found, seen, trains)
    names = _keras_names(found, trains)
    model, opt = _parts(watcher, found, idle)
    variables = watcher.variables
    boundaries = watcher.boundaries
    first = boundaries[0].values if boundaries else {}
    # a variable made in the first step (not read at the first boundary): its value at creation
    initial = [first[i][0] if i in first else watcher.created_late.get(
        id(variables[i]), np.zeros(variables[i].shape, variables[i].dtype.as_numpy_dtype)) for i in model]

    def values(b, i):
        if i in b.values:
            return b.values[i]
        return [np.zeros(variables[i].shape, variables[i].dtype.as_numpy_dtype)] * len(ctx.local_replica_ids)

    steps = []
    for k, b in enumerate(boundaries[1:], 1):
        op, reported, parts = b.reduced[-1] if b.reduced else ("SUM", np.zeros(()), [])
        named = _named(found, seen, k, b.reduced, groups, fit=watcher.mode == "fit")
        loss, replica_losses = float(np.sum(np.asarray(reported, np.float64))), _sums(parts)
        if named:  # a loss per model: the step's loss is their sum (as a workload's step returning a dict)
            loss = sum(v["loss"] for v in named.values())
            replica_losses = [sum(v) for v in zip(*(n["replicas"] for n in named.values()))]
        steps.append(WorkloadStep(
            loss, replica_losses, b.rows or [], [values(b, i) for i in model], [values(b, i) for i in opt],
            _step_gradients(seen, k, groups), {**(seen.metrics[k] if k < len(seen.metrics) else {}),
                                               **_indexed_reads(watcher, b)},
            seen.regularization(k - 1), None, named, b.examples))
    # each Mean-like metric's (total, count) at every boundary, from the first: what the check takes each step's
    # increments from (a metric known at every boundary only)
    facts.metric_state_values = _at_every_boundary(seen.states, lambda state: [0.0, 0.0])
    # and each replica's own copy of it (several replicas): what a deviation's model of per-replica state reads
    facts.metric_replica_states = _at_every_boundary(seen.replica_states, lambda copies: [[0.0, 0.0]] * len(copies))
    if watcher.evaluated and steps:  # the script's evaluate after its fit: its results, compared as metrics
        steps[-1].metrics.update({f"evaluate {k}": v for k, v in watcher.evaluated.items()})
        facts.metric_state_values.update({f"evaluate {k}": v for k, v in watcher.evaluate_states.items()
                                             if k in watcher.evaluated})
        facts.metric_replica_states.update({f"evaluate {k}": [v] for k, v in watcher.evaluate_copies.items()
                                               if k in watcher.evaluated})
    reduced = [r for b in boundaries for r in b.reduced]
    optimizers = [getattr(o, "inner_optimizer", o) for o in found.optimizers.values()]
    layers = [layer for m in found.models.values() for layer in _layers(m)]
    facts = dataclasses.replace(
        facts,
        loss_reduction=reduced[-1][0] if reduced else "SUM",
        reported=bool(reduced),
        models=list(found.models) or [""], optimizers=list(found.optimizers) or [""],
        metric_states={name: sorted(getattr(v, "path", v.name).rsplit("/", 1)[-1].split(":")[0] for v in m.variables)
                       for name, m in found.metrics.items()},
        keras_own_model=all(_keras_own(o) for o in [*found.models.values(), *found.optimizers.values(), *layers]),
        regularized=any(bool(getattr(m, "losses", None)) for m in found.models.values()),
        batch_norm=[[layer.name, bool(getattr(layer, "synchronized", False))] for layer in layers
                    if type(layer).__name__ == "BatchNormalization"],
        optimizer_clips=any(getattr(o, attr, None) is not None for o in optimizers
                            for attr in ("clipnorm", "global_clipnorm", "clipvalue")),
        optimizer_variables_after=len(opt),
        first_batch_rows=(sum(boundaries[1].rows or []) if len(boundaries) > 1 and boundaries[1].rows
                          else watcher.fit_rows),
        # the classes of the models fit trains whose train_step is the script's own, not Keras'
        fit_own_train_step=_own_train_step(watcher.fit_models),
        fits_skipped=watcher.fits_skipped,
        fit_script_code=_script_code(watcher, watcher.fit_models),
        # several models: each optimizer's gradients over its own model's variables (diagnosis._per_model)
        gradient_groups=([[m, len(indices)] for _, m, indices in groups] if groups
                         else [[name, 0] for name in found.optimizers]),
        trains=trains,
        sparse_gradients=False, random_ops=watcher.random_ops(RANDOM_OP),
        constructed=watcher.constructed, device_config=watcher.device_config,
        replica_reads=watcher.replica_reads, draws=watcher.drawn, boundaries=len(boundaries),
        runs=watcher.runs, distributed=watcher.distributed, step_mode=watcher.mode,
        # the most steps one execution of the script's fit runs, and how the strategy splits fit's first batch
        # among its replicas (tf.data's rebatch: the first rows % replicas get one more): what known deviations'
        # conditions read
        steps_per_execution=max((_steps_per_execution(m) for m in watcher.fit_models), default=None),
        fit_first_split=_split(watcher.fit_rows, strategy.num_replicas_in_sync) if watcher.fit_rows else None,
        # a parameter-server script's: per step, the worker its closure ran on; unseeded shuffles given a seed
        closure_workers=watcher.closure_workers, seeded_shuffles=watcher.seeded_shuffles,
        # the stand-in control's description: the script's optimizer (its optimizers', where they are of one class
        # and one configuration but their names: a GAN's two Adams) and its features' shape
        stand_in=_stand_in(found, watcher.feature_shape or [8]),
        # batches the script passed to strategy.run undistributed (every replica gets all of it), by where
        undistributed_inputs=watcher.undistributed,
        # per step, the per-replica values the script read with experimental_local_results (each summed)
        local_reads=[[[float(np.sum(np.asarray(v, np.float64))) for v in read] for read in b.local_reads]
                     for b in boundaries[1:]],
        loss_object_reduction=next((str(getattr(o, "reduction", "")) for o in found.losses.values()), None),
        # model variables made after the first boundary (a model with no Input, built by its first call in the
        # step): started from the reference's values at creation (late_init), their change measured from there
        built_in_step=[_name(variables[i], names) for i in model if i not in first],
        built_in_step_from_creation=all(id(variables[i]) in watcher.created_late for i in model if i not in first),
        late_values=watcher.late_values,  # [name, shape, value at creation] of each variable made in the first step
        # unseeded shuffles the dataset was sharded after ("file:line" -> where): per worker, its own order
        shuffled_before_sharding=watcher.shuffled_before_sharding,
    )
    if ctx.spec.kind != "default":
        extended = strategy.extended
        # a model's or optimizer's variable, or one of the script's own that trains (floating, trainable):
        # a counter the script keeps outside the scope (the multi-worker tutorial's epoch) is no mistake; and of
        # those only what the checked training reads or writes (a demonstration variable the steps never touch,
        # TensorFlow's guide's print(tf.Variable(1.)), is none of its business)
        owned = _ids(found.variables(found.models)) | _ids(found.variables(found.optimizers))
        accessed = watcher.accessed_in_steps()
        # a model the script fits with no strategy beside the distributed one (fits_skipped), and its optimizer:
        # trained outside every scope on purpose, never the checked training's, whether or not that training stepped
        aside = _ids([(None, v) for m in watcher.skipped_models
                      for v in [*_variables_of(m), *_optimizer_state_of(m)]])

        def touched(i) -> bool:
            if accessed is None and len(boundaries) < 2:
                return True  # no step traced or ended (it raised before): nothing says what the training touches
            v = variables[i]
            parts = [v, *_shards(v), *getattr(v, "values", ())]  # a distributed variable's per-device parts too
            if accessed is not None and any(id(p) in accessed for p in parts):
                return True
            changed = boundaries and i in boundaries[0].values and i in boundaries[-1].values and not all(
                np.array_equal(np.asarray(a), np.asarray(b))
                for a, b in zip(boundaries[0].values[i], boundaries[-1].values[i]))
            return bool(changed) or (accessed is None and id(v) in owned)
        facts.outside_scope = sorted(
            _name(variables[i], names) for i in model + opt
            if (id(variables[i]) in owned or (variables[i].dtype.is_floating and _trainable(variables[i])))
            and id(variables[i]) not in aside and touched(i)
            and not all(extended.variable_created_in_scope(p) for p in _shards(variables[i]) or [variables[i]]))
    return WorkloadRun(strategy.num_replicas_in_sync, ctx.local_replica_ids, [_name(variables[i], names) for i in model],
                       [_trainable(variables[i]) for i in model], [_name(variables[i], names) for i in opt],
                       initial, steps, facts, None, raised)


def _indexed_reads(watcher, boundary) -> dict:
    """What the script read by index of ``experimental_local_results`` in the step ending at ``boundary``,
    compared as a metric: per call site it indexed, that index's value of its last read there (``[0]`` of a
    per-replica accuracy is replica 0's under several replicas, one device's in the reference)."""
    out = {}
    for site, index in watcher.indexed.items():
        reads = [values for values, at in zip(boundary.local_reads, boundary.read_sites) if at == site]
        if reads and -len(reads[-1]) <= index < len(reads[-1]):
            out[f"{LOCAL_READ}[{index}] at {site}"] = float(np.sum(np.asarray(reads[-1][index], np.float64)))
    return out


def _steps_per_execution(model) -> int:
    """A compiled model's ``steps_per_execution`` (Keras 3: an int; Keras 2: a variable)."""
    value = getattr(model, "steps_per_execution", None) or getattr(model, "_steps_per_execution", None) or 1
    return int(np.asarray(value.numpy() if hasattr(value, "numpy") else value).reshape(()))


def _split(rows: int, replicas: int) -> list[int]:
    """A global batch of ``rows`` split among ``replicas`` as tf.data's rebatch splits it."""
    base, extra = divmod(rows, replicas)
    return [base + 1] * extra + [base] * (replicas - extra)
