"""The known-deviations file: well-formed, its evidence exists, its patterns name real tests,
docs/known_deviations.md lists every entry (tests/lint/test_docs.py), and each entry excuses
only what its signature describes: a
foreign wrong value in a test it covers is a FAIL, never an XFAIL."""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import numpy as np
import pytest

from suite.common.given import Given
from suite.common.results import Raised
from suite.common.specs import DEFAULT_SPECS, parse_spec
from suite.harness.judging import deviations
from suite.harness.judging.judgment import Check, PropertyFailure
from suite.harness.judging.quantity import Pattern, Quantity, glob
from suite.harness.judging.signatures import MODELS, NOTHING, Seen, Signature
from suite.harness.pool import versions
from tests.helpers import run_pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRIES = deviations.load()


def test_file_parses_and_every_entry_has_existing_evidence():
    Check("known_deviations.toml").that(len(ENTRIES) > 0, "entries", len(ENTRIES), "at least one")
    for d in ENTRIES:
        Check(d.id).that(len(d.signatures) > 0, "signatures", 0, "at least one (what TensorFlow does instead)")
        for item in d.evidence:
            path = item.split()[0]
            if path.startswith(("repros/", "tests/")):
                Check(d.id).that((ROOT / path.split("::")[0]).exists(), "evidence file", path, "in the repository")


def test_each_workaround_names_a_catalogued_cause():
    """An entry's ``workaround`` is the cause whose fix avoids it in the user's code: it must be one
    the loop check diagnoses (causes.CAUSES), or the BLOCKED verdict would show no way around."""
    from suite.harness.loopcheck.causes import CAUSES

    for d in ENTRIES:
        if d.workaround is not None:
            Check(d.id).that(d.workaround in CAUSES, "workaround", d.workaround, "a catalogued cause")


def test_patterns_name_existing_test_functions():
    """Every pattern names a test function of a module, or the check of a user's loop under
    specs (``loop-check[SPEC]``, SPEC a spec or a glob of specs, never a bare ``*``)."""
    for d in ENTRIES:
        for pattern in d.tests:
            if pattern.startswith("loop-check["):
                Check(d.id).that(re.fullmatch(r"loop-check\[[{a-z_]+[^*\]]*(:[^\]]*)?\]", pattern) is not None,
                                 "a loop-check pattern", pattern, "loop-check[KIND:...] naming its strategy kinds")
                continue
            module, rest = pattern.split("::", 1)
            function = re.match(r"\w+", rest).group(0)
            Check(d.id).that(f"def {function}(" in (ROOT / module).read_text(), "test function of a pattern",
                             f"{module}::{function}", "defined in that module")


# the specs whose test ids the entries' patterns may name: the default ones and the spec of each kind and
# shape some entry is about that no default spec has (three replicas of central_storage, of one worker's
# mirrored with reduce_to_one, three workers, a worker of two devices)
NAMED_SPECS = (*DEFAULT_SPECS, "mirrored:3:reduce_to_one", "central_storage:3", "multi_worker:3x1", "multi_worker:1x2")


@functools.cache
def collected_ids() -> tuple[str, ...]:
    """The test ids ``pytest tests --collect-only`` gives under NAMED_SPECS (a few seconds, no engine)."""
    proc = run_pytest(["tests", "--collect-only", "--strategies", ",".join(NAMED_SPECS)], timeout=300)
    Check("pytest tests --collect-only").equal(proc.returncode, 0, "exit code", proc.stdout[-2000:] + proc.stderr[-2000:])
    return tuple(line.strip() for line in proc.stdout.splitlines() if "::" in line)


def unmatched(patterns, ids, specs) -> list[str]:
    """The ``tests`` patterns that match none of ``ids`` (a ``loop-check[...]`` scope: none of ``specs``)."""
    scopes = [f"loop-check[{s}]" for s in specs]
    return [p for p in patterns if not any(glob(p).fullmatch(i) for i in (scopes if p.startswith("loop-check[") else ids))]


def test_every_tests_pattern_matches_a_collected_test():
    """A pattern of an entry's ``tests`` is text over test ids, whose parameters come in the order of the
    test's parametrize ids: one that matches no collected id (a renamed test, parameters reordered, a
    spec no kind of ours has) excuses nothing, and would fail only late, on a TensorFlow run."""
    ids = collected_ids()
    check = Check("known_deviations.toml")
    check.that(len(ids) > 1000, "test ids collected", len(ids), "the whole suite")
    check.equal([(d.id, p) for d in ENTRIES for p in unmatched(d.tests, ids, NAMED_SPECS)], [],
                "patterns of tests that match no collected test id")
    # the check's own test: parameters in another order, a misspelt test and an unknown spec kind match nothing
    stale = ["tests/properties/test_losses.py::test_keras_loss_reduction_inside_strategy_run[sum_over_batch_size-*]",
             "tests/properties/test_losses.py::test_keras_los_reduction_inside_strategy_run[*]",
             "loop-check[mirored:*]", "loop-check[mirrored:*]"]
    check.equal(unmatched(stale, ids, NAMED_SPECS), stale[:3], "stale patterns found (the check's own test)")


def test_signatures_name_their_quantities_by_field(tmp_path):
    """A signature matched against the text of a failure joins by English (a label reworded, a variable
    named like a loss, and it excuses the wrong thing or nothing); by field it names the kind, name,
    replica, worker and step the test's Check passes. A text quantity is a one-line error of the loader,
    and a Quantity's text never matches a signature."""
    check = Check("known_deviations.toml")
    check.equal(sorted({type(s.quantity).__name__ for d in ENTRIES for s in d.signatures}), ["Pattern"],
                "what the signatures' quantities are")
    path = tmp_path / "d.toml"
    path.write_text('[[deviation]]\nid = "x"\ntests = ["t.py::f"]\ntensorflow = ">=2"\nkeras = ">=2"\nsummary = "s"\n'
                    'evidence = []\nfirst_seen = "now"\n[[deviation.signature]]\nkind = "band"\nrtol = 1e-6\n'
                    'quantity = "loss after step *"\n')
    with pytest.raises(ValueError) as info:
        deviations.load(path)
    check.contains(str(info.value), ["deviation #0 (x)", "quantity 'loss after step *' is text", "by field"],
                   "the loader's error for a text quantity")
    sig = Signature.parse({"quantity": {"kind": "loss"}, "kind": "band", "rtol": 1e-6}, "test")
    check.equal((sig.covers(Quantity.of("loss", "loss after step 1", name="", step=1)), sig.covers("loss after step 1")),
                (True, False), "a signature by field covers the loss, and not its text")


def test_patterns_match_only_what_they_say():
    d = deviations.Deviation("x", ("t.py::f[mirrored:{2,3}-{Adam,Nadam}]", "t.py::g[*-float64]"),
                             ">=2.16", ">=3", "s", (), "now")
    check = Check("pattern")
    for nodeid, want in [("t.py::f[mirrored:2-Adam]", True), ("t.py::f[mirrored:3-Nadam]", True),
                         ("t.py::f[mirrored:1-Adam]", False), ("t.py::f[mirrored:2-SGD]", False),
                         ("t.py::g[default-scalar-float64]", True), ("t.py::g[default-float32]", False)]:
        check.equal(d.matches(nodeid), want, f"matches({nodeid!r})")
    check.equal((d.applies_to("2.21.0", "3.15.1"), d.applies_to("2.15.1", "2.15.0")), (True, False), "applies_to")


def test_malformed_signatures_are_one_line_errors(tmp_path):
    base = ('[[deviation]]\nid = "x"\ntests = ["t.py::f"]\ntensorflow = ">=2"\nkeras = ">=2"\nsummary = "s"\n'
            'evidence = []\nfirst_seen = "now"\n')
    for table, phrase in [("", "lacks ['signature']"),
                          ('[[deviation.signature]]\nquantity = "q"\nkind = "guess"\n', "kind 'guess'"),
                          ('[[deviation.signature]]\nquantity = "q"\nkind = "model"\nmodel = "nope"\n', "model 'nope'"),
                          ('[[deviation.signature]]\nquantity = "q"\nkind = "band"\n', "needs rtol or atol"),
                          ('[[deviation.signature]]\nquantity = "q"\nkind = "raises"\ntype = "E"\n',
                           "type, message and origin"),
                          ('[[deviation.signature]]\nquantity = "q"\nkind = "raises"\ntype = "E"\nmessage = "m"\n',
                           "type, message and origin"),
                          ('[[deviation.signature]]\nquantity = "q"\nkind = "raises"\ntype = "DeadlineExceededError"\n'
                           'message = "Collective has timed out"\norigin = ["op:*"]\n',
                           "a deadlock is no excuse on its own")]:
        path = tmp_path / "d.toml"
        path.write_text(base + table)
        with pytest.raises(ValueError) as info:
            deviations.load(path)
        Check("known_deviations.toml", case={"signature": table}).contains(str(info.value), [phrase, "deviation #0 (x)"],
                                                                          "the loader's error")


# -- each signature explains its deviation and nothing else ---------------------------------

def _close(a, b):
    return np.shape(a) == np.shape(b) and bool(np.allclose(np.asarray(a, float), np.asarray(b, float),
                                                           rtol=1e-12, atol=0, equal_nan=True))


# per model: (spec, expected, given, the deviant value the entry's summary states for that case)
MODEL_CASES = {
    "replica_scale_rounded_to_float32": ("mirrored:3", 0.7, None, 0.7 * 3 * float(np.float32(1 / 3))),
    "local_mean_not_scaled_by_replicas": ("mirrored:2", 0.5, None, 1.0),
    "metric_state_assigned_by_every_replica": (  # total 2 * 1 + 3, count 2 * 2 + 2
        "central_storage:2", 1.0, Given(kind="mean", increments=[(1.0, 2.0), (3.0, 2.0)]), 5 / 6),
    "metric_variables_assigned_by_every_replica": (  # total 2 * (2 * 0 + 1) + 3, count 2 * 2 + 2
        "central_storage:2", [4.0, 4.0], Given(start=[0.0, 0.0], increments=[[1.0, 2.0], [3.0, 2.0]],
                                               under=[parse_spec("central_storage:2")] * 2), [5.0, 6.0]),
    "partial_last_step_dropped": ("central_storage:2", [[[0], [1]], [[2], []]], Given(partial=True), [[[0], [1]]]),
    "partial_last_step_missing": ("central_storage:2", [], Given(dropped=[14]), [14]),
    "integer_sum_restored_by_division": ("mirrored:2", [1, 2, 3], None, [0, 2, 2]),
    # two workers in lockstep for one step (both read 0), then alternating: last writes 6 (worker 0), 7
    "increments_lost_between_workers": ("parameter_server:2w1ps", 8, Given(steps=[
        [0, 1], [1, 1], [0, 2], [1, 3], [0, 4], [1, 5], [0, 6], [1, 7]]), frozenset({6, 7})),
    "momentum_set_on_the_building_replica_only": ("mirrored:2:reduce_to_one", [], Given(variables=[
        "schedule_free_adam_w/iteration", "schedule_free_adam_w/sequential_dense_bias_momentum",
        "schedule_free_adam_w/sequential_dense_kernel_momentum", "sequential/dense/bias", "sequential/dense/kernel"]),
        ["schedule_free_adam_w/sequential_dense_kernel_momentum", "sequential/dense/kernel"]),
    # repros/keras3_clipping_per_replica.py: one device -1.0, Keras 3's per-replica clipping 0.0
    "alternative_rule": ("mirrored:2", -1.0, Given(alternative=0.0), 0.0),
    # repros/keras3_loss_scale_finiteness_replica_0.py: the scale 16384 after a skipped step, Keras 3 keeps 32768
    "alternative_outcome": ("mirrored:2", 16384.0, Given(alternative=32768.0), 32768.0),
    "replicas_apply_their_own_gradients": ("mirrored:2", -1.0, Given(unsummed=-0.5), -0.5),
    # the multi-worker tutorial's fit on tf-keras 2.21, two workers: a loss of 2.2979 logged as 4.5958
    "fit_logs_summed_over_replicas": ("multi_worker:2x1", 2.2979, Given(), 4.5958),
    "fit_logs_summed_over_replicas_of_the_alternative": ("multi_worker:2x1", 2.2979, Given(alternative=2.5), 5.0),
    # two replicas' own running means (each on its own copy) against the global mean of 0.6
    "fit_logs_sum_of_replica_trackers": ("mirrored:2", 0.6, Given(replica_logs=[0.5, 0.75]), 1.25),
    "fit_logs_mean_of_replica_trackers": ("mirrored:2", 0.6, Given(replica_logs=[0.5, 0.75]), 0.625),
    # Keras 3.0-3.1 on mirrored:3, split [2, 2, 0]: each tracker the mean of its steps' losses, the third's 0 / 0
    "fit_logs_sum_of_replica_trackers_counting_each_step": (
        "mirrored:3", 0.5, Given(replica_step_means=[[0.5, 1.0, float("nan")], [1.5, 1.0, float("nan")]]),
        float("nan")),
    # a script's Mean on Keras 3.0-3.6, two steps of [1, 3] on two replicas: copies (2, 2) and (6, 2) hold one device's
    # (8, 4) between them; the read copy's 1.0 where one device reads 2.0
    "first_replica_copy_of_the_summed_state": ("mirrored:2", 2.0, Given(
        kind="mean", increments=[(4.0, 2.0), (4.0, 2.0)], replica_states=[(2.0, 2.0), (6.0, 2.0)],
        replica=0), 1.0),
    # Keras 3.5-3.6: the replicas' own running means on the weights of the unscaled steps
    "fit_logs_mean_of_unscaled_replica_trackers": ("mirrored:2", 0.6, Given(unscaled_replica_logs=[0.5, 0.9]), 0.7),
    # Keras 3.7: the summed-on-write state over the unscaled steps' losses, (2 * 4 + 40) / (2 * 2 + 2)
    "fit_logs_summed_on_write_of_unscaled_steps": (
        "mirrored:2", 11.0, Given(kind="mean", unscaled_increments=[(4.0, 2.0), (40.0, 2.0)]), 8.0),
    # the fit property on TF 2.18.1 / Keras 3.6.0, linear_l2 with every weight 1, x = 1, y = 0, one row per
    # replica: kernel 0.21875 after the global batch's SGD step, -0.5625 after the sum of the unscaled losses'
    "replica_losses_unscaled_then_summed": ("mirrored:2", 0.21875, Given(unscaled=-0.5625), -0.5625),
    # the repro on Keras 3.7.0: replica 0's own update 0.5, replica 1's 6.0, both copies their mean
    "replica_copies_averaged": ("mirrored:2", np.array([0.5, 0.5]), Given(averaged=np.array([3.25, 3.25])),
                                np.array([3.25, 3.25])),
    # two replicas per worker: replica 2 draws replica 0's mask, replicas 1 and 3 their own
    "same_on_every_worker": ("multi_worker:2x2", [False, False, False], Given(per_worker=[False, True, False]),
                             [False, True, False]),
    # the one-pass variance's bounds around the exact value (repros/synchronized_bn_one_pass_variance.py)
    "one_pass_variance_bounds": ("mirrored:2", 0.0125489, Given(one_pass=(0.0, 0.02)), (0.0, 0.02)),
    # repros/synchronized_bn_one_pass_variance.py's column in float32 (split [3, 1], momentum 0.75):
    # Keras 3 clamps the variance -8 to 0, so the moving variance is 0.75, not 0.75 + 0.25 * 0.0125489
    "one_pass_variance_in_float32": ("mirrored:2", np.array([0.75 + 0.25 * 0.012548923]), Given(float32_one_pass={
        "batches": [np.float32(1e4 + np.array([[0.1], [0.2], [0.3], [0.4]])).astype(np.float64)],
        "sizes": [[3, 1]], "momentum": 0.75, "epsilon": 1 / 1024, "keras": 3, "step": 0, "replica": 0,
        "name": "moving_variance"}), np.array([0.75])),
    # repros/batch_norm_empty_replica.py: the empty replica's copy stays 0 where one device gives 2.25
    "empty_replica_skipped_bounds": ("mirrored:2", 2.25, Given(skipped=(-1e-12, 1e-12)), (-1e-12, 1e-12)),
    # repros/compute_average_loss_empty_replica.py under XLA on TF 2.12: 0 / 0 on the empty replica
    "nan_on_an_empty_replica": ("mirrored:2", 0.0, Given(empty=True), float("nan")),
    # repros/keras3_gradients_not_summed_before_3_5.py: w on a replica moved by its own gradient only
    # repros/keras3_metric_state_not_sync_on_read.py: the state's type before Keras 3.10
    "mirrored_metric_variables": ("mirrored:2", ["SyncOnReadVariable"], None, ["MirroredVariable"]),
    # the repro on Keras 3.0-3.6 after [1, 3]: replica 0's copy, 1.0, where the sum gives 2.0
    "metric_state_of_the_first_local_replica": (
        "mirrored:2", 2.0, Given(kind="mean", replica_states=[(1.0, 1.0), (3.0, 1.0)], replica=0), 1.0),
    # [1, 3], [10, 30], a checkpoint restored under mirrored:2, [100, 300] (Keras 3.6.0): replica 0's
    # copy 1 + 10 + 100 over 3, where the sync-on-read state is 444 over 6
    "metric_variables_per_replica_copy": ("mirrored:2", [444.0, 6.0], Given(
        start=[0.0, 0.0], replica_increments=[[[1.0, 1], [3.0, 1]], [[10.0, 1], [30.0, 1]],
                                              [[100.0, 1], [300.0, 1]]],
        restored_after=2, replica=0), [111.0, 3.0]),
    # two steps on mirrored:2 whose second step's losses differ between the copies (their parameters
    # parted after step 1): replica 0's copy tracks its own losses, 1 + 10 over 2
    "per_replica_metric_copies_of_unsummed_steps": ("mirrored:2", [45.0, 4.0], Given(
        start=[0.0, 0.0], replica_increments=[[[1.0, 1], [3.0, 1]], [[10.0, 1], [30.0, 1]]],
        unsummed_replica_increments=[[[1.0, 1], [3.0, 1]], [[10.0, 1], [31.0, 1]]],
        restored_after=None, replica=0), [11.0, 2.0]),
    # repros/keras3_accuracy_counts_each_update_before_3_4.py: 1 of 3 right, then 1 of 1, on one replica;
    # Keras 3.0-3.3 average the two batches' accuracies, (1/3 + 1) / 2 (1/3 a float32 mean), where
    # the examples give 2/4
    "metric_counts_each_update_as_one_example": (
        "default", 0.5, Given(kind="accuracy", batch_states=[[(1.0, 3.0)], [(1.0, 1.0)]], replica=0),
        (float(np.float32(1 / 3)) + 1) / 2),
    # the repro on Keras 3.7-3.9 after [1, 3] and [10, 30]: (2 * 4 + 40) / (2 * 2 + 2), not 44 / 4
    "metric_state_summed_on_write": ("mirrored:2", 11.0, Given(kind="mean", increments=[(4.0, 2.0), (40.0, 2.0)]),
                                     8.0),
    # the same with [100, 300] after a restore under mirrored:2 (Keras 3.7.0): 2 * 48 + 400 over 2 * 6 + 2
    "metric_variables_summed_on_write": ("mirrored:2", [444.0, 6.0], Given(
        start=[0.0, 0.0], increments=[[4.0, 2.0], [40.0, 2.0], [400.0, 2.0]],
        under=[parse_spec("mirrored:2")] * 3), [496.0, 14.0]),
}


# the frames a user's own loop raises through (its step, TensorFlow's strategy.run and a variable's update)
USERS_FRAMES = ("user/train.py:<module>", "tensorflow/python/distribute/distribute_lib.py:run", "user/train.py:step",
                "tensorflow/python/distribute/ps_values.py:assign_add", "op:__inference_step_42")

# per condition: given where it held, given where it did not
CONDITION_CASES = {
    "non_finite_off_replica_0_on_another_worker": (Given(poison=[[1.0, 1.0], [1.0, float("inf")]], workers=2),
                                                   Given(poison=[[float("inf"), 1.0], [1.0, 1.0]], workers=2)),
    "a_worker_without_rows_beside_one_with_rows": (Given(worker_rows=[[2, 2], [1, 0]]), Given(worker_rows=[[2, 2], [1, 1]])),
    "optimizer_not_built_before_the_step": (Given(optimizer_built=False), Given(optimizer_built=True)),
    "the_optimizer_clips": (Given(optimizer_clips=True), Given(optimizer_clips=False)),
    "replica_copies_differ_in_the_control": (Given(control_copies_differ=True), Given(control_copies_differ=False)),
    "fits_first_batch_split_unevenly": (Given(fit_first_split=[2, 1]), Given(fit_first_split=[2, 2])),
    "fit_runs_several_steps_per_execution": (Given(steps_per_execution=2), Given(steps_per_execution=1)),
    "trained_by_keras_fit": (Given(step_mode="fit"), Given(step_mode="call")),
}


def _with(given, more: Given) -> Given:
    """``given`` (a Given or None) with the fields ``more`` hands too."""
    return dataclasses.replace(given or Given(), **{f.name: getattr(more, f.name) for f in dataclasses.fields(more)
                                                   if getattr(more, f.name) is not None})


def _a_frame(pattern: str) -> str:
    """A frame that ``pattern`` (an origin glob) matches: ``*`` as ``x``, ``{a,b}`` as ``a``."""
    return re.sub(r"\{([^,}]*)[^}]*\}", r"\1", pattern).replace("*", "x")


def _foreign(value):
    """A wrong value of the same shape that no deviation describes (the foreign_result mutant's)."""
    if isinstance(value, list):
        return [_foreign(v) for v in value]
    if isinstance(value, str):
        return value + "Foreign"
    return value + 1 if isinstance(value, int) else value * 1.001 + 0.001


def _signatures():
    return [pytest.param(d, s, id=f"{d.id}:{s.kind}") for d in ENTRIES for s in d.signatures]


@pytest.mark.parametrize("entry, signature", _signatures())
def test_signature_explains_its_deviation_and_not_a_foreign_error(entry, signature):
    check = Check(entry.id, case={"signature": signature.describe()})
    if signature.kind == "raises":
        message = f"... {signature.message} ...".replace("\\", "")
        origin = tuple(_a_frame(pattern) for pattern in signature.origin)
        predicted = Raised(signature.type, message, "step", USERS_FRAMES + origin)
        held, not_held = CONDITION_CASES.get(signature.condition, (None, None))
        seen = lambda outcome, given=held: Seen("q", outcome, None, lambda a, b: a == b,  # noqa: E731
                                                parse_spec("mirrored:2"), given)
        check.equal(signature.explains(seen(predicted)), True, "the predicted exception explained")
        for foreign in (Raised("ForeignError", message, "step", predicted.frames),
                        Raised(signature.type, "other", "step", predicted.frames),
                        # the same exception and message raised from a user's own code: not the deviation
                        Raised(signature.type, message, "step", USERS_FRAMES), 1.0):
            check.equal(signature.explains(seen(foreign)), False, f"a foreign outcome {foreign!r} explained")
        if signature.condition:  # a deadlock, or a raise, where the probe did not confirm its condition
            check.equal(signature.explains(seen(predicted, not_held)), False,
                        f"the predicted exception where {signature.condition} did not hold")
        return
    if signature.kind == "band":
        expected = np.array([0.3, 2.0, 7.1])
        inside = expected * (1 + 0.5 * signature.rtol)
        seen = lambda actual: Seen("q", actual, expected, _close, parse_spec("mirrored:2"))  # noqa: E731
        check.equal(signature.explains(seen(inside)), True, "an error inside the band explained")
        check.equal(signature.explains(seen(_foreign(expected))), False, "a foreign error explained")
        return
    spec, expected, given, want = MODEL_CASES[signature.model]
    if signature.condition:  # the model applies only where its condition held
        held, not_held = CONDITION_CASES[signature.condition]
        given = _with(given, held)
        off = Seen("q", None, expected, _close, parse_spec(spec), _with(given, not_held))
        check.equal(signature.explains(dataclasses.replace(off, actual=signature.predicts(off))), False,
                    f"the predicted value where {signature.condition} did not hold")
    seen = lambda actual: Seen("q", actual, expected, _close if isinstance(expected, (float, np.ndarray)) else  # noqa: E731
                               (lambda a, b: a == b), parse_spec(spec), given)
    if signature.kind == "bounds":
        bounds = MODELS[signature.model](seen(None))
        check.equal(bounds, want, "the race's bounds")
        inside = sorted(bounds) if isinstance(bounds, frozenset) else list(bounds)
        low, high = min(inside), max(inside)
        check.that(low < high, "the race's bounds", bounds, "a range that a lost update can fall in")
        check.equal([signature.explains(seen(v)) for v in (low - 1, *inside, high + 1)],
                    [False, *[True] * len(inside), False], f"explained values around the bounds {bounds}")
        return
    predicted = signature.predicts(seen(None))
    check.that(seen(None).same(predicted, want), "the model's prediction", predicted, f"{want} (the entry's summary)")
    check.equal(seen(None).same(predicted, expected), False, "the model's prediction differs from the reference")
    check.equal(signature.explains(seen(predicted)), True, "the predicted value explained")
    check.equal(signature.explains(seen(_foreign(expected))), False, "a foreign wrong value explained")


def test_the_per_step_tracker_model_weighs_steps_not_rows():
    """Keras 3.0-3.1's loss trackers count each step as one: the sum over replicas of each one's
    mean of its steps' losses (finite where every replica had rows), NaN once a replica had none."""
    model = MODELS["fit_logs_sum_of_replica_trackers_counting_each_step"]
    seen = lambda means: Seen("q", None, 0.0, _close, parse_spec("mirrored:3"), Given(replica_step_means=means))  # noqa: E731
    check = Check("fit_logs_sum_of_replica_trackers_counting_each_step", "float64")
    check.close(model(seen([[0.5, 1.0, 2.0], [1.5, 1.0, 4.0]])), 1.0 + 1.0 + 3.0, "three replicas' means of two steps")
    check.that(np.isnan(model(seen([[0.5, 1.0, 2.0], [1.5, 1.0, float("nan")]]))), "a replica without rows at step 2",
               model(seen([[0.5, 1.0, 2.0], [1.5, 1.0, float("nan")]])), "NaN")
    check.that(model(Seen("q", None, 0.0, _close, parse_spec("mirrored:3"), Given())) is NOTHING, "no given",
               "a prediction", "none")


def test_the_float32_one_pass_model_excuses_the_one_pass_value_and_nothing_else():
    """The float32 property's excuse is no wider than the arithmetic: through a real Check with
    the entry in scope and the property's own tolerance (the two-pass float32 rounding bounds),
    what Keras 3 computes (the one-pass formula in float32) is excused; the two-pass value, and
    the variance off by 10% of itself, fail. Column 0 is the repro's (one-pass variance 0 for
    0.0125489), column 1 1e3 + [-0.9, 0.3, 0.55, 1] (0.4375 for 0.494230)."""
    from reference import batchnorm as ref_bn
    from tests.properties.test_blocks import EPSILON, MOMENTUM, _moving_bounds

    entry = next(d for d in ENTRIES if d.id == "synchronized-bn-one-pass-variance")
    x = np.float32(np.stack([1e4 + np.array([0.1, 0.2, 0.3, 0.4]), 1e3 + np.array([-0.9, 0.3, 0.55, 1.0])],
                            axis=1)).astype(np.float64)
    batches, sizes = [x], [[3, 1]]
    want = ref_bn.synchronized_steps(batches, sizes, MOMENTUM, EPSILON, 2)[0]
    bound = _moving_bounds(batches, sizes, True, one_pass=False, dtype="float32")[0]
    base = {"batches": batches, "sizes": sizes, "momentum": MOMENTUM, "epsilon": EPSILON, "keras": 3, "step": 0}
    mean, var = ref_bn.moments(x)
    off = ref_bn.moving_update(np.ones(2), 1.1 * var, MOMENTUM)  # the variance off by 10% of itself
    off_out = ref_bn.normalise(x, mean, 1.1 * var, EPSILON)[:3]
    cases = [(Quantity.of("batch norm statistic", "moving_variance on replica 0 after step 1", name="moving_variance",
                          one_copy=False, replica=0, step=1),
              "moving_variance", want["moving_variance"][0], bound["moving_variance"][0], off),
             (Quantity.of("batch norm output", "output of replica 0 at step 1", replica=0, step=1),
              "outputs", want["outputs"][0], bound["output"][0], off_out)]
    with deviations.in_force(deviations.Ledger((entry,))) as ledger:
        for what, name, expected, tol, foreign in cases:
            given = Given(float32_one_pass=dict(base, replica=0, name=name))
            predicted = MODELS["one_pass_variance_in_float32"](Seen(what, None, expected, None, None, given))
            check = Check(parse_spec("mirrored:2"), "float32", {"quantity": str(what)})
            check.close(predicted, expected, what, override={"float32": (tol, 1e-15)}, given=given)
            # (10% of the variance moves column 0's outputs less than float32's two-pass rounding at
            # 1e4: those fail as the reference's value where the model predicts another)
            for label, value, phrase in [("the two-pass value", expected, "predicts"),
                                         ("the variance off by 10%", foreign, f"known deviation {entry.id}")]:
                with pytest.raises(PropertyFailure) as info:
                    check.close(value, expected, what, override={"float32": (tol, 1e-15)}, given=given)
                Check("ledger", case={"quantity": str(what)}).contains(str(info.value), [phrase], f"the failure of {label}")
    Check("ledger").equal(dict(ledger.explained), {entry.id: 2}, "mismatches the model explained")


def test_a_mismatch_outside_every_signature_fails_and_names_the_entry():
    entry = deviations.Deviation("d", ("*",), ">=2", ">=2", "s", (), "now", (
        Signature(Pattern("q"), "band", rtol=1e-6),))
    check = Check("mirrored:2", "float64")
    with deviations.in_force(deviations.Ledger((entry,))) as ledger:
        check.close(1.0 + 1e-7, 1.0, Quantity.of("q"))  # within the band: tolerated and counted
        with pytest.raises(PropertyFailure) as info:
            check.close(1.1, 1.0, Quantity.of("q"))
        check.close(1.1, 1.1, Quantity.of("other"))  # another quantity: not covered
    Check("ledger").equal(dict(ledger.explained), {"d": 1}, "mismatches the band explained")
    Check("ledger").contains(str(info.value), ["got 1.1", "known deviation d in scope does not explain it"],
                             "the failure of a foreign error")


def test_a_probe_that_raised_is_excused_only_by_a_raises_signature_of_its_probe():
    """A probe exception (pool.ProbeError) that a ``raises`` signature for ``probe <name>`` in
    scope describes makes the test an expected failure; another type, message or probe, or a
    failure that is no probe exception, stays a failure."""
    from suite.harness.pool.pool import ProbeError

    entry = deviations.Deviation("d", ("*",), ">=2", ">=2", "s", (), "now", (
        Signature(Pattern("probe", (("probe", "losses.compute_average_loss"),)), "raises", type="InvalidArgumentError",
                  message="global_batch_size must be positive"),))

    def error(type_, message, probe="losses.compute_average_loss"):
        return ProbeError("engine: probe raised", Raised(type_, message, "step"), "", probe)

    check = Check("ledger")
    for exc, want in [(error("InvalidArgumentError", "assertion failed: [global_batch_size must be positive.]"), True),
                      (error("InvalidArgumentError", "another assertion"), False),
                      (error("ValueError", "global_batch_size must be positive"), False),
                      (error("InvalidArgumentError", "global_batch_size must be positive", "reduce.reduce"), False),
                      (PropertyFailure("[mirrored:2] q: got 1, but should be 2"), False)]:
        ledger = deviations.Ledger((entry,))
        check.equal(ledger.explains_error(exc), want, f"explains_error({exc!r})")
        check.equal(dict(ledger.explained), {"d": 1} if want else {}, f"mismatches counted for {exc!r}")
    group = ExceptionGroup("flaky", [error("InvalidArgumentError", "global_batch_size must be positive"),
                                     PropertyFailure("foreign")])
    check.equal(deviations.Ledger((entry,)).explains_error(group), False, "a group with an unexplained member")


def test_a_result_equal_to_the_reference_where_a_model_predicts_otherwise_fails():
    entry = deviations.Deviation("d", ("*",), ">=2", ">=2", "s", (), "now", (
        Signature(Pattern("int64 Sum metrics after a restore"), "model", model="integer_sum_restored_by_division"),))
    with deviations.in_force(deviations.Ledger((entry,))):
        with pytest.raises(PropertyFailure) as info:
            Check(parse_spec("mirrored:2")).equal([1, 2, 3], [1, 2, 3], Quantity.of("int64 Sum metrics after a restore"))
    Check("ledger").contains(str(info.value), ["known deviation d predicts [0, 2, 2]", "update or retire the entry"],
                             "the failure of a fixed deviation")


# -- end to end: a foreign wrong value in a covered test is a FAIL --------------------------

# entry -> a test id it covers (the spec is the id's first parameter). Chosen, not derived: an entry's
# `tests` globs say where it may apply, not where it shows (the deviation shows only for some of the
# ids, drawn examples and versions a glob covers: a split, a dtype, a metric), and no committed record
# names the ids a run saw it excuse (docs/measured_runs.json counts them per entry). What a choice
# must hold is checked instead: the id is in the entry's scope (test_every_entry_has_a_covered_test),
# and, where the entry applies to the installed versions, its run against a foreign value fails
# saying the entry's signature saw the value and refused it, which only a test that asks the
# signature can say (test_a_foreign_wrong_value_in_each_covered_test_fails, the deep step).
COVERED = {
    "keras3-fit-extra-draw-under-a-strategy":
        "tests/properties/test_fit.py::test_each_epoch_of_fit_trains_that_iteration_of_the_dataset[mirrored:2]",
    "keras3-fit-logs-summed-over-replicas-before-3.3":
        "tests/properties/test_fit.py::test_fit_trains_as_the_reference_on_the_global_batches[mirrored:2-1-even]",
    "keras3-fit-loss-tracker-counts-each-step-before-3.2":
        "tests/properties/test_fit.py::test_fit_trains_as_the_reference_on_the_global_batches[mirrored:3-1-uneven]",
    "keras2-fit-multi-worker-logs-summed-over-replicas":
        "tests/properties/test_fit.py::test_fit_trains_as_the_reference_on_the_global_batches[multi_worker:2x1-1-even]",
    "fit-loss-mean-per-replica-on-uneven-split":
        "tests/properties/test_fit.py::test_fit_trains_as_the_reference_on_the_global_batches[central_storage:2-1-uneven]",
    "keras3-fit-uneven-replica-batches-raise":
        "tests/properties/test_fit.py::test_fit_trains_as_the_reference_on_the_global_batches[mirrored:2-1-uneven]",
    "keras3-fit-multi-worker-raises":
        "tests/properties/test_fit.py::test_fit_trains_as_the_reference_on_the_global_batches[multi_worker:2x1-1-even]",
    "keras3-fit-steps-per-execution-mirrored-raises":
        "tests/properties/test_fit.py::test_fit_trains_as_the_reference_on_the_global_batches[mirrored:2-2-even]",
    "keras3-central-storage-variables-made-in-the-step":
        "tests/properties/test_training.py::test_a_model_built_by_its_first_call_in_a_distributed_step[central_storage:2]",
    "keras3-central-storage-loss-scale-updates":
        "tests/properties/test_blocks.py::test_loss_scaling_skips_a_non_finite_step_on_every_replica"
        "[central_storage:2-mixed_float16-dynamic]",
    "keras3-seed-state-mean-aggregation-3.7":
        "tests/properties/test_blocks.py::test_seeded_random_draws_repeat_and_replicas_draw_their_own[mirrored:2-dropout]",
    "keras3-variables-mean-aggregation-3.7":
        "tests/properties/test_blocks.py::test_unsynchronized_batch_norm_normalises_each_replica_by_itself[mirrored:2]",
    "keras3-muon-update-step-reads-keras-path":
        "tests/properties/test_training.py::test_optimizer_variables_created_lazily_in_a_distributed_step[mirrored:2-Muon]",
    "keras3-gradients-not-summed-before-3.5":
        "tests/properties/test_training.py::test_training_steps_match_reference_on_the_global_batch"
        "[mirrored:2-linear_l2-sgd-float64]",
    "compute-average-loss-float64-sample-weight":
        "tests/properties/test_losses.py::test_compute_average_loss_matches_reference[mirrored:2-per_example-float64]",
    "keras3-loss-replica-scale-rounded-to-float32":
        "tests/properties/test_losses.py::test_keras_loss_reduction_inside_strategy_run"
        "[mirrored:3-mse-sum_over_batch_size-float64]",
    "keras3-loss-unscaled-before-3.8":
        "tests/properties/test_losses.py::test_keras_loss_reduction_inside_strategy_run"
        "[mirrored:2-mse-sum_over_batch_size-float32]",
    "keras3-loss-nan-on-empty-replica-before-3.7":
        "tests/properties/test_losses.py::test_keras_loss_reduction_inside_strategy_run"
        "[mirrored:2-mse-sum_over_batch_size-float32]",
    "keras3-central-storage-metric-accumulation":
        "tests/properties/test_metrics.py::test_metric_result_is_the_metric_of_the_global_data[central_storage:2-mean]",
    "keras3-lazy-optimizer-slots-mirrored":
        "tests/properties/test_training.py::test_optimizer_variables_created_lazily_in_a_distributed_step"
        "[mirrored:2-Adam]",
    "keras3-central-storage-replica-context-updates":
        "tests/properties/test_training.py::test_optimizer_variables_created_lazily_in_a_distributed_step"
        "[central_storage:2-Nadam]",
    "keras3-schedule-free-adamw-replica-copies-diverge":
        "tests/properties/test_training.py::test_optimizer_variables_created_lazily_in_a_distributed_step"
        "[mirrored:4:reduce_to_one-ScheduleFreeAdamW]",
    "central-storage-drops-partial-step":
        "tests/properties/test_input.py::test_partial_last_step_is_delivered[central_storage:2-for]",
    "sync-on-read-integer-sum-restore-truncates":
        "tests/properties/test_checkpoint.py::test_integer_metric_state_survives_restore[mirrored:2]",
    "keras3-ps-optimizer-iterations-race":
        "tests/properties/test_parameter_server.py::test_optimizer_iterations_count_every_scheduled_step"
        "[parameter_server:2w1ps]",
    "keras3-activity-regularizer-not-normalised-before-3.14":
        "tests/properties/test_blocks.py::test_activity_regularizer_losses_are_scaled_as_the_guide_prescribes[mirrored:2]",
    "synchronized-bn-one-pass-variance":
        "tests/properties/test_blocks.py::test_synchronized_batch_norm_uses_the_global_batch[mirrored:2]",
    "keras2-synchronized-bn-empty-replica-skips-update":
        "tests/properties/test_blocks.py::test_synchronized_batch_norm_uses_the_global_batch[mirrored:3]",
    "keras3-unsynchronized-bn-empty-replica-nan":
        "tests/properties/test_blocks.py::test_unsynchronized_batch_norm_normalises_each_replica_by_itself[mirrored:2]",
    "keras2-central-storage-bn-empty-replica-nan":
        "tests/properties/test_blocks.py::test_unsynchronized_batch_norm_normalises_each_replica_by_itself"
        "[central_storage:2]",
    "keras3-loss-scale-finiteness-from-replica-0":
        "tests/properties/test_blocks.py::test_loss_scaling_skips_a_non_finite_step_on_every_replica"
        "[mirrored:2-mixed_float16-dynamic]",
    "keras3-loss-scale-deadlock-across-workers":
        "tests/properties/test_blocks.py::test_loss_scaling_skips_a_step_non_finite_on_another_worker"
        "[multi_worker:2x1-mixed_float16]",
    "keras2-mixed-precision-refused-under-central-storage":
        "tests/properties/test_blocks.py::test_loss_scaling_skips_a_non_finite_step_on_every_replica"
        "[central_storage:2-mixed_float16-fixed]",
    "keras3-sparse-second-moments-square-each-occurrence":
        "tests/properties/test_blocks.py::test_embedding_sparse_updates_equal_the_dense_reference[mirrored:2-adam]",
    "keras3-dropout-mask-shared-by-replicas":
        "tests/properties/test_blocks.py::test_seeded_random_draws_repeat_and_replicas_draw_their_own[mirrored:2-dropout]",
    "keras2-dropout-mask-shared-across-workers":
        "tests/properties/test_blocks.py::test_seeded_random_draws_repeat_and_replicas_draw_their_own"
        "[multi_worker:2x1-dropout]",
    "keras3-gradient-accumulation-fails-in-a-distributed-step":
        "tests/properties/test_blocks.py::test_gradient_accumulation_applies_the_mean_every_n_steps[mirrored:2]",
    "keras3-clipping-per-replica-before-the-sum":
        "tests/properties/test_blocks.py::test_clipping_acts_on_the_summed_gradient[mirrored:2-global_clipnorm]",
    "compute-average-loss-empty-replica-before-2.13":
        "tests/properties/test_losses.py::test_compute_average_loss_matches_reference[mirrored:2-none-float32]",
    "keras2-activity-regularizer-nan-on-empty-replica-before-2.14":
        "tests/properties/test_blocks.py::test_activity_regularizer_losses_are_scaled_as_the_guide_prescribes[mirrored:2]",
    "keras2-synchronized-bn-float64-type-error":
        "tests/properties/test_blocks.py::test_synchronized_batch_norm_uses_the_global_batch[mirrored:2]",
    "mwms-uneven-retrace-collective-timeout-2.13":
        "tests/properties/test_training.py::test_short_last_batch_training_matches_the_reference_split"
        "[multi_worker:2x1-constant]",
    "keras3-metric-state-per-replica-before-3.7":
        "tests/properties/test_losses.py::test_documented_loss_tracking_pitfall_example[mirrored:2]",
    "keras3-metric-state-mirrored-sum-before-3.10":
        "tests/properties/test_metrics.py::test_metric_result_is_the_metric_of_the_global_data[mirrored:2-mean]",
    "keras3-seed-state-uint32-not-broadcast-before-3.5":
        "tests/properties/test_blocks.py::test_seeded_random_draws_repeat_and_replicas_draw_their_own"
        "[multi_worker:2x1-dropout]",
    "keras3-adagrad-summed-sparse-gradient-fails-3.5-to-3.9":
        "tests/properties/test_blocks.py::test_embedding_sparse_updates_equal_the_dense_reference[mirrored:2-adagrad]",
    "keras3-accuracy-counts-each-update-before-3.4":
        "tests/properties/test_metrics.py::test_metric_result_is_the_metric_of_the_global_data[mirrored:2-accuracy]",
    "keras3-central-storage-updates-raise-before-3.7":
        "tests/properties/test_metrics.py::test_metric_result_is_the_metric_of_the_global_data[central_storage:2-mean]",
    "keras3-gradient-accumulation-counts-every-call-before-3.5":
        "tests/properties/test_blocks.py::test_gradient_accumulation_applies_the_mean_every_n_steps[default]",
    "keras3-optimizer-not-trackable-3.0":
        "tests/properties/test_checkpoint.py::test_checkpoint_restores_under_another_strategy[mirrored:2]",
}


def test_every_entry_has_a_covered_test():
    Check("COVERED").equal(sorted(COVERED), sorted(d.id for d in ENTRIES), "entries with a covered test")
    for d in ENTRIES:
        Check(d.id).that(d.matches(COVERED[d.id]), "its covered test", COVERED[d.id], "in the entry's scope")


# Entries whose signature states which replicas agree, not a value: a foreign number moves every
# replica's draw alike, so the relation (and the signature's verdict) stays; the covered test
# fails by its other checks (a dropout mask holds 0s and 1s)
RELATIONAL = {"keras3-dropout-mask-shared-by-replicas", "keras2-dropout-mask-shared-across-workers"}


@pytest.mark.deep  # about a minute and a half of CPU: the deep step of .ci/run
def test_a_foreign_wrong_value_in_each_covered_test_fails():
    """Every covered test of the entries that apply to the installed versions, run against the
    foreign_result mutant (each number moved, each exception renamed): each is a FAIL whose
    message says the entry in scope does not explain it."""
    v = versions.engine_versions(None)
    active = {d.id: COVERED[d.id] for d in ENTRIES if d.applies_to(v["tensorflow"], v["keras"])}
    by_id = {d.id: d for d in ENTRIES}
    if not active:
        pytest.skip(f"no entry applies to TensorFlow {v['tensorflow']}, Keras {v['keras']}")
    specs = sorted({test_id.split("[", 1)[1].split("-", 1)[0].rstrip("]") for test_id in active.values()} | {"default"})
    proc = run_pytest([*active.values(), "--strategies", ",".join(specs), "-rfEX", "--no-header", "--tb=short"],
                      900, TFDS_MUTANT="foreign_result", HYPOTHESIS_PROFILE="ci")
    out = proc.stdout + proc.stderr
    # one section per failure, headed "____ test_function[params] ____"
    sections = dict(re.findall(r"^_+ (\S+\[.*?\]) _+\n(.*?)(?=^_+ \S+\[|^={3,})", out, re.DOTALL | re.MULTILINE))
    for entry, test_id in active.items():
        check = Check(entry, case={"test": test_id})
        check.contains(out, [f"FAILED {test_id}"], "the covered test against a foreign wrong value")
        check.that(f"XFAIL {test_id}" not in out, "the covered test's outcome", "XFAIL", "FAILED")
        if all(s.kind == "bounds" for s in by_id[entry].signatures) or entry in RELATIONAL:
            continue  # a race's bounds may contain the moved value: the exact checks beside it fail
        section = sections.get(test_id.rsplit("::", 1)[-1], "")
        check.contains(section, [f"known deviation {entry} in scope does not explain it"],
                       "the failure of the covered test (the entry's signature saw the value and refused it)")
    Check("foreign_result").contains(out, [f"{len(active)} failed"], "the run's summary")


def test_central_storage_keeps_one_copy_of_a_restored_integer_sum():
    """Found by the signature check itself: CentralStorage restores an int64 Sum exactly (one
    aggregating copy), so the truncation model predicts no deviation there."""
    model = MODELS["integer_sum_restored_by_division"]
    seen = Seen("q", None, [1, 3], lambda a, b: a == b, parse_spec("central_storage:2"))
    Check("central_storage:2").equal(model(seen), [1, 3], "the restored counts the model predicts")


def test_the_central_storage_metric_models_predict_nothing_elsewhere():
    """The checkpoint property is in the metric entry's scope on every spec; only a state held
    under CentralStorage deviates."""
    model = MODELS["metric_variables_assigned_by_every_replica"]
    increments = [[1.0, 2.0], [3.0, 2.0], [1.0, 1.0]]
    mirrored, central = parse_spec("mirrored:2"), parse_spec("central_storage:2")
    seen = lambda under: Seen("q", None, [5.0, 5.0], lambda a, b: a == b, mirrored,  # noqa: E731
                              Given(start=[0.0, 0.0], increments=increments, under=under))
    check = Check("checkpoint")
    check.equal(model(seen([mirrored] * 3)), [5.0, 5.0], "the state of updates under mirrored:2")
    # saved under central_storage:2 after two updates (2 * 1 + 3, 2 * 2 + 2), one more update elsewhere
    check.equal(model(seen([central, central, mirrored])), [6.0, 7.0], "the state carried from central storage")


def _interleaved(events: list) -> tuple[list, int]:
    """Run Keras 3's ``assign(iterations + 1)`` steps as the interleaving ``events`` says: each
    event is a worker index, and a worker's events alternate between its step's read and its write
    (read + 1). Returns ``given.steps`` as the probe reports it ([worker, value written] per
    step, in the order the steps started, which is the order workers take them from the queue)
    and the counter's final value."""
    value, reading, steps, index = 0, {}, [], {}
    for worker in events:
        if worker not in reading:
            reading[worker] = value
            index[worker] = len(steps)
            steps.append([worker, None])
        else:
            value = reading.pop(worker) + 1
            steps[index[worker]][1] = value
    Check("the interleaving", case={"events": events}).equal(reading, {}, "steps read but never written")
    return steps, value


RACE = next(s for d in ENTRIES if d.id == "keras3-ps-optimizer-iterations-race" for s in d.signatures)


def _race_explains(final, steps: int, observed, spec="parameter_server:2w1ps") -> bool:
    return RACE.explains(Seen(RACE.quantity, final, steps, lambda a, b: a == b, parse_spec(spec),
                              Given(steps=observed)))


def test_the_iterations_race_excuses_lost_increments_that_the_writes_show():
    """A genuine interleaving as seen on TF 2.18.1 / Keras 3.15.1, 19 after 39 steps on two workers:
    worker 0 reads 0, worker 1 runs 20 steps, worker 0 writes 1, then 18 steps one at a time."""
    observed, final = _interleaved([0] + [1, 1] * 20 + [0] + [0, 0] * 9 + [1, 1] * 9)
    check = Check("keras3-ps-optimizer-iterations-race", case={"steps": observed})
    check.equal((len(observed), final), (39, 19), "the constructed interleaving (steps, final value)")
    check.equal(_race_explains(final, 39, observed), True, "19 after 39 steps with the writes that lose 20")
    check.equal(_race_explains(final, 39, observed, "parameter_server:3w1ps"), True, "the same writes with 3 workers")
    # two workers in lockstep lose one increment per pair of steps; any worker's last write can land last
    observed, final = _interleaved([0, 1, 0, 1] * 12)
    check.equal((len(observed), final), (24, 12), "the lockstep interleaving")
    check.equal([_race_explains(v, 24, observed) for v in (11, 12, 13)], [False, True, False],
                "11, 12, 13 after 24 lockstep steps whose last writes are both 12")


def test_the_iterations_race_does_not_excuse_a_stuck_counter():
    """iterations == 1 after 20+ steps: every step read 0, which only a worker's first step can
    (its later steps read after its own write); or the steps counted but the final value is not
    any worker's last write. Without observations the race cannot be told from a stuck counter."""
    check = Check("keras3-ps-optimizer-iterations-race")
    for steps in (20, 60):
        stuck = [[s % 2, 1] for s in range(steps)]
        check.equal(_race_explains(1, steps, stuck), False, f"1 after {steps} steps that all read 0")
        check.equal(_race_explains(1, steps, stuck, "parameter_server:8w1ps"), False,
                    f"1 after {steps} steps that all read 0 (8 workers)")
        counted, final = _interleaved([0, 0, 1, 1] * (steps // 2))
        check.equal(final, steps, "the steps one at a time")
        check.equal(_race_explains(1, steps, counted), False, f"1 after {steps} steps that wrote 1..{steps}")
        check.equal([_race_explains(v, steps, None) for v in (1, steps - 1)], [False, False],
                    f"a value after {steps} steps with no observations")


def test_the_iterations_race_does_not_excuse_a_value_above_the_steps_or_unexplained_writes():
    check = Check("keras3-ps-optimizer-iterations-race")
    observed, final = _interleaved([0] + [1, 1] * 20 + [0] + [0, 0] * 9 + [1, 1] * 9)
    check.equal([_race_explains(v, 39, observed) for v in (40, 41, 100)], [False] * 3, "values above 39 steps")
    counted, final = _interleaved([0, 0, 1, 1] * 10)
    check.equal(_race_explains(21, 20, counted), False, "21 after 20 steps that wrote 1..20")
    check.equal(_race_explains(21, 20, [*counted[:-1], [1, 21]]), False,
                "21 after 20 steps, the last one claiming to write 21")
    foreign = [[w, v + 1] for w, v in observed]  # every write moved: the step that read 0 now reads 1, never written
    check.equal(_race_explains(20, 39, foreign), False, "writes that no read explains")
    check.equal(_race_explains(19, 39, observed[:-1]), False, "observations of fewer steps than scheduled")


def test_a_rounding_band_is_judged_stale_over_the_session_not_per_test():
    """A band that never showed in one test (a few cases whose values happen to be representable)
    is not stale; one that never showed over BAND_JUDGED_AFTER comparisons of a session is."""
    totals: dict = {}
    n = deviations.BAND_JUDGED_AFTER
    deviations.merge_bands(totals, [["rounded", "*loss*", "band rtol 1e-07", n - 1, 0]])
    check = Check("deviations.stale_bands")
    check.equal(deviations.stale_bands(totals), [], f"a band unseen in {n - 1} comparisons")
    deviations.merge_bands(totals, [["rounded", "*loss*", "band rtol 1e-07", 1, 0],
                                    ["seen", "*sum*", "band rtol 1e-07", 400, 3]])
    stale = deviations.stale_bands(totals)
    check.equal(len(stale), 1, "stale bands after one more comparison (and a band that showed 3 times)")
    check.contains(stale[0] if stale else "", ["known deviation rounded", f"covered {n} comparisons",
                                               "update the entry"], "the stale band's message")


def test_a_bounds_signature_goes_stale_like_a_band():
    """A bounds signature's covered comparisons are counted per test (Check._consult) and judged
    over the session: bounds that never had to explain a value in BAND_JUDGED_AFTER comparisons
    (TensorFlow computes the reference's value every time) make the entry stale."""
    entry = deviations.Deviation("one-pass", ("*",), ">=2", ">=2", "s", (), "now", (
        Signature(Pattern("batch norm statistic", (("name", "moving_variance"),)), "bounds",
                  model="one_pass_variance_bounds"),))
    totals: dict = {}
    with deviations.in_force(deviations.Ledger((entry,))) as ledger:
        for _ in range(deviations.BAND_JUDGED_AFTER):
            Check(parse_spec("mirrored:2"), "float32").close(0.5, 0.5, Quantity.of(
                "batch norm statistic", "moving_variance after step 1", name="moving_variance", step=1),
                                                             given=Given(one_pass=(0.49, 0.51)))
    deviations.merge_bands(totals, ledger.band_counts())
    stale = deviations.stale_bands(totals)
    Check("deviations.stale_bands").contains(stale[0] if stale else "", [
        "known deviation one-pass", f"covered {deviations.BAND_JUDGED_AFTER} comparisons", "update the entry"],
        "the stale bounds' message")


def test_a_raises_entry_goes_stale_where_its_condition_held_and_the_probe_returned():
    """A value returned where a raises signature predicts the exception fails ("update or retire"),
    and for a signature with a condition only where the test confirmed the condition held: with
    Check.returned at once, for a probe that raises as a whole after the test (Ledger.stale_raises)."""
    entry = deviations.Deviation("deadlock", ("*",), ">=2", ">=2", "s", (), "now", (
        Signature(Pattern("mixed-precision loop"), "raises", type="DeadlineExceededError",
                  message="Collective has timed out",
                  origin=("keras/src/optimizers/loss_scale_optimizer.py:apply_fn",),
                  condition="non_finite_off_replica_0_on_another_worker"),))
    held, not_held = CONDITION_CASES["non_finite_off_replica_0_on_another_worker"]
    check = Check("stale raises")
    loop = Quantity.of("mixed-precision loop", "the loop")
    whole = Quantity.of("mixed-precision loop", "the loop, as a whole")
    with deviations.in_force(deviations.Ledger((entry,))) as ledger:
        Check(parse_spec("multi_worker:2x1")).returned(1.0, loop, given=not_held)  # condition not held: fine
        try:
            Check(parse_spec("multi_worker:2x1")).returned(1.0, loop, given=held)
            failed = ""
        except PropertyFailure as exc:
            failed = str(exc)
        check.contains(failed, ["returned a value, but known deviation deadlock predicts", "update or retire"],
                       "a value returned where the condition held")
        Check(parse_spec("multi_worker:2x1")).given_for(whole, held)
    check.contains(" ".join(ledger.stale_raises()), ["the loop, as a whole", "deadlock", "update or retire"],
                   "a probe that returned after the test confirmed the condition")
    check.equal(deviations.Ledger((entry,), given={loop: not_held}).stale_raises(), [],
                "stale raises where the condition did not hold")


VARIABLES = Pattern("variable", (("step", "*"),))  # a variable after any step
VARIABLE = Quantity.of("variable", "variable 0 after step 1", name="0", step=1)


def test_a_model_with_a_condition_predicts_nothing_where_the_condition_does_not_hold():
    """A conditioned model signature (the loop check's control, a clipping optimizer) neither
    explains nor goes stale where its condition does not hold: on TF 2.17 / Keras 3.4 the clipping
    property hands its own per-replica alternative, which the not-summed entry's loop-check
    signature would otherwise have predicted, and a reference value was called stale."""
    entry = deviations.Deviation("conditioned", ("*",), ">=2", ">=2", "s", (), "now", (
        Signature(VARIABLES, "model", model="alternative_rule", condition="replica_copies_differ_in_the_control"),))
    held, not_held = CONDITION_CASES["replica_copies_differ_in_the_control"]
    ledger = deviations.Ledger((entry,))
    seen = lambda given: Seen(VARIABLE, 1.0, 1.0, _close, parse_spec("mirrored:2"),  # noqa: E731
                              _with(Given(alternative=2.0), given))
    check = Check("conditioned model")
    check.equal([d.id for d, _ in ledger.stale(seen(not_held))], [], "stale where the condition did not hold")
    check.equal([d.id for d, _ in ledger.stale(seen(held))], ["conditioned"], "stale where it held")


def test_an_entry_whose_model_lands_on_the_reference_speaks_for_it():
    """Two deviations at once can land on the reference's value in a case (TF 2.17 / Keras 3.4: the
    activity regularizer's unnormalised penalty on a replica's own unsummed gradient, with
    symmetric data): the entry whose model composes them predicts the reference there, so the
    other entry, which alone predicts another value, is not called stale; without it, it is."""
    alone = deviations.Deviation("alone", ("*",), ">=2", ">=2", "s", (), "now", (
        Signature(VARIABLES, "model", model="alternative_rule"),))
    composed = deviations.Deviation("composed", ("*",), ">=2", ">=2", "s", (), "now", (
        Signature(VARIABLES, "model", model="replicas_apply_their_own_gradients"),))
    seen = Seen(VARIABLE, 1.0, 1.0, _close, parse_spec("mirrored:2"),
                Given(alternative=2.0, unsummed=1.0))
    check = Check("stale")
    check.equal([d.id for d, _ in deviations.Ledger((alone,)).stale(seen)], ["alone"], "the entry alone")
    check.equal([d.id for d, _ in deviations.Ledger((alone, composed)).stale(seen)], [], "beside the composed model")
    check.equal([d.id for d, _ in deviations.Ledger((alone, composed)).stale(
        dataclasses.replace(seen, given=Given(alternative=2.0, unsummed=3.0)))], ["alone", "composed"],
        "beside a model that predicts another value too")


# -- quantities by field ------------------------------------------------------------------------

def test_a_signature_by_field_covers_the_quantities_whose_fields_it_names():
    """``quantity = {kind = ..., sample_weight = true}`` covers a weighted compute_average_loss on
    any worker and replica, and neither an unweighted one, nor another kind, nor plain text that
    reads the same (the old suffix glob matched any wording that ended so)."""
    from suite.harness.judging.quantity import Quantity

    sig = Signature.parse({"quantity": {"kind": "compute_average_loss", "sample_weight": True}, "kind": "band",
                           "rtol": 1e-7}, "test")
    weighted = Quantity.of("compute_average_loss", sample_weight=True)
    check = Check("quantity by field")
    check.equal(str(weighted.at(worker=1, replica=3)), "compute_average_loss (with sample_weight) (worker 1) replica 3",
                "the text of a weighted quantity on worker 1, replica 3")
    for what, want in [(weighted, True), (weighted.at(worker=1, replica=3), True),
                       (Quantity.of("compute_average_loss", "SUM of compute_average_loss (with sample_weight)",
                                    sample_weight=True, reduced="SUM"), True),
                       (Quantity.of("compute_average_loss", sample_weight=False), False),
                       (Quantity.of("keras_loss", "keras_loss (with sample_weight)", sample_weight=True), False),
                       ("compute_average_loss (with sample_weight) replica 1", False)]:
        check.equal(sig.covers(what), want, f"covers {what!r}")
    with pytest.raises(ValueError, match="needs a kind"):
        Signature.parse({"quantity": {"sample_weight": True}, "kind": "band", "rtol": 1e-7}, "test")
    with pytest.raises(ValueError, match="a string, boolean or integer"):
        Signature.parse({"quantity": {"kind": "x", "replica": [1]}, "kind": "band", "rtol": 1e-7}, "test")


def test_a_field_given_as_a_star_asks_only_that_the_field_is_there():
    """``replica = "*"`` covers a quantity on any replica (an int field) and none that has no replica:
    a property's variable on a local replica, not the loop check's variable of one step."""
    from suite.harness.judging.quantity import Quantity

    sig = Signature.parse({"quantity": {"kind": "variable", "local_replica": "*", "step": "*"}, "kind": "model",
                           "model": "alternative_rule"}, "test")
    check = Check("quantity by field")
    for what, want in [(Quantity.of("variable", "variable 0 on local replica 1 after step 2", name=0, local_replica=1,
                                    step=2), True),
                       (Quantity.of("variable", "variable 0 on local replica 1 after step 2", name=0, local_replica=1,
                                    step=2).at(worker=1), True),
                       (Quantity.of("variable", "variable dense/kernel (replica 1) after step 2", name="dense/kernel",
                                    replica=1, step=2), False),
                       (Quantity.of("variable", "variable 0 on replica 1 after epoch 2", name=0, local_replica=1,
                                    epoch=2), False)]:
        check.equal(sig.covers(what), want, f"covers {what!r}")


def test_a_signature_by_field_speaks_for_the_loop_check_only_by_its_kinds():
    """The loop check consults the signatures whose every kind is one of its quantities' kinds: a
    property's ``{variable,fit logged loss}`` (fit's logs are no quantity of the loop check) stays out
    of it; ``{variable,replicas}``, ``step`` and ``random layers`` are in."""
    from suite.harness.loopcheck import differential

    check = Check("speaks_for_the_loop_check")
    for kind, want in [("variable", True), ("{variable,replicas}", True), ("step", True), ("random layers", True),
                       ("{variable,fit logged loss}", False), ("*", False), ("embedding table", False)]:
        sig = Signature.parse({"quantity": {"kind": kind}, "kind": "model", "model": "alternative_rule"}, "test")
        check.equal(differential.speaks_for_the_loop_check(sig), want, f"a signature of kind {kind!r}")
    led = differential.ledger(parse_spec("mirrored:2"), {"tensorflow": "2.16.1", "keras": "3.3.3"})
    kinds = {s.quantity.kind for d in led.entries for s in d.signatures}
    check.that(kinds and all(differential.speaks_for_the_loop_check(s) for d in led.entries for s in d.signatures),
               "the kinds of the loop check's ledger under mirrored:2 on Keras 3.3", sorted(kinds),
               "kinds of the loop check's quantities only")


def test_the_sample_weight_entry_names_its_quantities_by_field():
    entry = next(d for d in ENTRIES if d.id == "compute-average-loss-float64-sample-weight")
    Check(entry.id).equal([str(s.quantity) for s in entry.signatures],
                          ["{kind = 'compute_average_loss', sample_weight = true}"], "its signatures' quantities")
