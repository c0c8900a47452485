"""Gradient summing: custom-loop training steps under each strategy equal the reference's steps
on the global batch, on every replica's copy of every variable after every step; optimizer
variables created lazily inside a distributed step."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from reference import distribute as ref
from reference import model as ref_model
from reference.rules import Rule
from suite.common.catalog import ADAPTIVE, OPTIMIZERS
from suite.common.given import Given
from suite.harness.drawing import cases
from suite.harness.drawing.cases import ARCHS, arch_dict, training_cases
from suite.harness.judging import repro
from suite.harness.judging.judgment import Check
from suite.harness.judging.quantity import Quantity, probe_raised
from suite.harness.judging.tolerances import tolerance
from tests.helpers import COSTLY


def check_history(results, history, check, initial=None, alternative=None, iterations=None, nan_losses=(),
                  unsummed=None, first=0, calls=None, at=None, logged=None, logged_given=None, unscaled=None,
                  facts=None):
    """Every step's loss and every replica's copy of every variable against the reference; with
    ``initial`` (the parameters before the steps), first that trained variables changed: every
    element the reference's steps move by more than the tolerance differs from its initial value
    (a step that updates nothing fails by name, before the value comparisons). ``alternative``:
    the history under another rule, handed to each comparison as ``given=Given(alternative=...)``
    for a known deviation's model (suite/harness/judging/signatures.py: alternative_rule). ``iterations``:
    the optimizer's expected count (default: one per step). ``nan_losses``: the steps (from 1)
    whose reported loss a deviation's model may predict NaN for (a replica with no rows divided
    by its batch: signatures.nan_on_an_empty_replica). ``unsummed``: the steps as
    reference/model.py train_unsummed takes them, each replica applying its own gradient (the
    model of keras3-gradients-not-summed-before-3.5), handed to each comparison as
    ``given=Given(unsummed=...)`` (``first``: the global index of the first result's first replica,
    where ``results`` holds one worker's). ``calls``: the apply_gradients calls made, the count
    a deviation's model may predict for ``iterations`` (``given=Given(alternative=calls)``). ``at``: the
    steps (from 1) the results' entries were read after, where not after every step (Model.fit's
    boundaries); ``logged``: the loss fit's logs should report after each step, compared in place
    of the step's summed loss (``logged_given``: per step, what a deviation's model reads).
    ``unscaled``: the history of reference/model.py train with ``unscaled=True`` (the model of
    keras3-loss-unscaled-before-3.8 where the optimizer sums), handed to each variable's comparison
    as ``given=Given(unscaled=...)``. ``facts``: what the deviations' conditions read (a Given: the
    fit's first split), handed to each step's comparisons with the rest."""
    __tracebackhide__ = True
    own = None
    if unsummed is not None:
        own = ref_model.train_unsummed(*unsummed[:4], **unsummed[4])
    for w, result in enumerate(results):
        who = f" (worker {w})" if len(results) > 1 else ""
        on = {"worker": w} if len(results) > 1 else {}  # the fields of ``who``
        # a probe with options returns its step's exception
        if not check.returned(result, Quantity.of("step", "the step").at(**on)):
            continue
        local = len(result.history[0].params[0]) if result.history else 1
        if initial is not None and history:
            tol = tolerance(check.dtype, "trained", n_terms=4)
            for v, (copies, before, after) in enumerate(zip(result.history[-1].params, initial, history[-1]["params"])):
                before, after = np.asarray(before, np.float64), np.asarray(after, np.float64)
                moved = np.abs(after - before) > tol.bound(after)  # elements the reference visibly changes
                if not moved.any():
                    continue
                for r, copy in enumerate(copies):
                    kept = moved & (np.asarray(copy) == before.astype(copy.dtype))  # where the check fails
                    changed = not kept.any()

                    def predicted(steps, moved=moved, kept=kept, changed=changed, before=before, tol=tol):
                        """Whether the steps of another rule change them: a deviation's prediction. Changed where
                        they visibly move every such element; unchanged where the elements kept are ones they
                        do not visibly move; else no prediction."""
                        theirs = np.asarray(steps, np.float64)
                        visible = np.abs(theirs - before) > tol.bound(theirs)
                        return True if visible[moved].all() else None if changed else not (~visible[kept]).all()
                    given = dataclasses.replace(
                        facts or Given(),
                        unsummed=predicted(own[-1]["params"][first + w * local + r][v]) if own is not None else None,
                        alternative=predicted(alternative[-1]["params"][v]) if alternative is not None else None)
                    check.equal(changed, True, Quantity.of("variable changed", f"variable {v} on local replica {r} after "
                                                           f"{len(history)} steps{who}: changed", name=v, local_replica=r,
                                                           steps=len(history), **on),
                                "every element should have changed from the initial parameters where the "
                                f"reference's steps change it by more than the tolerance ({int(moved.sum())} of "
                                f"{moved.size} elements)",
                                given=given)
        steps = at if at is not None else range(1, len(history) + 1)
        for got, step in zip(result.history, steps):
            s, want = step - 1, history[step - 1]
            other = alternative[s] if alternative is not None else None
            empty = True if s + 1 in nan_losses else None
            mine = own[s] if own is not None else None
            if logged is not None:
                check.close(got.loss, logged[s], Quantity.of("fit logged loss", f"fit's logged loss after step {s + 1}",
                                                             step=s + 1).at(**on), kind="trained",
                            given=logged_given[s] if logged_given else None)
            else:
                given = dataclasses.replace(facts or Given(), empty=empty, alternative=other["loss"] if other else None,
                                            unsummed=mine["loss"] if mine else None)
                check.close(got.loss, want["loss"], Quantity.of("summed loss", f"summed loss at step {s + 1}",
                                                                step=s + 1).at(**on), kind="trained", given=given)
            for v, (copies, expected) in enumerate(zip(got.params, want["params"])):
                for r, copy in enumerate(copies):
                    given = dataclasses.replace(
                        facts or Given(), alternative=other["params"][v] if other else None,
                        unsummed=mine["params"][first + w * local + r][v] if mine else None,
                        unscaled=unscaled[s]["params"][v] if unscaled is not None else None)
                    check.close(copy, expected, Quantity.of("variable", f"variable {v} on local replica {r} after step "
                                                            f"{s + 1}", name=v, local_replica=r, step=s + 1).at(**on),
                                kind="trained", n_terms=4, given=given)
        check.equal(result.iterations, len(history) if iterations is None else iterations,
                    Quantity.of("optimizer iterations", f"optimizer.iterations{who} (one increment per applied step)",
                                per="applied step", **on),
                    given=Given(alternative=calls) if calls is not None else None)


@pytest.mark.parametrize("dtype", cases.DTYPES)
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("arch", sorted(ARCHS))
@given(data=st.data())
def test_training_steps_match_reference_on_the_global_batch(engines, spec, arch, optimizer, dtype, data):
    """compute_average_loss with the global batch size + scale_regularization_loss, gradients
    summed once by apply_gradients: every step equals the reference step on the global batch,
    whatever the split (uneven and empty replicas included), for every model with every optimizer."""
    arch_name, params, steps = data.draw(training_cases(spec.replicas, dtype, arch=arch), label="case")
    arch = ARCHS[arch_name]
    history = ref_model.train(arch, params, optimizer, steps, "global")
    assume(cases.well_conditioned(history, dtype, optimizer in ADAPTIVE))
    results = engines.call(spec, "training.train", arch=arch_dict(arch), optimizer=optimizer,
                           dtype=dtype, params=params, steps=steps)
    snippet = repro.training(spec, arch_dict(arch), OPTIMIZERS[optimizer], dtype, params, steps)
    case = {"arch": arch_name, "optimizer": optimizer, "sizes": [s[2] for s in steps]}
    check_history(results, history, Check(spec, dtype, case, snippet, rule=ref_model.train), initial=params,
                  unsummed=(arch, params, optimizer, steps, {}))


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
    results = engines.call(spec, "training.train", arch=arch_dict(arch), optimizer="sgd",
                           dtype=dtype, params=params, steps=steps, denominator="default")
    check_history(results, history, Check(spec, dtype, {"arch": arch_name, "sizes": [s[2] for s in steps]},
                                          rule=ref.compute_average_loss),
                  unsummed=(arch, params, "sgd", steps, {"denominator": "default"}))


OPTIMIZER_CLASSES = ["Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "Ftrl", "Lamb",
                     "Lion", "Muon", "Nadam", "RMSprop", "SGD", "ScheduleFreeAdamW"]
# the custom-training tutorial's model: no Input, so its first call (in the distributed step) builds it
LAZY_MODEL = Rule("documented", "https://www.tensorflow.org/tutorials/distribute/custom_training: create_model() "
                                "is a Sequential with no Input, created under strategy.scope() and first called "
                                "inside strategy.run in the tf.function step, which creates its variables")
# the optimizers keras.optimizers exports: a class not in OPTIMIZER_CLASSES is one the property does not cover
EXPORTED = Rule("observed", "the keras.optimizers.Optimizer subclasses keras.optimizers exports (suite/engine/compat.py "
                            "builtin_optimizer_names): OPTIMIZER_CLASSES, in the versions tested")
# the custom training guide's step: the optimizer made under the scope, first applied in the distributed step
LAZY = Rule("documented", "https://www.tensorflow.org/tutorials/distribute/custom_training: the optimizer is created "
                          "under strategy.scope() and first applied by apply_gradients in the tf.function step that "
                          "strategy.run runs; the Keras 2.15 Optimizer.iterations docstring: 'incremented by one every time "
                          "apply_gradients() is called'; tf.types.experimental.distributed.Mirrored: 'the value on all "
                          "replicas is the same'")


def test_every_builtin_optimizer_is_covered(engines, spec):
    """The lazy-creation property lists every optimizer the installed Keras exports."""
    names = engines.call(spec, "training.optimizer_names")[0]
    Check(spec, rule=EXPORTED).equal(sorted(set(names) - set(OPTIMIZER_CLASSES)), [],
                      "keras.optimizers classes not covered by OPTIMIZER_CLASSES")


@pytest.mark.parametrize("name", OPTIMIZER_CLASSES)
def test_optimizer_variables_created_lazily_in_a_distributed_step(engines, spec, name):
    """Created under the scope and never built, an optimizer's first apply_gradients inside a
    distributed tf.function step creates its variables: the steps run, iterations counts them,
    and every replica holds the same copy of every optimizer and model variable."""
    if name not in engines.call(spec, "training.optimizer_names")[0]:
        pytest.skip(f"keras.optimizers has no {name} in this version")
    _check_lazy(engines, spec, name, Check(spec, case={"optimizer": name}, rule=LAZY))


def test_a_model_built_by_its_first_call_in_a_distributed_step(engines, spec):
    """A model with no Input, created under the scope with SGD (TensorFlow's custom-training
    tutorial builds its model so): its first call, inside the distributed tf.function step, creates
    its variables there. The steps run, iterations counts them, and every replica holds the same
    copy of every model and optimizer variable."""
    _check_lazy(engines, spec, "SGD", Check(spec, case={"optimizer": "SGD", "model": "no Input"}, rule=LAZY_MODEL),
                lazy_model=True)


def _check_lazy(engines, spec, name: str, check: Check, lazy_model: bool = False) -> None:
    for w, r in enumerate(engines.call(spec, "training.lazy_optimizer", name=name, lazy_model=lazy_model)):
        who = f"{name} (worker {w})"
        # the probe never builds the optimizer before its first step (the condition of a deviation that raises)
        if not check.returned(r, Quantity.of("two distributed steps", f"{who}: two distributed steps", name=name, worker=w),
                              given=Given(optimizer_built=False)):
            continue  # a known deviation raised, as its signature predicts
        check.equal(r.disagreeing, [], Quantity.of("replica copies differ", f"{who}: variables whose replica copies differ",
                                                   name=name, worker=w), given=Given(variables=r.names))
        check.equal(r.iterations, 2, f"{who}: optimizer.iterations after two steps")
        check.that(r.n_variables >= 1, f"{who}: optimizer variables created", r.n_variables, "at least 1")
        if spec.kind not in ("default", "one_device"):
            check.that(r.distributed in (["MirroredVariable"], ["AggregatingVariable"]), f"{who}: optimizer variables",
                       r.distributed, "distributed variables of the strategy")


@COSTLY
@pytest.mark.parametrize("denominator", ["constant", "default"])
@given(data=st.data())
def test_short_last_batch_training_matches_the_reference_split(engines, spec, denominator, data):
    """Several epochs over a dataset whose length is not a multiple of the global batch G, from
    experimental_distribute_dataset: equal to the reference loop that splits each batch by the
    input rule (reference/input.py) and divides by G (the guide's constant) or by each replica's
    batch x replicas (the default)."""
    from reference import input as ref_input

    dtype = "float64"
    arch_name, params, _ = data.draw(training_cases(spec.replicas, dtype, max_steps=1), label="model")
    arch = ARCHS[arch_name]
    g = data.draw(st.integers(max(2, spec.replicas), 6), label="global batch")
    # a length that is not a multiple of G, drawn as whole batches plus a short one
    length = g * data.draw(st.integers(1, 2), label="whole batches") + data.draw(st.integers(1, g - 1),
                                                                                 label="short batch")
    epochs = data.draw(st.integers(1, 2), label="epochs")
    x = data.draw(cases.magnitudes(dtype, (length, arch.input_dim), 1 / 16, 2.0), label="x")
    if arch.head == "softmax":
        y = data.draw(cases.hnp.arrays(np.int32, length, elements=st.integers(0, arch.outputs - 1)), label="y")
    else:
        y = data.draw(cases.floats(dtype, (length, arch.outputs), -2.0, 2.0), label="y")
    split = ref_input.distribute(length, g, False, spec.replicas, "AUTO", True, spec.workers)
    steps = [(x[[i for part in s for i in part]], y[[i for part in s for i in part]], [len(p) for p in s])
             for s in split] * epochs
    history = ref_model.train(arch, params, "sgd", steps, g if denominator == "constant" else "default")
    assume(cases.well_conditioned(history, dtype, False))
    own = ref_model.train_unsummed(arch, params, "sgd", steps, g if denominator == "constant" else "default")
    # rows per worker at each step: a step that leaves one worker none (a deadlock's condition on TF 2.13)
    check_given = Given(worker_rows=[[sum(len(p) for p in ref.local_results(list(s), w, spec.workers))
                                      for w in range(spec.workers)] for s in split])
    results = engines.call(spec, "training.train_dataset", arch=arch_dict(arch), optimizer="sgd", dtype=dtype,
                           params=params, x=x, y=y, global_batch=g, epochs=epochs, denominator=denominator)
    per_epoch = len(split)
    check = Check(spec, dtype, {"G": g, "length": length, "denominator": denominator}, rule=ref_model.train)
    check.given_for(probe_raised("training.train_dataset"), check_given)
    for w, r in enumerate(results):
        for e, epoch in enumerate(r.epochs):
            want_sizes = [ref.local_results([len(p) for p in s], w, len(results)) for s in split]
            check.equal(epoch.sizes, want_sizes, f"replica batch sizes in epoch {e + 1} (worker {w}), by the input rule",
                        rule=ref_input.distribute)
            expected = history[(e + 1) * per_epoch - 1]["params"]
            mine = own[(e + 1) * per_epoch - 1]["params"]  # each replica's own copy (keras3-gradients-not-summed-before-3.5)
            local = spec.replicas // len(results)
            for v, (copies, want) in enumerate(zip(epoch.params, expected)):
                for c, copy in enumerate(copies):
                    check.close(copy, want, Quantity.of("variable", f"variable {v} on replica {c} after epoch {e + 1} "
                                                        f"(worker {w})", name=v, local_replica=c, epoch=e + 1, worker=w),
                                kind="trained", n_terms=4, given=Given(unsummed=mine[w * local + c][v]))

