"""Benchmark probes: a workload's train step built under the engine's strategy (or with no
strategy at all: the plain control), then timed K steps at a time by the engine's own clock.

``prepare`` builds a state (data pipeline, model, optimizer, step function, iterator) without
running it; the first ``run`` traces the step (the trace benchmark times that call); later
``run`` calls execute K steps and fetch the last loss, which waits for all K. Synchronous
strategies iterate a distributed dataset inside the ``tf.function`` (``next(iterator)`` in the
step); parameter servers schedule K closures on a per-worker dataset and join."""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

from suite.common.results import BenchRun, BenchState
from suite.engine import compat
from suite.engine.probes.registry import probe
from suite.engine.probes.tutorial import create_model
from suite.engine.steps import TrainStep, family_loss, reported
from suite.engine.workloads import fashion

keras = compat.keras
EXAMPLES = 4096  # rows in memory; the pipeline repeats them


def _data(workload: str):
    rng = np.random.default_rng(0)
    if workload == "linear":
        x = rng.normal(size=(EXAMPLES, 1)).astype(np.float32)
        return x, (3.0 * x + 2.0 + 0.1 * rng.normal(size=(EXAMPLES, 1))).astype(np.float32)
    if workload == "mlp":
        x = rng.normal(size=(EXAMPLES, 64)).astype(np.float32)
        w = rng.normal(size=(64, 10))
        return x, np.argmax(x @ w, axis=1).astype(np.int32)
    if workload == "cnn":
        (images, labels), _ = fashion.load_data(EXAMPLES, 1)
        return (images[..., None] / np.float32(255)).astype(np.float32), labels.astype(np.int32)
    raise KeyError(f"unknown workload {workload!r}")


# The linear and MLP workloads are members of the suite's model family (reference/model.py), built
# and scored by the same helpers as the training properties.
_FAMILY = {
    "linear": {"input_dim": 1, "hidden": (), "outputs": 1, "head": "linear", "l2": 1e-4},
    "mlp": {"input_dim": 64, "hidden": (256, 256), "outputs": 10, "head": "softmax", "l2": 1e-4},
}


def _model(workload: str):
    """Model, optimizer and per-example loss ``loss(y, out)`` of a workload."""
    if workload in _FAMILY:
        arch = _FAMILY[workload]
        optimizer = keras.optimizers.SGD(0.001) if workload == "linear" else keras.optimizers.Adam()
        return compat.build_model(arch, "float32"), optimizer, family_loss(arch)
    if workload == "cnn":
        return (create_model(), keras.optimizers.Adam(),
                lambda y, out: keras.losses.sparse_categorical_crossentropy(y, out, from_logits=True))
    raise KeyError(f"unknown workload {workload!r}")


class _State:
    def __init__(self, ctx, workload: str, global_batch: int, plain: bool):
        strategy = ctx.strategy
        x, y = ctx.cached(("bench-data", workload), lambda: _data(workload))
        self.coordinator = None if plain else ctx.coordinator

        def pipeline(batch):
            ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)
            return ds.prefetch(tf.data.AUTOTUNE)

        if plain:  # no strategy anywhere: the model, optimizer and step of a single-device loop
            model, opt, loss_fn = _model(workload)
            opt.build(model.trainable_variables)
            train_step = TrainStep(model, opt, loss_fn)  # compute_average_loss with no strategy: the mean

            @tf.function
            def step(iterator):
                return train_step(*next(iterator))

            self.iterator = iter(pipeline(global_batch))
        else:
            with strategy.scope():
                model, opt, loss_fn = _model(workload)
                opt.build(model.trainable_variables)  # see known deviation keras3-lazy-optimizer-slots-mirrored
            train_step = TrainStep(model, opt, loss_fn)

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
def prepare(ctx, workload: str, global_batch: int, key: str, plain: bool = False):
    """Build the state ``key`` (nothing runs yet). Earlier states of the same workload, batch
    and kind are dropped, so repeated trace rounds do not pile up."""
    group = (workload, global_batch, plain)
    for old in [k for k, v in ctx.cache.items() if isinstance(k, tuple) and k[0] == "bench" and v[0] == group]:
        del ctx.cache[old]
    state = _State(ctx, workload, global_batch, plain)
    ctx.cache[("bench", key)] = (group, state)
    replicas = 1 if plain else ctx.num_replicas
    return BenchState(replicas, global_batch, global_batch // replicas, state.parameters,
                      None if plain else compat.cross_device_ops_name(ctx.strategy),
                      "none (plain tf.function)" if plain else type(ctx.strategy).__name__,
                      tf.__version__, compat.KERAS_VERSION)


@probe
def run(ctx, key: str, steps: int):
    """Run ``steps`` train steps of state ``key``; the engine's own time for them (from the
    first dispatch to the fetched loss of the last) and the loss."""
    entry = ctx.cache.get(("bench", key))
    if entry is None:
        raise KeyError(f"no benchmark state {key!r} in this engine (prepare it first)")
    began = time.perf_counter()
    loss = entry[1].run(steps)
    return BenchRun(time.perf_counter() - began, loss)
