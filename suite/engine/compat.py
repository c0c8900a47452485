"""TensorFlow/Keras generation differences, in one place (engine side: imports TensorFlow).

Keras 2 (TF <= 2.15, or tf_keras with TF_USE_LEGACY_KERAS=1) and Keras 3 (TF >= 2.16) differ
in how variables are wrapped, how optimizers expose their state and how losses reduce
inside ``strategy.run``. Probes go through the helpers here instead of testing versions.
"""

from __future__ import annotations

import inspect
import os

import tensorflow as tf

from ..common.catalog import LOSS_CLASSES, METRIC_CLASSES

if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
    import tf_keras as keras  # Keras 2 on TF >= 2.16
else:
    keras = tf.keras

def _keras_version() -> str:
    for attr in ("__version__", "version"):
        value = getattr(keras, attr, None)
        if value:
            return value() if callable(value) else value
    import importlib.metadata  # TF 2.15's tf.keras has no __version__: ask the package

    return importlib.metadata.version("keras")


KERAS_VERSION: str = _keras_version()
KERAS_GENERATION: int = int(KERAS_VERSION.split(".")[0])


def keep_whole_tracebacks() -> None:
    """Turn off TensorFlow's and Keras' traceback filtering in every thread: an error then carries
    every frame it came through (in its traceback, and in the "in user code" stack a traced
    function's error message holds), which a known deviation's origin is matched against
    (suite/common/results.py frames_of). The public switches (tf.debugging and
    keras.config.disable_traceback_filtering) set a thread-local flag, and strategy.run calls
    each replica's function in a thread of its own, where filtering stays on; so the flags'
    defaults are replaced (private: TensorFlow's thread-local, Keras 3's module function; Keras 2
    reads TensorFlow's)."""
    import threading

    from tensorflow.python.util import traceback_utils as tf_traceback

    class _Off(threading.local):
        value = False

    tf.debugging.disable_traceback_filtering()
    tf_traceback._ENABLE_TRACEBACK_FILTERING = _Off()
    if KERAS_GENERATION >= 3:
        try:
            from keras.src.utils import traceback_utils as keras_traceback
        except ImportError:  # a Keras 3 without keras.src: its errors keep their filtered frames
            return
        keras_traceback.is_traceback_filtering_enabled = lambda: False


def tf_variable(v):
    """The tf.Variable (possibly a DistributedVariable) behind a Keras variable (Keras 2's
    mixed-precision AutoCastVariable unwrapped)."""
    if KERAS_GENERATION >= 3:
        return v.value if not isinstance(v, tf.Variable) else v
    return getattr(v, "_variable", v)


def local_values(strategy, v) -> list:
    """Every local replica's copy of variable ``v`` as numpy arrays, in replica order."""
    return [tf.convert_to_tensor(c).numpy() for c in strategy.experimental_local_results(tf_variable(v))]


def iterations(opt) -> int:
    """``optimizer.iterations`` as a number (a variable, or with Keras 3 gradient accumulation a
    tensor: the micro-steps // gradient_accumulation_steps)."""
    value = opt.iterations
    return int(tf.convert_to_tensor(value if isinstance(value, tf.Tensor) else tf_variable(value)).numpy())


def optimizer_variables(opt) -> list:
    """All state variables of an optimizer (iterations, slots, learning rate if a variable; a
    Keras 2 LossScaleOptimizer's scale and good-step counter, which its ``variables`` omits)."""
    vs = opt.variables
    out = list(vs() if callable(vs) else vs)
    state = getattr(getattr(opt, "_loss_scale", None), "_weights", None)
    return out + list(state.values()) if KERAS_GENERATION < 3 and state else out


def cross_device_ops_name(strategy) -> str | None:
    ext = strategy.extended
    ops = getattr(ext, "_cross_device_ops", None) or getattr(ext, "_inferred_cross_device_ops", None)
    return type(ops).__name__ if ops is not None else None


def make_loss(kind: str, reduction: str, dtype: str):
    """A Keras loss object. Keras 3 losses compute in their own dtype (floatx unless given),
    so the case dtype is passed; Keras 2 losses keep the input dtype and take no dtype."""
    cls, kwargs = LOSS_CLASSES[kind]
    cls = getattr(keras.losses, cls)
    kwargs = dict(kwargs, reduction=reduction)
    if KERAS_GENERATION < 3:
        return cls(**kwargs)
    if "dtype" in inspect.signature(cls.__init__).parameters:
        return cls(**kwargs, dtype=dtype)
    # Keras 3.0: the base Loss takes dtype and computes in self.dtype, but its subclasses do not
    # pass it on (3.1 added it to them); set the attribute the base constructor would have set
    loss = cls(**kwargs)
    loss.dtype = dtype
    return loss


def reset_metric(metric) -> None:
    """``metric.reset_state()`` for the suite's metrics (Mean, Sum and the accuracies, whose every
    state variable starts at zero). Keras 3.0-3.4's reduction metrics reset with ``assign(0.0)``,
    which an int64 Sum cannot take (TypeError: Cannot convert 0.0 to EagerTensor of dtype int64;
    3.5 assigns zeros of the variable's dtype); there each variable is set to zeros of its own
    dtype, which is what reset_state does."""
    if KERAS_GENERATION >= 3 and any(not v.dtype.startswith(("float", "bfloat")) for v in metric.variables):
        for v in metric.variables:
            v.assign(tf.zeros(v.shape, v.dtype))
        return
    metric.reset_state()


def make_metric(kind: str, dtype: str):
    return getattr(keras.metrics, METRIC_CLASSES[kind])(dtype=dtype)


def make_optimizer(cls: str, config: dict):
    return getattr(keras.optimizers, cls)(**config)


def builtin_optimizer_names() -> list[str]:
    """Every optimizer class exported by keras.optimizers that trains with default arguments."""
    skip = {"Optimizer", "LossScaleOptimizer", "MultiOptimizer", "OptimizerMap", "TFOptimizer"}
    names = []
    for name in dir(keras.optimizers):
        obj = getattr(keras.optimizers, name)
        if (isinstance(obj, type) and name not in skip and not name.startswith("_")
                and issubclass(obj, keras.optimizers.Optimizer)):
            names.append(name)
    return sorted(names)


class ActivityLoss(keras.layers.Layer):
    """A user's custom layer that passes its input through and calls ``add_loss`` with an L2
    activity penalty written by hand, ``rate * sum ||h_i||^2 / batch`` (``divide_no_nan``: an
    empty replica adds nothing), as Keras' own L2 activity regularizer normalises it."""

    def __init__(self, rate: float, **kwargs):
        super().__init__(**kwargs)
        self.rate = rate

    def call(self, x):
        batch = tf.cast(tf.shape(x)[0], x.dtype)
        self.add_loss(self.rate * tf.math.divide_no_nan(tf.reduce_sum(tf.square(x)), batch))
        return x


def build_model(arch: dict, dtype: str):
    """The model family of reference/model.py as a Keras Sequential model of ``dtype`` (or a
    mixed-precision policy: ``mixed_float16``, float32 inputs). An ``activity`` factor puts an
    L2 activity regularizer on every hidden layer (``activity_via="add_loss"``: an
    ``ActivityLoss`` layer after it instead, the same penalty through a user's ``add_loss``);
    ``batch_norm`` (benchmarks only, not in the reference) a synchronized BatchNormalization
    after each."""
    reg = keras.regularizers.L2(arch["l2"]) if arch["l2"] else None
    added = arch.get("activity_via") == "add_loss"  # the same penalty from a user's layer
    activity = keras.regularizers.L2(arch["activity"]) if arch.get("activity") and not added else None
    layers = [keras.Input(shape=(arch["input_dim"],), dtype="float32" if dtype.startswith("mixed") else dtype)]
    for width in arch["hidden"]:
        layers.append(keras.layers.Dense(width, activation="relu", kernel_regularizer=reg,
                                         activity_regularizer=activity, dtype=dtype))
        if arch.get("activity") and added:
            layers.append(ActivityLoss(arch["activity"], dtype=dtype))
        if arch.get("batch_norm"):
            layers.append(keras.layers.BatchNormalization(synchronized=True, dtype=dtype))
    layers.append(keras.layers.Dense(arch["outputs"], kernel_regularizer=reg, dtype=dtype,
                                     activation="softmax" if arch["head"] == "softmax" else None))
    return keras.Sequential(layers)


def per_example_loss(head: str, y, out):
    """MSE for a linear head, sparse categorical crossentropy of probabilities for softmax."""
    if head == "linear":
        return keras.losses.mse(y, out)
    return keras.losses.sparse_categorical_crossentropy(y, out)


def export_saved_model(model, path: str, input_spec):
    """Write a SavedModel with a ``serving_default`` signature (Keras 3 ``model.export``;
    Keras 2 ``tf.saved_model.save`` with a traced signature)."""
    if KERAS_GENERATION >= 3:
        quiet = {"verbose": False} if "verbose" in inspect.signature(model.export).parameters else {}  # Keras 3.5+
        model.export(path, format="tf_saved_model", **quiet)
    else:
        fn = tf.function(lambda x: model(x, training=False), input_signature=[input_spec])
        tf.saved_model.save(model, path, signatures={"serving_default": fn})


# -- mixed precision ---------------------------------------------------------------------------
def loss_scale_optimizer(inner_cls: str, inner_cfg: dict, scale: str, initial_scale: float, growth_steps: int):
    """The optimizer of the mixed-precision guide's custom loop: a dynamic LossScaleOptimizer
    (``scale="dynamic"``) or a fixed scale (Keras 2 ``dynamic=False``; Keras 3 has none and sets
    ``loss_scale_factor`` on the inner optimizer instead)."""
    ms = keras.mixed_precision
    if scale == "fixed":
        if KERAS_GENERATION >= 3:
            return make_optimizer(inner_cls, dict(inner_cfg, loss_scale_factor=initial_scale))
        return ms.LossScaleOptimizer(make_optimizer(inner_cls, inner_cfg), dynamic=False, initial_scale=initial_scale)
    return ms.LossScaleOptimizer(make_optimizer(inner_cls, inner_cfg), initial_scale=initial_scale,
                                 dynamic_growth_steps=growth_steps)


def scaled_loss(opt, loss):
    """The guide's ``scaled_loss``: Keras 3 ``scale_loss``, Keras 2 ``get_scaled_loss``."""
    return opt.scale_loss(loss) if KERAS_GENERATION >= 3 else opt.get_scaled_loss(loss)


def unscaled_gradients(opt, grads):
    """Keras 2's ``get_unscaled_gradients``; Keras 3's apply_gradients unscales by itself."""
    return grads if KERAS_GENERATION >= 3 else opt.get_unscaled_gradients(grads)


def loss_scale_value(opt) -> float:
    """The current loss scale (Keras 3 ``dynamic_scale`` or the fixed ``loss_scale_factor``;
    Keras 2 ``loss_scale``)."""
    if KERAS_GENERATION >= 3:
        return float(opt.dynamic_scale.numpy()) if hasattr(opt, "dynamic_scale") else float(opt.loss_scale_factor)
    return float(tf.convert_to_tensor(opt.loss_scale).numpy())
