"""The workload protocol: how a user's training loop is handed to the suite (engine side).

A workload is a factory addressable as ``package.module:factory``. The suite imports the module
in an engine process, sets the seeds, enters the strategy's scope and calls
``factory(ctx)`` with a ``WorkloadContext``; the factory returns a ``Workload``::

    def workload(ctx):
        model = make_model()
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

        def dataset(global_batch_size, input_context):
            return tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size)

        def step(batch):                       # optional: the code the user's loop runs per replica
            images, labels = batch
            with tf.GradientTape() as tape:
                per_example = loss(labels, model(images, training=True))
                scaled = tf.nn.compute_average_loss(per_example, global_batch_size=ctx.global_batch_size)
            grads = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return scaled

        return Workload(model, optimizer, loss, dataset, step=step)

Without ``step`` the suite trains with its canonical step (suite/engine/steps.py: the guide's
``compute_average_loss`` of ``loss``, plus ``scale_regularization_loss`` of ``model.losses``).
The check (``python -m suite.check``) runs the workload with no strategy on the global batch
(the reference) and under each strategy spec, and compares them after every step.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable
from typing import Any

from .. import layout


def is_workload(obj) -> bool:
    """A ``Workload`` of this project by either of its import names (suite/layout.py): a loop written
    against the checkout's ``suite`` runs in engines of the installed ``tf_distribute_suite`` and
    the other way round (the class is a plain record; the engine reads its fields)."""
    cls = type(obj)
    return isinstance(obj, Workload) or (
        cls.__name__ == "Workload" and cls.__module__ in {f"{name}.engine.workload" for name in layout.NAMES})


class WorkloadError(Exception):
    """A workload that cannot be used: its module does not import, its factory raises or returns
    something that is not a Workload, its dataset is too small. The message is one line naming
    the workload."""

    original: BaseException | None = None  # what the factory itself raised, where it raised


@dataclasses.dataclass(frozen=True)
class WorkloadContext:
    """What a factory gets: the strategy (the default strategy for the reference run), the global
    batch size every step consumes, the replicas in sync and the seed the suite set."""

    strategy: Any
    global_batch_size: int
    num_replicas_in_sync: int
    seed: int

    @property
    def per_replica_batch_size(self) -> int:
        return self.global_batch_size // self.num_replicas_in_sync


@dataclasses.dataclass
class Workload:
    """What a factory returns.

    ``model``: a Keras model; ``optimizer``: a Keras optimizer; ``loss(y, out)``: the per-example
    loss (one value per example: a Keras loss with ``reduction="none"`` or a function);
    ``dataset(global_batch_size, input_context)``: a ``tf.data.Dataset`` of ``(x, y)`` batches,
    called with ``input_context=None`` for ``experimental_distribute_dataset`` (global batches), or
    with a ``tf.distribute.InputContext`` when ``distribute="function"``
    (``distribute_datasets_from_function``: per-replica batches of
    ``input_context.get_per_replica_batch_size(global_batch_size)``); ``step(batch)``: the user's
    per-replica step, run in ``strategy.run``, returning the replica's scaled loss; ``metrics``:
    Keras metrics the step updates, by name; ``loss_reduction``: the ``tf.distribute.ReduceOp``
    name the user's loop reduces the step's loss with for reporting (the guide's ``"SUM"``).

    Several models and optimizers (a GAN, a student and its frozen teacher): ``models`` and
    ``optimizers``, each a dict by name (``{"generator": g, "discriminator": d}``), ``model`` and
    ``optimizer`` then None (or one of them); every model's variables and every optimizer's state
    are compared, and the gradients each optimizer's ``apply_gradients`` gets are captured for the
    diagnosis, the optimizer named as a model applying to that model's trainable variables. The
    step then returns a dict of losses by model name (each the replica's scaled loss of that model),
    so that a diagnosis can name the model it concerns."""

    model: Any
    optimizer: Any
    loss: Callable
    dataset: Callable
    step: Callable | None = None
    metrics: dict = dataclasses.field(default_factory=dict)
    loss_reduction: str = "SUM"
    distribute: str = "dataset"
    models: dict = dataclasses.field(default_factory=dict)
    optimizers: dict = dataclasses.field(default_factory=dict)


def parts(wl: Workload) -> tuple[dict, dict]:
    """The workload's models and optimizers by name: ``models`` and ``optimizers``, with ``model``
    and ``optimizer`` under the name "" where given (a one-model workload: ``{"": model}``)."""
    models = {**({"": wl.model} if wl.model is not None else {}), **wl.models}
    optimizers = {**({"": wl.optimizer} if wl.optimizer is not None else {}), **wl.optimizers}
    return models, optimizers


def resolve(target: str, path: str | None = None) -> Callable:
    """The factory named ``package.module:factory`` (``path`` put first on sys.path: the folder
    the user ran the check from). A module imported before is reloaded, so objects it makes at
    import (an optimizer at module level) start afresh in every run, as in a new process."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise WorkloadError(f"workload {target!r}: expected 'package.module:factory'")
    if path and path not in sys.path:
        sys.path.insert(0, path)
    try:
        module = sys.modules.get(module_name)
        module = importlib.reload(module) if module is not None else importlib.import_module(module_name)
    except Exception as exc:
        raise WorkloadError(f"workload {target!r}: module {module_name!r} does not import "
                            f"({type(exc).__name__}: {_line(exc)})") from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise WorkloadError(f"workload {target!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(factory):
        raise WorkloadError(f"workload {target!r}: {attr!r} is a {type(factory).__name__}, not a callable factory")
    return factory


def build(target: str, ctx: WorkloadContext, path: str | None = None) -> Workload:
    """Call the factory inside the strategy's scope and check what it returned."""
    factory = resolve(target, path)
    try:
        with ctx.strategy.scope():
            wl = factory(ctx)
    except WorkloadError:
        raise
    except Exception as exc:
        # with no strategy the workload cannot be used; under a strategy TensorFlow/Keras may refuse what
        # the factory builds there (a known deviation's raises signature, judged by ``original``'s frames)
        error = WorkloadError(f"workload {target!r}: the factory raised {type(exc).__name__}: {_line(exc)}")
        error.original = exc
        raise error from None
    if not is_workload(wl):
        raise WorkloadError(f"workload {target!r}: the factory returned a {type(wl).__name__}, "
                            "not a tf_distribute_suite.engine.workload.Workload (suite.engine.workload in a checkout)")
    for field in ("loss", "dataset"):
        if not callable(getattr(wl, field)):
            raise WorkloadError(f"workload {target!r}: Workload.{field} must be callable, "
                                f"got {type(getattr(wl, field)).__name__}")
    if wl.step is not None and not callable(wl.step):
        raise WorkloadError(f"workload {target!r}: Workload.step must be callable or None")
    if not isinstance(wl.models, dict) or not isinstance(wl.optimizers, dict):
        raise WorkloadError(f"workload {target!r}: Workload.models and Workload.optimizers must be dicts by name")
    models, optimizers = parts(wl)
    if not models or not optimizers:
        raise WorkloadError(f"workload {target!r}: a Workload needs a model (or models) and an optimizer (or "
                            "optimizers)")
    for name, m in models.items():
        if not hasattr(m, "trainable_variables"):
            raise WorkloadError(f"workload {target!r}: Workload.model{'s[' + repr(name) + ']' if name else ''} must be "
                                f"a Keras model (got {type(m).__name__})")
    for name, o in optimizers.items():
        if not hasattr(o, "apply_gradients"):
            raise WorkloadError(f"workload {target!r}: Workload.optimizer{'s[' + repr(name) + ']' if name else ''} "
                                f"must be a Keras optimizer (got {type(o).__name__})")
    if wl.loss_reduction not in ("SUM", "MEAN"):
        raise WorkloadError(f"workload {target!r}: Workload.loss_reduction must be 'SUM' or 'MEAN'")
    if wl.distribute not in ("dataset", "function"):
        raise WorkloadError(f"workload {target!r}: Workload.distribute must be 'dataset' or 'function'")
    return wl


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""
