"""The diagnosis of a loop's first diverging step: the catalogued causes (causes.py, ``CAUSES``)
its evidence supports: ratios of the loss, of the summed gradients and of a metric to the replica
count, the examples each replica saw, the weight penalty, the gradients' norms on each replica, and
what the engine saw of the workload (the loss object's reduction, BatchNormalization layers,
variables created outside the scope, an optimizer built in the first step)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ...common.results import optimizer_built_lazily, optimizer_slots_made_in_the_step
from .causes import CAUSES
from .render import short_error
from .runs import norm as _norm

RATIO_SLACK = 0.05  # a measured ratio "is" N when within 5% of it


@dataclasses.dataclass
class Diagnosis:
    cause: str
    evidence: list
    model: str = ""  # the model (and its optimizer) it concerns, in a workload of several

    @property
    def title(self) -> str:
        return f"{self.model}: {CAUSES[self.cause].title}" if self.model else CAUSES[self.cause].title

    @property
    def fix(self) -> str:
        return CAUSES[self.cause].fix


def _one_replicas_value(dist, metric: str, k: int):
    """``(j, values)`` where a mean metric's value after step ``k`` is the mean over the steps of
    replica j's values of what the script read with ``experimental_local_results`` (the last read
    of each step), not the mean of their sums; else None."""
    reads = (dist.facts.get("local_reads") or [])[:k]
    states = sorted(dist.facts.get("metric_states", {}).get(metric, ()))
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
    """Whether each worker's replicas returned exactly worker 0's losses and gradients (the same
    examples: distinct examples give the same float only by chance)."""
    per = len(d.replica_losses) // workers
    if per < 1 or any(d.replica_losses[w * per:(w + 1) * per] != d.replica_losses[:per] for w in range(1, workers)):
        return False
    return d.gradients is None or all(all(np.array_equal(a, b) for a, b in zip(d.gradients[w * per + i], d.gradients[i]))
                                      for w in range(1, workers) for i in range(per))


LOSS_REDUCTIONS_THAT_AVERAGE = ("sum_over_batch_size", "auto", "Reduction.AUTO", "Reduction.SUM_OVER_BATCH_SIZE")


def _group(run, name: str, offset: int, count: int):
    """``run`` as the diagnosis of one model and its optimizer sees it, in a workload of several: the
    gradients of that optimizer, the loss the step returned for that model and its weight penalty."""
    def step(st):
        named = (st.named or {}).get(name)
        return dataclasses.replace(
            st, gradients=None if st.gradients is None else [rep[offset:offset + count] for rep in st.gradients],
            **({"loss": named["loss"], "replica_losses": list(named["replicas"]),
                "regularization": named["regularization"], "named": None} if named else
               {"loss": math.nan, "replica_losses": [math.nan] * len(st.replica_losses), "named": None}))
    return dataclasses.replace(run, steps=[step(st) for st in run.steps],
                               facts={**run.facts, "gradient_groups": None})


def _per_model(ref, dist, mismatches: list, global_batch: int) -> list[Diagnosis]:
    """The causes of each model of several, each from its own optimizer's gradients, the loss the
    step returned for it and the differences of its own variables and optimizer state; a cause is
    named with the model (``generator: loss averaged per replica``)."""
    out, offset = [], 0
    outside = dist.facts.get("outside_scope") or []
    if mismatches and all(m.role == "metric" for m in mismatches):
        # only metrics differ, and no metric is any one model's: judged as one model's metrics are
        return diagnose(ref, dataclasses.replace(dist, facts={**dist.facts, "gradient_groups": None, "models": None}),
                        mismatches, global_batch)
    for name, count in dist.facts["gradient_groups"]:
        mine = [m for m in mismatches if (m.what.name == name if m.role == "loss"
                                          else m.role != "metric" and m.what.name.startswith(f"{name}/"))]
        if mine:
            found = diagnose(_group(ref, name, offset, count), _group(dist, name, offset, count), mine, global_batch)
            out.extend(dataclasses.replace(d, model=name) for d in found)
        theirs = [q for q in outside if q.removeprefix("optimizer: ").startswith(f"{name}/")]
        if theirs and not any(d.model == name and d.cause == "created_outside_scope" for d in out):
            # a mistake whether or not this spec's numbers show it (as for one model)
            shown = ", ".join(theirs[:4]) + (" ..." if len(theirs) > 4 else "")
            out.append(Diagnosis("created_outside_scope", [f"not created in the strategy's scope: {shown}"], model=name))
        offset += count
    # a metric of no model at one over the replica count, exactly, while every model's loss agrees: what a Mean
    # fed each replica's scaled loss shows, whatever else differs (the variables, where Keras < 3.5 applies each
    # replica's own gradients); a metric that differs otherwise is no cause's evidence
    n, metrics = dist.replicas, [m for m in mismatches if m.role == "metric"]
    if n > 1 and metrics and not any(m.role == "loss" for m in mismatches):
        exact = next((m for m in metrics if m.ratio is not None and abs(m.ratio * n - 1) <= 1e-4), None)
        if exact is not None:
            out.append(Diagnosis("metric_fed_scaled_loss", [f"{exact.quantity} after step {exact.step} is "
                                                            f"{exact.ratio:.7g} of one device's (1/{n} for {n} replicas) "
                                                            "while every model's loss agrees"]))
    return out


# what raises where an optimizer's slots are made inside the distributed step: Keras 3 under
# collectives (the placeholder its lazy build leaves in the step's cond), Keras 2 (the slot's scope);
# another raise of a step with an unbuilt optimizer (a collective's timeout) is not that cause
_SLOT_ERRORS = ("You must feed a value for placeholder tensor", "slot variable")


def diagnose(ref, dist, mismatches: list, global_batch: int) -> list[Diagnosis]:
    """The catalogued causes the evidence of the first diverging step supports (first the
    strongest); empty when none does. In a workload of several models and optimizers, each model's
    (``_per_model``)."""
    several = len(dist.facts.get("gradient_groups") or ()) > 1 or len(dist.facts.get("models") or ()) > 1
    if several and dist.facts.get("gradient_groups") and dist.raised is None:
        return _per_model(ref, dist, mismatches, global_batch)
    n = dist.replicas
    facts = dist.facts
    out: list[Diagnosis] = []

    def add(cause, *evidence):
        if cause not in [d.cause for d in out]:
            out.append(Diagnosis(cause, list(evidence)))

    if facts.get("outside_scope"):
        shown = ", ".join(facts["outside_scope"][:4]) + (" ..." if len(facts["outside_scope"]) > 4 else "")
        add("created_outside_scope", f"not created in the strategy's scope: {shown}")
    before, after = facts.get("optimizer_variables_before_step"), facts.get("optimizer_variables_after")
    lazy = optimizer_slots_made_in_the_step(facts)
    undistributed = facts.get("undistributed_inputs") or {}
    if n > 1 and undistributed and mismatches:  # a script's batch passed whole to every replica: the root cause
        where, shape = next(iter(undistributed.items()))
        k = mismatches[0].step
        r, d = ref.steps[k - 1], dist.steps[k - 1]
        returned = sum(d.replica_losses) / r.loss if r.loss and d.replica_losses else None
        add("batch_not_distributed", f"at {where} the script passed strategy.run a batch of shape {shape} that is no "
                                     f"distributed dataset's element: each of the {n} replicas got all of it",
            *([f"the losses the replicas returned in step {k} sum to {returned:.4g} x one device's ({n}, the replica "
               "count)"] if returned is not None else []))
        return out
    if dist.raised is not None:
        message = dist.raised.message
        if "Reduction" in message and ("SUM" in message or "NONE" in message) and "strategy" in message.lower():
            add("keras_loss_reduction", f"{dist.raised.where} raised {dist.raised.type}: {short_error(message)}")
        if optimizer_built_lazily(facts) and any(m in message for m in _SLOT_ERRORS):
            add("lazy_optimizer_build", f"the optimizer was not built when the first step began ({before} variables: "
                                        f"no slots yet), and {dist.raised.where} raised {dist.raised.type}: "
                                        f"{short_error(message)}")
        return out
    if dist.masks and len(dist.masks) > 1 and facts.get("random_layers"):
        if all(np.array_equal(m, dist.masks[0]) for m in dist.masks[1:]):
            add("identical_dropout_masks",
                f"the model's random layers ({', '.join(facts['random_layers'])}) in training mode gave every one of "
                f"the {len(dist.masks)} replicas the same output for the same input: the same random draws")
    if not mismatches:
        return out
    k = mismatches[0].step
    r, d = ref.steps[k - 1], dist.steps[k - 1]
    rows_ref, rows = sum(r.rows), sum(d.rows)
    if rows != rows_ref:
        if rows * n == rows_ref:
            add("per_replica_batch_size", f"step {k} gave the {n} replicas {rows} examples in all ({d.rows}), one device "
                                          f"{rows_ref}: the dataset's batches are the per-replica size, {n}x too small")
        else:
            add("per_replica_batch_size", f"step {k} gave the replicas {rows} examples ({d.rows}), one device {rows_ref}")
        return out
    # named where the lazily made slots did what such slots do: differ between the replicas; not for a slot
    # that differs from one device's, which rounding of a split batch (TensorFlow's custom-training tutorial
    # under multi_worker:2x1) or other data (its multi-worker tutorial's per-worker shuffles) also give
    if lazy and any(m.role == "replicas" for m in mismatches):
        add("lazy_optimizer_build", f"the optimizer had {before} variables when the first step began and {after} "
                                    "after it: its slots were created inside strategy.run")
    loss_ratio = d.loss / r.loss if r.loss else None
    returned = sum(d.replica_losses)
    returned_ratio = returned / r.loss if r.loss else None
    roles = {m.role for m in mismatches}
    only_metrics = roles == {"metric"}
    if only_metrics:
        for m in mismatches:
            one = _one_replicas_value(dist, m.what.name, k)
            if one is not None:
                j, series = one
                add("metric_from_one_replica", f"{m.quantity} after step {k} is {m.got}, the mean of replica {j}'s "
                                               f"values {[round(v, 7) for v in series]} that the script read with "
                                               f"experimental_local_results, not of all {n} replicas' (one device: "
                                               f"{m.expected})")
            elif _is(m.ratio, 1 / n):
                add("metric_fed_scaled_loss", f"{m.quantity} after step {k} is {m.ratio:.4g} of one device's "
                                              f"(1/{n} for {n} replicas) while the loss and every variable agree")
        return out
    reduction = str(facts.get("loss_object_reduction") or "")
    # the data loss's ratio: what the replicas' steps returned, summed, against one device's, the
    # weight penalty taken out of both (a correctly scaled penalty sums to one device's)
    reg = r.regularization or 0.0
    data_ratio = (returned - reg) / (r.loss - reg) if r.loss - reg else None
    grads = _grad_evidence(r, d)
    ratio = cosine = None
    evidence = [f"the losses the {n} replicas' steps returned sum to {data_ratio:.4g} x one device's"
                + (" (the weight penalty taken out of both)" if reg else "")] if data_ratio is not None else []
    if grads is not None:
        ratio, cosine, norms, ref_norm = grads
        evidence.append(f"the gradients they handed to apply_gradients sum to {ratio:.4g} x one device's "
                        f"(cosine {cosine:.6f})")
    # each cause is named only when every observation it predicts holds: the returned losses'
    # ratio, the summed gradients' ratio, and how each replica's gradients relate to one device's
    # and to each other's (unknown gradients contradict nothing, but predict nothing either)
    each = _replica_grad_evidence(r, d) if grads is not None else None
    grads_agree = grads is None or (_is(ratio, 1.0) and cosine > 0.99)
    # what each replica's step returned, its share of the weight penalty taken out: had each divided
    # by its own examples (or weights), those shares weighted by the examples (weights) would be
    # one device's loss exactly
    shares = [x - reg / n for x in d.replica_losses]
    data_ref = r.loss - reg
    by_rows = sum(x * rows for x, rows in zip(shares, d.rows)) / sum(d.rows) if sum(d.rows) else None
    by_weights = (sum(x * w for x, w in zip(shares, d.weights)) / sum(d.weights)
                  if d.weights and sum(d.weights) else None)
    grads_follow = grads is None or (cosine > 0.99 and data_ratio and abs(ratio - data_ratio) <= RATIO_SLACK * data_ratio)
    if n > 1 and not _is(data_ratio, 1.0) and _exactly(by_weights, data_ref) and grads_follow:
        add("weighted_loss_normalized_per_replica", *evidence,
            f"each replica divided its weighted loss by its own batch's weights {[round(w, 6) for w in d.weights]}: "
            f"the replicas' losses weighted by those sums give one device's loss ({by_weights:.7g} against "
            f"{data_ref:.7g})")
    elif n > 1 and _is(data_ratio, n) and _exactly(by_rows, data_ref) and grads_follow:
        if facts.get("user_step") and reduction in LOSS_REDUCTIONS_THAT_AVERAGE:
            add("keras_loss_reduction", *evidence, f"{n} is the replica count, and the loss object's reduction is "
                                                   f"{reduction!r}, which averages over each replica's own batch")
        else:
            add("loss_averaged_per_replica", *evidence, f"{n} is the replica count: each replica divided by its "
                                                        "own batch, not the global one")
    elif n > 1 and _is(data_ratio, 1 / n) and (grads is None or (_is(ratio, 1 / n) and cosine > 0.99)):
        add("loss_divided_twice", *evidence, f"1/{n} is one over the replica count: the loss was divided by it once "
                                             "too often")
    if each is not None and n > 1 and _is(data_ratio, 1.0):
        equal_to_summed, equal_to_each_other, norms_equal = each
        if equal_to_summed and _is(ratio, n) and cosine > 0.99:
            add("gradients_aggregated_by_hand", *evidence,
                f"every replica handed apply_gradients the gradients of the whole global batch (each equals one "
                f"device's), so apply_gradients' own sum over the {n} replicas counted them {n} times")
        elif (not equal_to_each_other and norms_equal and not _is(ratio, 1.0) and min(norms) > 0
              and abs(ref_norm - norms[0]) <= 1e-3 * ref_norm):
            add("clipped_before_aggregation",
                f"every replica handed apply_gradients gradients of its own direction but of the same global norm "
                f"{norms[0]:.6g} (on all {n}), and one device's norm is {ref_norm:.6g} too: a clip bound each "
                f"replica's gradients before apply_gradients summed them; their sum is {ratio:.4g} x one device's")
        elif not equal_to_summed and not equal_to_each_other and _is(ratio, n) and cosine > 0.99:
            add("gradient_of_per_replica_mean", *evidence,
                f"yet their gradients are each replica's own (they differ from each other and from one device's "
                f"whole-batch gradients) and sum to {n} x one device's ({n}, the replica count): each replica took the "
                "gradient of its own batch's mean, not of the loss it returned")
    if n > 1 and _is(data_ratio, 1.0) and grads is not None and grads_agree:
        moved = [m for m in mismatches if m.ratio is not None and math.isfinite(m.ratio)
                 and m.role == "variable"]
        hyper = [m for m in mismatches if m.role == "optimizer variable" and k == 1 and _is(m.ratio, n)]
        if moved and all(_is(m.ratio, n) for m in moved):
            add("optimizer_scaled_by_replicas", *evidence,
                f"yet every variable moved {moved[0].ratio:.4g} x one device's update ({n}, the replica count): the "
                "optimizer turned the same gradients into a larger step"
                + (f"; {hyper[0].quantity} is {hyper[0].ratio:.4g} x one device's from the first step" if hyper else ""))
    workers = facts.get("workers", 1)
    shuffled = facts.get("shuffled_before_sharding") or {}
    if workers > 1 and shuffled and k == 1:
        shuffle, shard = next(iter(shuffled.items()))
        add("shuffled_per_worker_before_sharding",
            f"the script shuffles at {shuffle} without a seed, and the dataset is sharded after it ({shard}): each "
            f"of the {workers} workers, a process of its own, draws its own order, so their shards overlap and miss "
            f"examples; step 1 already differs from one device's")
    if workers > 1 and _same_batches_on_every_worker(d, workers):
        add("input_not_sharded_per_worker",
            f"the replicas of all {workers} workers returned the same losses {d.replica_losses} and handed "
            "apply_gradients the same gradients, bit for bit, as worker 0's: every worker read the same examples")
    if facts.get("regularized") and reg and n > 1 and loss_ratio is not None:
        extra = d.loss - r.loss
        if abs(extra - (n - 1) * reg) <= RATIO_SLACK * (n - 1) * reg:
            add("regularization_not_scaled", f"the loss of step {k} exceeds one device's by {extra:.6g} = "
                                             f"({n} - 1) x the weight penalty {reg:.6g}: every replica added it whole")
    if not out and loss_ratio is not None and "loss" in roles and _is(loss_ratio, 1 / n):
        if facts.get("loss_reduction") == "MEAN" or _is(returned_ratio, 1.0):
            add("reduce_mean_for_sum", f"the reported loss is {loss_ratio:.4g} x one device's (1/{n}) while the "
                     f"replicas' own losses sum to {returned_ratio:.4g} x it; the loop reduces with "
                     f"{facts.get('loss_reduction')}")
    unsynced = [name for name, synced in facts.get("batch_norm", []) if not synced]
    # named only where the divergence shows in those layers' statistics (not for the layer's presence)
    statistics = [m for m in mismatches if m.what.of_variable and any(f"{name}/moving_" in m.what.name
                                                                       for name in unsynced)]
    if unsynced and n > 1 and statistics and not out:
        add("per_replica_batch_norm", f"BatchNormalization layers {', '.join(unsynced)} are not synchronized: each "
                                      f"of the {n} replicas normalizes with its own batch's statistics, one device "
                                      f"with the global batch's; their statistics diverged ({statistics[0].quantity}: "
                                      f"relative difference {statistics[0].relative:.3g})")
    if rows_ref < global_batch and len(set(d.rows)) > 1 and not out:
        agreed = f"steps 1-{k - 1} agreed; " if k > 1 else ""
        short = (f"{agreed}step {k} is a short batch of {rows_ref} examples (global batch {global_batch}), split "
                 f"{d.rows} among the replicas, and it is the first step that diverges")
        if facts.get("user_step") and reduction in LOSS_REDUCTIONS_THAT_AVERAGE:
            add("keras_loss_reduction", short, f"the loss object's reduction is {reduction!r}: under a strategy Keras 3 "
                                               "divides each replica's mean by the replica count, which is the global "
                                               "mean only when the replicas' batches are equal")
        else:
            add("short_batch_weighted_differently", short, "on the full batches before it, split evenly, the "
                                                           "denominators agreed")
    disagree = [m for m in mismatches if m.role == "replicas"]
    if disagree and not out:
        add("replicas_disagree", f"after step {k}, {disagree[0].quantity}: relative difference "
                                 f"{disagree[0].relative:.3g} ({len(disagree)} such comparisons)")
    return out
