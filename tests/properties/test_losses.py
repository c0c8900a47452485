"""Loss reduction in a custom loop: tf.nn.compute_average_loss, scale_regularization_loss,
multi-dimensional labels and Keras loss objects inside strategy.run, against reference/."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from reference import distribute as ref
from reference import losses as ref_losses
from reference.rules import Rule
from suite.common.catalog import LOSS_CLASSES
from suite.common.given import Given
from suite.harness.drawing import cases
from suite.harness.judging import repro
from suite.harness.judging.judgment import Check
from suite.harness.judging.quantity import Quantity
from tests.helpers import RETRACES, skip_if_xla_unsupported

DTYPES = pytest.mark.parametrize("dtype", cases.DTYPES)
# the custom training tutorial's worked example of the pitfall (per-replica losses [2, 3] and [4, 5], global batch 4)
TRACKING = Rule("documented", "https://www.tensorflow.org/tutorials/distribute/custom_training, 'Tracking training "
                              "loss across replicas': (2 + 3) / 4 = 1.25 and (4 + 5) / 4 = 2.25; a tf.metrics.Mean of "
                              "them has total 3.50 and count 2, result() 1.75: 'scaled by an additional factor that "
                              "is equal to the number of replicas in sync'")


def _avg_loss_repro(spec, losses, sizes, weights, weight_kind, gbs):
    w = {"none": "None", "scalar": "weights", "per_example": "my_slice(weights)[0]"}[weight_kind]
    return repro.snippet(spec, {"losses": losses, "sizes": sizes, "weights": weights},
                         "def fn():\n"
                         "    (mine,) = my_slice(losses)\n"
                         f"    return tf.nn.compute_average_loss(mine, sample_weight={w}, "
                         f"global_batch_size={gbs})\n"
                         "per_replica = tf.function(lambda: strategy.run(fn))()\n"
                         "print(strategy.experimental_local_results(per_replica))\n"
                         "print(strategy.reduce('SUM', per_replica, axis=None))\n")


WEIGHT_KINDS = ("none", "scalar", "per_example")


@DTYPES
@pytest.mark.parametrize("weight_kind", WEIGHT_KINDS)
@given(data=st.data())
def test_compute_average_loss_matches_reference(engines, spec, dtype, weight_kind, data):
    """Per replica: sum(loss * weight) / global batch (explicit, or replicas x local batch by
    default); SUM over replicas of the results: their total."""
    _check_compute_average_loss(engines, spec, dtype, weight_kind, data)


@RETRACES
@pytest.mark.parametrize("jit", ["replica", "step"])
@given(data=st.data())
def test_compute_average_loss_compiled_with_xla_matches_reference(engines, spec, jit, data):
    """The same rule with the step compiled by XLA as users write it: ``tf.function(
    jit_compile=True)`` around the replica function (``replica``) or around the step with
    strategy.run and strategy.reduce (``step``). Where TensorFlow cannot compile it for a
    strategy the test is skipped with TensorFlow's error."""
    dtype = data.draw(st.sampled_from(cases.DTYPES), label="dtype")
    weight_kind = data.draw(st.sampled_from(WEIGHT_KINDS), label="weight kind")
    _check_compute_average_loss(engines, spec, dtype, weight_kind, data, jit)


def _check_compute_average_loss(engines, spec, dtype, weight_kind, data, jit="none"):
    sizes = data.draw(cases.splits(spec.replicas), label="sizes")
    n = sum(sizes)
    losses = data.draw(cases.floats(dtype, n, 0.0, 8.0), label="per-example losses")
    weights = None
    if weight_kind == "scalar":
        weights = data.draw(cases.floats(dtype, (), 0.0, 4.0), label="weight")
    elif weight_kind == "per_example":
        weights = data.draw(cases.floats(dtype, n, 0.0, 4.0), label="weights")
    gbs = data.draw(st.none() | st.integers(max(n, 1), 3 * max(n, 1)), label="global_batch_size")
    results = engines.call(spec, "losses.compute_average_loss", losses=losses, sizes=sizes,
                           weight_kind=weight_kind, weights=weights, global_batch_size=gbs, jit=jit)
    skip_if_xla_unsupported(results, spec, jit)
    per_loss = ref.split(losses, sizes)
    per_w = ref.split(weights, sizes) if weight_kind == "per_example" else [weights] * len(sizes)
    expected = [ref.compute_average_loss(part, w, gbs, spec.replicas) for part, w in zip(per_loss, per_w)]
    case = {"sizes": sizes, "losses": losses, "weights": weights, "global_batch_size": gbs}
    check = Check(spec, dtype, case if jit == "none" else dict(case, jit=jit),
                  _avg_loss_repro(spec, losses, sizes, weights, weight_kind, gbs), rule=ref.compute_average_loss)
    if not all(check.returned(r, Quantity.of("compute_average_loss", f"compute_average_loss compiled with XLA ({jit}, "
                                                                       f"worker {w})", compiled=str(jit), worker=w))
               for w, r in enumerate(results)):
        return
    # whether the case has sample weights is a field of the quantity: known deviation
    # compute-average-loss-float64-sample-weight covers those only (the XLA variant's id does not
    # name the weight kind it draws)
    weighted = weight_kind != "none"
    # for the model of deviation compute-average-loss-empty-replica-before-2.13: 0 / 0 on an empty replica
    empty = [gbs is None and s == 0 for s in sizes]
    check.per_replica(results, expected, Quantity.of("compute_average_loss", sample_weight=weighted),
                      n_terms=max(sizes + [1]),
                      given=[Given(empty=e) for e in empty])
    check.on_workers(results, "total", sum(expected),
                     Quantity.of("compute_average_loss", "SUM of compute_average_loss" + " (with sample_weight)" * weighted,
                                 sample_weight=weighted, reduced="SUM"),
                     n_terms=n + spec.replicas, given=Given(empty=any(empty)))


@DTYPES
@given(data=st.data())
def test_summed_scaled_loss_equals_the_global_mean_on_even_splits(engines, spec, dtype, findings, data):
    """Equivalence: with the default denominator, SUM over replicas of compute_average_loss is
    the single-device mean over the global batch when replicas get equal batches. On uneven
    splits it is sum_r sum(loss_r) / (replicas * b_r); the factor against the mean is recorded."""
    sizes = data.draw(cases.splits(spec.replicas, min_total=1), label="sizes")
    n = sum(sizes)
    losses = data.draw(cases.floats(dtype, n, 0.0, 8.0), label="per-example losses")
    results = engines.call(spec, "losses.compute_average_loss", losses=losses, sizes=sizes)
    global_mean = float(np.mean(losses.astype(np.float64)))
    check = Check(spec, dtype, {"sizes": sizes, "losses": losses}, rule=ref.compute_average_loss)
    if len(set(sizes)) == 1:
        check.on_workers(results, "total", global_mean,
                         Quantity.of("compute_average_loss", "SUM of compute_average_loss vs single-device mean",
                                     reduced="SUM", against="single-device mean"), n_terms=n)
        return
    documented = sum(ref.compute_average_loss(part, None, None, spec.replicas)
                     for part in ref.split(losses, sizes))
    check.on_workers(results, "total", documented,
                     Quantity.of("compute_average_loss", "SUM of compute_average_loss on an uneven split", reduced="SUM",
                                 split="uneven"), n_terms=n)
    if global_mean:
        factor = documented / global_mean
        note(f"uneven split {sizes}: summed scaled loss = {factor:.4f} x global mean")
        findings.record("uneven split: summed compute_average_loss / global mean", spec, factor)


@given(data=st.data())
def test_mean_metric_of_scaled_losses_reports_loss_over_replicas(engines, spec, data):
    """Pitfall: a Mean metric fed each replica's scaled loss reports loss / replicas."""
    dtype = "float64"
    sizes = data.draw(cases.splits(spec.replicas, min_total=1), label="sizes")
    losses = data.draw(cases.floats(dtype, sum(sizes), 0.0, 8.0), label="per-example losses")
    gbs = sum(sizes)
    results = engines.call(spec, "losses.compute_average_loss", losses=losses, sizes=sizes,
                           global_batch_size=gbs)
    loss = float(np.mean(losses))
    check = Check(spec, dtype, {"sizes": sizes, "losses": losses}, rule=ref.compute_average_loss)
    check.on_workers(results, "total", loss, "summed scaled loss", n_terms=gbs)
    check.on_workers(results, "tracked_mean", loss / spec.replicas,
                     Quantity.of("Mean of scaled losses", "Mean metric of the scaled losses (loss / replicas)",
                                 example="drawn"),
                     n_terms=gbs, given_per_worker=_tracker_inputs(losses, sizes, gbs, len(results)), rule=TRACKING)


@pytest.mark.specs(lambda s: s.replicas == 2)
def test_documented_loss_tracking_pitfall_example(engines, spec):
    """The guide's numbers: per-replica losses [2, 3] and [4, 5], global batch 4: the loss is
    3.5 and a Mean of the scaled losses gives 1.75."""
    results = engines.call(spec, "losses.compute_average_loss", losses=np.array([2.0, 3, 4, 5]),
                           sizes=[2, 2], global_batch_size=4)
    check = Check(spec, "float64", {"sizes": [2, 2], "losses": [2.0, 3, 4, 5], "global_batch_size": 4},
                  rule=TRACKING)
    check.on_workers(results, "total", 3.5, "summed scaled loss")
    check.on_workers(results, "tracked_mean", 1.75, Quantity.of("Mean of scaled losses", example="documented"),
                     given_per_worker=_tracker_inputs(np.array([2.0, 3, 4, 5]), [2, 2], 4, len(results)))


def _tracker_inputs(losses, sizes, global_batch_size, workers) -> list:
    """What deviation models of the Mean tracker read, per worker: each replica's own state
    (its scaled loss, one update) and the worker's first replica."""
    states = [(ref.compute_average_loss(part, global_batch_size=global_batch_size), 1.0)
              for part in ref.split(losses, sizes)]
    return [Given(kind="mean", replica_states=states, replica=w * len(sizes) // workers) for w in range(workers)]


@DTYPES
@given(data=st.data())
def test_scale_regularization_loss_divides_by_replicas(engines, spec, dtype, data):
    """Every replica adds sum(reg) / replicas, so the SUM over replicas counts it once."""
    reg = data.draw(cases.floats(dtype, st.integers(0, 4), 0.0, 8.0), label="regularization losses")
    results = engines.call(spec, "losses.scale_regularization_loss", reg_losses=reg)
    each = ref.scale_regularization_loss(reg, spec.replicas)
    check = Check(spec, dtype, {"regularization losses": reg}, rule=ref.scale_regularization_loss)
    check.per_replica(results, [each] * spec.replicas, "scale_regularization_loss", n_terms=len(reg) + 1)
    check.on_workers(results, "total", float(np.sum(reg, dtype=np.float64)), "SUM of scale_regularization_loss",
                     n_terms=len(reg) + spec.replicas)


@DTYPES
@pytest.mark.parametrize("normalise", [True, False], ids=["normalised", "unnormalised"])
@given(data=st.data())
def test_multi_dimensional_labels(engines, spec, dtype, normalise, data):
    """Labels [B, T] or [B, H, W]: per-element losses divided by the elements per example, then
    compute_average_loss with the global batch, give the single-device per-element mean; the
    unnormalised sum is that mean times the elements per example (the documented factor)."""
    tail = data.draw(st.sampled_from([(3,), (2, 3), (1, 4)]), label="label dims")
    classes = 3  # fixed: each distinct trailing shape is one more trace
    sizes = data.draw(cases.splits(spec.replicas, min_total=1), label="sizes")
    n = sum(sizes)
    labels = data.draw(cases.hnp.arrays(np.int32, (n, *tail), elements=st.integers(0, classes - 1)),
                       label="labels")
    logits = data.draw(cases.floats(dtype, (n, *tail, classes)), label="logits")
    elements = int(np.prod(tail))
    results = engines.call(spec, "losses.multi_dim_loss", labels=labels, logits=logits, sizes=sizes,
                           normalise=normalise, global_batch_size=n)
    per_element = ref_losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    mean = float(per_element.mean())
    expected = mean if normalise else mean * elements
    snippet = repro.replica_run(
        spec, {"labels": labels, "logits": logits, "sizes": sizes},
        "y, z = my_slice(labels, logits)\n"
        "per_element = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=z)\n"
        + ("per_element /= tf.cast(tf.reduce_prod(tf.shape(y)[1:]), per_element.dtype)\n" if normalise else "")
        + f"return tf.nn.compute_average_loss(per_element, global_batch_size={n})")
    check = Check(spec, dtype, {"sizes": sizes, "label dims": tail}, snippet, rule=ref.compute_average_loss)
    check.on_workers(results, "total", expected,
                     "SUM of compute_average_loss (%s)" % ("per-element mean" if normalise else "elements x mean"),
                     n_terms=per_element.size, elements=elements)


KERAS_LOSSES = sorted(ref_losses.PER_EXAMPLE)
REDUCTIONS = ["none", "sum", "sum_over_batch_size", "auto"]


def _keras_loss_inputs(data, kind, dtype, n):
    classes, width = 3, 2
    if kind in ("mse", "mae"):
        return (data.draw(cases.floats(dtype, (n, width)), label="y_true"),
                data.draw(cases.floats(dtype, (n, width)), label="y_pred"))
    if kind == "bce_logits":
        y = data.draw(cases.hnp.arrays(np.dtype(dtype), (n, width), elements=st.sampled_from([0.0, 1.0])))
        return y, data.draw(cases.floats(dtype, (n, width)), label="logits")
    logits = data.draw(cases.floats(dtype, (n, classes)), label="logits")
    pred = logits if kind.endswith("logits") else ref_losses.softmax(logits).astype(dtype)
    labels = data.draw(cases.hnp.arrays(np.int32, n, elements=st.integers(0, classes - 1)), label="labels")
    if kind.startswith("sparse"):
        return labels, pred
    return np.eye(classes, dtype=dtype)[labels], pred


@DTYPES
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("kind", KERAS_LOSSES)
@given(data=st.data())
def test_keras_loss_reduction_inside_strategy_run(engines, spec, engine_versions, kind, reduction,
                                                  dtype, data):
    """Keras loss objects called on each replica's batch inside strategy.run: the value, or the
    error, that reference.losses.keras_loss_in_replica states for the installed Keras."""
    sizes = data.draw(cases.splits(spec.replicas, max_per_replica=4), label="sizes")
    y_true, y_pred = _keras_loss_inputs(data, kind, dtype, sum(sizes))
    results = engines.call(spec, "losses.keras_loss", kind=kind, reduction=reduction,
                           y_true=y_true, y_pred=y_pred, sizes=sizes)
    per_example = ref_losses.PER_EXAMPLE[kind](y_true, y_pred)
    expected = [ref_losses.keras_loss_in_replica(v, reduction, engine_versions["keras"], spec.replicas,
                                                 has_strategy=spec.kind != "default")
                for v in ref.split(per_example, sizes)]
    case = {"kind": kind, "reduction": reduction, "sizes": sizes, "dtype": dtype}
    cls, kwargs = LOSS_CLASSES[kind]
    snippet = repro.replica_run(spec, {"y_true": y_true, "y_pred": y_pred, "sizes": sizes},
                                f"loss = tf.keras.losses.{cls}(reduction={reduction!r}, **{kwargs!r})\n"
                                "return loss(*my_slice(y_true, y_pred))")
    check = Check(spec, dtype, case, snippet, rule=ref_losses.keras_loss_in_replica)
    what = Quantity.of("keras loss", f"{kind} loss, reduction {reduction!r}", loss=kind, reduction=reduction)
    if isinstance(expected[0], ref_losses.Raises):
        for r in results:
            check.raises(r, expected[0], what)
        return
    for r in results:
        check.returned(r, what)
    # for the model of deviation keras3-loss-nan-on-empty-replica-before-3.7: 0 / 0 on a replica with no rows
    check.per_replica(results, expected, what, n_terms=8, given=[Given(empty=s == 0) for s in sizes])
