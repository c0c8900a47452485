"""What TensorFlow does instead: the signature of each known deviation.

An entry of ``known_deviations.toml`` excuses a failure only when what the test observed is
what the entry says TensorFlow does instead. Each entry has one or more ``[[deviation.signature]]``
tables; a signature covers the checks whose quantity (the ``what`` of a Check comparison, a
``Quantity``) has the fields its ``quantity`` table names (quantity.py: ``Pattern``), and states
the deviant behaviour as one of:

``model``
    ``model = "<name>"``, a function of MODELS below: the value TensorFlow computes instead,
    from the check's expected value, its ``given`` inputs and the spec (``given`` is a
    ``suite.common.given.Given``; each model declares the fields it reads with ``@reads``, and a
    docstring's ``{"field": ...}`` names those fields). A mismatch explained by it (the
    observation equals the prediction, by the check's own comparison) is tolerated; a result equal
    to the reference where the prediction differs from it is a failure that says the entry must
    be updated.
``band``
    ``rtol`` (and ``atol``): a rounding deviation. A mismatch whose error stays within the band
    is tolerated. A test in which no covered comparison ever left the reference's tolerance is
    a failure too (the rounding has gone: update the entry).
``raises``
    ``type``, ``message`` (a regular expression specific to the deviation) and ``origin`` (globs
    over ``path:function`` frames, e.g. ``keras/src/random/seed_generator.py:next``, or
    ``op:NAME`` for the function a graph error ran in): a probe outcome that is that exception,
    raised through a frame matching each of those patterns of TensorFlow/Keras (the
    frames the engine sent back: suite/common/results.py ``frames_of``), where a value was
    expected is tolerated (the check's caller then skips what depends on it); a returned value
    is a failure that says the entry must be updated. The same message from another frame (a
    user's own code) is not excused. A deviation that deadlocks (a collective timeout) also
    names its ``condition`` (a function of CONDITIONS below over what the test handed over as
    ``given``): the timeout is excused only where the probe confirms that condition held.
``bounds``
    ``model = "<name>"`` returning ``(low, high)``, or the set of values the race can leave: a
    race. A value within the bounds (in the set) is tolerated (and so is the reference's own
    value, which the race may not disturb); one outside them is a plain failure.

A signature never widens a tolerance and never applies outside the test ids of its entry.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from ... import layout
from ...common.facts import Facts, optimizer_built_lazily
from ...common.given import Given, fields_named
from ...common.results import Raised
from .quantity import Pattern, glob

ref_metrics = layout.reference("metrics")

KINDS = ("model", "band", "raises", "bounds")


@dataclasses.dataclass(frozen=True)
class Seen:
    """One comparison a check made: the quantity, what TensorFlow gave, what the reference
    expects, the check's own equality (``same(a, b)``), the spec and the inputs the test handed
    to the comparison for deviation models (``given``)."""

    what: Any  # the Quantity, or the text, of the comparison
    actual: Any
    expected: Any
    same: Callable[[Any, Any], bool]
    spec: Any
    given: Given | None = None  # what the test handed (suite/common/given.py); None: nothing

    @property
    def inputs(self) -> Given:
        """``given``, or an empty Given where the test handed nothing (every field None)."""
        return self.given if self.given is not None else NO_GIVEN


NO_GIVEN = Given()


def reads(*names: str):
    """Declare the fields of ``given`` a model or condition reads (itself, or through a model it
    calls); each must be a field of Given, checked when this module loads
    (tests/units/test_given.py checks that the function reads no other)."""
    def declare(f):
        f.reads = fields_named(names, f.__name__)
        return f
    return declare


# -- models: what TensorFlow computes instead, as a function of the case --------------------

@reads()
def replica_scale_rounded_to_float32(seen: Seen):
    """Keras 3 ``scale_loss_for_distribution``: ``loss * ops.cast(1.0 / replicas, dtype)``, the
    factor built as a float32 constant first; the reference's value is ``mean / replicas``."""
    r = seen.spec.replicas
    return np.asarray(seen.expected, np.float64) * r * float(np.float32(1.0 / r))


@reads()
def local_mean_not_scaled_by_replicas(seen: Seen):
    """Keras 3.0-3.7 ``sum_over_batch_size`` inside ``strategy.run``: the local mean, which is
    the reference's value (mean / replicas) times the replica count."""
    return np.asarray(seen.expected, np.float64) * seen.spec.replicas


def _assigned_by_every_replica(start, increments, under, strategies=("central_storage",)) -> list:
    """Each update under one of ``strategies`` (``under``: the spec of each update; None: every
    strategy) makes every state variable ``replicas * old + increment``; under other strategies
    it adds the increment."""
    state = list(start)
    for step, spec in zip(increments, under):
        r = spec.replicas if strategies is None or spec.strategy in strategies else 1
        state = [r * old + inc for old, inc in zip(state, step)]
    return state


@reads("kind", "increments")
def metric_state_assigned_by_every_replica(seen: Seen):
    """Keras 3 metrics under CentralStorage: ``assign_add(v)`` is ``assign(self + v)`` on a SUM
    AggregatingVariable, so each replica assigns old + its increment and the strategy sums them:
    ``new = replicas * old + sum of the increments``, for total and count alike.
    ``given``: ``{"kind": metric, "increments": [(total, count) summed over replicas, per batch]}``."""
    if seen.spec.strategy != "central_storage":
        return NOTHING  # no deviation of this entry's outside CentralStorage
    g = seen.inputs
    if g.increments is None:
        return NOTHING  # a metric whose state is not (total, count): no prediction
    total, count = _assigned_by_every_replica([0.0, 0.0], g.increments, [seen.spec] * len(g.increments))
    return ref_metrics.result(g.kind, total, count)


@reads("start", "increments", "under")
def metric_variables_assigned_by_every_replica(seen: Seen):
    """The same CentralStorage mechanism, on the state variables themselves: each update under
    CentralStorage makes every variable ``replicas * old + increment`` (other strategies add the
    increment); a checkpoint carries the state across. ``given``: ``{"start": the initial state,
    "increments": [per update, each variable's increment], "under": [per update, its spec]}``."""
    return _assigned_by_every_replica(seen.given.start, seen.given.increments, seen.given.under)


@reads()
def mirrored_metric_variables(seen: Seen):
    """Keras 3.0-3.9 create metric state with ``synchronization`` left AUTO (the TensorFlow
    backend's Variable passes none to tf.Variable before keras-team/keras#21072), which
    MirroredStrategy and MultiWorkerMirroredStrategy make ON_WRITE: a MirroredVariable."""
    return ["MirroredVariable"]


@reads("kind", "replica_states", "replica")
def metric_state_of_the_first_local_replica(seen: Seen):
    """Keras 3.0-3.6 metric state under a mirrored strategy: MirroredVariables with aggregation
    NONE (the TensorFlow backend passed no aggregation to tf.Variable before keras-team/keras#20541),
    whose update in replica context writes the replica's own copy only
    (values._on_write_update_replica); read in cross-replica context a MirroredVariable returns
    the copy on the current device, the worker's first replica's (values._get_on_device_or_primary).
    So ``result()`` is the metric of that replica's data alone. ``given``: ``{"kind": metric,
    "replica_states": [(total, count) of each replica's own updates], "replica": the worker's
    first replica}``; no prediction without it."""
    g = seen.inputs
    if g.replica_states is None or g.replica is None:
        return NOTHING
    return ref_metrics.result(g.kind, *g.replica_states[g.replica])


@reads("kind", "increments", "replica_states", "replica")
def first_replica_copy_of_the_summed_state(seen: Seen):
    """The Keras 3.0-3.6 copies as the check of a script sees them: each replica's update writes its
    own copy of the state and a read in cross-replica context returns the first local copy. ``given``:
    ``{"kind": metric, "increments": one device's (total, count) per step so far, "replica_states":
    [the run's copies after the step, per local replica], "replica": the copy read}``. Where the
    copies between them hold one device's state (their counts sum to its count and their totals to
    its total, by the check's own comparison of the results), the value is the read copy's; else no
    prediction (the copies hold something else: not this deviation alone)."""
    g = seen.inputs
    if g.replica_states is None or g.increments is None or g.replica is None:
        return NOTHING
    total, count = (float(np.sum([inc[i] for inc in g.increments])) for i in (0, 1))
    copies = np.asarray(g.replica_states, np.float64)
    if not count or not np.isclose(copies[:, 1].sum(), count, rtol=1e-12, atol=0.0) or not seen.same(
            ref_metrics.result(g.kind, copies[:, 0].sum(), copies[:, 1].sum()),
            ref_metrics.result(g.kind, total, count)):
        return NOTHING
    return ref_metrics.result(g.kind, *copies[g.replica])


@reads("start", "replica_increments", "restored_after", "replica")
def metric_variables_per_replica_copy(seen: Seen):
    """The same Keras 3.0-3.6 copies on the state variables across a checkpoint: each replica
    adds its own increments to its copy; a checkpoint saves the primary copy (replica 0's: the
    chief's checkpoint is the one restored) and a restore gives every copy of the new variable
    that value; a worker reads its first replica's copy. ``given``: ``{"start": the initial
    state, "replica_increments": [per update, each replica's increment of each variable],
    "restored_after": the updates before the restore (None: no restore), "replica": the read
    copy}``; no prediction without it."""
    g = seen.inputs
    if g.replica_increments is None:
        return NOTHING
    copies = [list(g.start)]
    for step, incs in enumerate(g.replica_increments):
        if step == g.restored_after or len(copies) != len(incs):
            copies = [copies[0]] * len(incs)  # a restore, or the first update: every copy alike
        copies = [[old + inc for old, inc in zip(copy, inc_r)] for copy, inc_r in zip(copies, incs)]
    if g.restored_after == len(g.replica_increments):
        return copies[0]  # read right after the restore: the saved primary copy on every copy
    return copies[g.replica]


@reads("unsummed_replica_increments", "start", "restored_after", "replica")
def per_replica_metric_copies_of_unsummed_steps(seen: Seen):
    """metric_variables_per_replica_copy where each replica's increments are the losses on its own
    copy of the parameters: Keras 3.0-3.4 train each replica's copy with its own gradient
    (keras3-gradients-not-summed-before-3.5), so the copies' losses part from step 2, and the
    metric state is each replica's copy (keras3-metric-state-per-replica-before-3.7, whose range
    holds 3.0-3.4). ``given``: as metric_variables_per_replica_copy, with
    ``"unsummed_replica_increments"`` (reference/model.py train_unsummed's ``replica_losses``)."""
    g = seen.inputs
    if g.unsummed_replica_increments is None:
        return NOTHING
    return metric_variables_per_replica_copy(
        dataclasses.replace(seen, given=dataclasses.replace(g, replica_increments=g.unsummed_replica_increments)))


@reads("kind", "batch_states", "replica")
def metric_counts_each_update_as_one_example(seen: Seen):
    """Keras 3.0-3.3 ``Accuracy`` and ``BinaryAccuracy`` on rank-1 labels: ``accuracy()`` and
    ``binary_accuracy()`` took ``ops.mean(..., axis=-1)`` of the matches, which for rank-1
    labels is the mean over the batch, a scalar; ``update_state`` then counts it as one example
    (keras-team/keras#19847 removed the mean in 3.4.0). So each update adds its slice's accuracy
    (a float32 mean, Keras' floatx; NaN for a slice with no rows: the mean of nothing) to the
    total and 1 to the count: a
    metric of the updates, not of the examples. Each replica keeps its own state, and a read
    takes one replica's: its own inside ``strategy.run``; in cross-replica context the worker's
    first replica's (Keras 3.0-3.6 keep metric state per replica under the mirrored strategies:
    keras3-metric-state-per-replica-before-3.7, whose range holds this one's). ``given``:
    ``{"kind": metric, "batch_states": [per update, each replica's (total, count) of its slice],
    "replica": the replica read}``; no prediction without it, for other metrics, or under the
    strategies whose metric state is one copy (CentralStorage, parameter servers)."""
    g = seen.inputs
    if (g.batch_states is None or g.replica is None or g.kind not in ("accuracy", "binary_accuracy")
            or seen.spec.kind not in ("default", "one_device", "mirrored", "multi_worker")):
        return NOTHING
    # the mean in Keras' floatx (float32), as ops.mean of the float32 matches computes it
    means = [float(np.float32(t) / np.float32(c)) if c else float("nan")
             for t, c in (step[g.replica] for step in g.batch_states)]
    return ref_metrics.result(g.kind, float(np.sum(means)), float(len(means)))


@reads("kind", "increments")
def metric_state_summed_on_write(seen: Seen):
    """Keras 3.7-3.9 metric state under a mirrored strategy: MirroredVariables with aggregation
    SUM (keras-team/keras#20541) but ON_WRITE, and Keras' ``assign_add(v)`` is ``assign(self +
    v)``: in replica context each replica assigns old + its increment and the merge_call sums
    them into every copy, ``new = replicas * old + sum of the increments`` for total and count
    alike; every replica then reads that (global) value. ``given``: ``{"kind": metric,
    "increments": [(total, count) summed over replicas, per batch]}``."""
    g = seen.inputs
    if g.increments is None:
        return NOTHING
    total, count = _assigned_by_every_replica([0.0, 0.0], g.increments, [seen.spec] * len(g.increments), None)
    return ref_metrics.result(g.kind, total, count)


@reads("start", "increments", "under")
def metric_variables_summed_on_write(seen: Seen):
    """The Keras 3.7-3.9 mechanism on the state variables across a checkpoint: each update under
    a spec of R replicas makes every variable ``R * old + increment`` (R = 1 with no strategy);
    a restore gives every copy the saved value. ``given``: as metric_variables_assigned_by_every_replica."""
    return _assigned_by_every_replica(seen.given.start, seen.given.increments, seen.given.under, None)


@reads("partial")
def partial_last_step_dropped(seen: Seen):
    """The element ids of every step without a last step that needs dummy (empty) batches for
    some replicas. ``given``: ``{"partial": whether the reference's last step needs them}``."""
    steps = list(seen.expected)
    return steps[:-1] if seen.given.partial and steps else steps


@reads("dropped")
def partial_last_step_missing(seen: Seen):
    """The elements missing from a whole epoch: those of a last step that needed dummy batches.
    ``given``: ``{"dropped": the element ids of that step (on every worker), or []}``."""
    return sorted(set(seen.given.dropped) | set(seen.expected))


@reads()
def integer_sum_restored_by_division(seen: Seen):
    """``get_on_read_restore_ops``: each of N copies of a sync-on-read variable gets
    ``cast(value / N, int64)`` (N the replicas in sync), so the restored sum is ``N * (value // N)``.
    CentralStorage keeps one copy (an AggregatingVariable): nothing is divided."""
    n = 1 if seen.spec.strategy == "central_storage" else seen.spec.replicas
    return [n * (v // n) for v in seen.expected]


@reads("variables")
def momentum_set_on_the_building_replica_only(seen: Seen):
    """ScheduleFreeAdamW's lazy ``build()`` runs on replica 0 only and assigns each variable's
    value to its ``momentum`` slot there (aggregation NONE: one copy written); the first update
    then sets each replica's variable to its own momentum. Variables that start at zero (biases)
    stay equal; those with random initial values (kernels) and their momentum slots differ.
    ``given``: ``{"variables": names of every model and optimizer variable}``."""
    names = seen.given.variables
    kernels = [n for n in names if n.endswith("/kernel")]
    slots = [n for n in names if n.rsplit("/", 1)[-1] in {k.replace("/", "_") + "_momentum" for k in kernels}]
    return sorted(kernels + slots)


@reads("steps")
def increments_lost_between_workers(seen: Seen):
    """Lost read-modify-write updates of a Keras 3 optimizer's ``iterations`` under a
    ClusterCoordinator: the set of final values the race can leave, given what each step wrote.

    ``given``: ``{"steps": [[worker, written], ...]}``, one pair per scheduled step in schedule
    order: the worker that ran it and the value its ``assign(iterations + 1)`` wrote (its read
    plus 1). The derivation, for steps that each read the counter, write read + 1 and are run by
    workers that take closures from one FIFO queue and finish one before taking the next (so a
    worker's steps are in schedule order, each one's read after the previous one's write, and at
    most W steps are in flight):

    1. A read returns the last write before it, or 0 before any write. So a step that read
       ``r > 0`` read the write of another worker's step, or of its own worker's previous step
       (that write precedes the read and supersedes the worker's earlier writes): ``r`` is the
       value one of those steps wrote. By induction no value exceeds the number of writes.
    2. A worker's second and later steps read after its own first write: only a worker's first
       step can read 0, so at most W steps read 0 (a stuck counter, where every step reads 0
       and the final value is 1, breaks this once steps > W).
    3. The final value is the last write, and the last write is the last step of its worker:
       ``final`` is the value written by some worker's last step (so 1 <= final <= steps).

    Without observations nothing is predicted: the schedule alone allows any final value in
    [1, steps] (worker A reads 0, B runs every other step, A writes 1), which a stuck counter
    would also satisfy. Observations inconsistent with 1 and 2 mean something other than this
    race happened: no value is excused. Not a ``model`` signature: which worker's last write lands
    last is timing, so the value is one of up to W, not one."""
    steps = int(seen.expected)
    if steps == 0:
        return frozenset({0})
    observed = seen.inputs.steps
    if not observed or len(observed) != steps:
        return frozenset()
    writers: dict[int, set] = {}
    for worker, wrote in observed:
        writers.setdefault(int(wrote), set()).add(int(worker))
    previous: dict[int, int] = {}  # worker -> the value its previous step wrote
    for worker, wrote in observed:
        worker, read = int(worker), int(wrote) - 1
        if read < 0:
            return frozenset()
        if read == 0 and worker in previous:  # 2: only a worker's first step reads 0
            return frozenset()
        if read > 0 and not (writers.get(read, set()) - {worker} or previous.get(worker) == read):  # 1
            return frozenset()
        previous[worker] = int(wrote)
    workers = getattr(seen.spec, "workers", None)
    if workers is not None and len(previous) > workers:
        return frozenset()
    return frozenset(previous.values())  # 3: each worker's last write


@reads("alternative")
def alternative_rule(seen: Seen):
    """What the reference computes under the rule the deviation states TensorFlow follows
    instead (a reference function the test ran too, e.g. ``reference/model.train(...,
    clip_at="replica")``). ``given``: ``{"alternative": that value}`` (no prediction without it)."""
    if seen.inputs.alternative is None:
        return NOTHING
    return np.asarray(seen.inputs.alternative, np.float64)


@reads("alternative")
def alternative_outcome(seen: Seen):
    """Like alternative_rule, for an exact comparison of plain data (a flag, a count, a scale):
    the value as the test computed it. ``given``: ``{"alternative": that value}`` (no prediction
    without it)."""
    if seen.inputs.alternative is None:
        return NOTHING
    return seen.inputs.alternative


@reads()
def fit_logs_summed_over_replicas(seen: Seen):
    """Keras 2's fit on several workers: train_function reduces each replica's logs (the metrics'
    results, already the global ones) with strategy.reduce("SUM") over every replica of the cluster
    (tf_keras/src/engine/training.py reduce_per_replica: "auto" is "sum" off TPU, and a
    multi-worker collective strategy sums across workers), so each log is replicas x its value.
    On one worker the logs are not reduced: no prediction."""
    if seen.spec.workers < 2:
        return NOTHING
    return np.asarray(seen.expected, np.float64) * seen.spec.replicas


@reads("alternative")
def fit_logs_summed_over_replicas_of_the_alternative(seen: Seen):
    """fit_logs_summed_over_replicas on the weights of another rule's steps: Keras 2's fit on several
    workers, on a first global batch the replicas do not divide, logs replicas x the mean loss of the
    steps it took (fit-loss-mean-per-replica-on-uneven-split's). ``given``: ``{"alternative": the log
    under that rule}`` (no prediction without it, or on one worker)."""
    if seen.spec.workers < 2 or seen.inputs.alternative is None:
        return NOTHING
    return np.asarray(seen.inputs.alternative, np.float64) * seen.spec.replicas


@reads("replica_logs")
def fit_logs_sum_of_replica_trackers(seen: Seen):
    """Keras 3.0-3.2's fit: each replica's loss tracker is its own copy (metric state not
    sync-on-read), and train_function reduces the replicas' results with "sum" (reduce_per_replica,
    "auto" before keras-team/keras commit 779facd): the log is the sum over the replicas of each
    one's own running mean. ``given``: ``{"replica_logs": [per replica, its own running mean]}``."""
    logs = seen.inputs.replica_logs
    return NOTHING if logs is None else float(np.sum(logs))


@reads("replica_step_means")
def fit_logs_sum_of_replica_trackers_counting_each_step(seen: Seen):
    """Keras 3.0-3.1's fit: each replica's loss tracker is updated with its step's loss and no
    sample weight, so it counts each step as one, whatever its rows (keras-team/keras#19363, first
    in 3.2.0, passes the batch size); a replica left no rows adds its loss, ``0 / 0`` = NaN on Keras
    3.0-3.6 (keras3-loss-nan-on-empty-replica-before-3.7), and reads NaN from then on. The log is the
    sum over the replicas of each one's mean of its steps' losses, as fit_logs_sum_of_replica_trackers.
    ``given``: ``{"replica_step_means": [per step so far, per replica, its batch's mean loss plus the
    regularization on its own copy (NaN for no rows)]}`` (tests/properties/test_fit.py)."""
    means = seen.inputs.replica_step_means
    if not means:
        return NOTHING
    return float(np.sum(np.mean(np.asarray(means, np.float64), axis=0)))


@reads("replica_logs")
def fit_logs_mean_of_replica_trackers(seen: Seen):
    """Keras 3.3-3.4's fit: each replica's loss tracker is its own copy and train_function reduces
    the replicas' results with "mean": the log is the mean over the replicas of each one's own
    running mean (its own examples, on its own copy of the weights). ``given``: as
    fit_logs_sum_of_replica_trackers."""
    logs = seen.inputs.replica_logs
    return NOTHING if logs is None else float(np.mean(logs))


@reads("unscaled_replica_logs")
def fit_logs_mean_of_unscaled_replica_trackers(seen: Seen):
    """Keras 3.5-3.6's fit, two deviations at once: each replica's loss not scaled by the replicas
    (keras3-loss-unscaled-before-3.8: the summed step is too large from the first step on) and each
    replica's loss tracker its own copy, reduced with "mean" (keras3-metric-state-per-replica-before-3.7):
    the log is the mean over the replicas of each one's own running mean, on the weights of the
    unscaled steps. ``given``: ``{"unscaled_replica_logs": [per replica, its own running mean]}``
    (tests/properties/test_fit.py)."""
    logs = seen.inputs.unscaled_replica_logs
    return fit_logs_mean_of_replica_trackers(dataclasses.replace(seen, given=Given(replica_logs=logs)))


@reads("kind", "unscaled_increments")
def fit_logs_summed_on_write_of_unscaled_steps(seen: Seen):
    """Keras 3.7's fit, two deviations at once: each replica's loss not scaled by the replicas
    (keras3-loss-unscaled-before-3.8) and the loss tracker's state summed on write
    (keras3-metric-state-mirrored-sum-before-3.10, metric_state_summed_on_write) over the losses of
    the unscaled steps. ``given``: ``{"kind": metric, "unscaled_increments": [(total, count) summed
    over replicas, per batch, on the weights of the unscaled steps]}``."""
    g = seen.inputs
    if g.unscaled_increments is None:
        return NOTHING
    return metric_state_summed_on_write(dataclasses.replace(
        seen, given=dataclasses.replace(g, increments=g.unscaled_increments)))


@reads("unscaled")
def replica_losses_unscaled_then_summed(seen: Seen):
    """Keras 3.5-3.7's fit: each replica's loss is its own batch's mean plus the whole
    regularization, not divided by the replicas (keras-team/keras#20609 added the scaling in 3.8),
    and the optimizer sums the replicas' gradients (3.5+): every step is the step of the sum over
    the replicas of their mean losses (reference/model.py train with ``unscaled=True``), replicas x
    the global batch's step on an even split. ``given``: ``{"unscaled": the value under that rule}``;
    no prediction without it."""
    if seen.inputs.unscaled is None:
        return NOTHING
    return np.asarray(seen.inputs.unscaled, np.float64)


@reads("unsummed")
def replicas_apply_their_own_gradients(seen: Seen):
    """Keras 3.0-3.4's TensorFlow optimizer: nothing sums the replicas' gradients, and each replica's
    copy of a mirrored variable moves by that replica's own gradient, with its own optimizer state
    (reference/model.py train_unsummed). ``given``: ``{"unsummed": the value under that rule}`` (for
    whether a variable changed: True, False, or None where the rule does not decide it);
    no prediction without it."""
    value = seen.inputs.unsummed
    if value is None:
        return NOTHING
    return value if isinstance(value, bool) else np.asarray(value, np.float64)


@reads("averaged")
def replica_copies_averaged(seen: Seen):
    """Keras 3.7.0 hands tf.Variable each keras.Variable's aggregation, "mean" by default
    (keras-team/keras#20695): a mirrored variable assigned in replica context (an unsynchronized
    BatchNormalization's moving statistics) takes on every copy the mean of what the replicas
    assigned. ``given``: ``{"averaged": the mean over the replicas of each one's own value}``
    (no prediction without it)."""
    if seen.inputs.averaged is None:
        return NOTHING
    return np.asarray(seen.inputs.averaged, np.float64)


@reads("per_worker")
def same_on_every_worker(seen: Seen):
    """Each worker draws what the first worker draws (the same seed in every worker process):
    whether replica r's draw equals replica 0's is whether r is the first replica of its worker.
    ``given``: ``{"per_worker": those flags}`` (no prediction without it)."""
    if seen.inputs.per_worker is None:
        return NOTHING
    return seen.inputs.per_worker


@reads("one_pass")
def one_pass_variance_bounds(seen: Seen):
    """The value within the rounding bounds of a variance computed as ``E[x^2] - E[x]^2``
    (suite/harness/judging/tolerances.py batch_norm_bounds, one_pass). ``given``: ``{"one_pass": (low,
    high)}``, the reference's value with those bounds (nothing is excused without it: the
    float32 property hands one_pass_variance_in_float32 its inputs instead)."""
    if seen.inputs.one_pass is None:
        return frozenset()
    return seen.inputs.one_pass


def _sum_float32(terms) -> np.float32:
    """``terms`` added one after another in float32 (what TensorFlow's CPU reduce_sum over the
    batch axis does for the few rows per replica the suite draws, and what an all-reduce of two
    replicas' partials does in either order; measured bit for bit on TF 2.21 / Keras 3.15.1 and
    TF 2.15.1 / Keras 2.15 for 1-8 rows per replica)."""
    total = np.float32(0)
    for t in terms:
        total = np.float32(total + np.float32(t))
    return total


def one_pass_moments_float32(x, split, clamp: bool) -> tuple[np.ndarray, np.ndarray]:
    """The synchronized layer's batch mean and variance in float32, as Keras computes them:
    per replica ``sum(x)`` and ``sum(square(x))`` (each square rounded), all-reduced (SUM in
    replica order), ``mean = sum / n``, ``var = sum_sq / n - square(mean)``, clamped at 0 by
    ``maximum(var, 0)`` where ``clamp`` (Keras 3) and not (Keras 2.15: a negative variance)."""
    x = np.asarray(x, np.float32)
    parts = np.split(x, np.cumsum(split)[:-1])
    n = np.float32(len(x))
    mean, var = [], []
    for j in range(x.shape[1]):
        s = _sum_float32(_sum_float32(p[:, j]) for p in parts)
        q = _sum_float32(_sum_float32(np.square(p[:, j])) for p in parts)
        m = np.float32(s / n)
        v = np.float32(np.float32(q / n) - np.float32(m * m))
        mean.append(m)
        var.append(max(v, np.float32(0)) if clamp else v)
    return np.array(mean, np.float32), np.array(var, np.float32)


@reads("float32_one_pass")
def one_pass_variance_in_float32(seen: Seen):
    """What BatchNormalization(synchronized=True) computes in float32: each step's statistics by
    the one-pass formula in float32 arithmetic (one_pass_moments_float32), the outputs
    ``x * inv + (0 - mean * inv)`` with ``inv = rsqrt(var + epsilon)`` in float32
    (tf.nn.batch_normalization, tensorflow/python/ops/nn_impl.py), and the moving statistics
    updated in float32 from moving mean 0 and variance 1, every replica alike.

    Keras 3.15.1: keras/src/backend/tensorflow/nn.py ``_compute_moments_sync`` (lines 1515-1544:
    reduce_sum of x and of tf.square(x), replica_ctx.all_reduce(SUM) of each, divide_no_nan by
    the count, ``tf.maximum(y_squared_mean - tf.square(mean), 0.0)``); the update in
    keras/src/layers/normalization/batch_normalization.py ``call`` (lines 385-391:
    ``moving * momentum + stat * (1 - momentum)``). Keras 2.15:
    keras/src/layers/normalization/batch_normalization.py ``_sync_calculate_mean_and_var``
    (lines 1151-1214: the same sums, ``y_squared_mean - tf.square(mean)`` with no clamp, so a
    negative variance and NaN outputs where ``var + epsilon < 0``) and ``_assign_moving_average``
    (lines 865-886: ``moving - (moving - stat) * (1 - momentum)``).

    ``given``: ``{"float32_one_pass": {"batches", "sizes", "momentum", "epsilon", "keras" (the
    engines' Keras generation), "step" (0-based), "replica" (None: the one copy a CentralStorage
    variable keeps, the mean of the copies), "name" ("outputs", "moving_mean" or
    "moving_variance")}}``; no prediction without it. The rows are the float32 numbers the
    probe feeds; the error left to the check's own comparison is the rounding of the output
    formula (rsqrt's last bit): measured at most 0.0064 u |x| inv."""
    g = seen.inputs.float32_one_pass
    if g is None:
        return NOTHING
    f32 = np.float32
    keras3 = g["keras"] >= 3
    momentum, decay = f32(g["momentum"]), f32(1 - g["momentum"])
    features = np.asarray(g["batches"][0]).shape[1]
    mm, mv = np.zeros(features, f32), np.ones(features, f32)
    for step, (x, split) in enumerate(zip(g["batches"], g["sizes"])):
        mean, var = one_pass_moments_float32(x, split, clamp=keras3)
        if keras3:
            mm, mv = mm * momentum + mean * decay, mv * momentum + var * decay
        else:
            mm, mv = mm - (mm - mean) * decay, mv - (mv - var) * decay
        if step == g["step"]:
            break
    if g["name"] == "moving_mean":
        return mm.astype(np.float64)
    if g["name"] == "moving_variance":
        return mv.astype(np.float64)
    with np.errstate(invalid="ignore"):
        inv = (1 / np.sqrt((var + f32(g["epsilon"])).astype(np.float64))).astype(f32)
    x = np.asarray(x, f32)
    y = (x * inv + (f32(0) - mean * inv)).astype(np.float64)
    rows = np.split(y, np.cumsum(split)[:-1])
    return rows[g["replica"]] if g["replica"] is not None else y


@reads("skipped")
def empty_replica_skipped_bounds(seen: Seen):
    """A replica with no rows kept its copy of the moving statistics (the reference's values
    with that replica's update skipped, within the one-pass rounding bounds). ``given``:
    ``{"skipped": (low, high)}``."""
    return seen.given.skipped


@reads("empty")
def nan_on_an_empty_replica(seen: Seen):
    """``x / 0`` where ``div_no_nan`` belongs: NaN for a value computed from a replica with no
    rows (and for a sum that includes one), else no prediction. ``given``: ``{"empty": whether
    the value divided by an empty replica's batch}``."""
    return float("nan") if seen.inputs.empty else NOTHING


# -- conditions: what must have held for a raises signature (a deadlock) to apply -----------

@reads("poison", "workers")
def non_finite_off_replica_0_on_another_worker(seen: Seen) -> bool:
    """Some step's gradients were finite on replica 0 and non-finite on a replica of another
    worker (Keras 3's LossScaleOptimizer decides finiteness per replica: the workers take
    different branches). ``given``: ``{"poison": [per step, each replica's factor], "workers": W}``."""
    given = seen.inputs
    poison, workers = given.poison, given.workers if given.workers is not None else 1
    if not poison or workers < 2:
        return False
    per = len(poison[0]) // workers
    return any(np.isfinite(step[0]) and not all(np.isfinite(step[per:])) for step in poison)


@reads("worker_rows")
def a_worker_without_rows_beside_one_with_rows(seen: Seen) -> bool:
    """Some step left one worker no rows while another had some (that worker retraces for its
    empty batch and the others do not). ``given``: ``{"worker_rows": [per step, rows per worker]}``."""
    return any(0 in rows and any(rows) for rows in seen.inputs.worker_rows or ())


@reads("optimizer_built", "optimizer_variables_before_step", "optimizer_variables_after")
def optimizer_not_built_before_the_step(seen: Seen) -> bool:
    """The optimizer had not made its variables when the first distributed step began (they are
    made in that step, inside strategy.run). ``given``: ``{"optimizer_built": False}`` (the probe
    made it so) or the engine's counts ``{"optimizer_variables_before_step": n, "optimizer_variables_after": m}``."""
    g = seen.inputs
    return optimizer_built_lazily(Facts(optimizer_built=g.optimizer_built,
                                        optimizer_variables_before_step=g.optimizer_variables_before_step,
                                        optimizer_variables_after=g.optimizer_variables_after))


@reads("optimizer_clips")
def the_optimizer_clips(seen: Seen) -> bool:
    """The optimizer was given clipnorm, global_clipnorm or clipvalue. ``given``:
    ``{"optimizer_clips": True}`` (the engine's fact about a user's optimizer)."""
    return seen.inputs.optimizer_clips is True


@reads("fit_first_split")
def fits_first_batch_split_unevenly(seen: Seen) -> bool:
    """Model.fit's first global batch gave the replicas different numbers of rows. ``given``:
    ``{"fit_first_split": [rows per replica]}`` (the probe's split, or the engine's fact)."""
    split = seen.inputs.fit_first_split
    return bool(split) and len(set(split)) > 1


@reads("steps_per_execution")
def fit_runs_several_steps_per_execution(seen: Seen) -> bool:
    """Model.fit ran with ``steps_per_execution`` above 1. ``given``: ``{"steps_per_execution": k}``."""
    k = seen.inputs.steps_per_execution
    return isinstance(k, int) and k > 1


@reads("step_mode")
def trained_by_keras_fit(seen: Seen) -> bool:
    """The run trained with Model.fit (its logs are what was compared). ``given``: ``{"step_mode": "fit"}``."""
    return seen.inputs.step_mode == "fit"


@reads("control_copies_differ")
def replica_copies_differ_in_the_control(seen: Seen) -> bool:
    """In the check of a user's loop: after this step, the control's (the suite's known-right
    step's) replica copies of some variable differ, which no summing optimizer lets happen to a
    mirrored variable. ``given``: ``{"control_copies_differ": True}`` (differential.compare)."""
    return seen.inputs.control_copies_differ is True


CONDITIONS: dict[str, Callable[[Seen], bool]] = {f.__name__: f for f in (
    non_finite_off_replica_0_on_another_worker, a_worker_without_rows_beside_one_with_rows,
    optimizer_not_built_before_the_step, the_optimizer_clips, replica_copies_differ_in_the_control,
    fits_first_batch_split_unevenly, fit_runs_several_steps_per_execution, trained_by_keras_fit)}

# a message that any deadlock gives (a user's loop that reduces on one worker only, too): never
# an excuse without a condition the probe confirms
DEADLOCK = re.compile(r"timed out|DeadlineExceeded|Collective ops is aborted", re.IGNORECASE)


MODELS: dict[str, Callable[[Seen], Any]] = {f.__name__: f for f in (
    replica_scale_rounded_to_float32, local_mean_not_scaled_by_replicas, metric_state_assigned_by_every_replica,
    metric_variables_assigned_by_every_replica, mirrored_metric_variables, metric_state_of_the_first_local_replica,
    metric_variables_per_replica_copy, per_replica_metric_copies_of_unsummed_steps,
    first_replica_copy_of_the_summed_state,
    metric_counts_each_update_as_one_example, metric_state_summed_on_write,
    metric_variables_summed_on_write,
    partial_last_step_dropped,
    partial_last_step_missing,
    integer_sum_restored_by_division, momentum_set_on_the_building_replica_only, increments_lost_between_workers,
    alternative_rule, alternative_outcome, replicas_apply_their_own_gradients, replica_copies_averaged,
    fit_logs_summed_over_replicas, fit_logs_summed_over_replicas_of_the_alternative,
    fit_logs_sum_of_replica_trackers, fit_logs_mean_of_replica_trackers,
    fit_logs_sum_of_replica_trackers_counting_each_step,
    fit_logs_mean_of_unscaled_replica_trackers, fit_logs_summed_on_write_of_unscaled_steps,
    replica_losses_unscaled_then_summed, same_on_every_worker,
    one_pass_variance_bounds,
    one_pass_variance_in_float32,
    empty_replica_skipped_bounds, nan_on_an_empty_replica)}

# every model and condition declares the fields of ``given`` it reads (``reads``): checked as this module loads
_UNDECLARED = sorted(name for name, f in {**MODELS, **CONDITIONS}.items() if not hasattr(f, "reads"))
if _UNDECLARED:
    raise TypeError(f"signatures: {_UNDECLARED} declare no fields of given they read: decorate each with @reads(...)")

NOTHING = object()  # a signature that predicts no particular value for this comparison


@dataclasses.dataclass(frozen=True)
class Signature:
    quantity: Pattern  # the fields of the comparisons it covers (quantity.py), never their text
    kind: str
    model: str | None = None
    rtol: float = 0.0
    atol: float = 0.0
    type: str | None = None
    message: str | None = None
    origin: tuple[str, ...] = ()
    condition: str | None = None

    @classmethod
    def parse(cls, table: dict, where: str) -> Signature:
        kind = table.get("kind")
        if kind not in KINDS:
            raise ValueError(f"{where}: signature kind {kind!r} is not one of {KINDS}")
        if "quantity" not in table:
            raise ValueError(f"{where}: a signature needs a quantity (a table of the fields of the quantities it "
                             f"covers: quantity = {{ kind = ... }})")
        unknown = set(table) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"{where}: unknown signature keys {sorted(unknown)}")
        if kind in ("model", "bounds") and table.get("model") not in MODELS:
            raise ValueError(f"{where}: model {table.get('model')!r} is not one of {sorted(MODELS)}")
        if kind == "band" and not table.get("rtol", 0) and not table.get("atol", 0):
            raise ValueError(f"{where}: a band needs rtol or atol")
        if kind == "raises" and not (table.get("type") and table.get("message") and table.get("origin")):
            raise ValueError(f"{where}: a raises signature needs type, message and origin (the frames it comes from)")
        if kind == "raises" and (DEADLOCK.search(table["message"]) or DEADLOCK.search(table["type"])) \
                and table.get("condition") not in CONDITIONS:
            raise ValueError(f"{where}: a deadlock is no excuse on its own: name the condition that triggers it "
                             f"(one of {sorted(CONDITIONS)})")
        if "condition" in table and table["condition"] not in CONDITIONS:
            raise ValueError(f"{where}: condition {table['condition']!r} is not one of {sorted(CONDITIONS)}")
        if not isinstance(table["quantity"], dict):
            raise ValueError(f"{where}: quantity {table['quantity']!r} is text; name the quantities it covers by "
                             f"field (quantity = {{ kind = ..., step = \"*\" }}): text is for display only")
        return cls(**{**table, "quantity": Pattern.parse(table["quantity"], where),
                      "origin": tuple(table.get("origin", ()))})

    def covers(self, what) -> bool:
        """Whether this signature speaks of the comparison ``what`` (a Quantity; plain text never)."""
        return self.quantity.matches(what)

    def predicts(self, seen: Seen):
        """The deviant value this signature predicts for a value comparison, or NOTHING (a band
        or a race predicts no particular value; a raises signature is consulted by
        ``Check.returned`` instead); NOTHING too where its condition does not hold."""
        if self.condition is not None and not CONDITIONS[self.condition](seen):
            return NOTHING
        if self.kind == "model":
            return MODELS[self.model](seen)
        return NOTHING

    def explains(self, seen: Seen) -> bool:
        """Whether the observation is what the deviation does (checked only on a mismatch)."""
        a = seen.actual
        if self.kind == "raises":
            return (isinstance(a, Raised) and a.type == self.type and re.search(self.message, a.message) is not None
                    and self.came_from(a) and (self.condition is None or CONDITIONS[self.condition](seen)))
        if isinstance(a, Raised):
            return False
        if self.condition is not None and not CONDITIONS[self.condition](seen):
            return False
        if self.kind == "model":
            predicted = self.predicts(seen)
            return predicted is not NOTHING and seen.same(a, predicted)
        if self.kind == "band":
            x, e = np.asarray(a, np.float64), np.asarray(seen.expected, np.float64)
            return x.shape == e.shape and bool(np.all(np.abs(x - e) <= self.atol + self.rtol * np.abs(e)))
        bounds = MODELS[self.model](seen)
        if isinstance(bounds, (set, frozenset)):
            return np.ndim(a) == 0 and a in bounds
        low, high = bounds
        return bool(np.all((low <= np.asarray(a)) & (np.asarray(a) <= high)))

    def came_from(self, raised: Raised) -> bool:
        """Whether ``raised`` passed through a frame matching every pattern of the signature's
        origin (``{a,b}`` in a pattern: either)."""
        return all(any(glob(pattern).fullmatch(frame) for frame in raised.frames) for pattern in self.origin)

    def describe(self) -> str:
        if self.kind == "model":
            return f"model {self.model}"
        if self.kind == "band":
            return f"band rtol {self.rtol:g}, atol {self.atol:g}"
        if self.kind == "raises":
            return (f"raises {self.type} matching {self.message!r} from {' and '.join(self.origin)}"
                    + (f" when {self.condition}" if self.condition else ""))
        return f"bounds {self.model}"
