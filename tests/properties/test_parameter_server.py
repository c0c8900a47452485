"""ParameterServerStrategy with a ClusterCoordinator: training equals the reference when the
steps are ordered, every scheduled step is applied exactly once when they are not, partitioned
variables reassemble, and num_replicas_in_sync / loss scaling follow the documentation
(reference/parameter_server.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from reference import distribute as ref
from reference import losses as ref_losses
from reference import model as ref_model
from reference import parameter_server as ref_ps
from reference.losses import Raises
from reference.rules import Rule
from suite.common.catalog import ADAPTIVE
from suite.common.given import Given
from suite.common.specs import parse_spec
from suite.harness.drawing import cases
from suite.harness.drawing.cases import ARCHS, arch_dict, training_cases
from suite.harness.judging.judgment import Check
from suite.harness.judging.quantity import Quantity

# where the variables live: ParameterServerStrategy's docstring
ON_PS = Rule("documented", "ParameterServerStrategy docstring: 'Variables are created on parameter servers and they are "
                           "read and updated by workers in each step'")
# each scheduled function runs once when no worker fails (these clusters' workers do not)
ONCE = Rule("documented", "ClusterCoordinator.schedule docstring: 'schedule guarantees that fn will be executed on a "
                          "worker at least once; it could be more than once if its corresponding worker fails'; join: "
                          "'Blocks until all the scheduled functions have finished execution'")
# what a Keras optimizer's step counter counts
ITERATIONS = Rule("documented", "the Keras 2.15 Optimizer.iterations docstring: 'The number of training steps this "
                                "optimizer has run. By default, iterations would be incremented by one every time "
                                "apply_gradients() is called'")
# reference/parameter_server.py's sources, for what no function of it states
ROUND_ROBIN = Rule("observed", "parameter_server_strategy_v2.py _create_variable_round_robin: '/job:ps/task:%d' % "
                               "(variable_count % num_ps), each shard of a partitioned variable a variable of its own")
ONE_REPLICA = Rule("observed", "parameter_server_strategy_v2.py _num_replicas_in_sync: 'self._num_gpus_per_worker or "
                               "1' (1 on CPU workers)")


def _modes(spec):
    """Pipelined (per-worker dataset, one join) equals the reference only with one worker."""
    return ["pipelined", "sequential"] if spec.workers == 1 else ["sequential"]


@pytest.mark.parametrize("optimizer", ["sgd", "sgd_momentum", "adam"])
@given(data=st.data())
def test_ordered_training_equals_the_reference(engines, ps_spec, optimizer, data):
    """Variables on the ps tasks, steps run by the workers: with the steps in order (one
    worker, or each step joined before the next) every step's loss and the final variables
    equal the reference loop with one replica (num_replicas_in_sync is 1 on CPU workers)."""
    spec, dtype = ps_spec, data.draw(cases.dtypes(), label="dtype")
    arch_name, params, steps = data.draw(training_cases(1, dtype), label="case")
    arch = ARCHS[arch_name]
    history = ref_model.train(arch, params, optimizer, steps, "global")
    assume(cases.well_conditioned(history, dtype, optimizer in ADAPTIVE))
    for mode in _modes(spec):
        result = engines.call(spec, "ps.train", arch=arch_dict(arch), optimizer=optimizer, dtype=dtype,
                              params=params, steps=steps, mode=mode)[0]
        check = Check(spec, dtype, {"arch": arch_name, "optimizer": optimizer, "mode": mode,
                                    "sizes": [s[2] for s in steps]}, replicas=1, rule=ref_model.train)
        for s, (got, want) in enumerate(zip(result.losses, history)):
            check.close(got, want["loss"], f"loss of scheduled step {s + 1} ({mode})", kind="trained")
        for v, (got, want) in enumerate(zip(result.params, history[-1]["params"])):
            check.close(got, want, f"variable {v} after {len(steps)} steps ({mode})", kind="trained", n_terms=4)
        check.equal(result.iterations, len(steps), f"optimizer.iterations after {len(steps)} scheduled steps ({mode})")
        check.that(all("/job:ps/" in d for d in result.devices), "devices of the model variables", result.devices,
                   "on the ps tasks", rule=ON_PS)


@pytest.mark.parametrize("optimizer", ["keras", "assign_sub"])
@given(steps=st.integers(1, 40), dtype=cases.dtypes(), lr_exp=st.integers(2, 5),
       c=st.lists(st.integers(-8, 8), min_size=1, max_size=4), data=st.data())
def test_every_scheduled_step_is_applied_exactly_once(engines, ps_spec, optimizer, steps, dtype, lr_exp, c, data):
    """Steps scheduled over all workers at once, in whatever order the coordinator runs them,
    on a loss whose gradient does not depend on the weights: the weights end exactly at
    w0 - steps * lr * c (dyadic numbers, so exact in float32 too), the step counter at
    ``steps``, and every RemoteValue is fetched."""
    w0 = np.asarray(data.draw(st.lists(st.integers(-16, 16), min_size=len(c), max_size=len(c)), label="w0"),
                    dtype) / 4
    c_arr = np.asarray(c, dtype) / 4
    lr = 2.0 ** -lr_exp
    r = engines.call(ps_spec, "ps.exactly_once", w0=w0, c=c_arr, lr=lr, steps=steps, optimizer=optimizer)[0]
    expected = ref_ps.weight_independent_steps(w0, c_arr, lr, steps)
    check = Check(ps_spec, dtype, {"optimizer": optimizer, "steps": steps, "lr": lr, "c": c_arr, "w0": w0}, rule=ONCE)
    check.equal(r.count, steps, "the step counter after the scheduled steps")
    check.equal(r.fetched, steps, "results fetched")
    got = np.asarray(r.w, np.float64)
    moved = (np.asarray(w0, np.float64) - got) / (lr * c_arr) if np.all(c_arr) else None
    check.exact(got, expected, "weights after the scheduled steps",
                f"as if {np.round(moved, 3).tolist()} steps were applied" if moved is not None else "")


@given(steps=st.integers(20, 60))
def test_optimizer_iterations_count_every_scheduled_step(engines, ps_spec, steps):
    """A Keras optimizer's ``iterations`` counts its applied steps (learning-rate schedules and
    Adam's bias correction read it): after ``steps`` steps scheduled over all workers at once
    it reads ``steps``, as the step counter variable does. Each step's worker and the value it
    wrote into iterations go to the race's signature (``given``), which excuses only a final value
    that those writes can leave."""
    w0 = np.zeros(2, "float32")
    r = engines.call(ps_spec, "ps.exactly_once", w0=w0, c=np.ones(2, "float32"), lr=0.25, steps=steps)[0]
    check = Check(ps_spec, "float32", {"steps": steps}, rule=ITERATIONS)
    hint = f"the step counter reads {r.count}, the weights moved {float(-r.w[0]) / 0.25:g} steps"
    if r.steps is not None:
        hint += f"; [worker, value written] per step: {r.steps}"
    check.equal(r.iterations, steps, Quantity.of("optimizer iterations", "optimizer.iterations after the scheduled steps"),
                hint, given=Given(steps=r.steps))
    check.equal(r.count, steps, "the step counter after the scheduled steps", hint, rule=ONCE)
    check.exact(r.w, (w0 - 0.25 * steps).astype("float32"), "the weights after the scheduled steps (loss c.w, lr 0.25)",
                hint, rule=ONCE)


@st.composite
def partition_cases(draw):
    rows = draw(st.integers(1, 12), label="rows")
    cols = draw(st.integers(1, 3), label="cols")
    dtype = draw(st.sampled_from(["float32", "float64", "int32"]), label="dtype")
    if draw(st.booleans(), label="fixed"):
        kind, params = "fixed", {"num_shards": draw(st.integers(1, 6), label="num_shards")}
    else:
        kind, params = "min_size", {"min_shard_bytes": 2 ** draw(st.integers(2, 9), label="log2 min_shard_bytes"),
                                    "max_shards": draw(st.integers(1, 6), label="max_shards")}
    value = (np.arange(rows * cols).reshape(rows, cols) * 3 - 7).astype(dtype)
    return value, kind, params


def _check_partition(engines, ps_spec, case):
    __tracebackhide__ = True
    value, kind, params = case
    r = engines.call(ps_spec, "ps.partition", value=value, kind=kind, params=params)[0]
    if kind == "fixed":
        n = ref_ps.fixed_shards(value.shape[0], params["num_shards"])
    else:
        n = ref_ps.min_size_shards(value.shape, value.dtype.itemsize, params["min_shard_bytes"], params["max_shards"])
    check = Check(ps_spec, case={"partitioner": kind, **params, "variable": value},
                  rule=ref_ps.fixed_shards if kind == "fixed" else ref_ps.min_size_shards)
    rows = ref_ps.shard_rows(value.shape[0], n)
    check.equal(r.rows, rows, "rows of each shard")
    first = r.ps_tasks[0]
    check.equal(r.ps_tasks, [(first + i) % ps_spec.ps for i in range(len(rows))], "ps task of each shard (round-robin)",
                rule=ROUND_ROBIN)
    for i, (got, want) in enumerate(zip(r.shards, ref_ps.shards(value, n))):
        check.exact(got, want, f"shard {i}", rule=ref_ps.shards)
    check.exact(r.whole, value, "the variable reassembled (whole)")
    check.exact(r.concat, value, "the shards concatenated in order")


@given(case=partition_cases())
def test_partitioned_variables_reassemble(engines, ps_spec, case):
    """A variable created under a FixedShardsPartitioner or MinSizePartitioner is cut along
    axis 0 into the reference's number of shards with the "div" row counts, shards go
    round-robin over the ps tasks, and shards concatenated in order (and the variable read
    as one tensor) give back the unpartitioned value."""
    _check_partition(engines, ps_spec, case)


TWO_PS = parse_spec("parameter_server:1w2ps")


@given(case=partition_cases())
def test_shards_go_round_robin_over_two_ps_tasks(engines, case):
    """With one ps task the round-robin placement cannot be seen (every shard is on task 0), so
    the same property also runs on parameter_server:1w2ps, whatever the selected specs: there
    consecutive shards alternate between the two tasks."""
    _check_partition(engines, TWO_PS, case)


@pytest.mark.parametrize("dtype", cases.DTYPES)
@pytest.mark.parametrize("weighting", ["none", "per_example"])
@pytest.mark.parametrize("reduction", ["sum", "sum_over_batch_size"])
@given(data=st.data())
def test_num_replicas_and_loss_scaling(engines, ps_spec, engine_versions, reduction, weighting, dtype, data):
    """num_replicas_in_sync is 1 on CPU workers (outside and inside the step), so
    compute_average_loss divides by the step's own batch (or the given global batch size),
    and a Keras loss reduces as it does for one replica in the installed generation."""
    n = data.draw(st.integers(1, 6), label="batch")
    per_example = data.draw(cases.floats(dtype, (n,), 0.0, 4.0), label="per-example losses")
    weights = data.draw(cases.floats(dtype, (n,), 0.0, 2.0), label="weights") if weighting == "per_example" else None
    gbs = data.draw(st.none() | st.integers(1, 12), label="global_batch_size")
    r = engines.call(ps_spec, "ps.loss_scaling", per_example=per_example, weights=weights,
                     global_batch_size=gbs, reduction=reduction)[0]
    check = Check(ps_spec, dtype, {"per_example": per_example, "weights": weights, "global_batch_size": gbs},
                  replicas=ref_ps.NUM_REPLICAS_IN_SYNC_CPU, rule=ref.compute_average_loss)
    check.equal(r.num_replicas_in_sync, ref_ps.NUM_REPLICAS_IN_SYNC_CPU,
                "num_replicas_in_sync of the strategy (CPU workers)", rule=ONE_REPLICA)
    check.equal(r.replica_context_replicas, ref_ps.NUM_REPLICAS_IN_SYNC_CPU,
                "num_replicas_in_sync in a scheduled step's replica context (CPU workers)", rule=ONE_REPLICA)
    check.close(r.compute_average_loss,
                ref.compute_average_loss(per_example, weights, gbs, num_replicas=ref_ps.NUM_REPLICAS_IN_SYNC_CPU),
                Quantity.of("compute_average_loss", "compute_average_loss in a scheduled step"
                            + " (with sample_weight)" * (weights is not None), sample_weight=weights is not None,
                            where="a scheduled step"),
                n_terms=n)
    expected = ref_losses.keras_loss_in_replica(per_example, reduction, engine_versions["keras"],
                                                ref_ps.NUM_REPLICAS_IN_SYNC_CPU, has_strategy=True)
    what = f"Keras MAE with reduction={reduction} in a scheduled step"
    if isinstance(expected, Raises):
        check.raises(r.keras_raised or r, expected, what, rule=ref_losses.keras_loss_in_replica)
        return
    check.returned(r.keras_raised or r, what, rule=ref_losses.keras_loss_in_replica)
    check.close(r.keras_loss, expected, what, n_terms=n, rule=ref_losses.keras_loss_in_replica)
