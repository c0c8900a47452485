"""Training probes: custom-loop steps of the model family under the strategy, reading every
replica's copy of every variable after every step; optimizer variables created lazily."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ...common.results import Epoch, EpochTraining, Fitted, FittedEpochs, LazyOptimizer, Step, Training
from .. import compat
from .. import steps as train_steps
from ..steps import TrainStep, arch_key, family_loss, family_model_and_optimizer, load, optimizer_state, reported
from .common import counted, failed, local, replica_slice
from .registry import probe


def _trainer(ctx, arch, optimizer, dtype, default_denominator, metrics=None, options=None, jit="none"):
    """Model, optimizer (built eagerly, its initial state snapshotted; ``options`` added to its
    arguments) and traced step; ``jit``: XLA on the replica's forward and backward pass
    (``"replica"``) or on the whole step around strategy.run (``"step"``).

    With ``metrics`` (a dict to fill), the step also updates, on each replica, a Mean of the
    per-example losses and an int64 Sum counting examples (sync-on-read state)."""
    strategy = ctx.strategy
    options = train_steps.optimizer_options(strategy, options)
    model, opt = family_model_and_optimizer(strategy, arch, optimizer, dtype, options)
    observe = None
    if metrics is not None:
        with strategy.scope():
            metrics["loss"] = compat.make_metric("mean", dtype)
            metrics["examples"] = compat.make_metric("sum", "int64")

        def observe(per_example, x):
            metrics["loss"].update_state(per_example)
            metrics["examples"].update_state(tf.shape(x, out_type=tf.int64)[:1])

    train_step = TrainStep(model, opt, family_loss(arch), observe, jit=jit == "replica")
    y_dtype = tf.int32 if arch["head"] == "softmax" else tf.as_dtype(dtype)
    y_shape = [None] if arch["head"] == "softmax" else [None, arch["outputs"]]

    @tf.function(input_signature=[tf.TensorSpec([None, arch["input_dim"]], dtype),
                                  tf.TensorSpec(y_shape, y_dtype), tf.TensorSpec([None], tf.int32),
                                  tf.TensorSpec([], tf.int64)], jit_compile=True if jit == "step" else None)
    def step(x, y, sizes, gbs):
        counted(ctx, "training.train")
        per_replica = strategy.run(lambda: train_step(*replica_slice(sizes, x, y),
                                                      global_batch_size=None if default_denominator else gbs))
        return reported(strategy, per_replica)

    return model, opt, optimizer_state(opt), step


@probe
def train(ctx, arch, optimizer, dtype, params, steps, denominator="global", options=None, jit="none"):
    """Set the model's parameters, reset the optimizer, run the steps ``(x, y, sizes)``;
    return per step the SUM-reduced loss and every local replica's copy of every variable,
    and at the end the optimizer's iteration count. ``options``: keyword arguments added to
    the optimizer's (the blocks: ``clipnorm``, ``clipvalue``, ``global_clipnorm``,
    ``weight_decay``); ``jit``: the step compiled with XLA (see ``_trainer``), a failure to
    compile or run it returned as the exception."""
    key = ("train", arch_key(arch), optimizer, dtype, denominator, tuple(sorted((options or {}).items())), jit)
    model, opt, initial, step = ctx.cached(
        key, lambda: _trainer(ctx, arch, optimizer, dtype, denominator == "default", options=options, jit=jit))
    load(model, params, dtype, opt, initial)
    averages = getattr(opt, "_model_variables_moving_average", None) if (options or {}).get("use_ema") else None
    for average, value in zip(averages or [], params):  # as if the optimizer were built on these parameters
        average.assign(np.asarray(value, dtype))
    blocks = bool(options) or jit != "none"  # a block's failure comes back as the exception
    history = []
    for x, y, sizes in steps:
        try:
            loss = step(x, y, np.asarray(sizes, np.int32), np.int64(len(x)))
        except Exception as exc:
            if not blocks:
                raise
            return failed(ctx, exc, f"training.train(jit={jit}, {sorted(options or {})}): step {len(history) + 1}")
        history.append(Step(loss, [compat.local_values(ctx.strategy, v) for v in model.trainable_variables],
                            [compat.local_values(ctx.strategy, a) for a in averages] if averages else None))
    return Training(history, compat.iterations(opt))


def _compiled_loss(arch: dict):
    """The model family's loss as ``compile`` takes it (default reduction, sum over batch size)."""
    if arch["head"] == "linear":
        return compat.keras.losses.MeanSquaredError()
    return compat.keras.losses.SparseCategoricalCrossentropy()


@probe
def fit(ctx, arch, optimizer, dtype, params, x, y, batch, steps_per_execution=1):
    """``Model.fit`` of the model family (compiled under the scope with the family's loss and
    ``steps_per_execution``) for one epoch over ``Dataset.from_tensor_slices((x, y)).batch(batch)``,
    unshuffled, from ``params``: at each train-batch boundary the logs' loss and every local
    replica's copy of every variable; what fit raised, as the outcome."""
    strategy = ctx.strategy
    model, opt = family_model_and_optimizer(strategy, arch, optimizer, dtype)
    with strategy.scope():
        model.compile(optimizer=opt, loss=_compiled_loss(arch), steps_per_execution=steps_per_execution)
    load(model, params, dtype)
    steps, history = [], []

    class Boundaries(compat.keras.callbacks.Callback):
        def on_train_batch_end(self, index, logs=None):
            # the steps run so far, by the optimizer's count: the batch index fit passes with several steps an
            # execution is the execution's first step in Keras 3.0-3.4, its last from 3.5
            steps.append(compat.iterations(opt))
            history.append(Step(float((logs or {})["loss"]),
                                [compat.local_values(strategy, v) for v in model.trainable_variables]))

    y = np.asarray(y, np.int32 if arch["head"] == "softmax" else dtype)
    data = tf.data.Dataset.from_tensor_slices((np.asarray(x, dtype), y)).batch(batch)
    try:
        model.fit(data, epochs=1, shuffle=False, verbose=0, callbacks=[Boundaries()])
    except Exception as exc:
        return failed(ctx, exc, f"training.fit(steps_per_execution={steps_per_execution}): step {len(steps) + 1}")
    return Fitted(steps, history, compat.iterations(opt))


def optimizer_under(strategy, name):
    """A Keras optimizer ``name`` with its default arguments, created under ``strategy``'s scope."""
    with strategy.scope():
        return getattr(compat.keras.optimizers, name)()


@probe
def fit_epochs(ctx, kernel, learning_rate, rows, epochs):
    """``Model.fit`` for ``epochs`` epochs of a one-weight linear model (no bias; compiled under the scope
    with mse and SGD(``learning_rate``); the weight ``kernel``) over a dataset whose iteration k (from 0)
    is one batch of ``rows`` examples with the feature k + 1 and the label 0: a generator the dataset
    calls again each time it is iterated. After each epoch, every local replica's copy of the weight,
    and how many iterations of the dataset had begun."""
    strategy = ctx.strategy
    began = []

    def generate():
        began.append(len(began))
        for _ in range(rows):
            yield np.array([float(len(began))], np.float32), np.array([0.0], np.float32)

    signature = (tf.TensorSpec((1,), tf.float32), tf.TensorSpec((1,), tf.float32))
    data = tf.data.Dataset.from_generator(generate, output_signature=signature).batch(rows)
    with strategy.scope():
        model = compat.keras.Sequential([compat.keras.Input((1,)), compat.keras.layers.Dense(
            1, use_bias=False, kernel_initializer=compat.keras.initializers.Constant(kernel))])
        model.compile(optimizer=compat.keras.optimizers.SGD(learning_rate), loss="mse")
    kernels = []

    class Epochs(compat.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            kernels.append([float(np.asarray(c).reshape(())) for c in
                            compat.local_values(strategy, model.trainable_variables[0])])

    try:
        model.fit(data, epochs=epochs, verbose=0, callbacks=[Epochs()])
    except Exception as exc:
        return failed(ctx, exc, f"training.fit_epochs: epoch {len(kernels) + 1}")
    return FittedEpochs(kernels, len(began))


@probe
def lazy_optimizer(ctx, name, lazy_model=False):
    """A fresh model and optimizer ``name`` (default arguments) created under the scope; the
    first ``apply_gradients`` runs inside a distributed tf.function step and so creates the
    optimizer's variables there. ``lazy_model``: the model has no Input either (as TensorFlow's
    custom-training tutorial builds it), so its first call in that step creates its variables too.
    Returns what was created and whether copies agree."""
    strategy = ctx.strategy
    with strategy.scope():
        if lazy_model:
            model = compat.keras.Sequential([compat.keras.layers.Dense(1)])
        else:
            model = compat.build_model({"input_dim": 2, "hidden": [], "outputs": 1, "head": "linear", "l2": 0.0},
                                       "float32")
    opt = optimizer_under(strategy, name)
    before = [] if lazy_model else [v.numpy() for v in model.trainable_variables]  # (Keras 2 refuses to list none)
    x = tf.constant([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [-2.0, 1.0]])
    y = tf.constant([[1.0], [0.0], [2.0], [-1.0]])
    train_step = TrainStep(model, opt, compat.keras.losses.mse)

    @tf.function
    def step():
        return strategy.run(lambda: train_step(x, y, global_batch_size=4))

    try:
        step()
        step()
    except Exception as exc:
        return failed(ctx, exc, f"training.lazy_optimizer({name}): the first distributed step")
    variables = compat.optimizer_variables(opt)
    everything = list(variables) + list(model.trainable_variables)
    names = [compat.tf_variable(v).name.split(":")[0] for v in everything]
    disagreeing = [name for name, v in zip(names, everything) if not all(
        np.array_equal(c, local(strategy, compat.tf_variable(v))[0]) for c in local(strategy, compat.tf_variable(v)))]
    return LazyOptimizer(len(variables), int(compat.tf_variable(opt.iterations).numpy()),
                         sorted({type(compat.tf_variable(v)).__name__ for v in variables}), sorted(names),
                         sorted(disagreeing),
                         any(not np.array_equal(b, v.numpy()) for b, v in zip(before, model.trainable_variables)))


@probe
def optimizer_names(ctx):
    return compat.builtin_optimizer_names()


@probe
def train_dataset(ctx, arch, optimizer, dtype, params, x, y, global_batch, epochs, denominator):
    """Train from ``experimental_distribute_dataset(from_tensor_slices((x, y)).batch(G))`` for
    ``epochs`` epochs, with ``compute_average_loss(global_batch_size=G)`` (``denominator="constant"``,
    the guide's GLOBAL_BATCH_SIZE) or its default; return every replica's copy of every
    variable after each epoch, and each step's replica batch sizes."""
    strategy = ctx.strategy
    constant = denominator == "constant"

    def build():
        model, opt = family_model_and_optimizer(strategy, arch, optimizer, dtype)
        train_step = TrainStep(model, opt, family_loss(arch))

        # Iterated eagerly, a distributed dataset gives each replica's batch its static shape, so
        # every new split would retrace (the guide's step does); reduce_retracing generalises the
        # shapes after the first traces (static shapes, empty replicas included), as
        # element_spec would
        # named for the deviations' origin: a graph error names the function it ran in ([Op:__inference_NAME_N])
        @tf.function(reduce_retracing=True)
        def train_dataset_step(batch, g):
            counted(ctx, "training.train_dataset")
            # G is a tensor argument (one trace for every G), as the guide's constant would be
            return strategy.run(lambda xs, ys: (train_step(xs, ys, g if constant else None), tf.shape(xs)[0]),
                                args=batch)[1]

        return model, opt, optimizer_state(opt), train_dataset_step

    model, opt, initial, step = ctx.cached(("train_dataset", arch_key(arch), optimizer, dtype, constant), build)
    load(model, params, dtype, opt, initial)
    dist = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch))
    g = np.int64(global_batch)
    epochs_out = []
    for _ in range(epochs):
        sizes = [[int(n) for n in local(strategy, step(batch, g))] for batch in dist]
        epochs_out.append(Epoch(sizes, [compat.local_values(strategy, v) for v in model.trainable_variables]))
    return EpochTraining(epochs_out)
