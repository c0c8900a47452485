"""What each probe returns, declared once (no TensorFlow here): typed records of numpy arrays,
numbers and strings that cross the pipe pickled. Engines fill them (tensors converted by the
probe registry); tests read their fields.

An exception a probe catches as a documented outcome comes back in one shape, ``Raised``:
the exception's type name, its message (whitespace folded, long ones shortened in the
middle) and where it was raised.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Any

from .facts import Facts

record = dataclasses.dataclass(frozen=True)
Arrays = list  # numpy arrays, one per replica / variable / step
MESSAGE_CHARS = 8000  # whole TF messages (deviation signatures match them); Check shortens them for display


# the name a script's read by index of experimental_local_results is compared under, as a metric (``LOCAL_READ[0] at
# train.py:42``): what it read of one replica is compared with what one device read there
LOCAL_READ = "experimental_local_results(...)"
FACTORY_RAISED = "the factory"  # the ``where`` of a workload factory that raised under a strategy
# the ``where`` of a script that raised before its first draw (judged as a factory that raised)
SCRIPT_RAISED = "the script, before its first step,"


@record
class Raised:
    """An exception a probe caught: its type name, message, the probe (and step) it came from,
    and the frames it came through (``frames_of``): what a known deviation's origin is matched
    against."""

    type: str
    message: str
    where: str
    frames: tuple = ()
    at: str = ""  # a script's: its innermost line the exception came through (``train.py:42``), and that line
    call: str = ""  # ... and the function that line called, where the exception came from inside it (``load_weights``)

    def said(self) -> str:
        """Where a script raised, for a report: `` at train.py:42 (model.load_weights(path), in load_weights)``,
        or nothing where the script's line is not known."""
        if not self.at:
            return ""
        return f" at {self.at}" + (f", in {self.call}" if self.call else "")

    @classmethod
    def of(cls, exc: BaseException, where: str, limit: int | None = MESSAGE_CHARS) -> Raised:
        text = " ".join(str(exc).split())
        if limit and len(text) > limit:
            text = text[:200] + " ... " + text[-(limit - 205):]
        return cls(type(exc).__name__, text, where, frames_of(exc))


# a frame of the Python stack a TensorFlow graph error carries in its message (where the failing
# op was created: "... defined at (most recent call last): File "...", line N, in f")
_FRAME_IN_MESSAGE = re.compile(r'File "([^"]+)", line \d+, in ([\w<>.]+)')


# the function a graph error was raised in ("... [Op:__inference_fn_with_cond_1058]"): TensorFlow's
# variable-initializing wrapper of a tf.function's first call is ``fn_with_cond``
_OP_IN_MESSAGE = re.compile(r"\[Op:([\w.-]+)\]")
# the failing op of a graph error ("Detected at node 'a/b/Assert' defined at"): its name scopes say
# which TensorFlow function created it (the "defined at" stack leaves TensorFlow's own frames out)
_NODE_IN_MESSAGE = re.compile(r"Detected at node '?([^'\s]+)'? defined at")


def frame_name(filename: str, function: str) -> str:
    """``path:function``, the path from its top-level package on where it is installed
    (``keras/src/random/seed_generator.py:next``), else as the interpreter gave it."""
    path = re.split(r"[/\\](?:site|dist)-packages[/\\]", filename)[-1].replace("\\", "/")
    return f"{path}:{function}"


def frames_of(exc: BaseException) -> tuple[str, ...]:
    """Every frame ``exc`` came through, innermost last, once each: its traceback's, the frames
    its message carries (a graph error's op-creation stack, and as ``op:NAME`` the function the
    failing op ran in, and as ``node:NAME`` the failing op), and those of the exceptions it was raised from or during."""
    out, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            out.append(frame_name(tb.tb_frame.f_code.co_filename, tb.tb_frame.f_code.co_name))
            tb = tb.tb_next
        out.extend(frame_name(f, fn) for f, fn in _FRAME_IN_MESSAGE.findall(str(exc)))
        out.extend(f"op:{name}" for name in _OP_IN_MESSAGE.findall(str(exc)))
        out.extend(f"node:{name}" for name in _NODE_IN_MESSAGE.findall(str(exc)))
        exc = exc.__cause__ or exc.__context__
    return tuple(dict.fromkeys(out))


# -- engine -----------------------------------------------------------------------------------
@record
class Ping:
    pid: int
    worker_index: int


@record
class EngineInfo:
    """An engine process: its spec and place in the cluster, versions, strategy and devices."""

    spec: str
    worker_index: int
    pid: int
    tf_version: str
    keras_version: str
    keras_generation: int
    num_replicas_in_sync: int
    local_replica_ids: list
    strategy: str
    cross_device_ops: str | None
    tf_config: dict | None
    tmpdir: str
    heartbeat_timeout_ms: int | None = None  # the coordination service's, where one runs


@record
class ServerInfo:
    """A parameter-server cluster's worker or ps process, which only serves."""

    task: str
    pid: int
    target: str
    tf_version: str


# -- losses, reduce, metrics ------------------------------------------------------------------
@record
class ReplicaValues:
    """Per-replica values (``experimental_local_results`` of this worker) and their SUM reduction;
    ``tracked_mean`` is a ``Mean`` metric fed the per-replica values (the loss-tracking pitfall)."""

    local: Arrays
    total: Any = None
    tracked_mean: Any = None


@record
class Reductions:
    sum_axis0: Any
    mean_axis0: Any
    sum_none: Any
    mean_none: Any
    local: Arrays  # each replica's row sum
    replica_ids: list


@record
class MetricReads:
    in_replica: list  # per batch: each local replica's result() read inside strategy.run
    result: Any  # result() in cross-replica context
    variables: list  # the state variables' class names


# -- training and checkpoints -----------------------------------------------------------------
@record
class Step:
    loss: Any  # the SUM-reduced scaled loss
    params: list  # per variable: every local replica's copy
    averages: list | None = None  # with use_ema: per variable, every local replica's copy of its EMA


@record
class Training:
    history: list  # of Step
    iterations: int


@record
class Fitted:
    """What ``Model.fit`` did: at each of its train-batch boundaries (every steps_per_execution
    steps), the steps run so far, the loss its logs reported, every local replica's copy of every
    variable."""

    steps: list  # of int: the steps run at each boundary
    history: list  # of Step, its ``loss`` the logs' loss
    iterations: int


@record
class FittedEpochs:
    """``Model.fit`` over a dataset whose iterations differ (training.fit_epochs): after each epoch,
    every local replica's copy of the one weight, and how many iterations of the dataset had begun."""

    kernels: list  # per epoch, per local replica: the weight's value
    iterations: int


@record
class BatchNormStep:
    outputs: list  # per local replica: its rows of the layer's output
    moving_mean: list  # per local replica: its copy after the step
    moving_variance: list


@record
class BatchNormRun:
    steps: list  # of BatchNormStep
    variable: str  # the class of the moving statistics' variable (MirroredVariable, SyncOnReadVariable, ...)


@record
class ScaledStep:
    params: list  # per variable: every local replica's copy after the step
    scale: float  # the loss scale after the step


@record
class ScaledTraining:
    steps: list  # of ScaledStep
    variable_dtypes: list  # the dtypes of the model's variables
    output_dtype: str  # the dtype of the layer's output (the policy's compute dtype)


@record
class EmbeddingTraining:
    tables: list  # per step: every local replica's copy of the table
    gradient_type: str  # the class of the table's gradient inside the replica function


@record
class RandomDraws:
    runs: list  # per run (objects built afresh): per step: every local replica's draw


@record
class Epoch:
    sizes: list  # per step: this worker's replica batch sizes
    params: list  # per variable: every local replica's copy after the epoch


@record
class EpochTraining:
    epochs: list  # of Epoch


@record
class LazyOptimizer:
    n_variables: int
    iterations: int
    distributed: list  # class names of the optimizer variables
    names: list  # every optimizer and model variable
    disagreeing: list  # those whose replica copies differ
    changed: bool


@record
class TrainingState:
    """Every variable after training (model: each local replica's copy), and where it was saved."""

    params: list
    optimizer: Arrays
    iterations: int
    metrics: dict  # metric name -> its state variables' values
    metric_results: dict
    path: str | None = None


@record
class Restored:
    restored: TrainingState
    after: TrainingState  # after one more step


@record
class Prediction:
    prediction: Any


@record
class Counters:
    values: list
    path: str | None = None


# -- input ------------------------------------------------------------------------------------
@record
class Delivered:
    steps: list  # per step: each local replica's batch
    after_end: str | None  # what the exhausted iterator did (styles that can tell)


@record
class FromFunction:
    contexts: list  # [num_input_pipelines, input_pipeline_id, num_replicas_in_sync] per call
    steps: list | None = None
    raised: Raised | None = None


# -- parameter servers ------------------------------------------------------------------------
@record
class PsTraining:
    losses: list
    params: Arrays
    iterations: int
    devices: list


@record
class ExactlyOnce:
    w: Any
    count: int
    fetched: int
    iterations: int | None = None
    # per scheduled step, in schedule order: [the worker that ran it, the value it wrote into a
    # Keras 3 optimizer's iterations (its read + 1)]; None where that write cannot be observed
    steps: list | None = None


@record
class Partition:
    type: str
    rows: list
    ps_tasks: list
    shards: Arrays
    whole: Any
    concat: Any


@record
class PsLossScaling:
    num_replicas_in_sync: int
    replica_context_replicas: int
    compute_average_loss: Any
    keras_loss: Any = None
    keras_raised: Raised | None = None


# -- benchmarks and the tutorial --------------------------------------------------------------
@record
class BenchState:
    replicas: int
    global_batch: int
    per_replica_batch: int
    parameters: int
    cross_device_ops: str | None
    strategy: str
    tf_version: str
    keras_version: str
    block: dict | None = None  # what the engine built for a building block (bench.BLOCK_BUILT names it)


@record
class BenchRun:
    seconds: float  # the engine's own time for the K steps
    loss: float


@record
class TutorialEpoch:
    loss: float  # the mean over the epoch's steps of the SUM-reduced loss
    train_accuracy: float


@record
class TutorialRun:
    history: list  # of TutorialEpoch
    test_accuracy: float
    latest: str | None


@record
class Evaluation:
    test_accuracy: float
    restored: str | None
    correct: list | None = None  # per test example, in order: whether the restored model's prediction is its label


# -- users' workloads (python -m suite.check) ---------------------------------------------------
def example_digests(per_replica: list) -> list:
    """Per replica (``per_replica``: each replica's numpy arrays, one per numeric part of a batch, the
    example axis first), the sorted digests of its examples: each example's rows of every part hashed
    together, so two replicas (or workers) that got the same examples give the same digests. (numpy imported
    here: an engine imports this module before it can say that its interpreter lacks numpy or TensorFlow.)"""
    import numpy as np

    out = []
    for parts in per_replica:
        n = next((int(a.shape[0]) for a in parts if a.ndim), 1)
        digests = []
        for i in range(n):
            h = hashlib.blake2b(digest_size=8)
            for a in parts:
                h.update(np.ascontiguousarray(a[i] if a.ndim and a.shape[0] == n else a).tobytes())
            digests.append(int.from_bytes(h.digest(), "little"))
        out.append(sorted(digests))
    return out


@record
class WorkloadStep:
    loss: float  # the step's loss reduced as the user's loop reduces it (Workload.loss_reduction)
    replica_losses: list  # what the step returned on each local replica
    rows: list  # each local replica's examples in this step
    variables: list  # per model variable (trainable and not), every local replica's copy
    optimizer: list  # per optimizer variable (iterations, slots), every local replica's copy
    gradients: list | None  # per local replica, the gradients handed to apply_gradients (model.trainable order)
    metrics: dict  # name -> result() after the step
    regularization: float | None = None  # add_n(model.losses) before the step (weight penalties), if readable
    weights: list | None = None  # per local replica, the sum of its batch's example weights (None: no weights seen)
    # a step that returned a loss per model: {name: {"loss": reduced, "replicas": [each local replica's],
    # "regularization": that model's add_n(losses) before the step}}; ``loss`` is then their sum
    named: dict | None = None
    # per local replica, the sorted digests of the examples it got in this step (each example's rows of every numeric
    # part of the element, hashed together): what tells two workers' batches apart (None: not read)
    examples: list | None = None


@record
class WorkloadRun:
    replicas: int  # num_replicas_in_sync
    local_replica_ids: list
    names: list  # model variable names (model.variables order)
    trainable: list  # bool per model variable
    optimizer_names: list
    initial: list  # replica 0's value of each model variable before the first step
    steps: list  # of WorkloadStep
    facts: Facts  # what the engine saw of the workload (evidence for diagnoses; facts.py)
    masks: list | None = None  # each local replica's training-mode output for one shared input (random layers)
    raised: Raised | None = None  # the step that raised (its index in ``where``)
