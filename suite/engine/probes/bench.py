"""Benchmark probes: a workload's train step built under the engine's strategy (or with no
strategy at all: the plain control), then timed K steps at a time by the engine's own clock.

A state can switch on one Keras building block (``BLOCKS``) in both the strategy's step and the
plain control: clipping (``global_clipnorm`` on the optimizer), mixed precision (the
``mixed_float16`` policy with a dynamic LossScaleOptimizer, the loss scaled and the gradients
unscaled as the mixed-precision guide's loop does), synchronized BatchNormalization (after each
hidden layer or convolution) and XLA (the replica's forward and backward pass compiled with
``jit_compile=True``; apply_gradients outside it, as Keras' own train step does).

``prepare`` builds a state (data pipeline, model, optimizer, step function, iterator) without
running it; the first ``run`` traces the step (the trace benchmark times that call); later
``run`` calls execute K steps and fetch the last loss, which waits for all K. Synchronous
strategies iterate a distributed dataset inside the ``tf.function`` (``next(iterator)`` in the
step); parameter servers schedule K closures on a per-worker dataset and join."""

from __future__ import annotations

import os
import time

import numpy as np
import tensorflow as tf

from ...common.catalog import BENCH_BLOCKS
from ...common.results import BenchRun, BenchState
from .. import compat
from .. import workload as user_workload
from ..steps import TrainStep, reported
from ..workloads import builtin
from .common import failed
from .registry import probe

keras = compat.keras


def _data(workload: str):
    return builtin.data(workload)


BLOCKS = tuple(BENCH_BLOCKS)
CLIPNORM = 1.0  # global_clipnorm of the clipping block
MIXED_POLICY = "mixed_float16"


def _model(workload: str, block: str | None = None):
    """Model, optimizer and per-example loss ``loss(y, out)`` of a workload, with ``block``."""
    if block is not None and block not in BLOCKS:
        raise KeyError(f"unknown block {block!r}; known: {', '.join(BLOCKS)}")
    dtype = MIXED_POLICY if block == "mixed_precision" else None
    options = {"global_clipnorm": CLIPNORM} if block == "clipping" else {}
    model, optimizer, loss = builtin.parts(workload, dtype, batch_norm=block == "sync_batch_norm", options=options)
    if block == "mixed_precision":  # float16 outputs: the loss in float32, as the guide casts them
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
        return model, optimizer, lambda y, out, loss=loss: loss(y, tf.cast(out, tf.float32))
    return model, optimizer, loss


def _built(block, model, opt, train_step) -> dict | None:
    """What the state's step has of its block, read back from the built objects (the harness
    checks it, so a block that silently fell away is not timed as if it were on)."""
    if block is None:
        return None
    layers = model.layers
    if block == "clipping":
        inner = getattr(opt, "inner_optimizer", opt)
        return {"global_clipnorm": float(inner.global_clipnorm) if inner.global_clipnorm is not None else None}
    if block == "mixed_precision":
        return {"compute_dtype": layers[0].compute_dtype, "variable_dtype": layers[0].variable_dtype,
                "loss_scale_optimizer": train_step.loss_scaling}
    if block == "sync_batch_norm":
        norms = [layer for layer in layers if isinstance(layer, keras.layers.BatchNormalization)]
        return {"batch_norm_layers": len(norms), "synchronized": all(bool(getattr(n, "synchronized", False)) for n in norms)}
    return {"jit_compile": bool(getattr(train_step.losses_and_grads, "_jit_compile", False))}


def _user_state(state, ctx, target: str, global_batch: int, plain: bool, path: str | None = None, seed: int = 0):
    """A user's workload (``package.module:factory``, suite/engine/workload.py): its own step (or
    the canonical one) on its own dataset, repeated; with no strategy for the plain control. Built
    as the loop check builds it (suite/engine/probes/workload.py ``run``): the module (re)loaded from
    ``path`` (the folder pytest ran from; default the engine's), Keras' seeds set, the factory called
    in the strategy's scope with the strategy's replicas in sync. Unlike the check, op determinism
    stays off and random layers stay on: this times the loop as it trains."""
    strategy = tf.distribute.get_strategy() if plain else ctx.strategy
    replicas = 1 if plain else strategy.num_replicas_in_sync
    keras.utils.set_random_seed(seed)
    wl = user_workload.build(target, user_workload.WorkloadContext(strategy, global_batch, replicas, seed),
                             path or os.getcwd())
    canonical = TrainStep(wl.model, wl.optimizer, wl.loss)

    def replica_step(batch):
        if wl.step is None:
            return canonical(*batch, global_batch_size=global_batch)
        loss = wl.step(batch)  # a loss per model (several models and optimizers): their sum is the step's
        return tf.add_n([tf.cast(v, tf.float32) for v in loss.values()]) if isinstance(loss, dict) else loss

    op = getattr(tf.distribute.ReduceOp, wl.loss_reduction)
    if plain:
        state.iterator = iter(wl.dataset(global_batch, None).repeat())
        state.step = tf.function(lambda iterator: replica_step(next(iterator)))
    else:
        @tf.function
        def step(iterator):
            return strategy.reduce(op, strategy.run(replica_step, args=(next(iterator),)), axis=None)

        state.step = step
        if state.coordinator is not None:
            state.iterator = iter(state.coordinator.create_per_worker_dataset(
                lambda: wl.dataset(global_batch, None).repeat()))
        elif wl.distribute == "function":
            state.iterator = iter(strategy.distribute_datasets_from_function(
                lambda ic: wl.dataset(global_batch, ic).repeat()))
        else:
            state.iterator = iter(strategy.experimental_distribute_dataset(wl.dataset(global_batch, None).repeat()))
    models, _ = user_workload.parts(wl)
    state.parameters = int(sum(np.prod(v.shape) for m in models.values() for v in m.trainable_variables))
    state.built = None


class _State:
    def __init__(self, ctx, workload: str, global_batch: int, plain: bool, block: str | None = None,
                 path: str | None = None):
        strategy = ctx.strategy
        self.block = block
        if ":" in workload:  # a user's workload: package.module:factory
            self.coordinator = None if plain else ctx.coordinator
            return _user_state(self, ctx, workload, global_batch, plain, path)
        jit = block == "xla"
        x, y = ctx.cached(("bench-data", workload), lambda: _data(workload))
        self.coordinator = None if plain else ctx.coordinator

        def pipeline(batch):
            ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)
            return ds.prefetch(tf.data.AUTOTUNE)

        if plain:  # no strategy anywhere: the model, optimizer and step of a single-device loop
            model, opt, loss_fn = _model(workload, block)
            opt.build(model.trainable_variables)
            train_step = TrainStep(model, opt, loss_fn, jit=jit)  # compute_average_loss with no strategy: the mean

            @tf.function
            def step(iterator):
                return train_step(*next(iterator))

            self.iterator = iter(pipeline(global_batch))
        else:
            with strategy.scope():
                model, opt, loss_fn = _model(workload, block)
                opt.build(model.trainable_variables)  # see known deviation keras3-lazy-optimizer-slots-mirrored
            train_step = TrainStep(model, opt, loss_fn, jit=jit)

            @tf.function
            def step(iterator):
                losses = strategy.run(train_step, args=next(iterator), kwargs={"global_batch_size": global_batch})
                return reported(strategy, losses)

            if self.coordinator is not None:  # one replica per step: the step's batch is the global batch
                self.iterator = iter(self.coordinator.create_per_worker_dataset(lambda: pipeline(global_batch)))
            else:
                ds = pipeline(global_batch)
                if ctx.spec.is_multi_worker:
                    options = tf.data.Options()
                    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
                    ds = ds.with_options(options)
                self.iterator = iter(strategy.experimental_distribute_dataset(ds))
        self.step = step
        self.parameters = int(sum(np.prod(v.shape) for v in model.trainable_variables))
        self.built = _built(block, model, opt, train_step)

    def run(self, steps: int) -> float:
        if self.coordinator is not None:
            for _ in range(steps):
                result = self.coordinator.schedule(self.step, args=(self.iterator,))
            self.coordinator.join()
            return float(result.fetch())
        for _ in range(steps):
            loss = self.step(self.iterator)
        return float(loss)  # fetching the value waits for the last step, which waits for the others


@probe
def prepare(ctx, workload: str, global_batch: int, key: str, plain: bool = False, block: str | None = None,
            path: str | None = None):
    """Build the state ``key`` (nothing runs yet) with ``block`` (one of ``BLOCKS``) or none.
    ``workload`` is a built-in workload's name or a user's ``package.module:factory``, imported
    from ``path`` (the harness's folder). Earlier states of the same workload, batch, kind and
    block are dropped, so repeated trace rounds do not pile up."""
    group = (workload, global_batch, plain, block)
    for old in [k for k, v in ctx.cache.items() if isinstance(k, tuple) and k[0] == "bench" and v[0] == group]:
        del ctx.cache[old]
    try:
        state = _State(ctx, workload, global_batch, plain, block, path)
    except Exception as exc:
        if block is None:
            raise
        return failed(ctx, exc, f"bench.prepare({workload}, block={block})")
    ctx.cache[("bench", key)] = (group, state)
    replicas = 1 if plain else ctx.num_replicas
    return BenchState(replicas, global_batch, global_batch // replicas, state.parameters,
                      None if plain else compat.cross_device_ops_name(ctx.strategy),
                      "none (plain tf.function)" if plain else type(ctx.strategy).__name__,
                      tf.__version__, compat.KERAS_VERSION, state.built)


@probe
def run(ctx, key: str, steps: int):
    """Run ``steps`` train steps of state ``key``; the engine's own time for them (from the
    first dispatch to the fetched loss of the last) and the loss. A state with a block returns
    the exception of a step that raised (a block TensorFlow does not support under the
    strategy: the harness decides)."""
    entry = ctx.cache.get(("bench", key))
    if entry is None:
        raise KeyError(f"no benchmark state {key!r} in this engine (prepare it first)")
    began = time.perf_counter()
    try:
        loss = entry[1].run(steps)
    except Exception as exc:
        if entry[1].block is None:
            raise
        return failed(ctx, exc, f"bench.run({key}, block={entry[1].block})")
    return BenchRun(time.perf_counter() - began, loss)
