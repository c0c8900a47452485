"""The upgrade check (python -m suite.check TARGET --from ENV_A [--to ENV_B];
suite/harness/loopcheck/upgrade.py): matching one version's variables to the other's, the
attribution of each difference on synthetic runs, its one-line input errors, and the known
answers: loops whose behaviour across an upgrade the deviations file predicts (examples/upgrade.py,
the guide's loop), from TF 2.15 / Keras 2 and from TF 2.19 / Keras 3.9 to the session's
TensorFlow, each attributed as the file's version ranges say, and two mutants that change one
release's math only (``NAME@other``: the ``--from`` side's engines)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from suite.common import matching
from suite.common.facts import Facts
from suite.common.results import Raised, WorkloadRun, WorkloadStep
from suite.common.specs import parse_spec
from suite.harness.judging import deviations
from suite.harness.judging.judgment import Check
from suite.harness.loopcheck import differential, upgrade
from suite.harness.loopcheck.usercheck import EXIT, CheckInputError
from suite.harness.pool import versions
from tests.helpers import ROOT

# -- matching ------------------------------------------------------------------------------------
KERAS2 = ["dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias"]
KERAS3 = ["sequential/dense/kernel", "sequential/dense/bias", "sequential/dense_1/kernel", "sequential/dense_1/bias"]


@pytest.mark.parametrize("name, model, key", [
    ("m/dense/kernel", KERAS2, (0, "momentum")),  # Keras 2.15's optimizer: SLOT/VARIABLE
    ("v/dense_1/bias", KERAS2, (3, "velocity")),
    ("vhat/dense/bias", KERAS2, (1, "velocity_hat")),
    ("adam/sequential_dense_kernel_momentum", KERAS3, (0, "momentum")),  # Keras 3: OPT/PATH_SLOT
    ("adam/sequential_dense_1_kernel_velocity_hat", KERAS3, (2, "velocity_hat")),  # dense_1, not dense
    ("Adam/dense_1/kernel/m", KERAS2, (2, "momentum")),  # Keras 2's legacy optimizers: OPT/VARIABLE/SLOT
    ("iteration", KERAS2, (None, "iterations")),
    ("adam/iteration", KERAS3, (None, "iterations")),
    ("adam/learning_rate", KERAS3, (None, "learning_rate")),
])
def test_optimizer_state_is_matched_by_role_not_position(name, model, key):
    assert upgrade.optimizer_key(name, model) == key


def test_model_variables_match_by_order_and_name_what_one_build_has_alone_matches_nothing():
    keras2 = [("dense/kernel", (8, 16), True), ("dense/bias", (16,), True), ("bn/moving_mean", (16,), False)]
    keras3 = [("seq/dense/kernel", (8, 16), True), ("seq/dense/bias", (16,), True),
              ("seq/dropout/seed_generator_state", (2,), False), ("seq/bn/moving_mean", (16,), False)]
    assert matching.match(keras2, keras3) == [0, 1, None, 2]
    assert matching.match(keras3, keras2) == [0, 1, 3]


def _step(values, opt, loss=1.0, rows=(24, 24), replicas=1):
    return WorkloadStep(loss, [loss] * replicas, list(rows),
                        [[np.asarray(v, np.float64)] * replicas for v in values],
                        [[np.asarray(o, np.float64)] * replicas for o in opt], None, {})


def _run(names, opt_names, initial, steps, raised=None, replicas=1, trainable=None):
    return WorkloadRun(replicas, list(range(replicas)), names, trainable or [True] * len(names), opt_names,
                       [np.asarray(v, np.float64) for v in initial], steps, Facts(), None, raised)


def test_a_keras2_run_and_a_keras3_run_are_compared_slot_by_slot():
    """Keras 2 lists m then v per variable; here Keras 3's list is the other way round, and has a
    learning rate Keras 2 keeps out of its variables: each slot meets its own, the rate is listed."""
    a = _run(["dense/kernel"], ["iteration", "m/dense/kernel", "v/dense/kernel"], [[0.0, 0.0]],
             [_step([[1.0, 1.0]], [1, [0.5, 0.5], [0.25, 0.25]])])
    b = _run(["sequential/dense/kernel"],
             ["adam/iteration", "adam/learning_rate", "adam/sequential_dense_kernel_velocity",
              "adam/sequential_dense_kernel_momentum"], [[0.0, 0.0]],
             [_step([[1.0, 1.0]], [1, 0.1, [0.25, 0.25], [0.5, 0.5]])])
    x, y, notes = upgrade.align(a, b)
    assert differential.compare(x, y)[2] == []
    assert notes == ["state on one version only, not compared: adam/learning_rate"]
    swapped = dataclasses.replace(b, optimizer_names=[b.optimizer_names[i] for i in (0, 1, 3, 2)])
    found = differential.compare(*upgrade.align(a, swapped)[:2])[2]
    assert [m.quantity for m in found] == ["optimizer m/dense/kernel (replica 0)", "optimizer v/dense/kernel (replica 0)"]


def test_two_builds_of_different_models_are_an_input_error():
    a = _run(["dense/kernel"], [], [[0.0, 0.0]], [])
    b = _run(["dense/kernel", "dense/bias"], [], [[0.0, 0.0], [0.0]], [])
    with pytest.raises(CheckInputError, match="other trainable variables"):
        upgrade.align(a, b)


# -- attribution on synthetic runs ---------------------------------------------------------------
LABELS = ("old", "new")
ONE_PASS = upgrade.Row("default", "PASS", "same")
ONE_FAIL = upgrade.Row("default", "FAIL", "unexplained")


def _v(status, *ids):
    return differential.Verdict("mirrored:2", 2, status, deviations=[[i, "evidence"] for i in ids])


def _pair(scale=1.0, rows=(24, 24), raised=None):
    a = _run(["w"], [], [[0.0]], [_step([[1.0]], [], rows=rows, replicas=2)], replicas=2)
    b = _run(["w"], [], [[0.0]], [_step([[scale]], [], rows=rows, replicas=2)], replicas=2, raised=raised)
    return a, b


def _judge(b_scale, va, vb, one=ONE_PASS, rows=(24, 24), raised=None):
    a, b = _pair(b_scale, rows, raised)
    return upgrade.judge_row("mirrored:2", [a], [a], [b], va, vb, one, LABELS, differential.RTOL, differential.ATOL)


def test_a_spec_trained_the_same_passes_and_says_when_both_versions_fail_the_loop_check_alike():
    assert (_judge(1.0, _v("PASS"), _v("PASS")).status, _judge(1.0, _v("PASS"), _v("PASS")).lines) == ("PASS", [])
    both = _judge(1.0, _v("FAIL"), _v("FAIL"))
    assert both.status == "PASS" and "on both versions the loop check says FAIL" in both.lines[0]


def test_a_known_deviation_that_appears_or_disappears_explains_the_difference():
    row = _judge(2.0, _v("PASS"), _v("DEVIATION", "entry-x"))
    assert (row.status, row.attribution, row.deviations) == ("DEVIATION", "appears", [["entry-x", "appears"]])
    row = _judge(2.0, _v("DEVIATION", "entry-x"), _v("PASS"))
    assert (row.status, row.attribution, row.deviations) == ("DEVIATION", "disappears", [["entry-x", "disappears"]])
    row = _judge(1.0, _v("PASS"), _v("BLOCKED", "entry-y"), raised=Raised("ValueError", "no", "step 1"))
    assert (row.status, row.attribution) == ("BLOCKED", "appears")


def test_a_deviation_explains_nothing_where_the_loop_check_fails_on_one_side():
    row = _judge(2.0, _v("FAIL", "entry-x"), _v("DEVIATION", "entry-x", "entry-z"))
    assert (row.status, row.attribution) == ("FAIL", "unexplained")
    assert "known deviation entry-z appears (it does not explain every difference)" in row.lines


def test_a_difference_already_on_one_device_is_the_release_math_not_the_distribution():
    row = _judge(2.0, _v("PASS"), _v("PASS"), one=ONE_FAIL)
    assert (row.status, row.attribution) == ("FAIL", "one_device")
    # the same difference where the spec's relation to one device changed is not one device's
    assert _judge(2.0, _v("PASS"), _v("FAIL"), one=ONE_FAIL).attribution == "unexplained"


def test_replicas_that_received_other_examples_are_a_changed_observed_rule():
    a, b = _pair(2.0)
    b = dataclasses.replace(b, steps=[dataclasses.replace(b.steps[0], rows=[30, 18])])
    row = upgrade.judge_row("mirrored:2", [a], [a], [b], _v("PASS"), _v("PASS"), ONE_PASS, LABELS, 1e-4, 1e-7)
    assert (row.status, row.attribution) == ("DEVIATION", "rule_changed")
    assert "[30, 18]" in row.lines[0] and upgrade.RULE in row.lines[0]


def test_an_unexplained_difference_names_its_first_step_and_quantity():
    row = _judge(2.0, _v("PASS"), _v("PASS"))
    assert (row.status, row.attribution, row.first_step) == ("FAIL", "unexplained", 1)
    assert row.lines[0].startswith("first difference at step 1: w (replica 0): ")


def test_the_rounding_allowance_is_what_two_runs_of_the_old_version_differ_by():
    a, _ = _pair()
    wobble = dataclasses.replace(a, steps=[_step([[1.0 + 1e-3]], [], replicas=2)])
    assert upgrade.allowance(a, a) == 0.0
    assert upgrade.allowance(a, wobble) == pytest.approx(1e-3)
    # within rtol + 2 x allowance on the new version: the same training, its difference the worst agreeing one
    row = upgrade.judge_row("mirrored:2", [a], [wobble], [dataclasses.replace(a, steps=[_step([[1.0015]], [], replicas=2)])],
                            _v("PASS"), _v("PASS"), ONE_PASS, LABELS, 1e-4, 1e-7)
    assert (row.status, row.allowance, row.worst) == ("PASS", pytest.approx(1e-3), pytest.approx(1.5e-3))


def test_exit_codes_are_the_loop_checks():
    def report(*statuses):
        return upgrade.UpgradeReport("t", LABELS, ({}, {}), 48, 3, 1e-4, 1e-7,
                                     [upgrade.Row("s", s, "same") for s in statuses])
    assert [report("PASS").exit_code(), report("PASS", "DEVIATION").exit_code(),
            report("DEVIATION").exit_code(accept_known=True), report("BLOCKED", "FAIL").exit_code(),
            report("ERROR", "DEVIATION").exit_code()] == [0, EXIT["KNOWN"], 0, EXIT["FAIL"], EXIT["ERROR"]]


# -- the command's input errors: one line, exit 2 ------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--to", "tf221"], "error: --to needs --from"),
    (["--from", "tf299"], "error: 'tf299': no interpreter"),
    (["--from", "tf215", "--strategies", "mirrored:2@tf215"], "error: --strategies: with --from/--to give plain specs"),
    (["--from", "tf215", "--strategies", "mirrored:two"], "error: --strategies: "),
])
def test_bad_upgrade_options_are_one_line_usage_errors(args, message):
    done = subprocess.run([sys.executable, "-m", "suite.check", "examples.upgrade:unchanged", *args, "-q"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    Check(" ".join(args)).equal((done.returncode, done.stderr.count("\n"), done.stderr.startswith(message)),
                                (EXIT["USAGE"], 1, True), "exit status, lines, message", hint=done.stderr)


def test_from_and_to_take_an_interpreters_path():
    """``--from``/``--to`` with an interpreter path (documented beside a tox env's name): both sides
    run and the rows name the paths (the engines' log files are named from the spec's text, which
    holds the path: it crashed there with a traceback)."""
    done = subprocess.run([sys.executable, "-m", "suite.check", "examples.upgrade:unchanged", "--from", sys.executable,
                           "--to", sys.executable, "--strategies", "default", "-q"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    check = Check(f"--from {sys.executable} --to {sys.executable}")
    check.equal(done.returncode, 0, "exit status (the same interpreter on both sides)", done.stderr[-2000:])
    check.contains(done.stdout, [f"from: {sys.executable}", "PASS"], "the report")


# -- known answers -------------------------------------------------------------------------------
FROM = ("tf215", "tf219-keras39")  # built by .ci/run (TF 2.15 / Keras 2.15; TF 2.19 / Keras 3.9 as shipped)
TWO = parse_spec("mirrored:2")
CENTRAL = parse_spec("central_storage:2")
_REPORTS: dict = {}


def change(entry_id: str, old: dict, new: dict) -> str | None:
    """What the deviations file predicts for an entry across the upgrade: "appears", "disappears",
    "both" or None (on neither side), from its version ranges."""
    entry = next(d for d in deviations.load() if d.id == entry_id)
    on = [entry.applies_to(v.get("tensorflow"), v.get("keras")) for v in (old, new)]
    return {(False, True): "appears", (True, False): "disappears", (True, True): "both"}.get(tuple(on))


def checked(pool, env: str, target: str, specs=(TWO,), mutant=None) -> upgrade.UpgradeReport:
    key = (env, target, specs, mutant)
    if key not in _REPORTS:
        if not versions.interpreter(env)[0] or not (ROOT / ".tox" / env / "bin" / "python").exists():
            pytest.skip(f".tox/{env} is not built (tox run --notest -e {env})")
        pool.set_mutant(mutant)
        try:
            _REPORTS[key] = upgrade.run(target, env, None, list(specs), pool, path=str(ROOT))
        finally:
            pool.set_mutant(None)
    return _REPORTS[key]


def rows(report) -> dict:
    return {r.spec: r for r in report.rows}


def expect_row(row, report, entry_id: str, where: str = "mirrored:2"):
    """The row names ``entry_id`` as the deviations file's version ranges predict (appears,
    disappears, on both sides, or not at all), every entry it names changes as the file says, and
    it is a DEVIATION exactly when some entry appears or disappears (else PASS). With no strategy
    there is no loop check on either side: an entry shows there only where it changes (a remedy)."""
    named = {i: c for i, c in row.deviations}
    predicted = change(entry_id, *report.versions)
    if where == "default" and predicted == "both":
        predicted = None  # both versions deviate alike: the rows agree, and nothing names it
    expect(where, named.get(entry_id), predicted, f"what {entry_id} does across the upgrade", report)
    expect(where, {i: change(i, *report.versions) for i in named}, named,
           "each named entry's change, by the file's version ranges", report)
    moved = any(c in ("appears", "disappears") for c in named.values())
    expect(where, row.status, "DEVIATION" if moved else "PASS", "status", report)


def expect(where: str, actual, expected, what: str, report):
    Check(where).equal(actual, expected, what, hint=report.text())


@pytest.mark.parametrize("env", FROM)
def test_a_loop_the_upgrade_leaves_alone_passes(pool, env):
    report = checked(pool, env, "examples.upgrade:unchanged")
    expect(env, ([(r.spec, r.status) for r in report.rows], report.exit_code()),
           ([("default", "PASS"), ("mirrored:2", "PASS")], 0), "rows, exit status", report)


@pytest.mark.parametrize("env", FROM)
def test_clipnorm_clipped_per_replica_on_keras3(pool, env):
    report = checked(pool, env, "examples.upgrade:clipnorm")
    expect("default", rows(report)["default"].status, "PASS", "status", report)
    expect_row(rows(report)["mirrored:2"], report, "keras3-clipping-per-replica-before-the-sum")


@pytest.mark.parametrize("env", FROM)
def test_keras_dropout_masks_shared_by_replicas_on_keras3(pool, env):
    report = checked(pool, env, "examples.upgrade:dropout")
    expect("default", rows(report)["default"].status, "PASS", "status", report)
    expect_row(rows(report)["mirrored:2"], report, "keras3-dropout-mask-shared-by-replicas")


@pytest.mark.parametrize("env", FROM)
def test_adam_on_an_embedding_differs_on_one_device_already(pool, env):
    """The sparse second moments' entry is attributed on one device through its remedy (dense
    gradients: then the newer Keras trains what the older trains); under mirrored:2 the same
    difference, nothing more."""
    report = checked(pool, env, "examples.upgrade:embedding_adam")
    entry = "keras3-sparse-second-moments-square-each-occurrence"
    predicted = change(entry, *report.versions)
    expect_row(rows(report)["default"], report, entry, "default")
    spec = rows(report)["mirrored:2"]
    wanted = ("DEVIATION", "one_device") if predicted in ("appears", "disappears") else ("PASS", "same")
    expect("mirrored:2", (spec.status, spec.attribution), wanted, "status, attribution", report)


@pytest.mark.parametrize("env", FROM)
def test_the_guides_loop_the_same_on_one_device_metric_accumulation_under_central_storage(pool, env):
    report = checked(pool, env, "examples.guide:workload", (TWO, CENTRAL))
    expect("default", rows(report)["default"].status, "PASS", "status", report)
    expect_row(rows(report)["central_storage:2"], report, "keras3-central-storage-metric-accumulation", "central_storage:2")
    expect_row(rows(report)["mirrored:2"], report, "keras3-metric-state-mirrored-sum-before-3.10")


@pytest.mark.parametrize("env", FROM)
def test_a_mutant_of_one_releases_math_on_one_device_is_attributed_there(pool, env):
    """step_regularization_left_out on the --from side's engines only: its canonical step drops the
    L2 penalty, on one device already; no catalogued cause, exit 1."""
    report = checked(pool, env, "examples.upgrade:regularized", mutant="step_regularization_left_out@other")
    expect(env, ([(r.spec, r.status, r.attribution) for r in report.rows], report.exit_code()),
           ([("default", "FAIL", "unexplained"), ("mirrored:2", "FAIL", "one_device")], EXIT["FAIL"]),
           "rows, exit status", report)
    expect("default", rows(report)["default"].mismatches[0].quantity, "loss", "the first quantity that differs", report)


@pytest.mark.parametrize("env", FROM)
def test_a_mutant_of_one_releases_distribution_is_unexplained(pool, env):
    """double_gradient_aggregation on the --from side's engines only: gradients summed twice under
    a strategy, nothing on one device; the loop trained the same, so it is no loop's cause."""
    report = checked(pool, env, "examples.upgrade:unchanged", mutant="double_gradient_aggregation@other")
    spec = rows(report)["mirrored:2"]
    expect(env, (rows(report)["default"].status, spec.status, spec.attribution, spec.sides, report.exit_code()),
           ("PASS", "FAIL", "unexplained", ("FAIL", "PASS"), EXIT["FAIL"]), "rows, exit status", report)
    # the newer version moves half as far as the doubled one
    expect(env, round(spec.mismatches[0].ratio, 3), 0.5, "the first difference's ratio", report)


def test_the_json_of_an_upgrade_check_is_a_section_of_the_report(tmp_path):
    from suite.harness.reporting import run_report
    appeared = _judge(2.0, _v("PASS"), _v("DEVIATION", "entry-x"))
    report = upgrade.UpgradeReport("pkg.loop:workload", LABELS, ({"tensorflow": "2.15.1", "keras": "2.15.0"},
                                   {"tensorflow": "2.21.0", "keras": "3.15.1"}), 48, 3, 1e-4, 1e-7,
                                   [upgrade.Row("default", "PASS", "same", steps=3, agreed=3), appeared])
    path = tmp_path / "upgrade.json"
    path.write_text(json.dumps(report.as_json()))
    text = run_report.write_report([path], tmp_path / "out").read_text()
    assert "## Upgrade check of `pkg.loop:workload` (`upgrade.json`)" in text
    assert "From old (TensorFlow 2.15.1, Keras 2.15.0) to new (TensorFlow 2.21.0, Keras 3.15.1)" in text
    assert "| `mirrored:2` | PASS | DEVIATION | DEVIATION | 0/1 | 0 | step 1 | entry-x (appears) |" in text
    assert f"{report.summary()} (exit {EXIT['KNOWN']})" in text


# -- a side the check cannot use: one line, exit 2, no engine left behind -------------------------
ONE_SIDED = '''
import numpy as np
import tensorflow as tf
from suite.engine.workload import Workload

keras = tf.keras
VERSION = int(tf.__version__.split(".")[1])


def _workload(ctx, x):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(0.1)
    y = np.zeros((96,), np.int64)

    def dataset(global_batch_size, input_context):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size)
    return Workload(model, optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
                    dataset)


def keras3_only(ctx):
    """keras.ops exists in Keras 3 only: the factory does not build on Keras 2."""
    return _workload(ctx, np.asarray(keras.ops.ones((96, 4)), np.float32))


def data_by_version(ctx):
    """Data that depend on the TensorFlow minor: each version trains on other examples."""
    return _workload(ctx, np.full((96, 4), VERSION / 100, np.float32))
'''


@pytest.fixture(scope="module")
def one_sided(tmp_path_factory):
    path = tmp_path_factory.mktemp("upgrade_loops")
    (path / "onesided.py").write_text(ONE_SIDED)
    return path


@pytest.mark.parametrize("factory, message", [
    ("keras3_only", "error: on tf215: workload 'onesided:keras3_only'"),
    ("data_by_version", "error: workload 'onesided:data_by_version' trains on other data on this interpreter than "
                        "on tf215"),
])
def test_a_loop_that_cannot_be_compared_across_the_upgrade_is_a_one_line_usage_error(one_sided, factory, message):
    from tests.workloads.test_bad_input import check_cli
    if not (ROOT / ".tox" / "tf215" / "bin" / "python").exists():
        pytest.skip(".tox/tf215 is not built (tox run --notest -e tf215)")
    done, left = check_cli(one_sided, f"onesided:{factory}", "--from", "tf215", "--strategies", "mirrored:2")
    Check(factory).equal((done.returncode, done.stderr.count("\n"), done.stderr.startswith(message), left),
                         (EXIT["USAGE"], 1, True, []), "exit status, lines, message, engines left", hint=done.stderr)


def test_the_text_says_what_only_one_version_has_once_and_details_only_the_rows_that_differ():
    note = upgrade.ONE_SIDED + "adam/learning_rate"
    same = [upgrade.Row(s, "PASS", "same", lines=[note]) for s in ("default", "mirrored:2")]
    text = upgrade.UpgradeReport("t", LABELS, ({}, {}), 48, 3, 1e-4, 1e-7, same).text()
    assert (text.count(note), "default: PASS" in text) == (1, False)
