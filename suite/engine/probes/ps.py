"""Parameter-server probes: steps scheduled with a ClusterCoordinator onto the cluster's
workers, reading their inputs from per-worker datasets; variables live on the ps tasks."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ...common.results import ExactlyOnce, Partition, PsLossScaling, PsTraining, Raised
from .. import compat
from ..steps import TrainStep, arch_key, family_loss, family_model_and_optimizer, load, optimizer_state
from .common import counted
from .registry import probe


def _coordinator(ctx):
    if ctx.coordinator is None:
        raise ValueError(f"{ctx.spec.text} is not a parameter-server spec")
    return ctx.coordinator


def _batches_dataset_fn(xs: list, ys: list):
    """A dataset_fn whose dataset yields the given batches in order (sizes may differ): the
    rows are one constant, cut by offsets."""
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in xs])]).astype(np.int64)
    x_all = np.concatenate(xs) if xs else np.zeros((0,))
    y_all = np.concatenate(ys) if ys else np.zeros((0,))

    def dataset_fn():
        x_t, y_t, o_t = tf.constant(x_all), tf.constant(y_all), tf.constant(offsets)
        return tf.data.Dataset.range(len(xs)).map(lambda i: (x_t[o_t[i]:o_t[i + 1]], y_t[o_t[i]:o_t[i + 1]]))

    return dataset_fn


def _trainer(ctx, arch, optimizer, dtype, denominator):
    """Model and optimizer on the ps tasks (the optimizer's initial state snapshotted), and a
    worker step ``step(x, y)`` running ``strategy.run`` of one custom-loop step."""
    strategy = ctx.strategy
    model, opt = family_model_and_optimizer(strategy, arch, optimizer, dtype)
    gbs = None if denominator in ("global", "default") else int(denominator)
    train_step = TrainStep(model, opt, family_loss(arch))

    @tf.function
    def from_iterator(iterator):
        counted(ctx, "ps.train(per-worker dataset)")
        return strategy.run(train_step, args=next(iterator), kwargs={"global_batch_size": gbs})

    y_spec = (tf.TensorSpec([None], tf.int32) if arch["head"] == "softmax"
              else tf.TensorSpec([None, arch["outputs"]], dtype))

    @tf.function(input_signature=[tf.TensorSpec([None, arch["input_dim"]], dtype), y_spec])
    def from_arguments(x, y):
        counted(ctx, "ps.train(arguments)")
        return strategy.run(train_step, args=(x, y), kwargs={"global_batch_size": gbs})

    return model, opt, optimizer_state(opt), from_iterator, from_arguments


@probe
def train(ctx, arch, optimizer, dtype, params, steps, denominator="global", mode="pipelined"):
    """Custom-loop steps of the model family with variables on the ps tasks: parameters set,
    optimizer reset, then one scheduled step per batch ``(x, y, sizes)``.

    ``mode="pipelined"``: the batches come from a per-worker dataset, every step is scheduled
    at once and ``join()`` waits for all (the closures run in order only with one worker).
    ``mode="sequential"``: each step's batch is passed to ``schedule`` and joined before the
    next is scheduled, so the steps are ordered whichever worker runs them.
    Returns each step's fetched loss, the variables, the optimizer's iterations and the
    variables' devices."""
    coordinator = _coordinator(ctx)
    key = ("ps.train", arch_key(arch), optimizer, dtype, denominator)
    model, opt, initial, from_iterator, from_arguments = ctx.cached(
        key, lambda: _trainer(ctx, arch, optimizer, dtype, denominator))
    load(model, params, dtype, opt, initial)
    xs = [np.asarray(x, dtype) for x, _, _ in steps]
    ys = [np.asarray(y, np.int32 if arch["head"] == "softmax" else dtype) for _, y, _ in steps]
    if mode == "pipelined":
        iterator = iter(coordinator.create_per_worker_dataset(_batches_dataset_fn(xs, ys)))
        losses = [coordinator.schedule(from_iterator, args=(iterator,)) for _ in steps]
        coordinator.join()
    elif mode == "sequential":
        losses = []
        for x, y in zip(xs, ys):
            losses.append(coordinator.schedule(from_arguments, args=(tf.constant(x), tf.constant(y))))
            coordinator.join()
    else:
        raise ValueError(f"mode must be 'pipelined' or 'sequential', not {mode!r}")
    return PsTraining([r.fetch() for r in losses], [v.numpy() for v in model.trainable_variables],
                      int(compat.tf_variable(opt.iterations).numpy()),
                      sorted({compat.tf_variable(v).device for v in model.trainable_variables}))


def _recorded_increments(opt):
    """Make a Keras 3 optimizer's ``iterations.assign_add`` also record, per traced call, the tensor
    it returns: ``assign(self + value)`` returns ``self + value``, the value read plus 1, which is
    exactly what the step wrote. The wrapper calls Keras' own method and returns its result, so
    the ops are Keras' own. Keras 3.0-3.4 keep the counter in ``iterations`` (not ``_iterations``)
    and their ``assign_add`` returns nothing: there the value is the one it hands ``assign``.
    Returns the list the traced calls append to, or None for a Keras 2 ``tf.Variable`` (an atomic
    ``AssignAddVariableOp``, whose result is a second read)."""
    var = getattr(opt, "_iterations", None)
    var = getattr(opt, "iterations", None) if var is None else var
    if var is None or isinstance(var, tf.Variable) or not hasattr(var, "assign_add"):
        return None
    original, written = var.assign_add, []

    def assign_add(value):
        handed = []
        keras_assign = var.assign

        def assign(new, *args, **kwargs):
            handed.append(new)
            return keras_assign(new, *args, **kwargs)

        var.assign = assign
        try:
            out = original(value)
        finally:
            del var.assign  # Keras' own method again
        written.append(out if out is not None else handed[0])
        return out

    var.assign_add = assign_add
    return written


def _worker_index():
    """The index of the worker running the scheduled function (a call-time capture), or -1 where
    this TensorFlow has no ``experimental_get_current_worker_index``."""
    get = getattr(getattr(tf.distribute, "coordinator", None), "experimental_get_current_worker_index", None)
    return get() if get is not None else tf.constant(-1, tf.int64)


def _exactly_once_state(ctx, dtype, n, optimizer):
    """Variables (on the ps), a Keras SGD with learning rate 1 (or none: ``assign_sub``), a
    per-worker dataset of ones, and the traced worker step, kept for every call of this shape.
    The step returns its loss, the worker that ran it and the value it wrote into the Keras
    optimizer's iterations (-1 when not observable)."""
    strategy, coordinator = ctx.strategy, _coordinator(ctx)
    with strategy.scope():
        w = tf.Variable(np.zeros(n, dtype), name="w")
        count = tf.Variable(0, dtype=tf.int64, name="count")
        opt = compat.make_optimizer("SGD", {"learning_rate": 1.0}) if optimizer == "keras" else None
        if opt is not None:
            opt.build([w])
    written = _recorded_increments(opt) if opt is not None else None
    iterator = iter(coordinator.create_per_worker_dataset(
        lambda: tf.data.Dataset.from_tensors(tf.ones([n], dtype)).repeat()))

    @tf.function
    def worker_step(iterator, c, lr):
        counted(ctx, "ps.exactly_once")

        def replica_fn(ones, c, lr):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w * c * ones)  # one element of the per-worker dataset per step
            grad = tape.gradient(loss, w)
            before = len(written) if written is not None else 0
            if opt is not None:
                opt.apply_gradients([(lr * grad, w)])  # learning rate 1: the update is lr * c
            else:
                w.assign_sub(lr * grad)
            count.assign_add(1)
            wrote = written[before:] if written is not None else []
            return loss, tf.cast(wrote[0], tf.int64) if len(wrote) == 1 else tf.constant(-1, tf.int64)

        loss, wrote = strategy.run(replica_fn, args=(next(iterator), c, lr))
        return loss, _worker_index(), wrote

    return w, count, opt, iterator, worker_step


@probe
def exactly_once(ctx, w0, c, lr, steps, optimizer="keras"):
    """``steps`` closures scheduled over all workers at once, each taking one element of a
    per-worker dataset and doing SGD on ``loss = sum(w * c)`` (gradient ``c`` whatever ``w``)
    with a Keras SGD optimizer (``optimizer="keras"``) or ``assign_sub``, and counting itself
    in an int64 variable. Returns w, the count, the number of fetched results and the Keras
    optimizer's iterations, with each step's worker and the value it wrote into iterations
    (``steps``, None unless every step's write was observed)."""
    coordinator = _coordinator(ctx)
    w0 = np.asarray(w0)
    dtype = w0.dtype.name
    w, count, opt, iterator, worker_step = ctx.cached(
        ("ps.exactly_once", dtype, len(w0), optimizer), lambda: _exactly_once_state(ctx, dtype, len(w0), optimizer))
    w.assign(w0)
    count.assign(0)
    if opt is not None:
        compat.tf_variable(opt.iterations).assign(0)
    args = (iterator, tf.constant(np.asarray(c, dtype)), tf.constant(lr, dtype))
    results = [coordinator.schedule(worker_step, args=args) for _ in range(steps)]
    coordinator.join()
    fetched = [r.fetch() for r in results]
    steps_seen = [[int(worker), int(wrote)] for _, worker, wrote in fetched]
    observed = opt is not None and all(worker >= 0 and wrote >= 0 for worker, wrote in steps_seen)
    return ExactlyOnce(w.numpy(), int(count.numpy()), len(fetched),
                       int(compat.tf_variable(opt.iterations).numpy()) if opt is not None else None,
                       steps_seen if observed else None)


def _partitioner(kind, params):
    parts = tf.distribute.experimental.partitioners
    if kind == "fixed":
        return parts.FixedShardsPartitioner(num_shards=params["num_shards"])
    if kind == "min_size":
        return parts.MinSizePartitioner(min_shard_bytes=params["min_shard_bytes"], max_shards=params["max_shards"])
    raise ValueError(f"unknown partitioner {kind!r}")


@probe
def partition(ctx, value, kind, params):
    """A variable created with ``value`` under the scope while the strategy's partitioner is
    ``kind(params)`` (set on the strategy for this one creation: ParameterServerStrategy takes
    it at construction only, and a second strategy in one coordinator would reconnect the
    cluster). Returns each shard's rows, ps task and value, and the reassembled value."""
    strategy = ctx.strategy
    value = np.asarray(value)
    extended = strategy.extended
    saved = extended._variable_partitioner
    extended._variable_partitioner = _partitioner(kind, params)
    try:
        with strategy.scope():
            var = tf.Variable(value, name="partitioned")
    finally:
        extended._variable_partitioner = saved
    shards = list(getattr(var, "variables", [var]))
    whole = tf.convert_to_tensor(var).numpy()
    return Partition(type(var).__name__, [int(s.shape[0]) for s in shards],
                     [tf.DeviceSpec.from_string(s.device).task for s in shards], [s.numpy() for s in shards], whole,
                     np.concatenate([s.numpy() for s in shards]) if shards else value[:0])


def _scaling_steps(ctx, dtype, weighted, with_gbs, reduction):
    strategy = ctx.strategy
    vec = tf.TensorSpec([None], dtype)

    @tf.function(input_signature=[vec, vec, tf.TensorSpec([], tf.int64)])
    def average(values, w, gbs):
        counted(ctx, "ps.loss_scaling")

        def replica_fn(v, w, gbs):
            avg = tf.nn.compute_average_loss(v, sample_weight=w if weighted else None,
                                             global_batch_size=gbs if with_gbs else None)
            return avg, tf.distribute.get_replica_context().num_replicas_in_sync

        return strategy.run(replica_fn, args=(values, w, gbs))

    @tf.function(input_signature=[vec])
    def keras_loss(values):
        counted(ctx, "ps.loss_scaling(keras)")

        def replica_fn(v):
            loss = compat.make_loss("mae", reduction, dtype)(tf.zeros_like(v)[:, None], v[:, None])
            return tf.cast(loss, v.dtype)

        return strategy.run(replica_fn, args=(values,))

    return average, keras_loss


@probe
def loss_scaling(ctx, per_example, weights=None, global_batch_size=None, reduction="sum_over_batch_size"):
    """``num_replicas_in_sync`` outside and inside a scheduled ``strategy.run``; there,
    ``compute_average_loss`` of ``per_example`` (optional sample weights and global batch
    size), and a Keras mean absolute error with ``reduction`` of predictions ``per_example``
    against zeros (per-example values ``|per_example|``), or the error it raised."""
    strategy, coordinator = ctx.strategy, _coordinator(ctx)
    per_example = np.asarray(per_example)
    dtype = per_example.dtype.name
    w = np.asarray(weights if weights is not None else np.ones_like(per_example), dtype)
    average, keras_loss = ctx.cached(
        ("ps.loss_scaling", dtype, weights is not None, global_batch_size is not None, reduction),
        lambda: _scaling_steps(ctx, dtype, weights is not None, global_batch_size is not None, reduction))
    remote = coordinator.schedule(average, args=(tf.constant(per_example), tf.constant(w),
                                                 tf.constant(global_batch_size or 0, tf.int64)))
    coordinator.join()
    avg, replicas = remote.fetch()
    keras_value = raised = None
    try:
        remote = coordinator.schedule(keras_loss, args=(tf.constant(per_example),))
        coordinator.join()
        keras_value = remote.fetch()
    except Exception as exc:  # Keras 2 refuses some reductions under a strategy
        raised = Raised.of(exc, f"ps.loss_scaling: Keras loss with reduction {reduction!r} in a scheduled step")
    return PsLossScaling(strategy.num_replicas_in_sync, int(replicas), avg, keras_value, raised)
