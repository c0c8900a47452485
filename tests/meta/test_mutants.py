"""Each property can fail: run it against an engine with a deliberately wrong probe
(suite/engine/mutants.py) and require a failure that names the problem."""

from __future__ import annotations

import pytest

from suite.common.catalog import MUTANTS
from suite.harness.check import Check
from tests.helpers import run_pytest

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
        "tests/properties/test_training.py::test_training_steps_match_reference_on_the_global_batch[mirrored:2-sgd-float64]",
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
        "the variable reassembled (whole)"),
    "ps_shards_on_one_task": (
        "tests/properties/test_parameter_server.py::test_shards_go_round_robin_over_two_ps_tasks",
        "ps task of each shard (round-robin): got [0, 0"),
    "ps_loss_times_two": (
        "tests/properties/test_parameter_server.py::test_num_replicas_and_loss_scaling"
        "[parameter_server:2w1ps-sum-none-float64]",
        "compute_average_loss in a scheduled step"),
    "ps_gradient_doubled": (
        "tests/properties/test_parameter_server.py::test_ordered_training_equals_the_reference[parameter_server:2w1ps-sgd]",
        "after"),
}


def test_every_mutant_has_a_case():
    # foreign_result moves every probe result: tests/meta/test_deviations.py runs it
    Check("MUTANTS").equal(sorted(CASES), sorted(set(MUTANTS) - {"foreign_result"}), "mutants with a property case")


@pytest.mark.parametrize("mutant", sorted(CASES))
def test_property_catches_mutant(mutant):
    test_id, phrase = CASES[mutant]
    # the spec is the test id's first parameter; a test on a fixed spec runs under any selection
    spec = test_id.split("[", 1)[1].split("-", 1)[0].rstrip("]") if "[" in test_id else "default"
    proc = run_pytest([test_id, "--strategies", spec, "-x", "--no-header"], 600,
                      TFDS_MUTANT=mutant, HYPOTHESIS_PROFILE="ci")
    out = proc.stdout + proc.stderr
    check = Check(spec, case={"mutant": mutant, "property": test_id})
    check.equal(proc.returncode, 1, "the property's exit code against the mutant (1: it failed)", out[-3000:])
    check.contains(out, ["PropertyFailure", phrase], "the property's failure (it must name the problem)")
