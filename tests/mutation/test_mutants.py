"""Each property can fail: run it against an engine with a deliberately wrong probe
(suite/engine/mutants/) and require a failure that names the problem."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from suite.common.catalog import MUTANTS
from suite.harness.judging.judgment import Check
from suite.harness.pool import versions
from tests.helpers import run_pytest

TRAINING = "tests/properties/test_training.py::test_training_steps_match_reference_on_the_global_batch"
LOSSES = "tests/properties/test_losses.py::"
INPUT = "tests/properties/test_input.py::"
PS_TESTS = "tests/properties/test_parameter_server.py::"
BLOCKS = "tests/properties/test_blocks.py::"
RIGHT_LOOP = "tests/workloads/test_examples.py::test_the_right_loop_of_the_mistakes_passes[{spec}]"
RIGHT_SCRIPT = "tests/workloads/test_scripts.py::test_the_built_tutorial_trains_as_on_one_device[{spec}]"
GAN_SCRIPT = "tests/workloads/test_cluster_scripts.py::test_each_zoo_scripts_verdict_and_cause[{spec}-gan.py-right]"
MULTI_WORKER_SCRIPT = ("tests/workloads/test_cluster_scripts.py::"
                       "test_each_zoo_scripts_verdict_and_cause[{spec}-multi_worker_mistakes.py-right]")
PS_SCRIPT = "tests/workloads/test_ps_scripts.py::test_the_parameter_server_tutorials_loop_trains_as_on_one_device[{spec}]"
FIT_GAN_SCRIPT = ("tests/workloads/test_fit_scripts.py::"
                  "test_the_fit_gan_trains_as_on_one_device_and_its_mistakes_are_named[{spec}-right]")

# One spec of every strategy kind: the mutants run on each kind where they apply.
ONE = ("default", "one_device")  # one replica
MULTI = ("mirrored:2", "central_storage:2", "multi_worker:2x1")  # two replicas, one or two workers
SYNC = ONE + MULTI
PS = ("parameter_server:2w1ps",)
# Two TensorFlow versions in one session (tests/properties/test_across_versions.py): the engines of
# tox env tf215 (built by .ci/run before this step) against the session's; the mutant runs on the
# tf215 side only (its name ends in @other: EnginePool.set_mutant)
OTHER_ENV = "tf215"
VERSIONS = (f"mirrored:2@{OTHER_ENV}",)
KINDS = SYNC + PS + VERSIONS
ACROSS = "tests/properties/test_across_versions.py::"
FIT = "tests/properties/test_fit.py::test_fit_trains_as_the_reference_on_the_global_batches"
EPOCHS = "tests/properties/test_fit.py::test_each_epoch_of_fit_trains_that_iteration_of_the_dataset"


@dataclasses.dataclass(frozen=True)
class Case:
    """``mutant`` must make ``test`` fail, naming ``phrase``, under each spec of ``specs``
    ({spec} in the id; {dtype} takes each of ``dtypes``), with the engines' Keras generation one
    of ``keras``. A mutant applies to a kind when it changes what that kind computes: a
    per-replica mistake cannot show on one replica, and a mistake a Keras generation makes
    itself (a known deviation, excused by its signature) cannot be caught under it."""

    mutant: str
    test: str
    phrase: str
    specs: tuple = SYNC
    dtypes: tuple = ("float64",)
    keras: tuple = (2, 3)

    def ids(self, spec: str, keras: int | None = None) -> list[str]:
        if spec not in self.specs or (keras is not None and keras not in self.keras):
            return []
        return [self.test.format(spec=spec, dtype=d) for d in self.dtypes]


BOTH = ("float32", "float64")
CASES = [
    # the check of a user's loop (python -m suite.check) sees TensorFlow sum a loop's gradients wrongly
    Case("double_gradient_aggregation", RIGHT_LOOP, "examples.mistakes:right", MULTI),
    Case("step_one_replica_dropped", RIGHT_LOOP, "examples.mistakes:right", MULTI),
    # ... and in a training script run unchanged (one-process specs only, suite/harness/loopcheck/scriptcheck.py)
    Case("double_gradient_aggregation", RIGHT_SCRIPT, "examples/scripts/tutorial.py", ("mirrored:2", "central_storage:2")),
    Case("step_one_replica_dropped", RIGHT_SCRIPT, "examples/scripts/tutorial.py", ("mirrored:2", "central_storage:2")),
    # ... and under a multi-worker spec, each worker running a script in the multi-worker tutorial's shape
    Case("double_gradient_aggregation", MULTI_WORKER_SCRIPT, "multi_worker_mistakes.py --case right", ("multi_worker:2x1",)),
    Case("step_one_replica_dropped", MULTI_WORKER_SCRIPT, "multi_worker_mistakes.py --case right", ("multi_worker:2x1",)),
    # ... and in a script of two models and two optimizers (the mutants act on both)
    Case("double_gradient_aggregation", GAN_SCRIPT, "gan.py --case right", MULTI),
    Case("step_one_replica_dropped", GAN_SCRIPT, "gan.py --case right", MULTI),
    # ... and in a custom train_step run by Model.fit, its two optimizers applied with Keras 3's optimizer.apply
    Case("double_gradient_aggregation", FIT_GAN_SCRIPT, "fit_gan.py --case right", ("mirrored:2",), keras=(3,)),
    # ... and in a parameter-server script's scheduled step, on the spec's cluster
    Case("ps_gradient_doubled", PS_SCRIPT, "parameter_server.py", PS),
    # ... and in Keras' own train step, as Model.fit runs it (where fit trains on TF 2.21 / Keras 3.15)
    Case("fit_gradients_doubled", FIT + "[{spec}-1-even]", "after step", ONE + ("mirrored:2", "central_storage:2")),
    # ... where fit-loss-mean-per-replica-on-uneven-split excuses Keras' own per-replica scaling (an uneven split
    # under central storage): doubled gradients are not that
    Case("fit_gradients_doubled", FIT + "[{spec}-1-uneven]", "after step", ("central_storage:2",)),
    # ... and fit training a later iteration of its dataset than the epoch's (where Keras 3.5+ does so under a
    # strategy, a known deviation, the mutant's extra draw makes it two iterations late)
    Case("fit_draws_an_iteration_first", EPOCHS + "[{spec}]", "iterations of the dataset fit began",
         ONE + ("mirrored:2", "central_storage:2")),
    Case("local_batch_denominator", LOSSES + "test_compute_average_loss_matches_reference[{spec}-none-{dtype}]",
         "compute_average_loss", MULTI, BOTH),
    Case("local_batch_denominator", LOSSES + "test_summed_scaled_loss_equals_the_global_mean_on_even_splits"
         "[{spec}-{dtype}]", "SUM of compute_average_loss", MULTI, BOTH),
    Case("local_batch_denominator", LOSSES + "test_mean_metric_of_scaled_losses_reports_loss_over_replicas[{spec}]",
         "summed scaled loss", MULTI),
    Case("local_batch_denominator", LOSSES + "test_documented_loss_tracking_pitfall_example[{spec}]",
         "summed scaled loss", MULTI),
    Case("unnormalised_multi_dim", LOSSES + "test_multi_dimensional_labels[{spec}-normalised-{dtype}]",
         "elements per example", SYNC, BOTH),
    Case("scale_reg_not_divided", LOSSES + "test_scale_regularization_loss_divides_by_replicas[{spec}-{dtype}]",
         "= replicas", MULTI, BOTH),
    Case("keras_loss_times_replicas", LOSSES + "test_keras_loss_reduction_inside_strategy_run[{spec}-mse-sum-{dtype}]",
         "= replicas", MULTI, BOTH),
    Case("double_gradient_aggregation", TRAINING + "[{spec}-mlp_softmax-sgd-float64]", "after step 1", MULTI),
    # float32 alone: a classic training-loop mistake moves float32 results beyond the float32
    # tolerance (docs/reference.md derives it from measured error). Gradients summed twice
    # under the optimizers whose update scales with the gradient (Adam's first steps are
    # nearly scale-invariant: float64 and the other optimizers catch it).
    *[Case("double_gradient_aggregation", TRAINING + f"[{{spec}}-mlp_linear_l2-{opt}-float32]", "after step 1",
           MULTI) for opt in ("sgd", "sgd_momentum", "rmsprop")],
    Case("step_local_batch_denominator", TRAINING + "[{spec}-mlp_linear_l2-sgd-{dtype}]", "summed loss at step 1",
         MULTI, BOTH),
    Case("step_regularization_left_out", TRAINING + "[{spec}-linear_l2-sgd-{dtype}]", "summed loss at step 1", SYNC,
         BOTH),
    # the first drawn step has replica 0 empty: dropping replica 1 leaves the variables unchanged
    Case("step_one_replica_dropped", TRAINING + "[{spec}-mlp_linear_l2-sgd-{dtype}]", "on local replica 0 after",
         MULTI, BOTH),
    Case("step_applies_nothing", TRAINING + "[{spec}-mlp_linear_l2-sgd-{dtype}]",
         "changed from the initial parameters", SYNC, BOTH),
    Case("default_denominator_is_global",
         "tests/properties/test_training.py::test_default_denominator_weights_each_replica_by_its_own_batch[{spec}]",
         "at step", MULTI),
    Case("short_batch_dropped",
         "tests/properties/test_training.py::test_short_last_batch_training_matches_the_reference_split"
         "[{spec}-constant]", "replica batch sizes in epoch 1"),
    Case("optimizer_outside_scope", "tests/properties/test_training.py::"
         "test_optimizer_variables_created_lazily_in_a_distributed_step[{spec}-SGD]", "SGD (worker 0)", MULTI),
    # (on multi_worker:2x1 only: under mirrored:2 and central_storage:2 Keras 3 cannot build the model in
    # the step at all, known deviations that the raise matches before any variable is looked at)
    Case("optimizer_outside_scope", "tests/properties/test_training.py::"
         "test_a_model_built_by_its_first_call_in_a_distributed_step[{spec}]", "SGD (worker 0)",
         ("multi_worker:2x1",)),
    Case("optimizer_names_extra", "tests/properties/test_training.py::test_every_builtin_optimizer_is_covered[{spec}]",
         "not covered by OPTIMIZER_CLASSES"),
    Case("metric_first_replica",
         "tests/properties/test_metrics.py::test_metric_result_is_the_metric_of_the_global_data[{spec}-sum]",
         "in cross-replica context", ("mirrored:2", "multi_worker:2x1")),  # CentralStorage keeps one copy
    Case("metric_read_before_update",
         "tests/properties/test_metrics.py::test_metric_result_is_the_metric_of_the_global_data[{spec}-sum]",
         "inside strategy.run after batch"),
    Case("reduce_mean_of_means", "tests/properties/test_reduce.py::test_reduce_sum_and_mean_over_uneven_replicas"
         "[{spec}-{dtype}]", "reduce(MEAN, axis=0)", MULTI, BOTH),
    Case("reduce_mean_of_means", "tests/properties/test_reduce.py::test_reduce_docstrings_worked_examples[{spec}]",
         "partial_batch_6_mean_axis_0: mean_axis0", MULTI),
    Case("reversed_local_results",
         "tests/properties/test_reduce.py::test_experimental_local_results_are_in_replica_order[{spec}]",
         "replicas the local results come from (worker 0): got [1", MULTI),
    Case("input_rows_to_first_replica", INPUT + "test_replica_batches_follow_the_split_rule[{spec}-for]",
         "element ids of every step's local replica batches"),
    Case("input_rows_to_first_replica", INPUT + "test_the_input_guides_worked_examples[{spec}]", "the guide's",
         MULTI),
    Case("input_dropped_element", INPUT + "test_every_element_is_delivered_exactly_once[{spec}]",
         "elements missing: got [0"),
    Case("input_dropped_element", INPUT + "test_partial_last_step_is_delivered[{spec}-for]",
         "element ids of every step on worker 0", ("mirrored:2", "central_storage:2")),
    Case("optional_iteration_skips_first", INPUT + "test_iteration_styles_deliver_the_same_stream[{spec}]",
         "iterating with 'get_next_as_optional'"),
    Case("input_fn_global_batch", INPUT + "test_distribute_datasets_from_function_follows_input_context[{spec}]",
         "", MULTI),
    Case("values_fn_mirror_ids", INPUT + "test_values_from_function_sees_each_replica_context[{spec}]", "", MULTI),
    *[Case("input_policy_data", INPUT + f"test_file_sharding_with_fewer_files_than_workers_fails[{{spec}}-{policy}]",
           "distributing fewer files than workers: got no exception", ("multi_worker:2x1",)) for policy in
      ("FILE", "AUTO")],
    Case("checkpoint_without_optimizer",
         "tests/properties/test_checkpoint.py::test_checkpoint_restores_under_another_strategy[{spec}]",
         "optimizer iterations"),
    Case("counters_not_restored",
         "tests/properties/test_checkpoint.py::test_integer_metric_state_survives_restore[{spec}]",
         "int64 Sum metrics after a restore"),
    Case("saved_model_before_load", "tests/properties/test_checkpoint.py::"
         "test_saved_model_exported_under_a_strategy_predicts_identically_without_one[{spec}]",
         "prediction of the reloaded SavedModel"),
    Case("fashion_data_unseeded",
         "tests/properties/test_tutorial.py::test_synthetic_fashion_data_has_the_fashion_mnist_interface",
         "of a second call (deterministic)", ("default",)),
    Case("tutorial_restore_skipped",
         "tests/properties/test_tutorial.py::test_tutorial_flow_trains_checkpoints_and_restores_without_a_strategy",
         "test accuracy restored without a strategy", ("mirrored:2",)),
    Case("ps_step_scheduled_twice", PS_TESTS + "test_every_scheduled_step_is_applied_exactly_once[{spec}-keras]",
         "the step counter after the scheduled steps: got", PS),
    Case("ps_step_scheduled_twice", PS_TESTS + "test_optimizer_iterations_count_every_scheduled_step[{spec}]",
         "optimizer.iterations after the scheduled steps", PS),
    Case("ps_shards_reversed", PS_TESTS + "test_partitioned_variables_reassemble[{spec}]", "rows of each shard", PS),
    Case("ps_shards_on_one_task", PS_TESTS + "test_shards_go_round_robin_over_two_ps_tasks",
         "ps task of each shard (round-robin): got [0, 0", PS),
    Case("ps_loss_times_two", PS_TESTS + "test_num_replicas_and_loss_scaling[{spec}-sum-none-{dtype}]",
         "compute_average_loss in a scheduled step", PS, BOTH),
    Case("ps_gradient_doubled", PS_TESTS + "test_ordered_training_equals_the_reference[{spec}-sgd]", "after", PS),
    Case("clipping_dropped", BLOCKS + "test_clipping_acts_on_the_summed_gradient[{spec}-clipnorm]", "after step 1"),
    *[Case("clipping_dropped", BLOCKS + f"test_clipping_acts_on_the_summed_gradient[{{spec}}-{option}]",
           "after step 1", ("mirrored:2",)) for option in ("clipvalue", "global_clipnorm")],
    # Keras 3 clips each replica itself (keras3-clipping-per-replica-before-the-sum explains it)
    Case("clip_per_replica", BLOCKS + "test_clipping_acts_on_the_summed_gradient[{spec}-global_clipnorm]",
         "after step 1", MULTI, keras=(2,)),
    Case("step_regularization_not_scaled",
         BLOCKS + "test_activity_regularizer_losses_are_scaled_as_the_guide_prescribes[{spec}]", "at step 1", MULTI),
    Case("bn_not_synchronized", BLOCKS + "test_synchronized_batch_norm_uses_the_global_batch[{spec}]",
         "on replica", ("mirrored:2", "multi_worker:2x1")),
    Case("bn_not_synchronized", BLOCKS + "test_synchronized_batch_norm_in_float32_uses_the_global_batch[{spec}]",
         "on replica", ("mirrored:2", "multi_worker:2x1")),
    # (Keras 3 cannot train BatchNormalization under CentralStorage: a known deviation)
    Case("bn_momentum_inverted",
         BLOCKS + "test_unsynchronized_batch_norm_normalises_each_replica_by_itself[{spec}]", "moving_",
         ONE + ("mirrored:2", "multi_worker:2x1")),
    # (CentralStorage refuses dynamic loss scaling; several workers have the fixed case below)
    Case("loss_scale_replica_zero_decides",
         BLOCKS + "test_loss_scaling_skips_a_non_finite_step_on_every_replica[{spec}-mixed_float16-dynamic]", "after step",
         ("mirrored:2",)),
    Case("loss_scale_replica_zero_decides",
         BLOCKS + "test_loss_scaling_skips_a_step_non_finite_on_another_worker[{spec}-mixed_float16]", "",
         ("multi_worker:2x1",)),
    Case("sparse_duplicates_dropped",
         BLOCKS + "test_embedding_sparse_updates_equal_the_dense_reference[{spec}-sgd]", "after step"),
    # (Keras 3 cannot run Dropout in training mode under CentralStorage: a known deviation)
    Case("random_unseeded", BLOCKS + "test_seeded_random_draws_repeat_and_replicas_draw_their_own[{spec}-dropout]",
         "of a second run built afresh", ONE + ("mirrored:2", "multi_worker:2x1")),
    *[Case("random_unseeded", BLOCKS + f"test_seeded_random_draws_repeat_and_replicas_draw_their_own[{{spec}}-{kind}]",
           "of a second run built afresh") for kind in ("generator", "stateless_fold_in")],
    *[Case("random_replica_streams_shared",
           BLOCKS + f"test_seeded_random_draws_repeat_and_replicas_draw_their_own[{{spec}}-{kind}]",
           "equals replica 0's", ("mirrored:2",)) for kind in ("values_from_function", "stateless_fold_in")],
    # (Keras 3 cannot update EMA averages under CentralStorage: a known deviation)
    Case("ema_momentum_inverted",
         BLOCKS + "test_ema_of_the_weights_is_the_reference_average_on_every_replica[{spec}]", "the average of variable",
         ONE + ("mirrored:2", "multi_worker:2x1")),
    Case("accumulation_one_step_more",
         BLOCKS + "test_gradient_accumulation_applies_the_mean_every_n_steps[{spec}]", "", ONE, keras=(3,)),
    # (XLA cannot compile a replica's pass under CentralStorage: the test skips there)
    Case("step_local_batch_denominator",
         BLOCKS + "test_training_compiled_with_xla_matches_the_reference[{spec}-replica]", "at step 1",
         ("mirrored:2", "multi_worker:2x1")),
    # (XLA compiles a replica's loss or metric update only where every replica's ops run on one
    # device or process, and Keras 2.15's not at all: the tests skip elsewhere)
    Case("local_batch_denominator", LOSSES + "test_compute_average_loss_compiled_with_xla_matches_reference"
         "[{spec}-replica]", "compute_average_loss", ("central_storage:2", "multi_worker:2x1"), keras=(3,)),
    Case("metric_read_before_update", "tests/properties/test_metrics.py::"
         "test_metric_result_compiled_with_xla_is_the_metric_of_the_global_data[{spec}-replica]",
         "inside strategy.run after batch", ONE + ("central_storage:2", "multi_worker:2x1"), keras=(3,)),
    Case("weight_decay_per_replica", BLOCKS + "test_weight_decay_is_applied_once_per_step[{spec}]", "after step 1",
         MULTI),
    Case("local_batch_denominator@other", ACROSS + "test_compute_average_loss_agrees_across_versions[{spec}-{dtype}]",
         "other version vs this one", VERSIONS, BOTH),
    Case("reduce_mean_of_means@other", ACROSS + "test_strategy_reduce_agrees_across_versions[{spec}-float64]",
         "strategy.reduce: mean_axis0", VERSIONS),
    Case("step_local_batch_denominator@other", ACROSS + "test_training_steps_agree_across_versions[{spec}-sgd]",
         "other version vs this one", VERSIONS),
]


def plan(spec: str, keras: int | None = None) -> list[tuple[str, str, str]]:
    """``(test id, mutant, phrase)`` of every case under ``spec`` (and Keras generation ``keras``)."""
    return [(test, c.mutant, c.phrase) for c in CASES for test in c.ids(spec, keras)]


def test_every_mutant_has_a_case_and_every_kind_runs():
    # foreign_result moves every probe result: tests/units/test_deviations.py runs it
    check = Check("MUTANTS")
    check.equal(sorted({c.mutant.removesuffix("@other") for c in CASES}), sorted(set(MUTANTS) - {"foreign_result"}),
                "mutants with a case")
    check.equal([s for s in KINDS if not plan(s)], [], "strategy kinds no mutant runs on")


def _first_error(text: str) -> str:
    """The report's first ``E   SomeError: ...`` line (the one that says what went wrong)."""
    lines = [ln[1:].strip() for ln in text.splitlines() if re.match(r"^E\s+[\w.]*(Error|Failure|Exception)\b", ln)]
    return lines[0] if lines else text[-300:]


@pytest.mark.deep  # about 5 minutes of CPU on 2 cores: the deep step of .ci/run (docs/running.md)
@pytest.mark.parametrize("kind_spec", KINDS)
def test_every_mutant_is_caught_under(kind_spec, engine_versions, tmp_path):
    """One pytest session per spec runs every case of that spec (suite/harness/tools/mutation.py: the
    engines start once and switch mutants between cases); each must fail naming its problem."""
    if "@" in kind_spec and not Path(versions.interpreter(OTHER_ENV)[0]).exists():
        pytest.skip(f"{kind_spec}: no tox env {OTHER_ENV} to compare with (tox -e {OTHER_ENV} --notest; .ci/run builds it)")
    entries = plan(kind_spec, engine_versions["keras"][0])
    (tmp_path / "plan.json").write_text(json.dumps([[test, mutant] for test, mutant, _ in entries]))
    tests = list(dict.fromkeys(test for test, _, _ in entries))
    proc = run_pytest([*tests, "--strategies", kind_spec, "-p", "suite.harness.tools.mutation",
                       "--mutation-plan", str(tmp_path / "plan.json"), "--mutation-out", str(tmp_path / "out.json"),
                       "--no-header"], 1500, HYPOTHESIS_PROFILE="ci")
    check = Check(kind_spec, case={"cases": len(entries)})
    check.equal(proc.returncode, 0, "the mutation session's exit code",
                (proc.stdout + proc.stderr)[-3000:])
    records = json.loads((tmp_path / "out.json").read_text())
    survivors = [f"{r['mutant']} on {r['test']}: {r['outcome']}: {_first_error(r['text'])}" for r, (_, _, phrase)
                 in zip(records, entries) if r["outcome"] != "failed" or "PropertyFailure" not in r["text"]
                 or phrase not in r["text"]]
    check.equal(len(records), len(entries), "cases run")
    check.equal(survivors, [], "cases whose property did not fail naming the problem (PropertyFailure and the phrase)")


def matrix() -> list[str]:
    """The mutation matrix of docs/mutants.md: a row per property, each mutant that kills it, the specs it runs on
    and the property's other parameters it runs with."""
    rows: dict[str, dict[str, tuple[list, list]]] = {}
    for c in CASES:
        prop, _, params = c.test.split("::")[1].partition("[")
        specs, variants = rows.setdefault(prop, {}).setdefault(c.mutant, ([], []))
        specs += [s for s in c.specs if s not in specs]
        rest = params.rstrip("]").replace("{spec}", "").strip("-")
        variants += [v for v in (rest.format(dtype=d) for d in c.dtypes) if v and v not in variants]
        if c.keras != (2, 3) and f"Keras {c.keras[0]} only" not in variants:
            variants.append(f"Keras {c.keras[0]} only")
    lines = ["| property | mutant: specs it runs on (other parameters) |", "| --- | --- |"]
    for prop in sorted(rows):
        cells = "; ".join(f"`{m}`: {', '.join(specs)}" + (f" ({', '.join(variants)})" if variants else "")
                          for m, (specs, variants) in rows[prop].items())
        lines.append(f"| `{prop}` | {cells} |")
    return lines


def test_every_property_has_a_row_in_the_mutation_matrix():
    """Every property in tests/properties is killed by some mutant (docs/mutants.md shows
    ``matrix()``; tests/lint/test_docs.py keeps the page equal to it)."""
    root = Path(__file__).resolve().parents[2]
    properties = set(re.findall(r"^def (test_\w+)\(", "\n".join(
        p.read_text() for p in (root / "tests" / "properties").glob("test_*.py")), re.M))
    killed = {c.test.split("::")[1].split("[")[0] for c in CASES}
    Check("mutation matrix").equal(sorted(properties - killed), [], "properties no mutant kills")


if __name__ == "__main__":
    print("\n".join(matrix()))
