"""The Keras building blocks users put in their custom loops, under every synchronous strategy:
the optimizer's gradient clipping and weight decay. Each rule is reference/'s (clipping.py,
optimizers.py, model.train); the question is always whether the strategy's step equals one
device's step on the global batch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from reference import batchnorm as ref_bn
from reference import clipping
from reference import distribute as ref
from reference import embeddings as ref_emb
from reference import mixed_precision as ref_mp
from reference import model as ref_model
from reference import random_draws as ref_random
from reference.rules import Rule
from suite.common.catalog import ADAPTIVE, OPTIMIZERS
from suite.common.given import Given
from suite.harness.drawing import cases
from suite.harness.drawing.cases import ARCHS, arch_dict, training_cases
from suite.harness.judging import repro, tolerances
from suite.harness.judging.judgment import Check
from suite.harness.judging.quantity import Quantity, at
from tests.helpers import CHEAP, RETRACES, skip_if_xla_unsupported
from tests.properties.test_training import check_history

DTYPE = "float32"  # what users train in; the blocks' mistakes are far outside its tolerance


def _draw_training(data, spec, optimizers, arch=None, max_steps=3):
    """One of ``optimizers`` and a training case of the model family (cases.training_cases) for
    ``spec``: (optimizer, arch name, Arch, initial parameters, steps)."""
    optimizer = data.draw(st.sampled_from(optimizers), label="optimizer")
    arch_name, params, steps = data.draw(training_cases(spec.replicas, DTYPE, max_steps=max_steps, arch=arch),
                                         label="case")
    return optimizer, arch_name, cases.arch_named(arch_name), params, steps


def _size(grads, option: str) -> float:
    """What the clipping ``option`` compares with its threshold: the first kernel's norm
    (``clipnorm`` clips every variable by its own norm), the largest magnitude (``clipvalue``),
    the global norm (``global_clipnorm``)."""
    if option == "clipnorm":
        return float(np.linalg.norm(grads[0]))
    if option == "clipvalue":
        return max(float(np.max(np.abs(g), initial=0.0)) for g in grads)
    return clipping.global_norm(grads)


@st.composite
def thresholds(draw, option: str, arch, params, step) -> float:
    """A clipping threshold, placed by the first step's summed gradient and the largest of its
    replicas' gradients: ``below`` both (the sum and each replica clip: one device's update,
    clipping per replica and not clipping all differ), or ``between`` them (one side clips,
    the other does not: the issue's case, so that clipping each replica before the sum is
    caught). Where the two coincide (one replica, or one replica with examples) ``between``
    falls below both."""
    x, y, sizes = step
    per_replica = ref_model.replica_grads(arch, params, x, y, sizes, len(x))
    summed = [np.sum([g[v] for g in per_replica], axis=0) for v in range(len(per_replica[0]))]
    whole, largest = _size(summed, option), max(_size(g, option) for g in per_replica)
    lo, hi = sorted((whole, largest))
    region = draw(st.sampled_from(["below", "between"]), label="threshold region")
    u = draw(st.floats(0.25, 0.75), label="threshold position")
    c = lo + u * (hi - lo) if region == "between" and hi - lo > 1e-3 * hi else u * lo
    return float(np.float32(max(c, 1e-3)))  # a float32 number: the float32 step sees this threshold


@RETRACES
@pytest.mark.parametrize("option", clipping.OPTIONS)
@given(data=st.data())
def test_clipping_acts_on_the_summed_gradient(engines, spec, option, data):
    """``clipnorm``, ``clipvalue`` and ``global_clipnorm`` on the optimizer: every step equals one
    device's step on the global batch, whose gradient, the replicas' sum, is clipped (Keras
    optimizer docstrings; the guide's contract that apply_gradients sums the replicas). The
    threshold is drawn between the summed and the per-replica gradients' sizes."""
    optimizer, arch_name, arch, params, steps = _draw_training(data, spec, ["sgd", "sgd_momentum"])
    c = data.draw(thresholds(option, arch, params, steps[0]), label="threshold")
    history = ref_model.train(arch, params, optimizer, steps, "global", clip=(option, c))
    assume(cases.well_conditioned(history, DTYPE, False))
    per_replica = ref_model.train(arch, params, optimizer, steps, "global", clip=(option, c), clip_at="replica")
    options = {option: c}
    results = engines.call(spec, "training.train", arch=arch_dict(arch), optimizer=optimizer, dtype=DTYPE,
                           params=params, steps=steps, options=options)
    cls, cfg = OPTIMIZERS[optimizer]
    snippet = repro.training(spec, arch_dict(arch), (cls, dict(cfg, **options)), DTYPE, params, steps)
    case = {"arch": arch_name, "optimizer": optimizer, option: c, "sizes": [s[2] for s in steps]}
    check = Check(spec, DTYPE, case, snippet, rule=clipping.distributed_clipped_gradients)
    check_history(results, history, check, initial=params, alternative=per_replica,
                  unsummed=(arch, params, optimizer, steps, {"clip": (option, c)}))


@RETRACES
@given(data=st.data())
def test_weight_decay_is_applied_once_per_step(engines, spec, data):
    """``weight_decay=`` (decoupled; AdamW is Adam with it): every variable decays by
    ``weight_decay x learning_rate`` once per step, before the update, as on one device, for
    every replica count (reference/optimizers.py)."""
    optimizer, arch_name, arch, params, steps = _draw_training(data, spec, ["sgd", "adam"])
    wd = data.draw(st.sampled_from([0.125, 0.25, 0.5]), label="weight decay")
    history = ref_model.train(arch, params, optimizer, steps, "global", weight_decay=wd)
    assume(cases.well_conditioned(history, DTYPE, optimizer in ADAPTIVE))
    options = {"weight_decay": wd}
    results = engines.call(spec, "training.train", arch=arch_dict(arch), optimizer=optimizer, dtype=DTYPE,
                           params=params, steps=steps, options=options)
    cls, cfg = OPTIMIZERS[optimizer]
    snippet = repro.training(spec, arch_dict(arch), (cls, dict(cfg, **options)), DTYPE, params, steps)
    case = {"arch": arch_name, "optimizer": optimizer, "weight_decay": wd, "sizes": [s[2] for s in steps]}
    check_history(results, history, Check(spec, DTYPE, case, snippet, rule=ref_model.train), initial=params,
                  unsummed=(arch, params, optimizer, steps, {"weight_decay": wd}))


@CHEAP
@given(data=st.data())
def test_activity_regularizer_losses_are_scaled_as_the_guide_prescribes(engines, spec, data):
    """An L2 activity regularizer on every hidden layer puts ``l * sum ||h||^2 / local batch``
    into ``model.losses`` on each replica; the guide's step adds
    ``scale_regularization_loss(add_n(model.losses))``: each replica's examples weigh
    ``1 / (replicas x its batch)`` (reference/model.py activity_weights; one device's
    ``1 / global batch`` on an even split), the kernel terms count once over the replicas.
    The same penalty comes either from Keras' ``activity_regularizer`` or from a user's custom
    layer that calls ``add_loss`` in ``call`` (compat.ActivityLoss): drawn per case."""
    optimizer, arch_name, arch, params, steps = _draw_training(data, spec, ["sgd", "sgd_momentum"], "mlp_activity")
    via = data.draw(st.sampled_from(["activity_regularizer", "add_loss"]), label="penalty from")
    history = ref_model.train(arch, params, optimizer, steps, "global")
    assume(cases.well_conditioned(history, DTYPE, False))
    # Keras 3.0-3.13's regularizer does not divide by the batch (a deviation); a user's layer does
    unnormalised = (ref_model.train(arch, params, optimizer, steps, "global", activity_normalised=False)
                    if via == "activity_regularizer" else None)
    model = dict(arch_dict(arch), activity_via=via)
    results = engines.call(spec, "training.train", arch=model, optimizer=optimizer, dtype=DTYPE,
                           params=params, steps=steps)
    snippet = repro.training(spec, model, OPTIMIZERS[optimizer], DTYPE, params, steps)
    case = {"arch": arch_name, "via": via, "optimizer": optimizer, "sizes": [s[2] for s in steps]}
    # Keras 2.12-2.13's regularizer divides an empty replica's penalty by its batch with `/` (a deviation:
    # that step's loss is NaN)
    empty = {i + 1 for i, s in enumerate(steps) if 0 in s[2]} if via == "activity_regularizer" else set()
    check = Check(spec, DTYPE, case, snippet, rule=ref_model.activity_weights)
    check_history(results, history, check, initial=params, alternative=unnormalised,
                  nan_losses=empty, unsummed=(arch, params, optimizer, steps,
                                              {"activity_normalised": via != "activity_regularizer"}))


MOMENTUM, EPSILON = 0.75, 1 / 1024  # binary fractions (the mutant bn_momentum_inverted uses 1 - momentum)


@st.composite
def batch_norm_cases(draw, replicas: int):
    """1-2 steps of (global batch, split) with 2 features, the split uneven or with empty replicas
    as often as even, at least 2 rows; the features either of moderate size or with a large mean
    (10^3..10^4) and a small spread (0.01..1), where the one-pass variance E[x^2] - E[x]^2 cancels."""
    batches, sizes = [], []
    for _ in range(draw(st.integers(1, 2), label="steps")):
        split = draw(cases.splits(replicas, max_per_replica=4, min_total=2), label="sizes")
        n = sum(split)
        if draw(st.booleans(), label="large mean, small spread"):
            offset = draw(st.sampled_from([1e3, 1e4]), label="offset") * draw(st.sampled_from([1.0, -1.0]))
            spread = draw(st.sampled_from([0.01, 0.1, 1.0]), label="spread")
            x = offset + spread * draw(cases.floats("float64", (n, 2), -1.0, 1.0), label="x")
        else:
            x = draw(cases.floats("float64", (n, 2), -4.0, 4.0), label="x")
        batches.append(x)
        sizes.append(split)
    return batches, sizes


def _moving_bounds(batches, sizes, synchronized: bool, one_pass: bool, dtype: str = "float64") -> list[dict]:
    """Per step, per replica: rounding bounds of that replica's output rows and of its copies
    of the moving statistics computed in ``dtype`` (tolerances.batch_norm_bounds, carried
    through the updates ``m * momentum + stat * (1 - momentum)``)."""
    u = tolerances.UNIT[dtype]
    replicas = len(sizes[0])
    e_mm, e_mv = [np.zeros(2)] * replicas, [np.zeros(2)] * replicas
    mm, mv = [np.zeros(2)] * replicas, [np.ones(2)] * replicas  # the reference's copies (their magnitudes)
    out = []
    for x, split in zip(batches, sizes):
        parts = np.split(np.asarray(x), np.cumsum(split)[:-1])
        whole = tolerances.batch_norm_bounds(x, dtype, EPSILON, len(x) + replicas, one_pass)
        step = {"output": [], "moving_mean": [], "moving_variance": []}
        for r, part in enumerate(parts):
            b = tolerances.batch_norm_bounds(part, dtype, EPSILON, len(part) + 1) if not synchronized else whole
            rows = np.split(whole["output"], np.cumsum(split)[:-1])[r] if synchronized else b["output"]
            step["output"].append(float(rows.max(initial=0.0)))
            if len(part) or synchronized:  # an empty unsynchronized replica computes nothing to round
                # the update m * momentum + stat * (1 - momentum) rounds twice: 2 u of the larger term
                mean, var = ref_bn.moments(x if synchronized else part)
                e_mm[r] = MOMENTUM * e_mm[r] + (1 - MOMENTUM) * b["mean"] + 2 * u * np.maximum(abs(mm[r]), abs(mean))
                e_mv[r] = MOMENTUM * e_mv[r] + (1 - MOMENTUM) * b["var"] + 2 * u * np.maximum(abs(mv[r]), var)
                mm[r], mv[r] = ref_bn.moving_update(mm[r], mean, MOMENTUM), ref_bn.moving_update(mv[r], var, MOMENTUM)
            step["moving_mean"].append(float(np.max(e_mm[r])))
            step["moving_variance"].append(float(np.max(e_mv[r])))
        out.append(step)
    return out


def _within(value, bound: float) -> tuple:
    v = np.asarray(value, np.float64)
    return v - bound, v + bound


def _one_copy_given(per_replica: list) -> Given | None:
    """The deviation models' inputs for the one copy of a variable: the mean of the replicas'
    alternatives, the mean of their bounds."""
    first = per_replica[0]
    if first is None:
        return None

    def mean_bounds(field):
        values = [getattr(g, field) for g in per_replica]
        return None if values[0] is None else (ref_bn.one_copy([v[0] for v in values]),
                                               ref_bn.one_copy([v[1] for v in values]))
    return Given(
        alternative=None if first.alternative is None else ref_bn.one_copy([g.alternative for g in per_replica]),
        averaged=first.averaged,  # one value for every copy already
        # the model averages the copies itself
        float32_one_pass=None if first.float32_one_pass is None else dict(first.float32_one_pass, replica=None),
        one_pass=mean_bounds("one_pass"), skipped=mean_bounds("skipped"))


def _check_batch_norm(check, results, want, bounds, spec, deviant=None):
    """Every local replica's copies of the moving statistics and output rows, per step, within
    the derived rounding bounds (``bounds``); ``deviant``: per step, per quantity and replica,
    the inputs of the deviation models (``given``)."""
    for w, r in enumerate(results):
        on = {"worker": w} if len(results) > 1 else {}  # Quantity.at: the field, and " (worker W)" in the text
        if not check.returned(r, Quantity.of("batch norm steps", "BatchNormalization steps").at(**on)):
            continue  # a known deviation raised, as its signature predicts
        mine = ref.local_results(list(range(spec.replicas)), w, len(results))
        for s, (got, exp, bound) in enumerate(zip(r.steps, want, bounds)):
            for name in ("moving_mean", "moving_variance"):
                copies = getattr(got, name)
                if spec.kind == "central_storage":  # one copy of the variable, on the parameter device
                    check.close(copies[0] if copies else None, ref_bn.one_copy(exp[name]),
                                Quantity.of("batch norm statistic", f"{name} (its one copy) after step {s + 1}",
                                            name=name, one_copy=True, step=s + 1).at(**on),
                                override={check.dtype: (max(bound[name]), 1e-15)},
                                given=_one_copy_given(deviant[s][name]) if deviant else None, rule=ref_bn.one_copy)
                    continue
                for i, rid in enumerate(mine):
                    check.close(copies[i], exp[name][rid],
                                Quantity.of("batch norm statistic", f"{name} on replica {rid} after step {s + 1}",
                                            name=name, one_copy=False, replica=rid, step=s + 1).at(**on),
                                override={check.dtype: (bound[name][rid], 1e-15)},
                                given=deviant[s][name][rid] if deviant else None)
            for i, rid in enumerate(mine):
                check.close(got.outputs[i], exp["outputs"][rid],
                            Quantity.of("batch norm output", f"output of replica {rid} at step {s + 1}", replica=rid,
                                        step=s + 1).at(**on),
                            override={check.dtype: (bound["output"][rid], 1e-15)},
                            given=deviant[s]["outputs"][rid] if deviant else None)


@CHEAP
@given(data=st.data())
def test_synchronized_batch_norm_uses_the_global_batch(engines, spec, data):
    """BatchNormalization(synchronized=True) (Keras 2.15's SyncBatchNormalization) in training
    mode: every replica normalises its rows with the global batch's mean and variance, and every
    replica's copy of the moving mean and variance takes the documented update with them, on
    uneven and empty splits and for features with a large mean and a small variance
    (reference/batchnorm.py)."""
    batches, sizes = data.draw(batch_norm_cases(spec.replicas), label="case")
    want = ref_bn.synchronized_steps(batches, sizes, MOMENTUM, EPSILON, 2)
    skipped = ref_bn.synchronized_steps(batches, sizes, MOMENTUM, EPSILON, 2, empty="skip")
    bounds = _moving_bounds(batches, sizes, True, one_pass=False)
    one_pass = _moving_bounds(batches, sizes, True, one_pass=True)  # the deviation's rounding
    deviant = [{name: [Given(one_pass=_within(exp[name][r], wide[name if name != "outputs" else "output"][r]),
                             skipped=_within(other[name][r], wide[name if name != "outputs" else "output"][r]))
                       for r in range(spec.replicas)] for name in ("outputs", "moving_mean", "moving_variance")}
               for exp, other, wide in zip(want, skipped, one_pass)]
    results = engines.call(spec, "blocks.batch_norm", synchronized=True, dtype="float64", batches=batches,
                           sizes=sizes, momentum=MOMENTUM, epsilon=EPSILON)
    _check_batch_norm(Check(spec, "float64", {"sizes": sizes}, rule=ref_bn.synchronized_steps), results, want, bounds,
                      spec, deviant)


@st.composite
def float32_cancelling_batch_norm_cases(draw, replicas: int):
    """1-2 steps of (global batch, split) with 2 float32 features of a large mean (+-10^3..10^4)
    and a small spread (0.01..1), where float32's one-pass variance E[x^2] - E[x]^2 loses all
    its digits (ulp(E[x^2]) is 1/16 at 10^3 and 8 at 10^4); the split even or uneven, every
    replica with 1-4 rows (an empty replica is the float64 property's and another deviation's
    business). The rows are float32 numbers: the reference sees what TensorFlow sees."""
    batches, sizes = [], []
    for _ in range(draw(st.integers(1, 2), label="steps")):
        if draw(st.booleans(), label="even split"):
            split = [draw(st.integers(1, 4), label="per-replica batch")] * replicas
        else:
            split = draw(st.lists(st.integers(1, 4), min_size=replicas, max_size=replicas), label="sizes")
        if sum(split) < 2:
            split[0] += 1
        n = sum(split)
        offset = draw(st.sampled_from([1e3, 3e3, 1e4]), label="offset") * draw(st.sampled_from([1.0, -1.0]))
        spread = draw(st.sampled_from([0.01, 0.1, 1.0]), label="spread")
        u = draw(cases.floats("float64", (n, 2), -1.0, 1.0), label="x")
        batches.append((offset + spread * u).astype(np.float32).astype(np.float64))
        sizes.append(split)
    return batches, sizes


@CHEAP
@given(data=st.data())
def test_synchronized_batch_norm_in_float32_uses_the_global_batch(engines, spec, engine_versions, data):
    """The float64 property's rule (reference/batchnorm.py synchronized_steps) in float32, what
    users train in, on features with a large mean and a small spread: every replica's output and
    copies of the moving statistics within the two-pass float32 rounding bounds of the global
    batch's values. Where Keras' one-pass variance (known deviation
    synchronized-bn-one-pass-variance) is off, the observation must be what the one-pass formula
    gives in float32 arithmetic (signatures.one_pass_variance_in_float32), not merely near."""
    batches, sizes = data.draw(float32_cancelling_batch_norm_cases(spec.replicas), label="case")
    want = ref_bn.synchronized_steps(batches, sizes, MOMENTUM, EPSILON, 2)
    bounds = _moving_bounds(batches, sizes, True, one_pass=False, dtype="float32")
    base = {"batches": batches, "sizes": sizes, "momentum": MOMENTUM, "epsilon": EPSILON,
            "keras": engine_versions["keras"][0]}
    deviant = [{name: [Given(float32_one_pass=dict(base, step=s, replica=r, name=name)) for r in range(spec.replicas)]
                for name in ("outputs", "moving_mean", "moving_variance")} for s in range(len(batches))]
    results = engines.call(spec, "blocks.batch_norm", synchronized=True, dtype="float32", batches=batches,
                           sizes=sizes, momentum=MOMENTUM, epsilon=EPSILON)
    _check_batch_norm(Check(spec, "float32", {"sizes": sizes}, rule=ref_bn.synchronized_steps), results, want, bounds,
                      spec, deviant)


@CHEAP
@given(data=st.data())
def test_unsynchronized_batch_norm_normalises_each_replica_by_itself(engines, spec, data):
    """BatchNormalization (not synchronized) in training mode: each replica normalises its rows
    with its own rows' mean and variance (the docstring's "current batch" is the replica's), and
    each replica's copy of the moving statistics takes the documented update with them; a
    replica with no rows keeps its copy (reference/batchnorm.py unsynchronized_steps)."""
    batches, sizes = data.draw(batch_norm_cases(spec.replicas), label="case")
    want = ref_bn.unsynchronized_steps(batches, sizes, MOMENTUM, EPSILON, 2)
    nan = ref_bn.unsynchronized_steps(batches, sizes, MOMENTUM, EPSILON, 2, empty="nan")
    # Keras 3.7.0's mean aggregation: every copy the mean of the replicas' own (known deviation
    # keras3-variables-mean-aggregation-3.7), with an empty replica's NaN
    deviant = [{name: [Given(alternative=other[name][r], averaged=ref_bn.one_copy(other[name]))
                       if name != "outputs" else None for r in range(spec.replicas)]
                for name in ("outputs", "moving_mean", "moving_variance")} for other in nan]
    results = engines.call(spec, "blocks.batch_norm", synchronized=False, dtype="float64", batches=batches,
                           sizes=sizes, momentum=MOMENTUM, epsilon=EPSILON)
    _check_batch_norm(Check(spec, "float64", {"sizes": sizes}, rule=ref_bn.unsynchronized_steps), results, want,
                      _moving_bounds(batches, sizes, False, one_pass=False), spec, deviant)


MP_ARCH = ref_model.Arch(input_dim=3, hidden=(), outputs=2, head="linear")
MP_LR, MP_INITIAL_SCALE, MP_GROWTH = 0.125, 2.0 ** 10, 2
# the dtypes of a mixed policy (Keras 3 DTypePolicy; Keras 2.15 mixed_precision.Policy says the same)
MP_POLICY = Rule("documented", "keras DTypePolicy docstring: 'mixed_float16' or 'mixed_bfloat16' 'causes the compute "
                               "dtype to be float16 or bfloat16 and the variable dtype to be float32'")


def _mixed_precision_bounds(params, steps, policy: str) -> list[float]:
    """Per step, a bound on how far the parameters of the mixed-precision loop may be from the
    float64 reference after it: the forward ``x @ W + b`` and the backward ``x^T delta`` rounded
    in the policy's compute dtype (inputs exact in it, ``W`` and ``b`` rounded once when cast),
    each sum of k terms off by at most ``(k + 2) u`` of its terms' magnitudes, the update in
    float32, and the previous steps' errors carried through the gradient; times SAFETY."""
    u = ref_mp.UNIT[policy]
    w_, b_ = (np.asarray(p, np.float64) for p in params)
    err, out = 0.0, []
    for x, y, _ in steps:
        x = np.asarray(x, np.float64)
        n, d = x.shape
        wt = 1.0 / n
        pred = x @ w_ + b_
        size = np.abs(x) @ np.abs(w_) + np.abs(b_) + err * (np.abs(x).sum(axis=1, keepdims=True) + 1)
        e_out = (d + 2) * u * size + err * (np.abs(x).sum(axis=1, keepdims=True) + 1)
        delta = 2 * (pred - y) / MP_ARCH.outputs * wt
        e_delta = 2 / MP_ARCH.outputs * wt * (e_out + u * np.abs(pred - y))
        e_grad = max(float(((n + 2) * u * np.abs(x).T @ np.abs(delta) + np.abs(x).T @ e_delta).max()),
                     float(((n + 2) * u * np.abs(delta).sum(axis=0) + e_delta.sum(axis=0)).max()))
        err = err + MP_LR * e_grad + 2.0 ** -24 * float(np.abs(w_).max() + np.abs(b_).max())
        out.append(tolerances.SAFETY * err)
        grads = ref_model.loss_and_grads(MP_ARCH, [w_, b_], x, y, np.full(n, wt)).grads
        w_, b_ = w_ - MP_LR * grads[0], b_ - MP_LR * grads[1]
    return out


@st.composite
def mixed_precision_cases(draw, replicas: int, scale: str, poisoned=None):
    """Initial parameters, 2-4 steps whose inputs are multiples of 1/8 in [-2, 2] (exact in
    float16 and bfloat16), and per step the loss factor of each replica: a dynamic scale's steps
    get inf on one drawn replica with rows (an empty replica's gradient stays 0) about half the
    time, among the replicas ``poisoned`` (default: all); a fixed scale's steps never."""
    params = [draw(cases.magnitudes("float32", shape, 1 / 16, 1.0), label=f"param {i}")
              for i, shape in enumerate(MP_ARCH.shapes())]
    eighths = st.integers(-16, 16).map(lambda k: k / 8)
    steps, poison = [], []
    for _ in range(draw(st.integers(2, 4), label="steps")):
        sizes = draw(cases.splits(replicas, max_per_replica=3, min_total=1), label="sizes")
        n = sum(sizes)
        x = draw(cases.hnp.arrays(np.float32, (n, MP_ARCH.input_dim), elements=eighths), label="x")
        y = draw(cases.hnp.arrays(np.float32, (n, MP_ARCH.outputs), elements=eighths), label="y")
        steps.append((x, y, sizes))
        factors = [1.0] * replicas
        candidates = [r for r in (poisoned if poisoned is not None else range(replicas)) if sizes[r]]
        if scale == "dynamic" and candidates and draw(st.booleans(), label="a replica's gradients non-finite"):
            factors[draw(st.sampled_from(candidates), label="that replica")] = float("inf")
        poison.append(factors)
    return params, steps, poison


@CHEAP
@pytest.mark.parametrize("scale", ["dynamic", "fixed"])
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@given(data=st.data())
def test_loss_scaling_skips_a_non_finite_step_on_every_replica(engines, spec, policy, scale, data):
    """The mixed-precision guide's custom loop (float32 variables, float16/bfloat16 compute, the
    loss scaled and the gradients unscaled) under a dynamic LossScaleOptimizer or a fixed scale:
    the scale evolves as on one device (halved on a step with a non-finite gradient on any
    replica, doubled after two finite steps), such a step changes no replica's variables, and
    the finite steps equal the float64 reference within the bound derived for the compute dtype
    (reference/mixed_precision.py)."""
    # on several workers a non-finite gradient has a test of its own, with fixed numbers
    # (test_loss_scaling_skips_a_step_non_finite_on_another_worker): Keras 3 deadlocks there
    poisoned = range(spec.replicas) if spec.workers == 1 else ()
    params, steps, poison = data.draw(mixed_precision_cases(spec.replicas, scale, poisoned), label="case")
    check = Check(spec, "float32", {"policy": policy, "scale": scale, "poison": poison, "sizes": [s[2] for s in steps]},
                  rule=ref_mp.scaled_training)
    _check_scaled_training(check, engines, spec, policy, scale, params, steps, poison)


def _check_scaled_training(check, engines, spec, policy, scale, params, steps, poison, non_finite_on_the_last_worker=False,
                           **probe_args):
    """Run the mixed-precision loop and check, per worker and step: the variables' and compute
    dtypes, the loss scale, that every variable stayed finite, and every replica's copies
    within the derived bound (a step that made them non-finite ends the comparison).
    ``non_finite_on_the_last_worker``: the case where only the last worker's gradients are poisoned."""
    want = ref_mp.scaled_training(MP_ARCH, params, steps, poison, MP_LR, scale, MP_INITIAL_SCALE, MP_GROWTH)
    replica0 = ref_mp.scaled_training(MP_ARCH, params, steps, poison, MP_LR, scale, MP_INITIAL_SCALE, MP_GROWTH,
                                      decided_by=[0])
    own = ref_mp.scaled_training_unsummed(MP_ARCH, params, steps, poison, MP_LR, scale, MP_INITIAL_SCALE, MP_GROWTH,
                                          spec.workers)
    bounds = _mixed_precision_bounds(params, steps, policy)
    results = engines.call(spec, "blocks.mixed_precision", policy=policy, scale=scale, arch=arch_dict(MP_ARCH),
                           params=params, steps=steps, poison=poison, initial_scale=MP_INITIAL_SCALE,
                           growth_steps=MP_GROWTH, **probe_args)
    last_worker = {"non_finite_on_the_last_worker": True} if non_finite_on_the_last_worker else {}
    loop = Quantity.of("mixed-precision loop", "the mixed-precision loop" + ", non-finite on the last worker" * bool(
        last_worker), **last_worker)
    for w, r in enumerate(results):
        on = {"worker": w} if len(results) > 1 else {}  # Quantity.at: the field, and " (worker W)" in the text
        if not check.returned(r, loop.at(**on), given=Given(poison=poison[:len(steps)], workers=spec.workers)):
            continue  # a known deviation raised, as its signature predicts
        local = spec.replicas // len(results)
        for s, (got, exp, alt, mine) in enumerate(zip(r.steps, want, replica0, own)):
            check.equal(got.scale, exp["scale"],
                        Quantity.of("loss scale", f"loss scale after step {s + 1}", step=s + 1).at(**on),
                        given=Given(alternative=alt["scale"], unsummed=mine["scale"][w]))
            finite = all(bool(np.isfinite(np.asarray(c)).all()) for copies in got.params for c in copies)
            check.equal(finite, exp["finite"],
                        Quantity.of("variables finite", f"every replica's variables finite after step {s + 1}",
                                    step=s + 1).at(**on),
                        given=Given(alternative=alt["finite"], unsummed=mine["finite"]))
            if not finite:
                break  # what follows a step that made the variables non-finite is not comparable
            for v, (copies, expected) in enumerate(zip(got.params, exp["params"])):
                for c, copy in enumerate(copies):
                    check.close(copy, expected, Quantity.of("variable", f"variable {v} on local replica {c} after step "
                                                            f"{s + 1}", name=v, local_replica=c, step=s + 1).at(**on),
                                override={"float32": (bounds[s], 2.0 ** -22)},
                                given=Given(unsummed=mine["params"][w * local + c][v]))
        check.equal(r.variable_dtypes, ["float32", "float32"], str(at("the variables' dtypes", **on)), rule=MP_POLICY)
        check.equal(r.output_dtype, policy.split("_")[1], str(at("the layer's compute dtype", **on)),
                    rule=MP_POLICY)


@pytest.mark.specs(lambda spec: spec.workers > 1)
@pytest.mark.parametrize("policy", ["mixed_float16"])
def test_loss_scaling_skips_a_step_non_finite_on_another_worker(engines, spec, policy):
    """On several workers: one step whose gradients are non-finite only on the last worker's
    first replica, between two finite steps, is skipped on every replica and halves the scale,
    as on one device. Fixed numbers (a step that deadlocks a cluster costs its collective
    timeout, 10 s here, and a restart: it runs once, not once per drawn case)."""
    params = [np.array([[0.5, -0.25], [0.75, 0.125], [-0.5, 1.0]], np.float32), np.array([0.125, -0.5], np.float32)]
    per = spec.replicas // spec.workers
    x = np.array([[1.0, -0.5, 0.25], [0.5, 1.5, -1.0]] * spec.replicas, np.float32)
    y = np.array([[0.5, -1.0], [1.0, 0.25]] * spec.replicas, np.float32)
    sizes = [2] * spec.replicas
    steps = [(x, y, sizes)] * 3
    poison = [[1.0] * spec.replicas, [float("inf") if r == (spec.workers - 1) * per else 1.0
                                      for r in range(spec.replicas)], [1.0] * spec.replicas]
    check = Check(spec, "float32", {"policy": policy, "poison": poison}, rule=ref_mp.scaled_training)
    _check_scaled_training(check, engines, spec, policy, "dynamic", params, steps, poison,
                           non_finite_on_the_last_worker=True, collective_timeout=10.0)


VOCAB, DIM = 4, 2


@st.composite
def embedding_cases(draw, replicas: int):
    """An initial table and 1-3 steps of (indices, targets, split): indices from a vocabulary of
    4, so that an index repeats within a replica and across replicas in most steps; targets
    away from the rows (every looked-up row's gradient is far from 0)."""
    table = draw(cases.floats("float64", (VOCAB, DIM), -1.0, 1.0), label="table")
    steps = []
    for _ in range(draw(st.integers(1, 3), label="steps")):
        sizes = draw(cases.splits(replicas, max_per_replica=4, min_total=1), label="sizes")
        n = sum(sizes)
        indices = draw(cases.hnp.arrays(np.int32, n, elements=st.integers(0, VOCAB - 1)), label="indices")
        targets = draw(cases.magnitudes("float64", (n, DIM), 2.0, 4.0), label="targets")
        steps.append((indices, targets, sizes))
    return table, steps


@CHEAP
@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adagrad"])
@given(data=st.data())
def test_embedding_sparse_updates_equal_the_dense_reference(engines, spec, optimizer, data):
    """An Embedding table's gradient is a tf.IndexedSlices with a row per lookup; applied under a
    strategy (by SGD, and by Adam and Adagrad, whose slots take sparse updates) every replica's
    copy equals one device's update with the dense gradient of the global batch, whose rows sum
    every occurrence of their index, within a replica and across replicas (reference/embeddings.py)."""
    table, steps = data.draw(embedding_cases(spec.replicas), label="case")
    want = ref_emb.train(table, steps, optimizer)
    per_occurrence = ref_emb.train(table, steps, optimizer, squares="per_occurrence")
    # each replica's own table where nothing sums the replicas' gradients (Keras 3.0-3.4; Keras 3 squares each occurrence)
    own = [ref_emb.train(table, steps, optimizer, squares="per_occurrence", replica=g) for g in range(spec.replicas)]
    results = engines.call(spec, "blocks.embedding", optimizer=optimizer, dtype="float64", table=table, steps=steps)
    check = Check(spec, "float64", {"optimizer": optimizer, "indices": [s[0].tolist() for s in steps],
                                    "sizes": [s[2] for s in steps]}, rule=ref_emb.train)
    for w, r in enumerate(results):
        who = f" (worker {w})" if len(results) > 1 else ""
        check.equal(r.gradient_type, "IndexedSlices", f"the class of the table's gradient{who}")
        local = spec.replicas // len(results)
        for s, (copies, expected, alt) in enumerate(zip(r.tables, want, per_occurrence)):
            for c, copy in enumerate(copies):
                table = Quantity.of("embedding table", f"the table on local replica {c} after step {s + 1}",
                                    replica=c, step=s + 1).at(**({"worker": w} if who else {}))
                check.close(copy, expected, table, kind="trained", n_terms=4,
                            given=Given(alternative=alt, unsummed=own[w * local + c][s]))


@RETRACES
@pytest.mark.parametrize("kind", sorted(ref_random.RULES))
@given(data=st.data())
def test_seeded_random_draws_repeat_and_replicas_draw_their_own(engines, spec, kind, data):
    """Dropout masks and random numbers drawn inside strategy.run with a seed: a second run with
    the objects built afresh repeats the first exactly, each step draws anew, and the replicas'
    draws differ where the rule says so (a layer's or generator's stream per replica), or agree
    (a stateless op's fixed seed)."""
    seed = data.draw(st.integers(1, 2 ** 20), label="seed")
    shape = [data.draw(st.integers(4, 8), label="rows"), 8]
    steps = 2
    results = engines.call(spec, "blocks.random_draws", kind=kind, seed=seed, shape=shape, steps=steps)
    differ, source = ref_random.replicas_draw_their_own(kind)
    check = Check(spec, case={"kind": kind, "seed": seed, "shape": shape}, rule=ref_random.replicas_draw_their_own)
    if not all(check.returned(r, Quantity.of("random draws", f"the random draws of {kind} (worker {w})", layer=kind,
                                                       worker=w)) for w, r in enumerate(results)):
        return  # a known deviation raised, as its signature predicts
    runs = [[[d for r in results for d in r.runs[run][s]] for s in range(steps)] for run in range(2)]  # global replica order
    if kind == "dropout":  # the probe reports Dropout's output != 0 of a tensor of ones: its keep mask
        values = sorted({int(v) for step in runs[0] for d in step for v in np.unique(d)})
        check.that(set(values) <= {0, 1} and bool(values), "the values of the dropout masks", values, "0s and 1s")
    for s in range(steps):
        for rid, (a, b) in enumerate(zip(runs[0][s], runs[1][s])):
            check.exact(b, a, f"replica {rid}'s draw at step {s + 1} of a second run built afresh (it repeats)")
        check.that(any(not np.array_equal(a, b) for a, b in zip(runs[0][0], runs[0][1])), "the draws of step 2",
                   "equal to step 1's", "new draws each step")
    if spec.replicas > 1:
        draws = runs[0][0]
        shared = [bool(np.array_equal(draws[0], d)) for d in draws[1:]]
        per_worker = spec.replicas // spec.workers
        check.equal(shared, [not differ] * (spec.replicas - 1),
                    Quantity.of("shared draws", "whether each replica's first draw equals replica 0's"), hint=source,
                    given=Given(alternative=[True] * (spec.replicas - 1),  # every replica the same
                                # each worker's replicas as the first worker's: replica r as replica r % per_worker
                                per_worker=[r % per_worker == 0 for r in range(1, spec.replicas)]))


EMA_MOMENTUM = 0.75  # a binary fraction (the mutant ema_momentum_inverted uses 1 - momentum)



@RETRACES  # XLA compiles the step again for every new shape of a replica's batch
@pytest.mark.parametrize("jit", ["replica", "step"])
@given(data=st.data())
def test_training_compiled_with_xla_matches_the_reference(engines, spec, jit, data):
    """The guide's training step compiled with XLA as users write it: ``tf.function(jit_compile=
    True)`` around the replica's forward and backward pass (``replica``; apply_gradients outside,
    as Keras' own train step does), or around the whole step with strategy.run (``step``). Every
    step equals the reference on the global batch, as without XLA. Where TensorFlow cannot
    compile the step for a strategy the test is skipped with TensorFlow's error."""
    optimizer, arch_name, arch, params, steps = _draw_training(data, spec, ["sgd_momentum", "adam"], "mlp_linear_l2")
    history = ref_model.train(arch, params, optimizer, steps, "global")
    assume(cases.well_conditioned(history, DTYPE, optimizer in ADAPTIVE))
    results = engines.call(spec, "training.train", arch=arch_dict(arch), optimizer=optimizer, dtype=DTYPE,
                           params=params, steps=steps, jit=jit)
    skip_if_xla_unsupported(results, spec, jit)
    snippet = repro.training(spec, arch_dict(arch), OPTIMIZERS[optimizer], DTYPE, params, steps)
    case = {"arch": arch_name, "optimizer": optimizer, "jit": jit, "sizes": [s[2] for s in steps]}
    check = Check(spec, DTYPE, case, snippet, rule=ref_model.train)
    if all(check.returned(r, Quantity.of("step", f"the step compiled with XLA ({jit}, worker {w})", compiled=str(jit),
                                                       worker=w)) for w, r in enumerate(results)):
        check_history(results, history, check, initial=params, unsummed=(arch, params, optimizer, steps, {}))


@CHEAP
@given(data=st.data())
def test_ema_of_the_weights_is_the_reference_average_on_every_replica(engines, spec, engine_versions, data):
    """``use_ema=True``: after every step each replica's copy of every variable's moving average
    is ``momentum * average + (1 - momentum) * variable`` of the reference's trained variables
    (reference/model.py ema; where the average starts is each generation's)."""
    optimizer, arch_name, arch, params, steps = _draw_training(data, spec, ["sgd", "sgd_momentum"], "mlp_linear_l2")
    history = ref_model.train(arch, params, optimizer, steps, "global")
    assume(cases.well_conditioned(history, DTYPE, False))
    start = "copy" if engine_versions["keras"][0] >= 3 else "built"
    averages = ref_model.ema(params, history, EMA_MOMENTUM, start)
    options = {"use_ema": True, "ema_momentum": EMA_MOMENTUM}
    results = engines.call(spec, "training.train", arch=arch_dict(arch), optimizer=optimizer, dtype=DTYPE,
                           params=params, steps=steps, options=options)
    check = Check(spec, DTYPE, {"arch": arch_name, "optimizer": optimizer, "start": start,
                                "sizes": [s[2] for s in steps]}, rule=ref_model.train)
    # each replica's own trajectory and its average, where nothing sums the replicas' gradients (Keras 3.0-3.4)
    own = ref_model.train_unsummed(arch, params, optimizer, steps)
    own_averages = [ref_model.ema(params, [{"params": st["params"][g]} for st in own], EMA_MOMENTUM, start)
                    for g in range(spec.replicas)]
    for w, r in enumerate(results):
        on = {"worker": w} if len(results) > 1 else {}
        if not check.returned(r, Quantity.of("use_ema training", "training with use_ema").at(**on)):
            continue
        local = spec.replicas // len(results)
        check_history([r], history, check, unsummed=(arch, params, optimizer, steps, {}), first=w * local)
        for s, (got, want) in enumerate(zip(r.history, averages)):
            for v, (copies, expected) in enumerate(zip(got.averages, want)):
                for c, copy in enumerate(copies):
                    check.close(copy, expected, Quantity.of("variable average", f"the average of variable {v} on local "
                                                            f"replica {c} after step {s + 1}", name=v, local_replica=c,
                                                            step=s + 1).at(**on),
                                kind="trained", n_terms=4, given=Given(unsummed=own_averages[w * local + c][s][v]),
                                rule=ref_model.ema)


@CHEAP
@given(data=st.data())
def test_gradient_accumulation_applies_the_mean_every_n_steps(engines, spec, engine_versions, data):
    """Keras 3 ``gradient_accumulation_steps=2`` in the guide's step: the optimizer applies, every
    second step, the mean of the two steps' summed gradients, and nothing in between
    (reference/model.py train accumulation_steps), on every replica."""
    if engine_versions["keras"][0] < 3:
        pytest.skip("Keras 2 optimizers have no gradient_accumulation_steps")
    arch_name, params, steps = data.draw(training_cases(spec.replicas, DTYPE, max_steps=4), label="case")
    arch = ARCHS[arch_name]
    history = ref_model.train(arch, params, "sgd", steps, "global", accumulation_steps=2)
    assume(cases.well_conditioned(history, DTYPE, False))
    results = engines.call(spec, "training.train", arch=arch_dict(arch), optimizer="sgd", dtype=DTYPE,
                           params=params, steps=steps, options={"gradient_accumulation_steps": 2})
    check = Check(spec, DTYPE, {"arch": arch_name, "sizes": [s[2] for s in steps]}, rule=ref_model.train)
    accumulating = [Quantity.of("gradient accumulation training", f"training with gradient_accumulation_steps (worker {w})",
                                worker=w) for w in range(len(results))]
    if all(check.returned(r, what) for r, what in zip(results, accumulating)):
        # Keras 3's iterations counts applied steps (its micro-steps // gradient_accumulation_steps)
        check_history(results, history, check, iterations=len(steps) // 2, calls=len(steps))
