"""Differential properties across TensorFlow versions: the same drawn case under the
session's TensorFlow and under another one, in one run. A spec ``SPEC@ENV`` (``mirrored:2@tf215``)
runs its engines with the interpreter of tox env ENV (or the Python at a path); each test here
runs the case under it and under ``SPEC`` in the session's own interpreter and requires the two
to agree, for contracts that the documentation states without a version: a correct TensorFlow
gives the same numbers, up to the rounding either may add (tolerances.between_engines). The
reference only conditions the cases (no kinks); the expected value is the other version's
result, and a failure cites the reference rule of the property compared. Without a ``@`` spec
these tests have no parameters and are skipped::

    tox -e tf215 --notest
    pytest tests/properties/test_across_versions.py --strategies mirrored:2@tf215,multi_worker:2x1@tf215
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from reference import distribute as ref
from reference import model as ref_model
from suite.common.catalog import ADAPTIVE, OPTIMIZERS
from suite.harness.drawing import cases
from suite.harness.drawing.cases import ARCHS, arch_dict, training_cases
from suite.harness.judging.judgment import Check
from suite.harness.judging.quantity import Quantity
from suite.harness.judging.tolerances import between_engines
from suite.harness.plugin import state


def _versions(request, spec) -> dict:
    """Both sides' versions, for the case line of a failure."""
    s = state.of(request.config)
    here, there = s.versions, s.other_versions[spec.text]
    return {"here": f"TF {here['tensorflow']} / Keras {here['keras']}",
            "there": f"TF {there['tensorflow']} / Keras {there['keras']}"}


def _agree(check: Check, there: list, here: list, attrs: list[str], what: str, kind: str | None = None, **tol):
    """Every worker's fields ``attrs`` (and per-replica ``local`` values) under the other version
    equal the session's within both engines' rounding (``kind``: the quantities' kind, where a
    known deviation names them by field)."""
    __tracebackhide__ = True

    def named(text: str, **fields):
        return Quantity.of(kind, text, against="other version", **fields) if kind else text

    check.equal(len(there), len(here), named(f"{what}: workers answering", workers=True))
    for w, (b, a) in enumerate(zip(there, here)):
        who = f" (worker {w})" if len(here) > 1 else ""
        on = {"worker": w} if len(here) > 1 else {}
        for attr in attrs:
            check.close(getattr(b, attr), getattr(a, attr),
                        named(f"{what}: {attr}{who}, other version vs this one", attr=attr, **on), **tol)


@pytest.mark.parametrize("dtype", cases.DTYPES)
@given(data=st.data())
def test_compute_average_loss_agrees_across_versions(engines, versioned_spec, dtype, request, data):
    """``tf.nn.compute_average_loss`` of each replica's losses (its docstring: the sum over the
    global batch size, by default replicas x local batch) and their SUM: no version in the rule."""
    spec = versioned_spec
    sizes = data.draw(cases.splits(spec.replicas), label="sizes")
    losses = data.draw(cases.floats(dtype, sum(sizes), 0.0, 8.0), label="per-example losses")
    gbs = data.draw(st.none() | st.integers(max(sum(sizes), 1), 3 * max(sum(sizes), 1)), label="global_batch_size")
    call = dict(losses=losses, sizes=sizes, global_batch_size=gbs)
    here = engines.call(spec.base, "losses.compute_average_loss", **call)
    there = engines.call(spec, "losses.compute_average_loss", **call)
    check = Check(spec, dtype, dict(_versions(request, spec), sizes=sizes, losses=losses, global_batch_size=gbs),
                  rule=ref.compute_average_loss)
    n = max(sizes + [1])
    for w, (b, a) in enumerate(zip(there, here)):
        check.equal(len(b.local), len(a.local), f"local results (worker {w})")
        for r, (x, y) in enumerate(zip(b.local, a.local)):
            check.close(x, y, Quantity.of("compute_average_loss", f"compute_average_loss replica {r} (worker {w}), other "
                                          "version vs this one", replica=r, worker=w, against="other version"),
                        n_terms=n, override=between_engines())
    _agree(check, there, here, ["total"], "SUM of compute_average_loss", "compute_average_loss",
           n_terms=sum(sizes) + spec.replicas,
           override=between_engines())


@pytest.mark.parametrize("dtype", cases.DTYPES)
@given(data=st.data())
def test_strategy_reduce_agrees_across_versions(engines, versioned_spec, dtype, request, data):
    """``strategy.reduce`` SUM and MEAN, ``axis=0`` and ``axis=None`` (the reduce docstring's
    rules), on uneven and empty replicas."""
    spec = versioned_spec
    sizes = data.draw(cases.splits(spec.replicas, min_total=1), label="sizes")
    width = data.draw(st.integers(1, 3), label="width")
    rows = data.draw(cases.floats(dtype, (sum(sizes), width)), label="rows")
    here = engines.call(spec.base, "reduce.reduce", rows=rows, sizes=sizes)
    there = engines.call(spec, "reduce.reduce", rows=rows, sizes=sizes)
    check = Check(spec, dtype, dict(_versions(request, spec), sizes=sizes, rows=rows), rule=ref.reduce)
    _agree(check, there, here, ["sum_axis0", "mean_axis0", "sum_none", "mean_none"], "strategy.reduce",
           n_terms=sum(sizes), override=between_engines())


@pytest.mark.parametrize("optimizer", ["sgd", "sgd_momentum", "adam"])
@given(data=st.data())
def test_training_steps_agree_across_versions(engines, versioned_spec, optimizer, request, data):
    """The guide's step (``compute_average_loss`` with the global batch size, gradients summed
    once by ``apply_gradients``) trains the same model under both versions: every step's loss
    and every replica's copy of every variable, Keras 2 against Keras 3 where the two sides are
    of different generations (their optimizers' documented update rules are the same)."""
    spec = versioned_spec
    dtype = data.draw(st.sampled_from(cases.DTYPES), label="dtype")
    arch_name, params, steps = data.draw(training_cases(spec.replicas, dtype), label="case")
    arch = ARCHS[arch_name]
    # the reference only keeps the case away from kinks, where two roundings could part ways
    assume(cases.well_conditioned(ref_model.train(arch, params, optimizer, steps, "global"), dtype,
                                  optimizer in ADAPTIVE))
    call = dict(arch=arch_dict(arch), optimizer=optimizer, dtype=dtype, params=params, steps=steps)
    here = engines.call(spec.base, "training.train", **call)
    there = engines.call(spec, "training.train", **call)
    check = Check(spec, dtype, dict(_versions(request, spec), arch=arch_name, optimizer=OPTIMIZERS[optimizer][0],
                                    sizes=[s[2] for s in steps]), rule=ref_model.train)
    check.equal(len(there), len(here), "workers answering")
    for w, (b, a) in enumerate(zip(there, here)):
        who = f" (worker {w})" if len(here) > 1 else ""
        on = {"worker": w} if len(here) > 1 else {}
        check.equal(len(b.history), len(a.history), f"steps trained{who}")
        for s, (got, want) in enumerate(zip(b.history, a.history)):
            check.close(got.loss, want.loss, Quantity.of("summed loss", f"summed loss at step {s + 1}{who}, other version "
                                                         "vs this one", step=s + 1, against="other version", **on),
                        kind="trained", override=between_engines("trained"))
            for v, (copies, expected) in enumerate(zip(got.params, want.params)):
                for r, (x, y) in enumerate(zip(copies, expected)):
                    check.close(x, y, Quantity.of("variable", f"variable {v} on local replica {r} after step {s + 1}{who}, "
                                                  "other version vs this one", name=v, local_replica=r, step=s + 1,
                                                  against="other version", **on),
                                kind="trained", n_terms=4, override=between_engines("trained"))
