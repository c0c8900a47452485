"""Gradient summing: custom-loop training steps under each strategy equal the reference's steps
on the global batch, on every replica's copy of every variable after every step; optimizer
variables created lazily inside a distributed step."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from reference import model as ref_model
from reference.optimizers import ADAPTIVE, CONFIGS
from suite import cases, repro
from suite.assertions import PropertyFailure, assert_close
from suite.profiles import examples

ARCHS = {
    "mlp_linear_l2": ref_model.Arch(input_dim=3, hidden=(4,), outputs=2, head="linear", l2=1 / 64),
    "mlp_softmax": ref_model.Arch(input_dim=3, hidden=(5, 3), outputs=3, head="softmax"),
    "linear_l2": ref_model.Arch(input_dim=2, hidden=(), outputs=1, head="linear", l2=1 / 8),
}


@st.composite
def training_cases(draw, replicas: int, dtype: str, max_steps: int = 4):
    arch_name = draw(st.sampled_from(sorted(ARCHS)), label="arch")
    arch = ARCHS[arch_name]
    params = [draw(cases.floats(dtype, shape, -1.0, 1.0), label=f"param {i}")
              for i, shape in enumerate(arch.shapes())]
    steps = []
    for _ in range(draw(st.integers(1, max_steps), label="steps")):
        sizes = draw(cases.splits(replicas, max_per_replica=4, min_total=1), label="sizes")
        n = sum(sizes)
        x = draw(cases.floats(dtype, (n, arch.input_dim), -2.0, 2.0), label="x")
        if arch.head == "softmax":
            y = draw(cases.hnp.arrays(np.int32, n, elements=st.integers(0, arch.outputs - 1)), label="labels")
        else:
            y = draw(cases.floats(dtype, (n, arch.outputs), -2.0, 2.0), label="y")
        steps.append((x, y, sizes))
    return arch_name, params, steps


def _arch_dict(arch):
    return {"input_dim": arch.input_dim, "hidden": list(arch.hidden), "outputs": arch.outputs,
            "head": arch.head, "l2": arch.l2}


def _check_history(results, history, spec, dtype, case, snippet=None):
    __tracebackhide__ = True
    common = dict(spec=spec, dtype=dtype, kind="trained", replicas=spec.replicas, case=case, repro=snippet)
    for w, result in enumerate(results):
        who = f" (worker {w})" if len(results) > 1 else ""
        for s, (got, want) in enumerate(zip(result["history"], history)):
            assert_close(got["loss"], want["loss"], what=f"summed loss at step {s + 1}{who}", **common)
            for v, (copies, expected) in enumerate(zip(got["params"], want["params"])):
                for r, copy in enumerate(copies):
                    assert_close(copy, expected, n_terms=4,
                                 what=f"variable {v} on local replica {r} after step {s + 1}{who}", **common)
        if result["iterations"] != len(history):
            raise PropertyFailure(f"[{spec}] optimizer.iterations={result['iterations']}{who}, "
                                  f"but should be {len(history)} (one increment per step)")


@pytest.mark.parametrize("dtype", cases.DTYPES)
@pytest.mark.parametrize("optimizer", sorted(CONFIGS))
@examples(0.5)
@given(data=st.data())
def test_training_steps_match_reference_on_the_global_batch(engines, spec, optimizer, dtype, data):
    """compute_average_loss with the global batch size + scale_regularization_loss, gradients
    summed once by apply_gradients: every step equals the reference step on the global batch,
    whatever the split (uneven and empty replicas included)."""
    arch_name, params, steps = data.draw(training_cases(spec.replicas, dtype), label="case")
    arch = ARCHS[arch_name]
    history = ref_model.train(arch, params, optimizer, steps, "global")
    assume(cases.well_conditioned(history, dtype, optimizer in ADAPTIVE))
    results = engines.call(spec, "training.train", arch=_arch_dict(arch), optimizer=optimizer,
                           dtype=dtype, params=params, steps=steps)
    _check_history(results, history, spec, dtype,
                   {"arch": arch_name, "optimizer": optimizer, "sizes": [s[2] for s in steps]},
                   repro.training(spec, _arch_dict(arch), CONFIGS[optimizer], dtype, params, steps))


@examples(0.5)
@given(data=st.data())
def test_default_denominator_weights_each_replica_by_its_own_batch(engines, spec, findings, data):
    """With compute_average_loss's default denominator (replicas x local batch) training equals
    the single-device steps on even splits; on uneven splits each replica's examples weigh
    1/(replicas x its batch), as the reference states."""
    dtype = "float64"
    arch_name, params, steps = data.draw(training_cases(spec.replicas, dtype), label="case")
    arch = ARCHS[arch_name]
    history = ref_model.train(arch, params, "sgd", steps, "default")
    assume(cases.well_conditioned(history, dtype, False))
    results = engines.call(spec, "training.train", arch=_arch_dict(arch), optimizer="sgd",
                           dtype=dtype, params=params, steps=steps, denominator="default")
    _check_history(results, history, spec, dtype, {"arch": arch_name, "sizes": [s[2] for s in steps]})
    if all(len(set(s[2])) == 1 for s in steps):
        single = ref_model.train(arch, params, "sgd", steps, "global")
        for got, want in zip(history, single):
            for a, b in zip(got["params"], want["params"]):
                assert_close(a, b, what="reference: default denominator on even splits vs global",
                             spec=spec, dtype=dtype, kind="trained")


OPTIMIZER_CLASSES = ["Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "Ftrl", "Lamb",
                     "Lion", "Muon", "Nadam", "RMSprop", "SGD", "ScheduleFreeAdamW"]


def test_every_builtin_optimizer_is_covered(engines, spec):
    """The lazy-creation property lists every optimizer the installed Keras exports."""
    names = engines.call(spec, "training.optimizer_names")[0]
    missing = sorted(set(names) - set(OPTIMIZER_CLASSES))
    assert not missing, f"[{spec}] keras.optimizers exports {missing}, not covered by OPTIMIZER_CLASSES"


@pytest.mark.parametrize("name", OPTIMIZER_CLASSES)
def test_optimizer_variables_created_lazily_in_a_distributed_step(engines, spec, name):
    """Created under the scope and never built, an optimizer's first apply_gradients inside a
    distributed tf.function step creates its variables: the steps run, iterations counts them,
    and every replica holds the same copy of every optimizer and model variable."""
    if name not in engines.call(spec, "training.optimizer_names")[0]:
        pytest.skip(f"keras.optimizers has no {name} in this version")
    for w, r in enumerate(engines.call(spec, "training.lazy_optimizer", name=name)):
        who = f"[{spec}] {name} (worker {w})"
        if "raised" in r:
            raise PropertyFailure(f"{who}: the first distributed step raised {r['raised']}: {r['message']}")
        if r["iterations"] != 2 or not r["copies_agree"] or r["n_variables"] < 1:
            raise PropertyFailure(f"{who}: iterations={r['iterations']} (should be 2), replica copies "
                                  f"agree={r['copies_agree']}, optimizer variables={r['n_variables']}")
        if spec.kind not in ("default", "one_device") and r["distributed"] not in (
                ["MirroredVariable"], ["AggregatingVariable"]):
            raise PropertyFailure(f"{who}: optimizer variables are {r['distributed']}, but should be "
                                  f"distributed variables of the strategy")
