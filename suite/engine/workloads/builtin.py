"""The suite's built-in workloads, written against the workload protocol (suite/engine/workload.py):
the distributed-training guide's linear model, an MLP, and the custom-training tutorial's CNN.
The benchmarks build theirs from the same parts (suite/engine/probes/bench.py), and the check of
a user's loop runs them like any user's (``python -m suite.check suite.engine.workloads.builtin:cnn``)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from .. import compat
from ..steps import family_loss
from ..workload import Workload
from . import fashion

keras = compat.keras
EXAMPLES = 4096  # the benchmarks' rows in memory (their pipeline repeats them)

# The linear and MLP workloads are members of the suite's model family (reference/model.py), built
# and scored by the same helpers as the training properties.
FAMILY = {
    "linear": {"input_dim": 1, "hidden": (), "outputs": 1, "head": "linear", "l2": 1e-4},
    "mlp": {"input_dim": 64, "hidden": (256, 256), "outputs": 10, "head": "softmax", "l2": 1e-4},
}
NAMES = ("linear", "mlp", "cnn")


def data(name: str, examples: int = EXAMPLES):
    """``(x, y)`` of a workload: deterministic (numpy's PCG64, seed 0), nothing downloaded."""
    rng = np.random.default_rng(0)
    if name == "linear":
        x = rng.normal(size=(examples, 1)).astype(np.float32)
        return x, (3.0 * x + 2.0 + 0.1 * rng.normal(size=(examples, 1))).astype(np.float32)
    if name == "mlp":
        x = rng.normal(size=(examples, 64)).astype(np.float32)
        w = rng.normal(size=(64, 10))
        return x, np.argmax(x @ w, axis=1).astype(np.int32)
    if name == "cnn":
        (images, labels), _ = fashion.load_data(examples, 1)
        return (images[..., None] / np.float32(255)).astype(np.float32), labels.astype(np.int32)
    raise KeyError(f"unknown workload {name!r}; known: {', '.join(NAMES)}")


def cnn_model(dtype=None, batch_norm=False):
    """The guide's model: Conv2D 32 3x3 relu, MaxPool, Conv2D 64 3x3 relu, MaxPool, Flatten,
    Dense 64 relu, Dense 10 (logits). The benchmarks' blocks: ``dtype`` a layer dtype policy
    (``mixed_float16``), ``batch_norm`` a synchronized BatchNormalization after each convolution."""
    def conv(filters):
        layer = [keras.layers.Conv2D(filters, 3, activation="relu", dtype=dtype)]
        if batch_norm:
            layer.append(keras.layers.BatchNormalization(synchronized=True, dtype=dtype))
        return layer + [keras.layers.MaxPooling2D(dtype=dtype)]

    return keras.Sequential([
        keras.Input((28, 28, 1)), *conv(32), *conv(64), keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(64, activation="relu", dtype=dtype), keras.layers.Dense(10, dtype=dtype)])


def parts(name: str, dtype: str | None = None, batch_norm: bool = False, options: dict | None = None):
    """Model, optimizer (with keyword ``options`` such as ``global_clipnorm``) and per-example
    loss ``loss(y, out)`` of a workload; ``dtype`` a layer dtype policy, ``batch_norm`` a
    synchronized BatchNormalization after each hidden layer or convolution."""
    options = options or {}
    if name in FAMILY:
        arch = dict(FAMILY[name], batch_norm=batch_norm)
        optimizer = keras.optimizers.SGD(0.001, **options) if name == "linear" else keras.optimizers.Adam(**options)
        return compat.build_model(arch, dtype or "float32"), optimizer, family_loss(arch)
    if name == "cnn":
        loss = lambda y, out: keras.losses.sparse_categorical_crossentropy(y, out, from_logits=True)  # noqa: E731
        return cnn_model(dtype, batch_norm), keras.optimizers.Adam(**options), loss
    raise KeyError(f"unknown workload {name!r}; known: {', '.join(NAMES)}")


def _factory(name: str):
    def factory(ctx):
        model, optimizer, loss = parts(name)
        optimizer.build(model.trainable_variables)  # see known deviation keras3-lazy-optimizer-slots-mirrored
        x, y = data(name, examples=4 * ctx.global_batch_size)

        def dataset(global_batch_size, input_context):
            return tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size)

        return Workload(model, optimizer, loss, dataset)  # the suite's canonical step trains it

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = f"The built-in {name} workload with the suite's canonical step."
    return factory


linear = _factory("linear")
mlp = _factory("mlp")
cnn = _factory("cnn")
