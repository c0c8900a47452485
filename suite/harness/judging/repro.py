"""Runnable plain-TensorFlow snippets that reproduce a failing case (attached to failures)."""

from __future__ import annotations

import numpy as np

from ...common.specs import Spec
from ...common.strategies import strategy_source


def strategy_lines(spec: Spec) -> str:
    """Code that builds the strategy of ``spec`` in a fresh process: the engine's own source."""
    source = strategy_source(spec)
    unavailable = "class Unavailable(RuntimeError):  # the spec's hardware is missing\n    pass\n" \
        if "Unavailable" in source else ""
    return "import numpy as np\nimport tensorflow as tf\n" + unavailable + source


def array(name: str, value) -> str:
    if value is None:  # an absent input (no sample_weight): np.array(None) would need dtype=object
        return f"{name} = None\n"
    a = np.asarray(value)
    return f"{name} = np.array({a.tolist()!r}, dtype=np.{a.dtype.name})\n"


SLICE = """\
def my_slice(*tensors):  # this replica's consecutive rows, sizes[i] rows for replica i
    rid = tf.distribute.get_replica_context().replica_id_in_sync_group
    offsets = tf.constant(np.concatenate([[0], np.cumsum(sizes)]), tf.int64)
    return [tf.convert_to_tensor(t)[offsets[rid]:offsets[rid + 1]] for t in tensors]
"""


def snippet(spec: Spec, arrays: dict, body: str) -> str:
    """Strategy set-up, the case's arrays, the slicing helper and a body using them."""
    return strategy_lines(spec) + "".join(array(k, v) for k, v in arrays.items()) + SLICE + body


def replica_run(spec: Spec, arrays: dict, replica_body: str, after: str = "") -> str:
    """A snippet that runs ``replica_body`` (the body of ``def fn():``, using ``my_slice``)
    on every replica inside a tf.function and prints each replica's result."""
    body = "def fn():\n" + "".join(f"    {line}\n" for line in replica_body.strip().splitlines())
    body += ("per_replica = tf.function(lambda: strategy.run(fn))()\n"
             "print([v.numpy() for v in strategy.experimental_local_results(per_replica)])\n")
    return snippet(spec, arrays, body + after)


def training(spec: Spec, arch: dict, optimizer: tuple, dtype: str, params, steps) -> str:
    """A snippet of the custom loop the training property runs (first step's batch)."""
    cls, cfg = optimizer
    x, y, sizes = steps[0]
    reg = f"tf.keras.regularizers.L2({arch['l2']!r})" if arch["l2"] else "None"
    added = bool(arch.get("activity")) and arch.get("activity_via") == "add_loss"
    act = (f", activity_regularizer=tf.keras.regularizers.L2({arch['activity']!r})"
           if arch.get("activity") and not added else "")
    after = f"        ActivityLoss({arch['activity']!r}),\n" if added else ""
    layers = "".join(f"        tf.keras.layers.Dense({w}, activation='relu', kernel_regularizer=reg{act}, "
                     f"dtype='{dtype}'),\n{after}" for w in arch["hidden"])
    layer_class = ("class ActivityLoss(tf.keras.layers.Layer):  # a user's layer with add_loss\n"
                   "    def __init__(self, rate):\n        super().__init__()\n        self.rate = rate\n"
                   "    def call(self, h):\n        n = tf.cast(tf.shape(h)[0], h.dtype)\n"
                   "        self.add_loss(self.rate * tf.math.divide_no_nan(tf.reduce_sum(tf.square(h)), n))\n"
                   "        return h\n") if added else ""
    head = "'softmax'" if arch["head"] == "softmax" else "None"
    loss = ("tf.keras.losses.sparse_categorical_crossentropy(ys, out)" if arch["head"] == "softmax"
            else "tf.keras.losses.mse(ys, out)")
    body = (f"{layer_class}reg = {reg}\n"
            "with strategy.scope():\n"
            "    model = tf.keras.Sequential([\n"
            f"        tf.keras.Input(({arch['input_dim']},), dtype='{dtype}'),\n{layers}"
            f"        tf.keras.layers.Dense({arch['outputs']}, activation={head}, kernel_regularizer=reg,\n"
            f"                              dtype='{dtype}')])\n"
            f"    opt = tf.keras.optimizers.{cls}(**{cfg!r})\n"
            "    opt.build(model.trainable_variables)\n"
            "for v, p in zip(model.trainable_variables, params):\n"
            "    v.assign(p)\n"
            "def fn():\n"
            "    xs, ys = my_slice(x, y)\n"
            "    with tf.GradientTape() as tape:\n"
            "        out = model(xs, training=True)\n"
            f"        loss = tf.nn.compute_average_loss({loss}, global_batch_size=len(x))\n"
            "        if model.losses:\n"
            "            loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))\n"
            "    grads = tape.gradient(loss, model.trainable_variables)\n"
            "    opt.apply_gradients(zip(grads, model.trainable_variables))\n"
            "    return loss\n"
            "tf.function(lambda: strategy.run(fn))()\n"
            "for v in model.trainable_variables:\n"
            "    print([c.numpy() for c in strategy.experimental_local_results(v)])\n")
    arrays = {"x": x, "y": y, "sizes": sizes}
    return snippet(spec, arrays, f"params = {[np.asarray(p).tolist() for p in params]!r}\n" + body)
