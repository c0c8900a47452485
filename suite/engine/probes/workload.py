"""A user's workload (suite/engine/workload.py) trained under the engine's strategy, reading after
every step what the check compares: the reported loss, every replica's copy of every model and
optimizer variable, the metric results, and as evidence for a diagnosis what each replica's
step returned, how many examples it saw and the gradients it handed to ``apply_gradients``.

The same probe runs the reference (the ``default`` spec: no strategy, the global batch on one
device) and every distributed spec, with op determinism on and the seeds set, the model loaded
with the reference's initial values. Random layers (Dropout and its kin) are switched off for
the comparison, since a replica's draws cannot equal one device's; what they draw is checked
once, before training (``masks``).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading

import numpy as np
import tensorflow as tf

from ...common import matching
from ...common.facts import Facts
from ...common.results import FACTORY_RAISED, Raised, WorkloadRun, WorkloadStep, example_digests
from ...common.snapshots import Snapshots
from .. import compat, workload
from ..steps import TrainStep
from ..workloads import stand_in as stand_ins
from .common import failed
from .registry import probe

keras = compat.keras
RANDOM_LAYERS = {"Dropout": "rate", "SpatialDropout1D": "rate", "SpatialDropout2D": "rate",
                 "SpatialDropout3D": "rate", "GaussianDropout": "rate", "AlphaDropout": "rate",
                 "GaussianNoise": "stddev"}
_DETERMINISTIC = []


def _random_attr(layer) -> str | None:
    """The attribute that switches a random layer off (its rate or stddev), for Keras' random
    layers and subclasses of them."""
    for cls in type(layer).__mro__:
        if cls.__name__ in RANDOM_LAYERS and cls.__module__.startswith(("keras", "tf_keras")):
            return RANDOM_LAYERS[cls.__name__]
    return None


def _keras_own(obj) -> bool:
    return type(obj).__module__.startswith(("keras", "tf_keras"))


def _name(v) -> str:
    return getattr(v, "path", None) or compat.tf_variable(v).name.split(":")[0]


def _layers(model):
    out = []
    for layer in getattr(model, "layers", []):
        out.append(layer)
        if getattr(layer, "layers", None):
            out.extend(_layers(layer))
    return out


def _prefixed(name: str, v) -> str:
    """A variable's name in the check: its own, after the model's or optimizer's name in a workload
    of several (``generator/dense/kernel``)."""
    return f"{name}/{_name(v)}" if name else _name(v)


def _facts(ctx, wl, strategy, built_variables: int) -> Facts:
    """What the engine can see of the workload before it trains: evidence for diagnoses."""
    models, optimizers = workload.parts(wl)
    layers = [layer for m in models.values() for layer in _layers(m)]
    inner = [getattr(o, "inner_optimizer", o) for o in optimizers.values()]
    facts = Facts(
        loss_reduction=wl.loss_reduction,
        loss_object_reduction=str(getattr(wl.loss, "reduction", "")) or None,
        user_step=wl.step is not None,
        optimizer_variables_before_step=built_variables,
        optimizer_built=(False if any(getattr(o, "built", None) is False for o in inner)
                         else getattr(inner[0], "built", None)),
        batch_norm=[[layer.name, bool(getattr(layer, "synchronized", False))] for layer in layers
                    if type(layer).__name__ == "BatchNormalization"],
        random_layers=[layer.name for layer in layers if _random_attr(layer)
                       and float(getattr(layer, _random_attr(layer), 0) or 0) > 0],
        # whether every random layer is one of Keras' own classes (not a user's subclass)
        random_layers_keras=all(type(layer).__name__ in RANDOM_LAYERS
                                and type(layer).__module__.startswith(("keras", "tf_keras"))
                                for layer in layers if _random_attr(layer)),
        regularized=any(bool(m.losses) for m in models.values()),
        # whether the model, every layer and the optimizer are Keras' own classes: only then can the
        # control (the suite's step on them) speak for TensorFlow/Keras rather than the user's code
        keras_own_model=all(_keras_own(obj) for obj in [*models.values(), *optimizers.values(), *layers]),
        optimizer_clips=any(getattr(o, attr, None) is not None for o in inner
                            for attr in ("clipnorm", "global_clipnorm", "clipvalue")),
        # the names of several models and optimizers ([""] for one of each): the canonical-step control
        # fits one model with one optimizer only
        models=list(models), optimizers=list(optimizers),
        # each metric's state, by its variables' last names: ("count", "total") is a mean (its
        # result total / count), which a deviation model of metric accumulation can predict
        metric_states={name: sorted(_name(v).rsplit("/", 1)[-1] for v in m.variables)
                       for name, m in wl.metrics.items()},
    )
    if ctx.spec.kind != "default":
        extended = strategy.extended
        facts.outside_scope = sorted(
            {_prefixed(k, v) for k, m in models.items() for v in m.variables
             if not extended.variable_created_in_scope(compat.tf_variable(v))}
            | {"optimizer: " + _prefixed(k, v) for k, o in optimizers.items() for v in compat.optimizer_variables(o)
               if not extended.variable_created_in_scope(compat.tf_variable(v))})
    return facts


class _Capture:
    """``optimizer.apply_gradients`` wrapped so each replica's step records the gradients it
    hands over (per thread: MirroredStrategy runs each replica's function in a thread of its own)."""

    def __init__(self, optimizer, variables, dense=False, record=True):
        self.local = threading.local()
        self.sparse = False  # whether a gradient handed over was a tf.IndexedSlices (seen while tracing)
        self.index = {id(v): i for i, v in enumerate(variables)}
        self.variables = variables
        original = optimizer.apply_gradients

        def apply_gradients(grads_and_vars, *args, **kwargs):
            pairs = list(grads_and_vars)
            self.sparse = self.sparse or any(isinstance(g, tf.IndexedSlices) for g, _ in pairs)
            if dense:  # the remedy ``dense_gradients`` (known_deviations.toml): the optimizer's dense path
                pairs = [(tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g, v) for g, v in pairs]
            given = {self.index.get(id(v)): g for g, v in pairs}
            before = getattr(self.local, "grads", None) if record else None
            if before:  # called again in the same step (a GAN's discriminator steps): the gradients summed
                try:
                    given = {i: tf.convert_to_tensor(g) + tf.convert_to_tensor(before[i]) if i in before else g
                             for i, g in given.items()}
                except Exception:  # noqa: BLE001  (another call's tensors in another graph: the last call's)
                    pass
            if record:  # (a script's steps return what the script returns: nothing to take the gradients out)
                self.local.grads = given
            return original(pairs, *args, **kwargs)

        optimizer.apply_gradients = apply_gradients

    def start(self):
        self.local.grads = None

    def take(self, zeros: bool = False):
        """The gradients handed over in this step, per variable (zeros where a variable got none);
        [] where apply_gradients was not called (``zeros``: zeros for every variable then)."""
        grads = getattr(self.local, "grads", None)
        if grads is None and zeros:
            grads = {}
        if grads is None:
            return []
        return [tf.zeros_like(tf.convert_to_tensor(v)) if grads.get(i) is None else tf.convert_to_tensor(grads[i])
                for i, v in enumerate(self.variables)]


def _rows(batch):
    return tf.shape(tf.nest.flatten(batch)[0])[0]


WEIGHT_KEYS = ("sample_weight", "sample_weights", "weight", "weights", "w")


def _example_weights(batch):
    """The batch's example weights, where the batch says which they are: a dict's weight key
    (WEIGHT_KEYS), Keras' ``(x, y, sample_weight)``, or ``((x, sample_weight), y)`` (a rank-1
    float second input); else None."""
    def keyed(d):
        key = next((k for k in WEIGHT_KEYS if k in d), None)
        return None if key is None else d[key]

    if isinstance(batch, dict):
        return keyed(batch)
    if isinstance(batch, (tuple, list)) and len(batch) == 3:
        return batch[2]
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        inputs = batch[0]
        if isinstance(inputs, dict):
            return keyed(inputs)
        if isinstance(inputs, (tuple, list)) and len(inputs) == 2:
            w = inputs[1]
            if getattr(w, "shape", None) is not None and w.shape.rank == 1 and w.dtype.is_floating:
                return w
    return None


def _weight_sum(batch):
    """The replica's summed example weights (float64), or -1 where the batch has none."""
    w = _example_weights(batch)
    return tf.constant(-1.0, tf.float64) if w is None else tf.reduce_sum(tf.cast(w, tf.float64))


def _dataset(ctx, wl, strategy, global_batch):
    """The workload's batches as the strategy delivers them (parameter servers: the global
    batches in order, passed to each scheduled step)."""
    if ctx.coordinator is not None:
        return iter(wl.dataset(global_batch, None))
    if wl.distribute == "function":
        return iter(strategy.distribute_datasets_from_function(lambda ic: wl.dataset(global_batch, ic)))
    if ctx.spec.kind == "default":
        return iter(wl.dataset(global_batch, None))
    return iter(strategy.experimental_distribute_dataset(wl.dataset(global_batch, None)))


def _masks(strategy, model, x):
    """Each replica's training-mode output for the same input: equal outputs mean equal random
    draws."""
    out = strategy.run(lambda: model(x, training=True))
    return [np.asarray(v) for v in strategy.experimental_local_results(out)]


def _examples(strategy, batch, replicas: int) -> list | None:
    """Per local replica, the digests of the examples it got in the step (results.example_digests: each
    example's rows of every numeric part of the element hashed together), what tells whether two
    workers read the same examples; None where the element's parts cannot be read per replica."""
    try:
        leaves = [strategy.experimental_local_results(leaf) for leaf in tf.nest.flatten(batch)]
        numeric = [values for values in leaves if len(values) == replicas and all(
            isinstance(v, tf.Tensor) and (v.dtype.is_floating or v.dtype.is_integer or v.dtype.is_bool)
            for v in values)]
        if not numeric:
            return None
        return example_digests([[np.asarray(values[r]) for values in numeric] for r in range(replicas)])
    except Exception:  # an element of no tensors per replica (a coordinator's remote values)
        return None


def _digest(batch) -> str:
    """A digest of a batch's values (every tensor of its structure, in order)."""
    h = hashlib.sha256()
    for t in tf.nest.flatten(batch):
        a = np.asarray(t)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


# TensorFlow's ops that draw random numbers (stateful, stateless and generator-backed); Keras' random
# layers, switched off for the comparison (their rate or stddev 0), draw none
RANDOM_OP = re.compile(r"(Random|StatelessRandom|StatelessTruncatedNormal|StatelessMultinomial|StatelessParameterized"
                       r"|StatefulUniform|StatefulStandardNormal|StatefulTruncatedNormal|StatefulRandomBinomial"
                       r"|RngReadAndSkip|RngSkip|Multinomial|TruncatedNormal|ParameterizedTruncatedNormal"
                       r"|NonDeterministicInts|AnonymousSeedGenerator)\w*")


def _random_ops(step_fn, batch) -> list | None:
    """The random ops in the traced step (its graph and the functions it calls, the replica step
    inside ``strategy.run`` among them), by op type; None where its graph cannot be read."""
    try:
        graph = step_fn.get_concrete_function(batch).graph.as_graph_def()
    except Exception:  # noqa: BLE001  (a step traced elsewhere: nothing known, nothing claimed)
        return None
    ops = {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}
    return sorted(op for op in ops if RANDOM_OP.fullmatch(op))


def _regularization(model) -> float | None:
    """The model's weight penalties (``add_n(model.losses)``) at the current weights, read
    eagerly; None when they cannot be read outside the step (activity penalties)."""
    try:
        losses = model.losses
        return float(np.asarray(tf.add_n([tf.convert_to_tensor(v) for v in losses]))) if losses else 0.0
    except Exception:
        return None


def fresh_start(seed: int) -> None:
    """What every run of a user's code starts from: op determinism on (once per engine), Keras'
    session cleared (its names start afresh) and the seeds set."""
    if not _DETERMINISTIC:
        tf.config.experimental.enable_op_determinism()
        _DETERMINISTIC.append(True)
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)


@probe
def run(ctx, target, steps, global_batch, seed=0, canonical=False, init=None, path=None, dense_gradients=False,
        init_names=None, init_trainable=None, stand_in=False, stand_in_of=None):
    """Build the workload (fresh), load ``init`` (every model variable), train ``steps`` steps of
    its dataset with its own step (``canonical``: the suite's) and report each step.
    ``dense_gradients``: hand apply_gradients dense tensors for tf.IndexedSlices (a remedy the
    upgrade check tries, suite/harness/loopcheck/upgrade.py). ``init_names``, ``init_trainable``:
    ``init`` is another build's (another version's), matched by suite/common/matching.py.
    ``stand_in``: train the stand-in control of the workload instead (suite/engine/workloads/stand_in.py:
    the suite's own Keras model with the workload's optimizer class and hyper-parameters).
    ``stand_in_of``: train the stand-in of a run that has no workload (a script's; its
    ``stand_ins.described``), ``target`` then unused."""
    strategy = ctx.strategy
    store = Snapshots()  # the steps' variables and gradients (suite/common/snapshots.py)
    fresh_start(seed)
    wctx = workload.WorkloadContext(strategy, int(global_batch), strategy.num_replicas_in_sync, seed)
    try:
        if stand_in_of is not None:
            with strategy.scope():
                wl = stand_ins.build_described(stand_in_of, int(global_batch), seed)
        else:
            wl = workload.build(target, wctx, path)
    except workload.WorkloadError as exc:
        if exc.original is None or ctx.spec.kind == "default":
            raise  # with no strategy: the workload cannot be used (an input error)
        # under a strategy: the run's outcome, judged by the known deviations' raises signatures
        return WorkloadRun(strategy.num_replicas_in_sync, ctx.local_replica_ids, [], [], [], [], [],
                           Facts(factory_raised=True), None, failed(ctx, exc.original, FACTORY_RAISED))
    if stand_in:
        with strategy.scope():
            wl = stand_ins.build(wl, int(global_batch), seed)
    models, optimizers = workload.parts(wl)
    model, opt = next(iter(models.values())), next(iter(optimizers.values()))  # the one model (the canonical step's)
    variables = [v for m in models.values() for v in m.variables]
    names = [_prefixed(k, v) for k, m in models.items() for v in m.variables]
    trainable = [v for m in models.values() for v in m.trainable_variables]
    optimizer_variables = lambda: [v for o in optimizers.values() for v in compat.optimizer_variables(o)]  # noqa: E731
    built_variables = len(optimizer_variables())
    facts = _facts(ctx, wl, strategy, built_variables)
    batches = _dataset(ctx, wl, strategy, global_batch)
    try:
        first = next(batches)
    except StopIteration:
        raise workload.WorkloadError(f"workload {target!r}: its dataset is empty") from None
    masks = None
    if facts.random_layers and ctx.coordinator is None and ctx.spec.kind != "default" and len(models) == 1:
        saved = [np.array(compat.local_values(strategy, v)[0]) for v in model.variables]
        # the same input on every replica of every worker: ones shaped like one example
        x0 = tf.ones_like(tf.convert_to_tensor(tf.nest.flatten(strategy.experimental_local_results(first)[0])[0])[:1])
        try:
            masks = _masks(strategy, model, x0)
        except Exception as exc:  # the step will meet the same error (CentralStorage, Keras 3)
            raised = Raised.of(exc, "the model's random layers in training mode")
            facts.masks_raised = [raised.type, raised.message, list(raised.frames)]
            if isinstance(exc, tf.errors.OpError):
                ctx.request_restart()
        for v, value in zip(model.variables, saved):
            v.assign(value)
    for m in models.values():
        for layer in _layers(m):
            attr = _random_attr(layer)
            if attr:
                setattr(layer, attr, 0.0)
    if init is not None and init_names is not None:  # another build's values, matched variable by variable
        mine = [(n, tuple(v.shape), any(v is t for t in trainable)) for n, v in zip(names, variables)]
        theirs = [(n, tuple(np.shape(x)), t) for n, x, t in zip(init_names, init, init_trainable)]
        for v, i in zip(variables, matching.match(theirs, mine)):
            if i is not None:
                v.assign(np.asarray(init[i]))
    elif init is not None:
        if len(init) != len(variables):
            raise workload.WorkloadError(f"workload {target!r}: the factory built {len(variables)} model "
                                         f"variables here and {len(init)} for the reference: it must build the "
                                         "same model whatever the strategy")
        for v, value in zip(variables, init):
            v.assign(np.asarray(value))
    initial = [store.keep(np.array(compat.local_values(strategy, v)[0])) for v in variables]
    # each optimizer's gradients, over the variables of the model of its name (else every model's)
    captures = [_Capture(o, models[k].trainable_variables if k in models and len(optimizers) > 1 else trainable,
                         dense=dense_gradients) for k, o in optimizers.items()]
    facts.gradient_groups = [[k, len(c.variables)] for k, c in zip(optimizers, captures)]
    canonical_step = TrainStep(model, opt, wl.loss) if len(models) == 1 and len(optimizers) == 1 else None
    if canonical and canonical_step is None:
        raise workload.WorkloadError(f"workload {target!r}: the canonical step trains one model with one optimizer")
    user_step = wl.step if wl.step is not None and not canonical else None
    op = getattr(tf.distribute.ReduceOp, wl.loss_reduction)
    loss_names: list = []  # the names of the losses a step returns as a dict (set while tracing)

    def replica(batch):
        for c in captures:
            c.start()
        if user_step is not None:
            loss = user_step(batch)
        else:
            x, y = batch
            loss = canonical_step(x, y, global_batch_size=global_batch)
        if isinstance(loss, dict):  # one loss per model: a vector in the order of their names
            loss_names[:] = sorted(loss)
            loss = tf.stack([tf.cast(tf.convert_to_tensor(loss[k]), tf.float64) for k in loss_names])  # exact
        grads = [g for c in captures for g in c.take(zeros=len(captures) > 1)]
        return tf.convert_to_tensor(loss), _rows(batch), grads, _weight_sum(batch)

    def distributed(batch):
        per_replica = strategy.run(replica, args=(batch,))
        return (strategy.reduce(op, per_replica[0], axis=None),) + tuple(per_replica)

    step_fn = tf.function(distributed, reduce_retracing=True)
    history, raised, digests = [], None, []
    batch = first
    for k in range(1, steps + 1):
        ctx.progress(f"{ctx.spec.text}: step {k} of {steps}")  # the run's own engine: one device's runs under theirs
        if k > 1:
            try:
                batch = next(batches)
            except StopIteration:
                break
        penalties = {k: _regularization(m) for k, m in models.items()}
        regularization = None if None in penalties.values() else sum(penalties.values())
        if ctx.spec.kind == "default":  # what one device trains on, for the upgrade check: the same data on both
            digests.append(_digest(batch))
        try:
            if ctx.coordinator is not None:
                value = ctx.coordinator.schedule(step_fn, args=(batch,))
                ctx.coordinator.join()
                reported, losses, rows, grads, weights = value.fetch()
                losses, rows, grads, weights = [losses], [rows], [grads], [weights]
            else:
                reported, losses, rows, grads, weights = step_fn(batch)
                losses, rows = strategy.experimental_local_results(losses), strategy.experimental_local_results(rows)
                weights = strategy.experimental_local_results(weights)
                grads = [[strategy.experimental_local_results(g)[r] for g in grads] for r in range(len(losses))]
            examples = _examples(strategy, batch, len(losses)) if ctx.coordinator is None else None
        except Exception as exc:
            raised = failed(ctx, exc, f"step {k}")
            break
        reported = np.asarray(reported, np.float64)
        losses = [np.asarray(v, np.float64) for v in losses]
        named = None
        if loss_names:  # the step returned a loss per model: each reduced across the replicas, and its sum
            named = {name: {"loss": float(reported[i]), "replicas": [float(v[i]) for v in losses],
                            "regularization": penalties.get(name)} for i, name in enumerate(loss_names)}
        history.append(WorkloadStep(
            float(np.sum(reported)), [float(np.sum(v)) for v in losses], [int(np.asarray(v)) for v in rows],
            [store.copies(compat.local_values(strategy, v)) for v in variables],
            [store.copies(compat.local_values(strategy, v)) for v in optimizer_variables()],
            [[store.keep(np.asarray(g)) for g in gs] for gs in grads] if all(len(gs) for gs in grads) else None,
            {name: float(np.asarray(m.result())) for name, m in wl.metrics.items()}, regularization,
            None if any(float(np.asarray(w)) < 0 for w in weights) else [float(np.asarray(w)) for w in weights],
            named, examples))
    store.close()
    if store.large():
        ctx.replace_after()
    first_rows = sum(history[0].rows) if history else None
    facts.optimizer_variables_after = len(optimizer_variables())
    facts.first_batch_rows = first_rows
    facts.sparse_gradients = any(c.sparse for c in captures)
    facts.batch_digests = digests
    facts.random_ops = _random_ops(step_fn, first) if history else None
    return WorkloadRun(strategy.num_replicas_in_sync, ctx.local_replica_ids, names,
                       [any(v is t for t in trainable) for v in variables],
                       [_prefixed(k, v) for k, o in optimizers.items() for v in compat.optimizer_variables(o)],
                       initial, history, facts, masks, raised)


@probe
def environment(ctx):
    """The engine's TensorFlow and Keras versions (the check's header)."""
    return {"tensorflow": tf.__version__, "keras": compat.KERAS_VERSION, "pid": os.getpid()}
