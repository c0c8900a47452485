"""Each property can fail: run it against an engine with a deliberately wrong probe
(suite/engine/mutants.py) and require a failure that names the problem."""

from __future__ import annotations

import pytest

from suite.common.catalog import MUTANTS
from suite.harness.check import Check
from tests.helpers import run_pytest

TRAINING = "tests/properties/test_training.py::test_training_steps_match_reference_on_the_global_batch"

# mutant -> (property test id, whose first parameter is the spec it runs under; a phrase the
# failure must contain)
CASES = {
    "local_batch_denominator": (
        "tests/properties/test_losses.py::test_compute_average_loss_matches_reference[mirrored:2-none-float64]",
        "compute_average_loss"),
    "unnormalised_multi_dim": (
        "tests/properties/test_losses.py::test_multi_dimensional_labels[mirrored:2-normalised-float64]",
        "elements per example"),
    "scale_reg_not_divided": (
        "tests/properties/test_losses.py::test_scale_regularization_loss_divides_by_replicas[mirrored:2-float64]",
        "= replicas"),
    "double_gradient_aggregation": (
        "tests/properties/test_training.py::test_training_steps_match_reference_on_the_global_batch[mirrored:2-mlp_softmax-sgd-float64]",
        "after step 1"),
    "metric_first_replica": (
        "tests/properties/test_metrics.py::test_metric_result_is_the_metric_of_the_global_data[mirrored:2-sum]",
        "in cross-replica context"),
    "reduce_mean_of_means": (
        "tests/properties/test_reduce.py::test_reduce_sum_and_mean_over_uneven_replicas[mirrored:2-float64]",
        "reduce(MEAN, axis=0)"),
    "reversed_local_results": (
        "tests/properties/test_reduce.py::test_experimental_local_results_are_in_replica_order[mirrored:2]",
        "replicas the local results come from (worker 0): got [1, 0]"),
    "input_rows_to_first_replica": (
        "tests/properties/test_input.py::test_replica_batches_follow_the_split_rule[mirrored:2-for]",
        "element ids of every step's local replica batches: got"),
    "input_dropped_element": (
        "tests/properties/test_input.py::test_every_element_is_delivered_exactly_once[mirrored:2]",
        "elements missing: got [0]"),
    "keras_loss_times_replicas": (
        "tests/properties/test_losses.py::test_keras_loss_reduction_inside_strategy_run[mirrored:2-mse-sum-float64]",
        "= replicas"),
    "ps_step_scheduled_twice": (
        "tests/properties/test_parameter_server.py::test_every_scheduled_step_is_applied_exactly_once[parameter_server:2w1ps-keras]",
        "the step counter after the scheduled steps: got"),
    "ps_shards_reversed": (
        "tests/properties/test_parameter_server.py::test_partitioned_variables_reassemble[parameter_server:2w1ps]",
        "rows of each shard"),
    "ps_shards_on_one_task": (
        "tests/properties/test_parameter_server.py::test_shards_go_round_robin_over_two_ps_tasks",
        "ps task of each shard (round-robin): got [0, 0"),
    "ps_loss_times_two": (
        "tests/properties/test_parameter_server.py::test_num_replicas_and_loss_scaling"
        "[parameter_server:2w1ps-sum-none-float64]",
        "compute_average_loss in a scheduled step"),
    "default_denominator_is_global": (
        "tests/properties/test_training.py::test_default_denominator_weights_each_replica_by_its_own_batch[mirrored:2]",
        "at step"),
    "checkpoint_without_optimizer": (
        "tests/properties/test_checkpoint.py::test_checkpoint_restores_under_another_strategy[mirrored:2]",
        "optimizer iterations"),
    "short_batch_dropped": (
        "tests/properties/test_training.py::test_short_last_batch_training_matches_the_reference_split"
        "[mirrored:2-constant]", "replica batch sizes in epoch 1"),
    "optimizer_outside_scope": (
        "tests/properties/test_training.py::test_optimizer_variables_created_lazily_in_a_distributed_step"
        "[mirrored:2-SGD]", "SGD (worker 0)"),
    "metric_read_before_update": (
        "tests/properties/test_metrics.py::test_metric_result_is_the_metric_of_the_global_data[mirrored:2-sum]",
        "inside strategy.run after batch"),
    "optional_iteration_skips_first": (
        "tests/properties/test_input.py::test_iteration_styles_deliver_the_same_stream[mirrored:2]",
        "iterating with 'get_next_as_optional'"),
    # float32 alone: a classic training-loop mistake moves float32 results beyond the float32
    # tolerance (docs/reference.md derives it from measured error)
    "step_local_batch_denominator": (TRAINING + "[mirrored:2-mlp_linear_l2-sgd-float32]", "summed loss at step 1"),
    "step_regularization_left_out": (TRAINING + "[mirrored:2-linear_l2-sgd-float32]", "summed loss at step 1"),
    "step_one_replica_dropped": (TRAINING + "[mirrored:2-mlp_linear_l2-sgd-float32]", "after step 1"),
    "step_applies_nothing": (TRAINING + "[mirrored:2-mlp_linear_l2-sgd-float32]", "changed from the initial parameters"),
    "ps_gradient_doubled": (
        "tests/properties/test_parameter_server.py::test_ordered_training_equals_the_reference[parameter_server:2w1ps-sgd]",
        "after"),
}


def test_every_mutant_has_a_case():
    # foreign_result moves every probe result: tests/meta/test_deviations.py runs it
    Check("MUTANTS").equal(sorted(CASES), sorted(set(MUTANTS) - {"foreign_result"}), "mutants with a property case")


# gradients summed twice, in float32 alone, under the optimizers whose update scales with the
# gradient (Adam's first steps are nearly scale-invariant: float64 and the other optimizers catch it)
FLOAT32_DOUBLE_GRADIENT = {f"double_gradient_aggregation/{opt}": ("double_gradient_aggregation", (
    TRAINING + f"[mirrored:2-mlp_linear_l2-{opt}-float32]", "after step 1")) for opt in ("sgd", "sgd_momentum", "rmsprop")}


@pytest.mark.parametrize("mutant", sorted(CASES) + sorted(FLOAT32_DOUBLE_GRADIENT))
def test_property_catches_mutant(mutant):
    if mutant in FLOAT32_DOUBLE_GRADIENT:
        mutant, (test_id, phrase) = FLOAT32_DOUBLE_GRADIENT[mutant]
    else:
        test_id, phrase = CASES[mutant]
    # the spec is the test id's first parameter; a test on a fixed spec runs under any selection
    spec = test_id.split("[", 1)[1].split("-", 1)[0].rstrip("]") if "[" in test_id else "default"
    proc = run_pytest([test_id, "--strategies", spec, "-x", "--no-header"], 600,
                      TFDS_MUTANT=mutant, HYPOTHESIS_PROFILE="ci")
    out = proc.stdout + proc.stderr
    check = Check(spec, case={"mutant": mutant, "property": test_id})
    check.equal(proc.returncode, 1, "the property's exit code against the mutant (1: it failed)", out[-3000:])
    check.contains(out, ["PropertyFailure", phrase], "the property's failure (it must name the problem)")


def test_readme_shows_which_mutant_kills_which_property():
    """The README's matrix has a row per property naming every mutant that kills it here, and
    lists the properties no mutant kills yet; both stay true to CASES."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    section = readme.split("## Each property can fail", 1)[1].split("\n## ", 1)[0]
    killed = {}
    for mutant, (test_id, _) in list(CASES.items()) + [v for v in FLOAT32_DOUBLE_GRADIENT.values()]:
        killed.setdefault(test_id.split("::")[1].split("[")[0], set()).add(mutant)
    check = Check("README.md")
    for prop, mutants in killed.items():
        row = next((line for line in section.splitlines() if line.startswith(f"| `{prop}` |")), "")
        check.that(all(f"`{m}`" in row for m in mutants), f"the matrix row of {prop}", row, f"naming {sorted(mutants)}")
    properties = set(re.findall(r"^def (test_\w+)\(", "\n".join(
        p.read_text() for p in (root / "tests" / "properties").glob("test_*.py")), re.M))
    gaps = section.split("Not yet killed by a mutant", 1)[1]
    for prop in sorted(properties - set(killed)):
        check.that(f"`{prop}`" in gaps, "the README's list of properties without a mutant", prop, "listed")
