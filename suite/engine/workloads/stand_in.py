"""The stand-in control of the check of a user's loop: the suite's own Keras model (Keras' classes
only) with the user's optimizer class and hyper-parameters, on data shaped like the user's
features, trained by the suite's canonical step.

Where the loop's divergence under a spec is also the control's (the canonical step on the user's
own model), but the model or optimizer has classes of the user's own, that control cannot tell the
user's code from TensorFlow's and Keras'. The stand-in has none of the user's classes: where it
diverges under the same spec too, the divergence belongs to TensorFlow/Keras with that optimizer
(suite/harness/loopcheck/usercheck.py: Checker.control, controls.stand_in_of).
"""

from __future__ import annotations

import importlib

import numpy as np
import tensorflow as tf

from .. import compat
from ..workload import Workload

keras = compat.keras
EXAMPLES_PER_STEP = 3  # global batches of data: one per compared step, as the check's default
HIDDEN, OUTPUTS = 16, 4


def keras_optimizer_class(optimizer):
    """The nearest of Keras' own optimizer classes the user's optimizer is (itself, for Keras' own)."""
    inner = getattr(optimizer, "inner_optimizer", None)  # a LossScaleOptimizer: the optimizer it wraps
    if inner is not None:
        optimizer = inner
    for cls in type(optimizer).__mro__:
        if cls.__module__.startswith(("keras", "tf_keras")):
            return optimizer, cls
    return optimizer, None


def feature_shape(wl, global_batch: int) -> tuple[int, ...]:
    """The per-example shape of the first floating input of the workload's batches with an
    example axis (the features), from its dataset's element spec; (8,) where none is known."""
    context = None if wl.distribute == "dataset" else tf.distribute.InputContext()
    try:
        spec = wl.dataset(global_batch, context).element_spec
    except Exception:  # noqa: BLE001  (the loop's own run reports its dataset's errors)
        return (8,)
    for s in tf.nest.flatten(spec):
        shape = getattr(s, "shape", None)
        if shape is not None and s.dtype.is_floating and shape.rank and shape.rank >= 2 \
                and all(d is not None for d in shape[1:]):
            return tuple(int(d) for d in shape[1:])
    return (8,)


def build(wl, global_batch: int, seed: int = 0) -> Workload:
    """The stand-in for workload ``wl`` (call inside the strategy's scope): see ``build_from``."""
    user, cls = keras_optimizer_class(wl.optimizer)
    if cls is None:
        raise TypeError(f"the optimizer {type(wl.optimizer).__name__} is no Keras optimizer")
    return build_from(cls, user.get_config(), feature_shape(wl, global_batch), global_batch, seed)


def described(optimizer, shape) -> dict | None:
    """What ``build_from`` needs of a run, as plain data (a script's: its optimizer and the shape of
    its features), or None where the optimizer is no Keras optimizer."""
    user, cls = keras_optimizer_class(optimizer)
    if cls is None:
        return None
    return {"optimizer": [cls.__module__, cls.__qualname__], "config": user.get_config(), "shape": list(shape)}


def build_described(description: dict, global_batch: int, seed: int = 0) -> Workload:
    """``build_from`` of a ``described`` run (call inside the strategy's scope)."""
    module, qualname = description["optimizer"]
    cls = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    return build_from(cls, description["config"], tuple(description["shape"]), global_batch, seed)


def build_from(cls, config: dict, shape: tuple, global_batch: int, seed: int = 0) -> Workload:
    """A Sequential of Flatten, Dense(16, tanh) and Dense(4), the mean squared error of a fixed
    tanh projection of features of ``shape``, and a fresh optimizer of Keras class ``cls`` from
    ``config``, built before the first step (call inside the strategy's scope)."""
    model = keras.Sequential([keras.Input(shape), keras.layers.Flatten(),
                              keras.layers.Dense(HIDDEN, activation="tanh"), keras.layers.Dense(OUTPUTS)])
    optimizer = cls.from_config(config)
    optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(seed + 17)
    n = EXAMPLES_PER_STEP * global_batch
    x = rng.normal(size=(n, *shape)).astype(np.float32)
    y = np.tanh(x.reshape(n, -1) @ rng.normal(size=(int(np.prod(shape)), OUTPUTS)) / np.sqrt(np.prod(shape)))
    y = y.astype(np.float32)

    def dataset(global_batch_size, input_context):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size)

    return Workload(model, optimizer, keras.losses.MeanSquaredError(reduction="none"), dataset)
