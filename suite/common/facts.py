"""What an engine observed of a workload run or a script, declared once (no TensorFlow here).

The workload and script probes (``suite/engine/probes/workload.py``, ``script.py``) build a ``Facts``
and send it in ``WorkloadRun.facts``; the check of a user's loop (``suite/harness/loopcheck/``) reads
it by attribute. Both sides import this module, so a misspelt fact is an AttributeError (a write too:
the record has slots) where it used to be a dict key silently read as None, and a type checker sees it.

Every field has a default: what the check reads when the engine did not see it (``None``: not
observed; a probe that did not run that far, a factory that raised, a workload that is not a
script). The defaults are what the dict's ``.get`` gave before, so every verdict reads the same.
Values are plain data (numbers, strings, lists, dicts): the record pickles between engines of any
TensorFlow version and the pytest process.

The deviations' conditions (``signatures.CONDITIONS``) read some facts from a comparison's
``given`` (``suite/common/given.py``: a Given field of the same name); ``named`` checks those names
against the fields when the module naming them loads.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(slots=True)
class Facts:
    """What the engine saw of a workload or script run: evidence for diagnoses and the deviations'
    conditions. Filled by the engine as it runs (hence not frozen); slots make a misspelt write fail."""

    # -- what ran ---------------------------------------------------------------------------------
    script: bool | None = None  # the run is a training script's (probes/script.py), not a workload factory's
    factory_raised: bool | None = None  # the workload's factory raised under the strategy (the run has no steps)
    user_step: bool | None = None  # the loop's own per-replica step ran (a script's always), not the suite's canonical one
    workers: int = 1  # the processes whose replies were stitched into the run (runs.stitch)
    # how a script stepped: "calls" (strategy.run in a tf.function), "schedules" (a ClusterCoordinator), "fit", ...
    step_mode: str | None = None
    draws: int | None = None  # elements the script drew from a distributed dataset
    boundaries: int | None = None  # step boundaries the script's watcher saw (its first included)
    runs: int | None = None  # times the script called strategy.run
    distributed: bool | None = None  # the script drew from a distributed dataset or iterator
    reported: bool | None = None  # the script reduced a loss with strategy.reduce (its step's loss is that)
    constructed: list = dataclasses.field(default_factory=list)  # [[strategy class, its arguments shown], ...]
    device_config: list | None = None  # the script's own device configuration calls, as shown
    replica_reads: dict = dataclasses.field(default_factory=dict)  # "file:line" -> times num_replicas_in_sync was read
    tf_config_set: str | None = None  # the cluster of the TF_CONFIG the script set itself before its strategy
    closure_workers: list | None = None  # a parameter-server script's: per step, the worker its closure ran on
    seeded_shuffles: list | None = None  # the script's unseeded shuffles the engine gave a seed ("file:line")
    # unseeded shuffles the dataset was sharded after ("file:line" -> where it was sharded)
    shuffled_before_sharding: dict | None = None
    undistributed_inputs: dict | None = None  # batches passed to strategy.run whole: "file:line" -> their shape
    local_reads: list | None = None  # per step: the per-replica values read with experimental_local_results (summed)

    # -- the loss -----------------------------------------------------------------------------------
    loss_reduction: str | None = None  # how the loop reduces its loss across replicas ("SUM", "MEAN")
    loss_object_reduction: str | None = None  # the reduction of the Keras loss object, as str() shows it
    regularized: bool | None = None  # some model has losses of its own (weight penalties)

    # -- models, layers, optimizers ----------------------------------------------------------------
    models: list | None = None  # the models' names ([""] for one)
    optimizers: list | None = None  # the optimizers' names ([""] for one)
    keras_own_model: bool | None = None  # model, every layer and the optimizer are Keras' own classes
    batch_norm: list = dataclasses.field(default_factory=list)  # [[BatchNormalization layer, synchronized], ...]
    random_layers: list = dataclasses.field(default_factory=list)  # layers with a positive dropout-like rate
    random_layers_keras: bool | None = None  # every random layer is one of Keras' own classes
    # a random layer in training mode raised before training: [type, message, *frames] of what it raised
    masks_raised: list | None = None
    outside_scope: list | None = None  # variables not created in the strategy's scope (None: no strategy)
    optimizer_built: bool | None = None  # the optimizer had made its variables when the first step began
    optimizer_variables_before_step: int | None = None  # the optimizer's variables when the first step began
    optimizer_variables_after: int | None = None  # and after the steps
    optimizer_clips: bool | None = None  # the optimizer was given clipnorm, global_clipnorm or clipvalue
    gradient_groups: list | None = None  # per optimizer: [its name, how many variables its gradients cover]
    trains: dict | None = None  # a script's: each optimizer's name -> the model it trains
    sparse_gradients: bool | None = None  # some gradient was an IndexedSlices
    stand_in: dict | None = None  # the stand-in control's description of the script's optimizer and features
    built_in_step: list | None = None  # model variables made in the first step (a model with no Input)
    built_in_step_from_creation: bool | None = None  # and each one's value at creation was seen
    late_values: list | None = None  # [name, shape, value at creation] of each variable made in the first step

    # -- metrics ---------------------------------------------------------------------------------------
    # each metric's state, by its variables' last names (("count", "total") is a mean)
    metric_states: dict = dataclasses.field(default_factory=dict)
    metric_state_values: dict | None = None  # each Mean-like metric's [total, count] at every boundary
    metric_replica_states: dict | None = None  # and each replica's own copy of it

    # -- data and fit ------------------------------------------------------------------------------------
    first_batch_rows: int | None = None  # the examples of the first global batch
    batch_digests: list | None = None  # with no strategy: a digest of each step's batch (the upgrade check)
    random_ops: list | None = None  # random ops in the traced step
    fit_own_train_step: list | None = None  # classes of the models fit trains whose train_step is the script's
    # the script's own code in what Keras' own train step runs: model and layer classes, compiled losses and metrics
    # defined in the script's files (a custom layer's batch statistics differ per replica as the script wrote them)
    fit_script_code: list | None = None
    fits_skipped: list | None = None  # "file:line (Class)" of each fit of a model trained with no strategy (not compared)
    steps_per_execution: int | None = None  # the most steps one execution of the script's fit runs
    fit_first_split: list | None = None  # the rows per replica of fit's first batch

    def condition_given(self, names: tuple[str, ...]) -> dict[str, Any]:
        """The facts ``names`` as keyword arguments of a ``Given`` (what a deviation's condition reads)."""
        return {name: getattr(self, name) for name in names}


FIELDS = frozenset(f.name for f in dataclasses.fields(Facts))


def named(names: tuple[str, ...], where: str) -> tuple[str, ...]:
    """``names`` if each is a field of Facts; else a one-line ValueError naming the unknown ones."""
    unknown = [name for name in names if name not in FIELDS]
    if unknown:
        raise ValueError(f"{where}: unknown facts {unknown}: not fields of suite.common.facts.Facts")
    return tuple(names)


def optimizer_slots_made_in_the_step(facts: Facts) -> bool:
    """The optimizer had more variables after the first distributed step than when it began
    (``optimizer_variables_before_step`` < ``optimizer_variables_after``, the engine's counts): it
    made its slots inside strategy.run."""
    before, after = facts.optimizer_variables_before_step, facts.optimizer_variables_after
    return before is not None and after is not None and after > before


def optimizer_built_lazily(facts: Facts) -> bool:
    """The optimizer had not made its variables when the first distributed step began: the engine
    saw it unbuilt (``optimizer_built`` False) or saw its slots made in the step. The one decision,
    for the loop check's diagnosis and the deviations' condition alike."""
    return facts.optimizer_built is False or optimizer_slots_made_in_the_step(facts)
