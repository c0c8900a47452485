"""The Keras building blocks users put in their custom loops, under every synchronous strategy:
the optimizer's gradient clipping and weight decay. Each rule is reference/'s (clipping.py,
optimizers.py, model.train); the question is always whether the strategy's step equals one
device's step on the global batch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from reference import clipping
from reference import model as ref_model
from suite.common.catalog import ADAPTIVE, OPTIMIZERS
from suite.harness import cases, repro
from suite.harness.cases import ARCHS, BLOCK_ARCHS, arch_dict, training_cases
from suite.harness.check import Check
from tests.properties.test_training import check_history

# Where every drawn case traces a new step (the block's options are Python numbers of the
# optimizer): a few per spec by default, the profile's number with --deep (suite/harness/profiles.py)
RETRACES = pytest.mark.budget(4)
# one trace per spec, three engine steps per case: more cases for the same time
CHEAP = pytest.mark.budget(8)

DTYPE = "float32"  # what users train in; the blocks' mistakes are far outside its tolerance


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
    optimizer = data.draw(st.sampled_from(["sgd", "sgd_momentum"]), label="optimizer")
    arch_name, params, steps = data.draw(training_cases(spec.replicas, DTYPE, max_steps=3), label="case")
    arch = ARCHS[arch_name]
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
    check_history(results, history, Check(spec, DTYPE, case, snippet), initial=params, alternative=per_replica)


@RETRACES
@given(data=st.data())
def test_weight_decay_is_applied_once_per_step(engines, spec, data):
    """``weight_decay=`` (decoupled; AdamW is Adam with it): every variable decays by
    ``weight_decay x learning_rate`` once per step, before the update, as on one device, for
    every replica count (reference/optimizers.py)."""
    optimizer = data.draw(st.sampled_from(["sgd", "adam"]), label="optimizer")
    arch_name, params, steps = data.draw(training_cases(spec.replicas, DTYPE, max_steps=3), label="case")
    arch = ARCHS[arch_name]
    wd = data.draw(st.sampled_from([0.125, 0.25, 0.5]), label="weight decay")
    history = ref_model.train(arch, params, optimizer, steps, "global", weight_decay=wd)
    assume(cases.well_conditioned(history, DTYPE, optimizer in ADAPTIVE))
    options = {"weight_decay": wd}
    results = engines.call(spec, "training.train", arch=arch_dict(arch), optimizer=optimizer, dtype=DTYPE,
                           params=params, steps=steps, options=options)
    cls, cfg = OPTIMIZERS[optimizer]
    snippet = repro.training(spec, arch_dict(arch), (cls, dict(cfg, **options)), DTYPE, params, steps)
    case = {"arch": arch_name, "optimizer": optimizer, "weight_decay": wd, "sizes": [s[2] for s in steps]}
    check_history(results, history, Check(spec, DTYPE, case, snippet), initial=params)


@CHEAP
@given(data=st.data())
def test_activity_regularizer_losses_are_scaled_as_the_guide_prescribes(engines, spec, data):
    """An L2 activity regularizer on every hidden layer puts ``l * sum ||h||^2 / local batch``
    into ``model.losses`` on each replica; the guide's step adds
    ``scale_regularization_loss(add_n(model.losses))``: each replica's examples weigh
    ``1 / (replicas x its batch)`` (reference/model.py activity_weights; one device's
    ``1 / global batch`` on an even split), the kernel terms count once over the replicas."""
    optimizer = data.draw(st.sampled_from(["sgd", "sgd_momentum"]), label="optimizer")
    arch_name, params, steps = data.draw(training_cases(spec.replicas, DTYPE, max_steps=3, arch="mlp_activity"),
                                         label="case")
    arch = BLOCK_ARCHS[arch_name]
    history = ref_model.train(arch, params, optimizer, steps, "global")
    assume(cases.well_conditioned(history, DTYPE, False))
    unnormalised = ref_model.train(arch, params, optimizer, steps, "global", activity_normalised=False)
    results = engines.call(spec, "training.train", arch=arch_dict(arch), optimizer=optimizer, dtype=DTYPE,
                           params=params, steps=steps)
    snippet = repro.training(spec, arch_dict(arch), OPTIMIZERS[optimizer], DTYPE, params, steps)
    case = {"arch": arch_name, "optimizer": optimizer, "sizes": [s[2] for s in steps]}
    check_history(results, history, Check(spec, DTYPE, case, snippet), initial=params, alternative=unnormalised)
