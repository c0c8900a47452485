"""The evidence of each catalogued cause (causes.py), as small named predicates: each reads what was
observed of a spec's run against the reference (``Observed``: the first diverging step, the step that
raised, what the engine saw of the workload) and returns the lines of evidence that name its cause,
or None where any of it does not hold. A predicate reads observations only, never whether another
cause was found: which of several found causes the report shows, and in what order, is declared in
causes.py (``SHOWN``, ``ENDS``, ``SUBSUMES``, ``FALLBACKS``) and applied by diagnosis.diagnose
after every predicate was evaluated.

The observations: ratios of the loss, of the summed gradients and of a metric to the replica count,
the examples each replica saw, the weight penalty, the gradients' norms on each replica, and what the
engine saw of the workload (the loss object's reduction, BatchNormalization layers, variables created
outside the scope, an optimizer built in the first step)."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from ...common.facts import Facts, optimizer_built_lazily, optimizer_slots_made_in_the_step
from ...common.results import LOCAL_READ
from .render import short_error
from .runs import norm as _norm

RATIO_SLACK = 0.05  # a measured ratio "is" N when within 5% of it


# how the engine names Keras' loss tracker of a model the script holds as ``model`` (``model.metrics[loss]``)
FIT_LOSS_TRACKER = ".metrics[loss]"


def _one_replicas_value(dist, metric: str, k: int):
    """``(j, values)`` where a mean metric's value after step ``k`` is the mean over the steps of
    replica j's values of what the script read with ``experimental_local_results`` (the last read
    of each step), not the mean of their sums; else None."""
    reads = (dist.facts.local_reads or [])[:k]
    states = sorted(dist.facts.metric_states.get(metric, ()))
    if len(reads) < k or not all(reads) or states != ["count", "total"] or dist.replicas < 2:
        return None
    last = [step[-1] for step in reads]
    got = dist.steps[k - 1].metrics.get(metric)
    if got is None or any(len(values) != len(last[0]) for values in last) or len(last[0]) < 2:
        return None
    if _exactly(got, sum(sum(values) for values in last) / k):
        return None
    for j in range(len(last[0])):
        series = [values[j] for values in last]
        if _exactly(got, sum(series) / k):
            return j, series
    return None


def _is(x, target) -> bool:
    return x is not None and math.isfinite(x) and target > 0 and abs(x - target) <= RATIO_SLACK * target


def _grad_evidence(r, d):
    """(ratio of the replicas' summed gradients to the reference's, projected; their cosine;
    each replica's global gradient norm; the reference's norm), or None without gradients."""
    if r.gradients is None or d.gradients is None or not r.gradients or not d.gradients:
        return None
    ref = [np.asarray(g, np.float64) for g in r.gradients[0]]
    summed = [sum(np.asarray(rep[i], np.float64) for rep in d.gradients) for i in range(len(ref))]
    dot = sum(float(np.vdot(a, b)) for a, b in zip(summed, ref))
    nr = math.sqrt(sum(_norm(g) ** 2 for g in ref))
    ns = math.sqrt(sum(_norm(g) ** 2 for g in summed))
    if not nr or not ns:
        return None
    norms = [math.sqrt(sum(_norm(g) ** 2 for g in rep)) for rep in d.gradients]
    return dot / nr ** 2, dot / (nr * ns), norms, nr


def _exactly(x, target) -> bool:
    """``x`` equals ``target`` within float32 rounding of a few sums (1e-4 relative)."""
    return x is not None and target is not None and math.isfinite(x) and abs(x - target) <= 1e-4 * abs(target)


def _replica_grad_evidence(r, d):
    """(every replica's gradients equal one device's summed-batch gradients, the replicas'
    gradients equal each other's, their global norms equal), each within 1e-3 relative."""
    ref = [np.asarray(g, np.float64) for g in r.gradients[0]]
    reps = [[np.asarray(g, np.float64) for g in rep] for rep in d.gradients]

    def close(a, b):
        scale = math.sqrt(sum(_norm(x) ** 2 for x in b)) or 1.0
        return math.sqrt(sum(_norm(x - y) ** 2 for x, y in zip(a, b))) <= 1e-3 * scale

    norms = [math.sqrt(sum(_norm(g) ** 2 for g in rep)) for rep in reps]
    return (all(close(rep, ref) for rep in reps), all(close(rep, reps[0]) for rep in reps[1:]),
            max(norms) - min(norms) <= 1e-3 * max(norms))


def _same_batches_on_every_worker(d, workers: int) -> bool:
    """Whether each worker's replicas got worker 0's examples: where the run read the digests of the
    examples each replica drew (a script's), from them alone, since equal losses prove nothing where a
    loss reads no example (a GAN's generator fed noise); else from each worker's replicas returning
    exactly worker 0's losses and gradients (distinct examples give the same float only by chance)."""
    if d.examples is not None:
        per = len(d.examples) // workers
        return per >= 1 and any(d.examples[:per]) and all(
            d.examples[w * per:(w + 1) * per] == d.examples[:per] for w in range(1, workers))
    per = len(d.replica_losses) // workers
    if per < 1 or any(d.replica_losses[w * per:(w + 1) * per] != d.replica_losses[:per] for w in range(1, workers)):
        return False
    return d.gradients is None or all(all(np.array_equal(a, b) for a, b in zip(d.gradients[w * per + i], d.gradients[i]))
                                      for w in range(1, workers) for i in range(per))


LOSS_REDUCTIONS_THAT_AVERAGE = ("sum_over_batch_size", "auto", "Reduction.AUTO", "Reduction.SUM_OVER_BATCH_SIZE")


# what raises where an optimizer's slots are made inside the distributed step: Keras 3 under
# collectives (the placeholder its lazy build leaves in the step's cond), Keras 2 (the slot's scope);
# another raise of a step with an unbuilt optimizer (a collective's timeout) is not that cause
_SLOT_ERRORS = ("You must feed a value for placeholder tensor", "slot variable")


@dataclasses.dataclass
class Observed:
    """What the predicates read: the reference's and the spec's runs, the differences of the first
    diverging step (``mismatches``, all of one step) and the global batch; the rest is derived on
    first use."""

    ref: object
    dist: object
    mismatches: list
    global_batch: int

    @property
    def n(self) -> int:
        return self.dist.replicas

    @property
    def facts(self) -> Facts:
        return self.dist.facts

    @property
    def raised(self) -> bool:
        return self.dist.raised is not None

    # -- gates: which part of the run a predicate may read ------------------------------------
    @property
    def diverged(self) -> bool:
        """A step ran and diverged: its values are there to read (the step did not raise)."""
        return not self.raised and bool(self.mismatches)

    @functools.cached_property
    def same_examples(self) -> bool:
        """The first diverging step gave the replicas as many examples as one device had."""
        return self.diverged and self.rows == self.rows_ref

    @functools.cached_property
    def in_step(self) -> bool:
        """What the step computed is what differs (not the examples it got, not only the metrics):
        the gate of the causes read from the losses, gradients and variables of the step."""
        return self.same_examples and not self.only_metrics

    # -- the first diverging step -------------------------------------------------------------
    @property
    def k(self) -> int:
        return self.mismatches[0].step

    @property
    def r(self):
        return self.ref.steps[self.k - 1]

    @property
    def d(self):
        return self.dist.steps[self.k - 1]

    @property
    def rows_ref(self) -> int:
        return sum(self.r.rows)

    @property
    def rows(self) -> int:
        return sum(self.d.rows)

    @functools.cached_property
    def roles(self) -> set:
        return {m.role for m in self.mismatches}

    @functools.cached_property
    def loss_is_a_metric(self) -> bool:
        """fit's logged loss where the script's own train_step feeds Keras' loss tracker: the log is that
        metric's result (its ``NAME.metrics[loss]`` equals the step's loss in both runs), not a loss the
        step computed (keras.io's "Customizing what happens in fit()" updates it with compute_loss's value)."""
        if not self.diverged or not self.facts.fit_own_train_step:
            return False
        for name in self.d.metrics:
            if name.endswith(FIT_LOSS_TRACKER) and name in self.r.metrics and _exactly(
                    self.r.metrics[name], self.r.loss) and _exactly(self.d.metrics[name], self.d.loss):
                return True
        return False

    @property
    def only_metrics(self) -> bool:
        """Only metrics differ: the reported loss counts as one where it is a metric's result
        (``loss_is_a_metric``)."""
        roles = {m.role for m in self.mismatches if not (m.role == "loss" and self.loss_is_a_metric)}
        return roles == {"metric"}

    @property
    def reduction(self) -> str:
        return str(self.facts.loss_object_reduction or "")

    @property
    def keras_reduces(self) -> bool:
        """The user's own step with a Keras loss object whose reduction averages over the batch."""
        return bool(self.facts.user_step) and self.reduction in LOSS_REDUCTIONS_THAT_AVERAGE

    @property
    def reg(self) -> float:
        return self.r.regularization or 0.0

    @property
    def returned(self) -> float:
        return sum(self.d.replica_losses)

    @property
    def loss_ratio(self):
        return self.d.loss / self.r.loss if self.r.loss else None

    @property
    def returned_ratio(self):
        return self.returned / self.r.loss if self.r.loss else None

    @functools.cached_property
    def data_ratio(self):
        """What the replicas' steps returned, summed, against one device's, the weight penalty taken
        out of both (a correctly scaled penalty sums to one device's)."""
        r, reg = self.r, self.reg
        return (self.returned - reg) / (r.loss - reg) if r.loss - reg else None

    @functools.cached_property
    def grads(self):
        return _grad_evidence(self.r, self.d)

    @property
    def ratio(self):
        return None if self.grads is None else self.grads[0]

    @property
    def cosine(self):
        return None if self.grads is None else self.grads[1]

    @functools.cached_property
    def each(self):
        """(equal to one device's summed, equal to each other, norms equal) of the replicas' gradients."""
        return _replica_grad_evidence(self.r, self.d) if self.grads is not None else None

    @property
    def grads_agree(self) -> bool:
        return self.grads is None or (_is(self.ratio, 1.0) and self.cosine > 0.99)

    @property
    def grads_follow(self):
        """The summed gradients follow the returned losses (unknown gradients contradict nothing)."""
        return self.grads is None or (self.cosine > 0.99 and self.data_ratio
                                      and abs(self.ratio - self.data_ratio) <= RATIO_SLACK * self.data_ratio)

    @property
    def data_ref(self) -> float:
        return self.r.loss - self.reg

    @property
    def shares(self) -> list:
        """What each replica's step returned, its share of the weight penalty taken out."""
        return [x - self.reg / self.n for x in self.d.replica_losses]

    @property
    def by_rows(self):
        """The shares weighted by each replica's examples: one device's loss exactly where each replica
        divided by its own examples."""
        d = self.d
        return sum(x * rows for x, rows in zip(self.shares, d.rows)) / sum(d.rows) if sum(d.rows) else None

    @property
    def by_weights(self):
        """The shares weighted by each replica's weight sum: one device's loss exactly where each replica
        divided by its own weights."""
        d = self.d
        return (sum(x * w for x, w in zip(self.shares, d.weights)) / sum(d.weights)
                if d.weights and sum(d.weights) else None)

    @property
    def loss_lines(self) -> list:
        """The evidence of the causes read from the loss and the gradients: their ratios to one device's."""
        out = [f"the losses the {self.n} replicas' steps returned sum to {self.data_ratio:.4g} x one device's"
               + (" (the weight penalty taken out of both)" if self.reg else "")] if self.data_ratio is not None else []
        if self.grads is not None:
            out.append(f"the gradients they handed to apply_gradients sum to {self.ratio:.4g} x one device's "
                       f"(cosine {self.cosine:.6f})")
        return out

    @property
    def short_batch(self) -> str | None:
        """The first diverging step is a short batch split unevenly: in words, else None."""
        d, k = self.d, self.k
        if not (self.rows_ref < self.global_batch and len(set(d.rows)) > 1):
            return None
        agreed = f"steps 1-{k - 1} agreed; " if k > 1 else ""
        return (f"{agreed}step {k} is a short batch of {self.rows_ref} examples (global batch {self.global_batch}), "
                f"split {d.rows} among the replicas, and it is the first step that diverges")


# -- the predicates, one a cause's (a cause found several ways has several) -----------------------
# each is named where every observation it predicts holds; unknown gradients contradict nothing,
# but predict nothing either

def created_outside_scope(o: Observed):
    outside = o.facts.outside_scope
    if outside:
        shown = ", ".join(outside[:4]) + (" ..." if len(outside) > 4 else "")
        return [f"not created in the strategy's scope: {shown}"]
    return None


def batch_not_distributed(o: Observed):
    """A script's batch passed whole to every replica (the root cause of all else that differs)."""
    undistributed = o.facts.undistributed_inputs or {}
    if not (o.n > 1 and undistributed and o.mismatches):
        return None
    where, shape = next(iter(undistributed.items()))
    n, k = o.n, o.k
    r, d = o.r, o.d
    returned = sum(d.replica_losses) / r.loss if r.loss and d.replica_losses else None
    return [f"at {where} the script passed strategy.run a batch of shape {shape} that is no distributed dataset's "
            f"element: each of the {n} replicas got all of it",
            *([f"the losses the replicas returned in step {k} sum to {returned:.4g} x one device's ({n}, the replica "
               "count)"] if returned is not None else [])]


def keras_loss_reduction_raised(o: Observed):
    """Keras 2 refusing its default reduction inside strategy.run."""
    if not o.raised:
        return None
    raised = o.dist.raised
    message = raised.message
    if "Reduction" in message and ("SUM" in message or "NONE" in message) and "strategy" in message.lower():
        return [f"{raised.where} raised {raised.type}{raised.said()}: {short_error(message)}"]
    return None


def lazy_optimizer_build_raised(o: Observed):
    """The step raised what a slot made inside the distributed step raises, with no slots before it."""
    if not o.raised or not optimizer_built_lazily(o.facts):
        return None
    raised = o.dist.raised
    if any(m in raised.message for m in _SLOT_ERRORS):
        return [f"the optimizer was not built when the first step began "
                f"({o.facts.optimizer_variables_before_step} variables: no slots yet), and {raised.where} "
                f"raised {raised.type}{raised.said()}: {short_error(raised.message)}"]
    return None


def identical_dropout_masks(o: Observed):
    masks, facts = o.dist.masks, o.facts
    if o.raised or not (masks and len(masks) > 1 and facts.random_layers):
        return None
    if all(np.array_equal(m, masks[0]) for m in masks[1:]):
        return [f"the model's random layers ({', '.join(facts.random_layers)}) in training mode gave every one of "
                f"the {len(masks)} replicas the same output for the same input: the same random draws"]
    return None


def per_replica_batch_size(o: Observed):
    if not o.diverged or o.same_examples:
        return None
    n, k, rows, rows_ref, d = o.n, o.k, o.rows, o.rows_ref, o.d
    if rows * n == rows_ref:
        return [f"step {k} gave the {n} replicas {rows} examples in all ({d.rows}), one device {rows_ref}: the "
                f"dataset's batches are the per-replica size, {n}x too small"]
    return [f"step {k} gave the replicas {rows} examples ({d.rows}), one device {rows_ref}"]


def lazy_optimizer_build(o: Observed):
    """Named where the lazily made slots did what such slots do: differ between the replicas; not for a
    slot that differs from one device's, which rounding of a split batch (TensorFlow's custom-training
    tutorial under multi_worker:2x1) or other data (its multi-worker tutorial's per-worker shuffles) also
    give."""
    if not o.same_examples or not optimizer_slots_made_in_the_step(o.facts):
        return None
    if any(m.role == "replicas" for m in o.mismatches):
        return [f"the optimizer had {o.facts.optimizer_variables_before_step} variables when the first step "
                f"began and {o.facts.optimizer_variables_after} after it: its slots were created inside "
                "strategy.run"]
    return None


def _metrics_alone(o: Observed) -> list:
    """The differing metrics, where only metrics differ (else none)."""
    return [m for m in o.mismatches if m.role == "metric"] if o.same_examples and o.only_metrics else []


def metric_from_one_replica(o: Observed):
    for m in _metrics_alone(o):
        one = _one_replicas_value(o.dist, m.what.name, o.k)
        if one is not None:
            j, series = one
            return [f"{m.quantity} after step {o.k} is {m.got}, the mean of replica {j}'s values "
                    f"{[round(v, 7) for v in series]} that the script read with experimental_local_results, not of "
                    f"all {o.n} replicas' (one device: {m.expected})"]
    return None


def local_result_of_one_replica(o: Observed):
    """A value the script read by index of ``experimental_local_results`` (compared as a metric:
    ``LOCAL_READ[0] at train.py:42``) differs from what one device read there, under several replicas:
    the script kept one replica's value as the whole's."""
    if o.n < 2:
        return None
    for m in _metrics_alone(o):
        if m.what.name.startswith(LOCAL_READ):
            index = m.what.name[len(LOCAL_READ):].partition("]")[0].lstrip("[")
            return [f"{m.quantity} after step {o.k} is {m.got}: the script read [{index}] of "
                    f"experimental_local_results, one replica's value of the {o.n} replicas' (one device: {m.expected})"]
    return None


def same_examples_through(ref, dist, upto: int) -> bool:
    """Whether the spec's replicas together got exactly the reference's examples in each of the first
    ``upto`` steps (the digests of the examples each drew, as multisets); False where a run did not read
    them."""
    if upto < 1 or len(ref.steps) < upto or len(dist.steps) < upto:
        return False
    for r, d in zip(ref.steps[:upto], dist.steps[:upto]):
        if r.examples is None or d.examples is None:
            return False
        if sorted(x for rep in d.examples for x in rep) != sorted(x for rep in r.examples for x in rep):
            return False
    return True


def returned_by_train_step(facts, name: str) -> bool:
    """Whether the metric ``name`` is a log of fit that the script's own ``train_step`` returned, not a
    Keras metric it holds (the engine names those ``HOLDER.metrics[NAME]``): what Keras' fit reduces over
    the replicas by itself (``reduce_per_replica``)."""
    log = name.removeprefix("fit ")
    held = any(key == log or key.endswith(f".metrics[{log}]") for key in (facts.metric_states or {}))
    return name.startswith("fit ") and bool(facts.fit_own_train_step) and not held


def fit_log_reduced_over_replicas(o: Observed):
    """Only fit's logs differ, each a value the script's own train_step returns (no Keras metric it
    holds), at exactly 1/N or N x one device's: what fit's own reduction of train_step's returns over
    the replicas makes of a per-replica value (reduce_per_replica, reduction "auto": Keras 3's
    "mean" off TPU averages the replicas' shares of a global mean; Keras 2's "sum" adds N equal means)."""
    if o.n < 2:
        return None
    logs = _metrics_alone(o)
    if not logs or not all(returned_by_train_step(o.facts, m.what.name) for m in logs):
        return None
    # (the ratio, how it reads, what fit does with the replicas' values and where Keras does it, what it makes of them)
    ways = [(1 / o.n, f"of one device's (1/{o.n} for {o.n} replicas)", "averages it over the replicas (Keras 3: "
             "reduce_per_replica(..., reduction='auto'), 'mean' off TPU, in keras/src/backend/tensorflow/trainer.py)",
             f"a replica's share of the global mean is logged at 1/{o.n} of one device's"),
            (o.n, f"x one device's ({o.n} replicas)", "sums it over the replicas (Keras 2: "
             "reduce_per_replica(..., 'auto'), 'sum' off TPU, in keras/src/engine/training.py)",
             f"a value alike on every replica is logged at {o.n} x one device's")]
    for m in logs:
        for ratio, reads, does, makes in ways:
            if _is(m.ratio, ratio):
                return [f"{m.quantity} after step {o.k} is {m.ratio:.4g} {reads} while the loss and every variable "
                        "agree", f"{m.what.name.removeprefix('fit ')} is a value the script's train_step returns to fit, "
                        f"which {does}: {makes}"]
    return None


def metric_fed_scaled_loss(o: Observed):
    """A metric at 1/N of one device's that is not one replica's value (nor a value a custom
    train_step returned to fit, which no Mean of the script's averaged)."""
    for m in _metrics_alone(o):
        if returned_by_train_step(o.facts, m.what.name):
            continue
        if _one_replicas_value(o.dist, m.what.name, o.k) is None and _is(m.ratio, 1 / o.n):
            if o.loss_is_a_metric and m.what.name.endswith(FIT_LOSS_TRACKER):
                return [f"{m.quantity} after step {o.k} is {m.ratio:.4g} of one device's (1/{o.n} for {o.n} replicas) "
                        "while every variable agrees; fit logs it as the loss",
                        "the script's own train_step updates Keras' loss tracker with the replica's scaled loss "
                        "(Keras' own train_step unscales it first: unscale_loss_for_distribution, in Keras 3's "
                        "keras/src/backend/tensorflow/trainer.py)"]
            return [f"{m.quantity} after step {o.k} is {m.ratio:.4g} of one device's (1/{o.n} for {o.n} replicas) "
                    "while the loss and every variable agree"]
    return None


def first_metric(o: Observed, predicate) -> int:
    """The place of the first differing metric that alone shows ``predicate``'s cause: the order of
    the metric causes among themselves (causes.py, ``TOGETHER``)."""
    return next((i for i, m in enumerate(o.mismatches)
                 if predicate(dataclasses.replace(o, mismatches=[m])) is not None), len(o.mismatches))


def weighted_loss_normalized_per_replica(o: Observed):
    if not o.in_step or o.n <= 1:
        return None
    if not _is(o.data_ratio, 1.0) and _exactly(o.by_weights, o.data_ref) and o.grads_follow:
        return [*o.loss_lines,
                f"each replica divided its weighted loss by its own batch's weights "
                f"{[round(w, 6) for w in o.d.weights]}: the replicas' losses weighted by those sums give one device's "
                f"loss ({o.by_weights:.7g} against {o.data_ref:.7g})"]
    return None


def _averaged_per_replica(o: Observed) -> bool:
    """The returned losses are N x one device's and weighted by each replica's examples give it exactly."""
    return o.in_step and o.n > 1 and _is(o.data_ratio, o.n) and _exactly(o.by_rows, o.data_ref) and o.grads_follow


def keras_loss_reduction(o: Observed):
    """The x N ratio with a loss object that averages over each replica's own batch."""
    if _averaged_per_replica(o) and o.keras_reduces:
        return [*o.loss_lines, f"{o.n} is the replica count, and the loss object's reduction is {o.reduction!r}, "
                               "which averages over each replica's own batch"]
    return None


def loss_averaged_per_replica(o: Observed):
    if _averaged_per_replica(o) and not o.keras_reduces:
        return [*o.loss_lines, f"{o.n} is the replica count: each replica divided by its own batch, not the global one"]
    return None


def loss_divided_twice(o: Observed):
    n = o.n
    if o.in_step and n > 1 and _is(o.data_ratio, 1 / n) and (o.grads is None or (_is(o.ratio, 1 / n)
                                                                                 and o.cosine > 0.99)):
        return [*o.loss_lines, f"1/{n} is one over the replica count: the loss was divided by it once too often"]
    return None


def _gradients_readable(o: Observed) -> bool:
    """Each replica's gradients are known and the returned losses sum to one device's."""
    return o.in_step and o.each is not None and o.n > 1 and _is(o.data_ratio, 1.0)


def gradients_aggregated_by_hand(o: Observed):
    if not _gradients_readable(o):
        return None
    equal_to_summed, _, _ = o.each
    if equal_to_summed and _is(o.ratio, o.n) and o.cosine > 0.99:
        return [*o.loss_lines, f"every replica handed apply_gradients the gradients of the whole global batch (each "
                               f"equals one device's), so apply_gradients' own sum over the {o.n} replicas counted "
                               f"them {o.n} times"]
    return None


def clipped_before_aggregation(o: Observed):
    if not _gradients_readable(o):
        return None
    _, equal_to_each_other, norms_equal = o.each
    _, _, norms, ref_norm = o.grads
    if (not equal_to_each_other and norms_equal and not _is(o.ratio, 1.0) and min(norms) > 0
            and abs(ref_norm - norms[0]) <= 1e-3 * ref_norm):
        return [f"every replica handed apply_gradients gradients of its own direction but of the same global norm "
                f"{norms[0]:.6g} (on all {o.n}), and one device's norm is {ref_norm:.6g} too: a clip bound each "
                f"replica's gradients before apply_gradients summed them; their sum is {o.ratio:.4g} x one device's"]
    return None


def gradient_of_per_replica_mean(o: Observed):
    if not _gradients_readable(o):
        return None
    equal_to_summed, equal_to_each_other, _ = o.each
    n = o.n
    if not equal_to_summed and not equal_to_each_other and _is(o.ratio, n) and o.cosine > 0.99:
        return [*o.loss_lines, f"yet their gradients are each replica's own (they differ from each other and from one "
                               f"device's whole-batch gradients) and sum to {n} x one device's ({n}, the replica "
                               "count): each replica took the gradient of its own batch's mean, not of the loss it "
                               "returned"]
    return None


def optimizer_scaled_by_replicas(o: Observed):
    if not (o.in_step and o.n > 1 and _is(o.data_ratio, 1.0) and o.grads is not None and o.grads_agree):
        return None
    n, k = o.n, o.k
    moved = [m for m in o.mismatches if m.ratio is not None and math.isfinite(m.ratio) and m.role == "variable"]
    hyper = [m for m in o.mismatches if m.role == "optimizer variable" and k == 1 and _is(m.ratio, n)]
    if moved and all(_is(m.ratio, n) for m in moved):
        return [*o.loss_lines,
                f"yet every variable moved {moved[0].ratio:.4g} x one device's update ({n}, the replica count): the "
                "optimizer turned the same gradients into a larger step"
                + (f"; {hyper[0].quantity} is {hyper[0].ratio:.4g} x one device's from the first step" if hyper else "")]
    return None


def shuffled_per_worker_before_sharding(o: Observed):
    workers = o.facts.workers
    shuffled = o.facts.shuffled_before_sharding or {}
    if o.in_step and workers > 1 and shuffled and o.k == 1:
        shuffle, shard = next(iter(shuffled.items()))
        return [f"the script shuffles at {shuffle} without a seed, and the dataset is sharded after it ({shard}): "
                f"each of the {workers} workers, a process of its own, draws its own order, so their shards overlap "
                f"and miss examples; step 1 already differs from one device's"]
    return None


def input_not_sharded_per_worker(o: Observed):
    workers = o.facts.workers
    if o.in_step and workers > 1 and _same_batches_on_every_worker(o.d, workers):
        if o.d.examples is not None:
            return [f"the replicas of all {workers} workers got worker 0's examples in step {o.k} (the digests of "
                    f"the {sum(map(len, o.d.examples))} examples they drew): every worker read the same examples"]
        return [f"the replicas of all {workers} workers returned the same losses {o.d.replica_losses} and handed "
                "apply_gradients the same gradients, bit for bit, as worker 0's: every worker read the same examples"]
    return None


def regularization_not_scaled(o: Observed):
    if not (o.in_step and o.facts.regularized and o.reg and o.n > 1 and o.loss_ratio is not None):
        return None
    n, reg, extra = o.n, o.reg, o.d.loss - o.r.loss
    if abs(extra - (n - 1) * reg) <= RATIO_SLACK * (n - 1) * reg:
        return [f"the loss of step {o.k} exceeds one device's by {extra:.6g} = ({n} - 1) x the weight penalty "
                f"{reg:.6g}: every replica added it whole"]
    return None


def reduce_mean_for_sum(o: Observed):
    n = o.n
    if not (o.in_step and o.loss_ratio is not None and "loss" in o.roles and _is(o.loss_ratio, 1 / n)):
        return None
    if o.facts.loss_reduction == "MEAN" or _is(o.returned_ratio, 1.0):
        return [f"the reported loss is {o.loss_ratio:.4g} x one device's (1/{n}) while the replicas' own losses sum "
                f"to {o.returned_ratio:.4g} x it; the loop reduces with {o.facts.loss_reduction}"]
    return None


def per_replica_batch_norm(o: Observed):
    """Named only where the divergence shows in those layers' statistics (not for the layer's presence)."""
    if not o.in_step:
        return None
    unsynced = [name for name, synced in o.facts.batch_norm if not synced]
    statistics = [m for m in o.mismatches if m.what.of_variable and any(f"{name}/moving_" in m.what.name
                                                                         for name in unsynced)]
    if unsynced and o.n > 1 and statistics:
        return [f"BatchNormalization layers {', '.join(unsynced)} are not synchronized: each of the {o.n} replicas "
                f"normalizes with its own batch's statistics, one device with the global batch's; their statistics "
                f"diverged ({statistics[0].quantity}: relative difference {statistics[0].relative:.3g})"]
    return None


def keras_loss_reduction_short_batch(o: Observed):
    """The first divergence is a short, unevenly split batch, with a loss object that averages (Keras 3
    divides each replica's mean by N)."""
    if o.in_step and o.short_batch and o.keras_reduces:
        return [o.short_batch, f"the loss object's reduction is {o.reduction!r}: under a strategy Keras 3 divides "
                               "each replica's mean by the replica count, which is the global mean only when the "
                               "replicas' batches are equal"]
    return None


def short_batch_weighted_differently(o: Observed):
    if o.in_step and o.short_batch and not o.keras_reduces:
        return [o.short_batch, "on the full batches before it, split evenly, the denominators agreed"]
    return None


def replicas_disagree(o: Observed):
    disagree = [m for m in o.mismatches if m.role == "replicas"] if o.in_step else []
    if disagree:
        return [f"after step {o.k}, {disagree[0].quantity}: relative difference {disagree[0].relative:.3g} "
                f"({len(disagree)} such comparisons)"]
    return None
