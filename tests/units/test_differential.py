"""The comparison and diagnoses of the check of a user's loop (suite/harness/loopcheck/differential.py) on
runs made up here: the norm-wise tolerance passes rounding and fails a whole-update mistake far
smaller than any catalogued one, the reference's repeatability names the variable that moved,
and the CentralStorage metric deviation is predicted from its documented formula."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from suite.common.facts import Facts
from suite.common.results import Raised, WorkloadRun, WorkloadStep
from suite.common.specs import parse_spec
from suite.harness.judging import deviations
from suite.harness.judging.judgment import Check, PropertyFailure
from suite.harness.judging.quantity import Quantity
from suite.harness.loopcheck import causes, controls, diagnosis, differential, evidence, render, usercheck
from suite.harness.loopcheck.causes import CAUSES
from suite.harness.loopcheck.evidence import Observed
from suite.harness.loopcheck.runs import first_difference, first_non_finite
from suite.harness.pool.pool import EngineError

INITIAL = [np.linspace(-1.0, 1.0, 64).reshape(8, 8), np.zeros(8)]
UPDATE = [np.full((8, 8), 0.01), np.full(8, -0.02)]


def run(scale: float = 1.0, noise: float = 0.0, replicas: int = 1, metric: list | None = None, rows=(48,)) -> WorkloadRun:
    """Two steps of SGD-like updates: ``scale`` x the update per step, ``noise`` added per element."""
    rng = np.random.default_rng(1)
    steps, values = [], [v.copy() for v in INITIAL]
    for k in range(2):
        values = [v + scale * u + noise * rng.standard_normal(v.shape) for v, u in zip(values, UPDATE)]
        steps.append(WorkloadStep(1.0 - 0.1 * k, [(1.0 - 0.1 * k) / replicas] * replicas, list(rows),
                                  [[v.copy() for _ in range(replicas)] for v in values], [], None,
                                  {"m": metric[k]} if metric else {}))
    return WorkloadRun(replicas, list(range(replicas)), ["kernel", "bias"], [True, True], [],
                       [v.copy() for v in INITIAL], steps, Facts())


def test_rounding_passes_and_a_tenth_of_a_percent_of_an_update_fails():
    check = Check("differential.compare")
    ref = run()
    _, worst, found = differential.compare(ref, run(noise=1e-8, replicas=2))
    check.equal(found, [], "differences found for float32-sized noise")
    check.that(worst < 1e-4, "worst relative difference of the noise", worst, "below rtol 1e-4")
    agreed, _, found = differential.compare(ref, run(scale=1.001, replicas=2))
    check.equal((agreed, sorted({m.quantity for m in found})),
                (0, ["bias (replica 0)", "bias (replica 1)", "kernel (replica 0)", "kernel (replica 1)"]),
                "an update 0.1% too large: agreeing steps and the differences of step 1")
    check.that(all(abs(m.ratio - 1.001) < 1e-9 for m in found), "the ratios of the updates",
               [m.ratio for m in found], "1.001")


def test_small_differences_across_the_update_are_said_not_judged():
    """A FAIL with no cause whose every difference is small and lies across the update (noise, as
    rounding gives) carries a note saying so; an update 0.5% too large (along it) gets none."""
    check = Check("differential.verdict_of")
    ref = run()
    across = differential.verdict_of("mirrored:2", ref, [run(noise=1e-6, replicas=2)], 48, rtol=1e-6)
    check.equal(across.status, "FAIL", "noise beyond a tight tolerance", render.details(across))
    check.contains(" ".join(across.notes), ["lies across the update, not along it"], "the note")
    along = differential.verdict_of("mirrored:2", ref, [run(scale=1.005, replicas=2)], 48)
    check.equal(along.status, "FAIL", "an update 0.5% too large", render.details(along))
    check.that(not any("across the update" in n for n in along.notes), "no such note", along.notes,
               "none for a difference along the update")


def test_a_replica_that_disagrees_is_a_difference():
    dist = run(replicas=2)
    dist.steps[0].variables[1][1] = dist.steps[0].variables[1][1] + 0.01
    _, _, found = differential.compare(run(), dist)
    Check("differential.compare").equal([m.quantity for m in found],
                                        ["bias (replica 1)", "bias: replica 1 against replica 0"],
                                        "differences when replica 1's bias moved")


def test_the_reference_that_does_not_repeat_itself_names_the_variable():
    moved = run(noise=1e-3)
    Check("runs.first_difference").equal(
        (first_difference(run(), run()), first_difference(run(), moved).split(" (")[0]),
        (None, "variable kernel after step 1"), "what moved between two runs")


KERAS3 = {"tensorflow": "2.21.0", "keras": "3.15.1"}
KERAS2 = {"tensorflow": "2.15.1", "keras": "2.15.0"}
MEAN = {"m": ["count", "total"]}  # a mean's metric_states


def test_central_storage_metrics_follow_the_documented_formula():
    """new state = replicas x old + increment (known deviation keras3-central-storage-metric-
    accumulation), asked of the ledger like any property's comparison: a mean of 0.5 over 4
    examples, then 0.25 over all 8, under 2 replicas reads 0.5, then (2 x 2 + 0) / (2 x 4 + 4) =
    1/3: DEVIATION on Keras 3, where the entry applies; FAIL on Keras 2 and for any other value."""
    ref = run(metric=[0.5, 0.25], rows=(4,))
    ref.facts.metric_states = dict(MEAN)
    check = Check("differential.verdict_of")
    for metric, versions, want in [([0.5, 1 / 3], KERAS3, ("DEVIATION", "keras3-central-storage-metric-accumulation")),
                                   ([0.5, 1 / 3], KERAS2, ("FAIL", None)), ([0.5, 0.3], KERAS3, ("FAIL", None))]:
        dist = run(replicas=2, metric=metric, rows=(2, 2))
        dist.facts.metric_states = dict(MEAN)
        v = differential.verdict_of("central_storage:2", ref, [dist], 8, spec_obj=parse_spec("central_storage:2"),
                                 versions=versions)
        check.equal((v.status, v.deviation[0] if v.deviation else None), want,
                    f"verdict for metrics {metric} on Keras {versions['keras']}", render.details(v))


def _raised(message: str, frames: tuple, kind: str = "ValueError") -> Raised:
    return Raised(kind, message, "step 1", ("user/train.py:<module>", "user/train.py:step") + frames)


AGGREGATION = "You must specify an aggregation method to update a AggregatingVariable in Replica Context. You can ..."
SEED_GENERATOR = ("keras/src/layers/regularization/dropout.py:call", "keras/src/random/seed_generator.py:next",
                  "keras/src/backend/common/variables.py:assign", "tensorflow/python/distribute/ps_values.py:assign")
USERS_ASSIGN_ADD = ("keras/src/backend/common/variables.py:assign_add", "keras/src/backend/common/variables.py:assign",
                    "tensorflow/python/distribute/ps_values.py:assign")


def _step_raised(spec: str, raised: Raised, versions=KERAS3, facts=None):
    dist = run(replicas=parse_spec(spec).replicas)
    dist = dataclasses.replace(dist, steps=[], raised=raised, facts=Facts(**(facts or {})))
    return differential.verdict_of(spec, run(), [dist], 48, spec_obj=parse_spec(spec), versions=versions)


def test_a_raised_step_is_blocked_only_from_the_deviations_origin():
    """The same ValueError under CentralStorage: from Keras' seed generator (Dropout: known deviation
    keras3-central-storage-replica-context-updates) the loop is right but BLOCKED; from the user's
    own assign_add on a variable created without an aggregation it is the loop's: FAIL."""
    check = Check("differential.verdict_of")
    v = _step_raised("central_storage:2", _raised(AGGREGATION, SEED_GENERATOR))
    check.equal((v.status, v.deviation[0] if v.deviation else None),
                ("BLOCKED", "keras3-central-storage-replica-context-updates"), "Keras' Dropout raising",
                render.details(v))
    v = _step_raised("central_storage:2", _raised(AGGREGATION, USERS_ASSIGN_ADD))
    check.equal((v.status, v.deviations), ("FAIL", []), "the user's assign_add raising", render.details(v))
    v = _step_raised("central_storage:2", _raised(AGGREGATION, SEED_GENERATOR), versions=KERAS2)
    check.equal(v.status, "FAIL", "the same error on Keras 2, where no entry applies", render.details(v))


def test_a_users_deadlock_is_the_loops_failure():
    """A collective timeout on multi_worker:2x1 is never an excuse by itself: a user's loop that
    reduces on one worker only fails (the deadlock entry needs Keras' LossScaleOptimizer frame
    and a probe that confirms its condition)."""
    timeout = _raised("Collective has timed out during execution. [Op:__inference_step_12]", (),
                      "DeadlineExceededError")
    v = _step_raised("multi_worker:2x1", timeout)
    Check("differential.verdict_of").equal((v.status, v.deviations), ("FAIL", []), "a user's deadlock",
                                        render.details(v))


def test_a_placeholder_error_is_blocked_only_where_the_optimizer_was_built_in_the_step():
    """keras3-lazy-optimizer-slots-mirrored raises from TensorFlow's variable-initializing wrapper
    (fn_with_cond) when the optimizer makes its slots in the first step, as TensorFlow's own
    tutorial does: the loop is right but BLOCKED, and the fix of lazy_optimizer_build (the entry's
    workaround) is shown as the way around it. The same error where the optimizer was built before
    the step is no known deviation: FAIL, no catalogued cause."""
    placeholder = Raised("InvalidArgumentError", "Graph execution error: ... You must feed a value for placeholder "
                         "tensor 'cond/else/_1/cond/Placeholder' with dtype int32 [Op:__inference_fn_with_cond_1058]",
                         "step 1", ("op:__inference_fn_with_cond_1058",))
    check = Check("differential.verdict_of")
    lazy = {"optimizer_built": False, "optimizer_variables_before_step": 1, "optimizer_variables_after": 5}
    v = _step_raised("mirrored:2", placeholder, facts=lazy)
    check.equal(([d.cause for d in v.diagnoses], v.status, v.deviation[0] if v.deviation else None),
                ([], "BLOCKED", "keras3-lazy-optimizer-slots-mirrored"),
                "an optimizer built in the first step", render.details(v))
    check.that(CAUSES["lazy_optimizer_build"].fix in v.deviation[1], "the way around it shown",
               v.deviation[1], "the fix of lazy_optimizer_build")
    built = {"optimizer_built": True, "optimizer_variables_before_step": 5, "optimizer_variables_after": 5}
    v = _step_raised("mirrored:2", placeholder, facts=built)
    check.equal(([d.cause for d in v.diagnoses], v.status, v.deviations), ([], "FAIL", []),
                "the same error with the optimizer built before the step", render.details(v))


def test_shared_draws_of_keras_dropout_do_not_excuse_a_divergence():
    """Keras 3's Dropout drawing one mask for both replicas is its known deviation (DEVIATION when
    nothing else differs), but a loop that also diverges for a reason no cause names is FAIL; a
    user's own random layer drawing the same masks is the loop's (identical_dropout_masks)."""
    check = Check("differential.verdict_of")
    masks = [np.ones((1, 4)), np.ones((1, 4))]
    facts = {"random_layers": ["dropout"], "random_layers_keras": True}
    for scale, keras_own, want in [(1.0, True, ("DEVIATION", [])), (1.5, True, ("FAIL", [])),
                                   (1.0, False, ("FAIL", ["identical_dropout_masks"]))]:
        dist = dataclasses.replace(run(scale=scale, replicas=2), masks=masks,
                                   facts=Facts(**{**facts, "random_layers_keras": keras_own}))
        v = differential.verdict_of("mirrored:2", run(), [dist], 48, spec_obj=parse_spec("mirrored:2"), versions=KERAS3)
        check.equal((v.status, [d.cause for d in v.diagnoses]), want,
                    f"update x{scale}, Keras' own Dropout: {keras_own}", render.details(v))
        if keras_own:
            check.equal(v.deviation[0] if v.deviation else None, "keras3-dropout-mask-shared-by-replicas",
                        "the deviation named", render.details(v))


def test_the_loop_check_and_a_property_name_the_same_entry_for_the_same_observation():
    """One judgment: Keras' seed generator raising under CentralStorage, judged by the Dropout
    property's Check (its test id's ledger) and by the loop check (loop-check[central_storage:2]),
    names the same entry; the user's own assign_add is excused by neither."""
    test = "tests/properties/test_blocks.py::test_seeded_random_draws_repeat_and_replicas_draw_their_own" \
           "[central_storage:2-dropout]"
    entries = tuple(d for d in deviations.load() if d.matches(test) and d.applies_to(KERAS3["tensorflow"], KERAS3["keras"]))
    check = Check("one judgment")
    for frames, want in [(SEED_GENERATOR, "keras3-central-storage-replica-context-updates"), (USERS_ASSIGN_ADD, None)]:
        raised = _raised(AGGREGATION, frames)
        with deviations.in_force(deviations.Ledger(entries)) as ledger:
            try:
                Check(parse_spec("central_storage:2")).returned(raised, Quantity.of(
                    "random draws", "the random draws of dropout (worker 0)", layer="dropout", worker=0))
                by_property = sorted(ledger.explained)[0]
            except PropertyFailure:
                by_property = None
        v = _step_raised("central_storage:2", None, facts={"masks_raised": [raised.type, raised.message,
                                                                             list(raised.frames)]})
        check.equal((by_property, v.deviation[0] if v.deviation else None), (want, want),
                    f"the entry named by the property and by the loop check, raised through {frames[1]}",
                    render.details(v))


# -- causes named only when every observation they predict holds ----------------------------------
G = [np.full((8, 8), 0.5), np.full(8, -1.0)]  # one device's gradients of step 1
D = [np.eye(8) * 0.25, np.linspace(-0.3, 0.3, 8)]  # a direction in which two replicas' batches differ


def _with_step1(run_, losses, grads, weights=None, rows=(24, 24)):
    """``run_`` with step 1's returned losses, gradients, rows and example-weight sums replaced."""
    first = dataclasses.replace(run_.steps[0], replica_losses=list(losses), gradients=grads, rows=list(rows),
                                weights=weights)
    return dataclasses.replace(run_, steps=[first] + run_.steps[1:])


def _causes(dist) -> list:
    ref = _with_step1(run(), [1.0], [G], rows=(48,))
    v = differential.verdict_of("mirrored:2", ref, [dist], 48, spec_obj=parse_spec("mirrored:2"), versions=KERAS3)
    return [d.cause for d in v.diagnoses]


def test_each_gradient_cause_is_named_only_with_all_of_its_evidence():
    """Updates twice one device's on 2 replicas, with the evidence of each cause: the losses
    summing to 2 x and the gradients too (loss averaged per replica); the losses right and every
    replica handing over one device's whole gradients (aggregated by hand: the old ratio rule
    also named 'loss averaged' and 'clipped' here); the losses right and each replica's own
    gradients at one device's norm (clipped before aggregation); the losses and gradients right
    (the optimizer scaled by the replica count); the losses right only when weighted by each
    replica's example weights (normalised by its own weights); the losses right and each replica's
    own gradients summing to 2 x (the gradient of a per-replica mean)."""
    check = Check("diagnosis.diagnose")
    two = run(scale=2.0, replicas=2)
    own = [[g + d for g, d in zip(G, D)], [g - d for g, d in zip(G, D)]]  # each replica's own gradients, summing to 2G
    half = [[x / 2 for x in rep] for rep in own]  # the same, summing to one device's G
    ref_norm = float(np.sqrt(sum(np.sum(g ** 2) for g in G)))

    def at_norm(grads, norm):
        n = float(np.sqrt(sum(np.sum(g ** 2) for g in grads)))
        return [g * (norm / n) for g in grads]

    cases = {
        "loss_averaged_per_replica": _with_step1(two, [1.0, 1.0], own),
        "gradients_aggregated_by_hand": _with_step1(two, [0.5, 0.5], [G, G]),
        "clipped_before_aggregation": _with_step1(two, [0.5, 0.5], [at_norm(rep, ref_norm) for rep in own]),
        "optimizer_scaled_by_replicas": _with_step1(two, [0.5, 0.5], half),
        # the losses right, each replica's own gradients (of its own batch's mean) summing to 2 x one device's
        "gradient_of_per_replica_mean": _with_step1(two, [0.5, 0.5], own),
        # replica 0 weighs 22 and returns 1.2, replica 1 weighs 26 and returns 26 / 26 x (48 - 22 x 1.2) / 26
        "weighted_loss_normalized_per_replica": _with_step1(two, [1.2, (48.0 - 22 * 1.2) / 26], own,
                                                             weights=[22.0, 26.0]),
    }
    for cause, dist in cases.items():
        check.equal(_causes(dist), [cause], f"causes named for the evidence of {cause}")


def test_a_cause_is_not_named_when_one_of_its_observations_contradicts_it():
    """The loss ratio 2 of 'loss averaged per replica' with gradients summing to one device's: no
    cause fits (the old rule named it from one ratio)."""
    two = run(scale=2.0, replicas=2)
    half = [[(g + d) / 2 for g, d in zip(G, D)], [(g - d) / 2 for g, d in zip(G, D)]]
    Check("diagnosis.diagnose").equal(_causes(_with_step1(two, [1.0, 1.0], half)), [],
                                         "causes for losses 2 x and gradients 1 x one device's")



def _flat(shown) -> list:
    return [p for place in shown for p in (place if isinstance(place, tuple) else (place,))]


def test_the_catalogue_declares_every_predicate_s_place():
    """Every predicate a cause is found by (causes.CAUSES, ``found_by``) has one place in the order
    the report lists them (causes.SHOWN), and the precedence names only listed predicates: a root
    cause (ENDS), a fallback (FALLBACKS), a predicate that subsumes others, listed before them
    (SUBSUMES), a place of several with its order among them (TOGETHER)."""
    check = Check("causes.SHOWN")
    listed = _flat(causes.SHOWN)
    found_by = [p for c in causes.CAUSES.values() for p in c.found_by]
    check.equal(sorted(p.__name__ for p in listed), sorted(p.__name__ for p in found_by),
                "the predicates listed against those of the catalogue, each once")
    for p in (*causes.ENDS, *causes.FALLBACKS, *causes.SUBSUMES, *(q for v in causes.SUBSUMES.values() for q in v)):
        check.that(p in listed, "a predicate of the precedence", p.__name__, "listed in SHOWN")
    for holder, theirs in causes.SUBSUMES.items():
        for p in theirs:
            check.that(listed.index(holder) < listed.index(p), "subsumes", f"{holder.__name__} -> {p.__name__}",
                       "the subsuming predicate listed first")
    check.equal(sorted(map(len, causes.TOGETHER)), sorted(len(p) for p in causes.SHOWN if isinstance(p, tuple)),
                "the places of several predicates, each with its order")


def test_each_cause_s_evidence_is_evaluated_on_its_own(monkeypatch):
    """Every predicate of the catalogue is evaluated, once, whatever the others find: here a script's
    batch passed whole to every replica, a root cause after which the report names nothing, and the
    losses' evidence of 'loss averaged per replica' holds too, found by its own predicate; no
    predicate is tried only because another found nothing."""
    check = Check("diagnosis.evaluate")
    called = []

    def spy(p):
        @functools.wraps(p)
        def wrapped(o):
            called.append(p.__name__)
            return p(o)
        return wrapped

    own = [[g + d for g, d in zip(G, D)], [g - d for g, d in zip(G, D)]]
    ref = _with_step1(run(), [1.0], [G], rows=(48,))
    dist = _with_step1(run(scale=2.0, replicas=2), [1.0, 1.0], own)
    dist = dataclasses.replace(dist, facts=Facts(undistributed_inputs={"train.py:12": [48, 8]}))
    _, _, mismatches = differential.compare(ref, dist)
    check.equal([d.cause for d in diagnosis.diagnose(ref, dist, mismatches, 48)], ["batch_not_distributed"],
                "the causes named")
    for name, cause in causes.CAUSES.items():
        monkeypatch.setitem(causes.CAUSES, name, dataclasses.replace(cause, found_by=tuple(map(spy, cause.found_by))))
    found = diagnosis.evaluate(Observed(ref, dist, mismatches, 48))
    check.equal(sorted(called), sorted(p.__name__ for p in _flat(causes.SHOWN)), "the predicates evaluated, each once")
    check.equal(sorted(p.__name__ for p in found), ["batch_not_distributed", "loss_averaged_per_replica"],
                "the predicates that hold")


def test_both_causes_evidence_holds_and_the_declared_precedence_names_one():
    """Each replica's example weights equal to its examples: the evidence of 'weighted loss normalised
    by each replica's own weights' and of 'loss averaged per replica' both hold, each found by its own
    predicate; the report names the first, which the catalogue says subsumes the second."""
    check = Check("diagnosis.diagnose")
    own = [[g + d for g, d in zip(G, D)], [g - d for g, d in zip(G, D)]]
    ref = _with_step1(run(), [1.0], [G], rows=(48,))
    dist = _with_step1(run(scale=2.0, replicas=2), [1.0, 1.0], own, weights=[24.0, 24.0])
    _, _, mismatches = differential.compare(ref, dist)
    found = diagnosis.evaluate(Observed(ref, dist, mismatches, 48))
    check.equal(sorted(p.__name__ for p in found), ["loss_averaged_per_replica", "weighted_loss_normalized_per_replica"],
                "the predicates that hold")
    check.that(evidence.loss_averaged_per_replica in causes.SUBSUMES[evidence.weighted_loss_normalized_per_replica],
               "SUBSUMES", "weighted_loss_normalized_per_replica", "subsumes loss_averaged_per_replica")
    check.equal([d.cause for d in diagnosis.diagnose(ref, dist, mismatches, 48)],
                ["weighted_loss_normalized_per_replica"], "the causes named")


def test_precedence_is_applied_as_declared():
    """With every predicate holding, the report lists the causes in the declared order up to the first
    root cause; without the root causes, a subsumed predicate and the fallbacks are left out, and a
    cause found two ways is named once, at its first place; a fallback is named alone."""
    check = Check("diagnosis.named")
    o = Observed(run(), run(), [], 48)
    every = {p: [p.__name__] for p in _flat(causes.SHOWN)}

    def names(found):
        return [c for c, _ in diagnosis.named(found, o)]

    check.equal(names(every), ["created_outside_scope", "batch_not_distributed"], "every predicate holding")
    without = {p: v for p, v in every.items() if p is not evidence.batch_not_distributed}
    check.equal(names(without), ["created_outside_scope", "keras_loss_reduction", "lazy_optimizer_build",
                                 "identical_dropout_masks", "per_replica_batch_size"], "all but the script's root cause")
    check.equal(diagnosis.named(without, o)[1][1], ["keras_loss_reduction_raised"],
                "the evidence of a cause found two ways: its first place's")
    no_ends = {p: v for p, v in every.items() if p not in causes.ENDS}
    check.equal(names(no_ends), ["created_outside_scope", "keras_loss_reduction", "lazy_optimizer_build",
                                 "identical_dropout_masks", "metric_from_one_replica", "metric_fed_scaled_loss",
                                 "fit_log_reduced_over_replicas", "weighted_loss_normalized_per_replica",
                                 "gradients_aggregated_by_hand", "optimizer_scaled_by_replicas",
                                 "shuffled_per_worker_before_sharding",
                                 "input_not_sharded_per_worker", "regularization_not_scaled"], "no root cause holding")
    fallbacks = {p: every[p] for p in causes.FALLBACKS}
    check.equal(names(fallbacks), ["reduce_mean_for_sum"], "only the fallbacks holding")
    check.equal(names({p: every[p] for p in causes.FALLBACKS[-2:]}), ["short_batch_weighted_differently"],
                "the last two fallbacks holding")
    custom = diagnosis.named(every, o, shown=(evidence.replicas_disagree, evidence.created_outside_scope), ends=(),
                             subsumes={evidence.replicas_disagree: (evidence.created_outside_scope,)}, fallbacks=())
    check.equal([c for c, _ in custom], ["replicas_disagree"], "a precedence given as data")

def _control_case(keras_own: bool, clips: bool, control_scale: float = 2.0):
    """The loop's run and the control's, both moving twice one device's update on 2 replicas."""
    facts = {"user_step": True, "keras_own_model": keras_own, "optimizer_clips": clips}
    ref = dataclasses.replace(run(), facts=Facts(**facts))
    dist = dataclasses.replace(run(scale=2.0, replicas=2), facts=Facts(**facts))
    control = dataclasses.replace(run(scale=control_scale, replicas=2), facts=Facts(**facts))
    return ref, dist, controls.control_of(ref, ref, [control], [dist])


def test_the_control_tells_tensorflows_divergence_from_the_loops():
    """A divergence no cause explains: where the suite's canonical step on the same Keras model
    and optimizer diverges the same way, it is TensorFlow's/Keras': DEVIATION naming the entry
    whose model predicts the control's values under its condition (a clipping optimizer: Keras 3's
    per-replica clipping), else an unrecorded deviation; where the control trains right, or the
    model has classes of the user's own, it stays FAIL with what the control showed."""
    check = Check("differential.verdict_of with a control")
    for keras_own, clips, control_scale, want in [
            (True, True, 2.0, ("DEVIATION", "keras3-clipping-per-replica-before-the-sum")),
            (True, False, 2.0, ("DEVIATION", "unrecorded")),
            (True, True, 1.0, ("FAIL", None)),
            (False, True, 2.0, ("FAIL", None))]:
        ref, dist, control = _control_case(keras_own, clips, control_scale)
        v = differential.verdict_of("mirrored:2", ref, [dist], 48, spec_obj=parse_spec("mirrored:2"), versions=KERAS3,
                                 control=control)
        check.equal((v.status, v.deviation[0] if v.deviation else None), want,
                    f"Keras' own model {keras_own}, clipping {clips}, control x{control_scale}", render.details(v))


def test_a_step_with_random_draws_of_its_own_is_random_where_it_differs_and_never_fail():
    """Random ops in the traced step (facts.random_ops): where the runs differ, RANDOM (exit 5),
    not FAIL, even where a cause's evidence holds (a note says so); where they agree, PASS; the
    same difference without random ops stays FAIL with its cause."""
    check = Check("differential.verdict_of with random draws")
    ref = run()
    drawn = {"random_ops": ["RngReadAndSkip", "StatelessRandomNormalV2"]}
    two = dataclasses.replace(run(scale=2.0, replicas=2), facts=Facts(**drawn))
    averaged = _with_step1(two, [1.0, 1.0], [[g + d for g, d in zip(G, D)], [g - d for g, d in zip(G, D)]])
    ref = _with_step1(ref, [1.0], [G], rows=(48,))
    spec = parse_spec("mirrored:2")
    v = differential.verdict_of("mirrored:2", ref, [averaged], 48, spec_obj=spec, versions=KERAS3)
    check.equal((v.status, v.diagnoses), ("RANDOM", []), "the verdict where the runs differ", render.details(v))
    check.contains(v.error or "", ["RngReadAndSkip", "StatelessRandomNormalV2", "cannot be compared"], "what it says")
    check.that(any("loss averaged per replica" in n for n in v.notes), "the notes", v.notes,
               "the cause whose evidence holds too, as a note")
    report = usercheck.Report("t", KERAS3, 48, 2, 1e-4, 1e-7, [], [v])
    check.equal((report.exit_code(), report.exit_code(accept_known=True)), (5, 5), "the exit status")
    same = dataclasses.replace(run(replicas=2), facts=Facts(**drawn))
    check.equal(differential.verdict_of("mirrored:2", run(), [same], 48, spec_obj=spec, versions=KERAS3).status, "PASS",
                "the verdict where the runs agree")
    plain = dataclasses.replace(averaged, facts=Facts())
    v = differential.verdict_of("mirrored:2", ref, [plain], 48, spec_obj=spec, versions=KERAS3)
    check.equal((v.status, [d.cause for d in v.diagnoses]), ("FAIL", ["loss_averaged_per_replica"]),
                "the verdict of the same difference without random ops")


def test_a_run_where_only_the_second_optimizers_state_differs_fails():
    """Several optimizers (a GAN's): every one's state is compared, so a run whose variables and
    first optimizer agree but whose second optimizer's moments differ is FAIL, the difference named
    by that optimizer."""
    def gan(second: float, replicas: int):
        steps = [WorkloadStep(1.0, [1.0 / replicas] * replicas, [48 // replicas] * replicas,
                              [[v + u for _ in range(replicas)] for v, u in zip(INITIAL, UPDATE)],
                              [[np.full(2, 0.5)] * replicas, [np.full(2, second)] * replicas], None, {})]
        facts = {"models": ["generator", "discriminator"], "optimizers": ["generator", "discriminator"]}
        return WorkloadRun(replicas, list(range(replicas)), ["generator/kernel", "discriminator/bias"], [True, True],
                           ["generator/adam/m", "discriminator/adam/m"], [v.copy() for v in INITIAL], steps, Facts(**facts))
    spec = parse_spec("mirrored:2")
    check = Check("differential.verdict_of of several optimizers")
    check.equal(differential.verdict_of("mirrored:2", gan(0.25, 1), [gan(0.25, 2)], 48, spec_obj=spec,
                                     versions=KERAS3).status, "PASS", "both optimizers agreeing")
    v = differential.verdict_of("mirrored:2", gan(0.25, 1), [gan(0.5, 2)], 48, spec_obj=spec, versions=KERAS3)
    check.equal((v.status, [m.quantity for m in v.mismatches]),
                ("FAIL", ["optimizer discriminator/adam/m (replica 0)", "optimizer discriminator/adam/m (replica 1)"]),
                "the second optimizer's moments differing", render.details(v))
    check.that(usercheck.Checker.control_fits(gan(0.25, 1)) is not None, "the control", "fits",
               "no control for two models and two optimizers")


def _copies_apart(run_: WorkloadRun) -> WorkloadRun:
    """``run_`` with replica 1's copy of every variable moved off replica 0's (as each replica moving
    by its own gradient leaves them: Keras 3.0-3.4)."""
    steps = [dataclasses.replace(st, variables=[[c[0], c[1] + 0.01 * (k + 1)] for c in st.variables])
             for k, st in enumerate(run_.steps)]
    return dataclasses.replace(run_, steps=steps)


def test_the_stand_in_speaks_for_tensorflow_where_the_users_classes_stop_the_control():
    """The control diverges as the loop does but the model has classes of the user's own: where the
    stand-in (the suite's own Keras model with the loop's optimizer) trains right, the control speaks
    for nothing (FAIL); where it diverges as an entry predicts (its copies apart on Keras 3.4:
    keras3-gradients-not-summed-before-3.5), the loop's verdict is DEVIATION naming that entry only,
    with a note that the user's classes were not verified; where it diverges as no entry predicts,
    DEVIATION unrecorded."""
    check = Check("controls.stand_in_of")
    facts = {"user_step": True, "keras_own_model": False}
    ref = dataclasses.replace(run(), facts=Facts(**facts))
    dist = dataclasses.replace(_copies_apart(run(scale=2.0, replicas=2)), facts=Facts(**facts))
    control = controls.control_of(ref, ref, [dist], [dist])
    check.equal((control.user_classes, control.same_as_loop), (True, False), "the control on the user's classes")
    spec, keras34 = parse_spec("mirrored:2"), {"tensorflow": "2.17.1", "keras": "3.4.1"}
    judge = differential.judge_for(spec, keras34)
    right = controls.stand_in_of(control, run(), [run(replicas=2)], judge=judge)
    check.equal(right.same_as_loop, False, "the control where the stand-in trains right")
    v = differential.verdict_of("mirrored:2", ref, [dist], 48, spec_obj=spec, versions=keras34, control=right)
    check.equal(v.status, "FAIL", "the verdict where the stand-in trains right", render.details(v))
    apart = controls.stand_in_of(control, run(), [_copies_apart(run(scale=2.0, replicas=2))], judge=judge)
    check.equal((apart.same_as_loop, apart.entries), (True, ("keras3-gradients-not-summed-before-3.5",)),
                "the control where the stand-in's copies are apart on Keras 3.4")
    v = differential.verdict_of("mirrored:2", ref, [dist], 48, spec_obj=spec, versions=keras34, control=apart)
    check.equal((v.status, sorted({i for i, _ in v.deviations})), ("DEVIATION", ["keras3-gradients-not-summed-before-3.5"]),
                "the loop's verdict", render.details(v))
    check.that(any("classes of the user's own" in n for n in v.notes), "the notes", v.notes, "the classes unverified")
    alike = dataclasses.replace(run(scale=2.0, replicas=2), facts=Facts(**facts))  # copies together, 2 x the update
    moved = controls.stand_in_of(controls.control_of(ref, ref, [alike], [alike]), run(),
                                     [run(scale=2.0, replicas=2)], judge=judge)
    v = differential.verdict_of("mirrored:2", ref, [alike], 48, spec_obj=spec, versions=keras34, control=moved)
    check.equal((moved.entries, v.status, [i for i, _ in v.deviations]), ((), "DEVIATION", ["unrecorded"]),
                "a stand-in that diverges as no entry predicts", render.details(v))


def test_the_stand_in_alone_turns_a_fail_into_its_deviation_only_where_it_diverges_the_same_way():
    """No control could run (a script; batches the canonical step cannot train): the stand-in alone
    makes a FAIL DEVIATION only where it diverges from the same step as an entry predicts and the run
    shows no cause of its own. It trains right: FAIL, with a note. It diverges on Keras 3.4 (copies
    apart) while the run's replicas disagree too: DEVIATION naming the entry. The run's loss is twice
    one device's (loss averaged per replica): FAIL with that cause. The same on Keras 3.15 (no entry
    applies): FAIL."""
    check = Check("controls.by_stand_in")
    spec = parse_spec("mirrored:2")
    keras34, keras315 = {"tensorflow": "2.17.1", "keras": "3.4.1"}, {"tensorflow": "2.21.0", "keras": "3.15.1"}
    ref = run()
    apart = _copies_apart(run(replicas=2))

    def judged(dist, stand, versions):
        v = differential.verdict_of("mirrored:2", ref, [dist], 48, spec_obj=spec, versions=versions)
        return controls.by_stand_in(v, run(), [stand], 48, judge=differential.judge_for(spec, versions))

    v = judged(apart, run(replicas=2), keras34)
    check.equal(v.status, "FAIL", "a stand-in that trains right", render.details(v))
    check.that(any("trains here what it trains on one device" in n for n in v.notes), "the note", v.notes,
               "what the stand-in showed")
    v = judged(apart, _copies_apart(run(replicas=2)), keras34)
    check.equal((v.status, [i for i, _ in v.deviations], v.diagnoses),
                ("DEVIATION", ["keras3-gradients-not-summed-before-3.5"], []), "the stand-in's copies apart on Keras 3.4",
                render.details(v))
    averaged = dataclasses.replace(apart, steps=[dataclasses.replace(st, loss=2 * st.loss, replica_losses=[
        2 * x for x in st.replica_losses]) for st in apart.steps])
    v = judged(averaged, _copies_apart(run(replicas=2)), keras34)
    check.equal((v.status, [d.cause for d in v.diagnoses]), ("FAIL", ["loss_averaged_per_replica"]),
                "a run with a cause of its own", render.details(v))
    v = judged(apart, _copies_apart(run(replicas=2)), keras315)
    check.equal(v.status, "FAIL", "the same where no entry applies", render.details(v))


def test_a_remedy_that_makes_the_run_train_as_one_device_is_the_entrys_deviation():
    """controls.by_remedy: a FAIL whose run with the entry's remedy equals one device's is DEVIATION naming the
    entry first; a remedied run that still differs leaves the FAIL, with what it showed as a note; a remedy that
    could not run says so; the rerun is asked for each entry's remedy by name."""
    check = Check("controls.by_remedy")
    entry = next(d for d in deviations.load() if d.remedy == "scaled_keras_losses")
    spec, ref = parse_spec("mirrored:2"), run()
    asked = []

    def rerun_with(result):
        def rerun(remedy):
            asked.append(remedy)
            if isinstance(result, Exception):
                raise result
            return [result]
        return rerun

    def failed():
        return differential.verdict_of("mirrored:2", ref, [run(scale=2.0, replicas=2)], 48, spec_obj=spec, versions=KERAS3)

    v = controls.by_remedy(failed(), ref, [entry], rerun_with(run(replicas=2)), 48, spec=spec, versions=KERAS3)
    check.equal((v.status, [i for i, _ in v.deviations], v.diagnoses, asked),
                ("DEVIATION", [entry.id], [], ["scaled_keras_losses"]), "the remedied run trains as one device",
                render.details(v))
    check.contains(v.deviations[0][1], ["trains what it trains on one device", "TensorFlow/Keras, not the script"],
                   "its evidence")
    still = controls.by_remedy(failed(), ref, [entry], rerun_with(run(scale=1.5, replicas=2)), 48, spec=spec,
                               versions=KERAS3)
    check.equal((still.status, still.deviations), ("FAIL", []), "the remedied run still differs",
                render.details(still))
    check.contains(" ".join(still.notes), [f"the remedy of known deviation {entry.id}), the run still differs"],
                   "the note")
    broken = controls.by_remedy(failed(), ref, [entry], rerun_with(EngineError("engine died")), 48, spec=spec,
                                versions=KERAS3)
    check.equal(broken.status, "FAIL", "a remedy that could not run", render.details(broken))
    check.contains(" ".join(broken.notes), ["could not be made (engine died)"], "the note")


def test_per_replica_metric_copies_are_predicted_only_where_they_hold_one_devices_state():
    """The check of a script reads each replica's copy of a Mean's (total, count): under Keras 3.0-3.6
    (keras3-metric-state-per-replica-before-3.7) a metric that reads the first copy, where the copies between
    them hold one device's state, is that entry's; copies that hold anything else are a plain difference."""
    check = Check("differential.compare")
    keras36 = {"tensorflow": "2.18.1", "keras": "3.6.0"}
    spec = parse_spec("mirrored:2")
    ref = run(metric=[2.0, 2.0])
    ref.facts.metric_states = {"m": {"total": [], "count": []}}
    ref.facts.metric_state_values = {"m": [[0.0, 0.0], [96.0, 48.0], [192.0, 96.0]]}

    def dist(copies):
        d = run(replicas=2, metric=[copies[0][0][0] / copies[0][0][1], copies[1][0][0] / copies[1][0][1]])
        d.facts.metric_replica_states = {"m": [[[0.0, 0.0], [0.0, 0.0]], *copies]}
        return d

    held = dist([[[36.0, 24.0], [60.0, 24.0]], [[84.0, 48.0], [108.0, 48.0]]])  # sums (96, 48), (192, 96)
    v = differential.verdict_of("mirrored:2", ref, [held], 48, spec_obj=spec, versions=keras36)
    check.equal((v.status, sorted({i for i, _ in v.deviations})),
                ("DEVIATION", ["keras3-metric-state-per-replica-before-3.7"]), "copies holding one device's state",
                render.details(v))
    other = dist([[[36.0, 24.0], [70.0, 24.0]], [[84.0, 48.0], [118.0, 48.0]]])  # a total one device never had
    v = differential.verdict_of("mirrored:2", ref, [other], 48, spec_obj=spec, versions=keras36)
    check.equal(v.status, "FAIL", "copies holding another state", render.details(v))
    v = differential.verdict_of("mirrored:2", ref, [held], 48, spec_obj=spec, versions=KERAS3)
    check.equal(v.status, "FAIL", "the same copies on Keras 3.15, outside the entry's range", render.details(v))


def test_a_run_that_goes_non_finite_is_said_so_with_its_quantity_and_step():
    """first_non_finite names the first NaN or infinite quantity and its step; a spec's run that goes
    non-finite where the reference stays finite gets a note saying so (not only "got nan")."""
    check = Check("runs.first_non_finite")
    ref = run()
    check.equal(first_non_finite(ref), None, "a finite run")
    blown = run(replicas=2)
    blown.steps[1].variables[1][1][:] = np.inf
    check.equal(first_non_finite(blown), "variable bias is infinite after step 2", "an infinite bias")
    blown.steps[1].variables[0][0].flat[0] = np.nan
    check.equal(first_non_finite(blown), "variable kernel is NaN after step 2", "a NaN kernel first")
    v = differential.verdict_of("mirrored:2", ref, [blown], 48)
    check.contains(" ".join(v.notes), ["under mirrored:2 the run goes non-finite: variable kernel is NaN after step 2"],
                   "the verdict's notes")


def test_a_variable_named_like_a_loss_is_asked_of_as_a_variable():
    """The ledger is asked about a compared quantity by its role, never by its name's first word: a
    functional model's layer named ``loss_head`` has the variables ``loss_head/kernel`` and
    ``loss_head/bias``, which the entries' ``variable *`` signatures cover (Keras 3.3's unsummed
    gradients under mirrored:2); read by its text, ``loss_head/kernel (replica 0)`` was taken for the
    loss and escaped them."""
    check = Check("differential.compare")
    asked = []

    def judge(what, got, expected, given, same):
        asked.append(what)
        return None

    names = ["loss_head/kernel", "loss_head/bias"]
    ref, dist = (dataclasses.replace(r, names=names) for r in (run(), run(scale=1.001, replicas=2)))
    differential.compare(ref, dist, judge=judge)
    check.equal(sorted({(q.kind, q.get("name"), q.get("replica")) for q in asked}),
                [("variable", "loss_head/bias", 0), ("variable", "loss_head/bias", 1),
                 ("variable", "loss_head/kernel", 0), ("variable", "loss_head/kernel", 1)],
                "the role, name and replica of each quantity the ledger was asked about")
    led = differential.ledger(parse_spec("mirrored:2"), {"tensorflow": "2.16.1", "keras": "3.3.3"})
    for q in asked:
        check.contains([e.id for e, _ in led.covering(q)], ["keras3-gradients-not-summed-before-3.5"],
                       f"the entries whose signatures cover {q}")


def test_input_not_sharded_is_named_from_the_examples_each_worker_drew():
    """Two workers whose replicas returned the same losses (a model that reads no example: a GAN's
    generator fed noise) prove nothing about the input: where the run recorded the digests of the
    examples each replica drew (workloads and scripts alike), the cause is named from them alone, when
    every worker drew worker 0's examples, and not when each drew its own."""
    from types import SimpleNamespace

    ref = run(replicas=1, rows=(4,))
    dist = dataclasses.replace(run(replicas=2, rows=(2, 2)), facts=Facts(workers=2))
    differs = [SimpleNamespace(step=1, role="variable", what=SimpleNamespace(name="kernel", role="variable"))]
    check = Check("input_not_sharded_per_worker")

    def named(examples):
        steps = [dataclasses.replace(dist.steps[0], examples=examples), *dist.steps[1:]]
        return evidence.input_not_sharded_per_worker(Observed(ref, dataclasses.replace(dist, steps=steps), differs, 4))

    check.that(named(None) is not None, "equal losses, no digests read", named(None), "named from the losses")
    check.equal(named([[1], [2]]), None, "equal losses, each worker its own examples")
    check.contains(" ".join(named([[1], [1]]) or []), ["got worker 0's examples", "digests"],
                   "the same examples on both workers")
