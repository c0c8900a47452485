"""Parameter-server training scripts, checked unchanged (suite/harness/loopcheck/scriptcheck.py):
TensorFlow's parameter-server tutorial's custom loop (examples/scripts/parameter_server.py: an
in-process cluster, a ClusterCoordinator, per-worker datasets) runs on the spec's cluster with each
scheduled closure joined before the next, and the one-device reference runs each closure on the
iterator of the worker that ran it there; a synchronous script is not checked on a parameter-server
spec, nor a parameter-server script on a synchronous one."""

from __future__ import annotations

import textwrap

import pytest

from suite.common.specs import parse_spec
from suite.harness.judging.judgment import Check
from suite.harness.loopcheck import render, scriptcheck
from tests.helpers import ROOT
from tests.workloads.test_cluster_scripts import checker

SCRIPTS = ROOT / "examples" / "scripts"


def test_the_parameter_server_tutorials_loop_trains_as_on_one_device(ps_spec, pool):
    """The tutorial's loop (examples/scripts/parameter_server.py) builds its own in-process cluster,
    a partitioned ParameterServerStrategy and a ClusterCoordinator; under the check its strategy
    and coordinator are the spec's, its servers are not started, and every variable and the
    optimizer's state after each scheduled step equal one device's (PASS). Its unseeded shuffle
    (which each worker would draw in its own order) gets one seed on both sides, and the report
    says so, and that its partitioner was not applied. Under a synchronous spec it is not checked,
    saying why."""
    spec = ps_spec
    c = checker(pool, SCRIPTS / "parameter_server.py")
    v = c.check(spec)
    check = Check(spec, case={"script": "parameter_server.py"})
    check.equal((v.status, v.diagnoses, v.agreed), ("PASS", [], c.steps), "the tutorial's verdict and steps agreed",
                render.details(v))
    ref = c.reference(*scriptcheck._reference_key(spec))
    check.equal((ref.facts.step_mode, ref.facts.closure_workers), ("schedules", [0, 1, 0]),
                "how the reference's steps were told apart, and the workers of its closures (round robin)")
    check.equal(sorted(ref.facts.seeded_shuffles), ["parameter_server.py:95"],
                "where the unseeded shuffles given a seed were made (one, the same on both sides: the PASS above)")
    notes = " ".join(scriptcheck._script_notes(c))
    check.contains(notes, ["steps by the closures it schedules on its ClusterCoordinator",
                           "unseeded shuffles (parameter_server.py:95) were given a seed",
                           "variable_partitioner shards the spec's strategy's variables"], "the report's notes")
    with pytest.raises(scriptcheck.NotCheckedHere) as info:
        c.check(parse_spec("mirrored:2"))
    check.contains(str(info.value), [scriptcheck.OTHER_KIND["coordinated"]], "why a synchronous spec does not run it")


COUNTER = """
import tensorflow as tf

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    total = tf.Variable(0.0)


def dataset_fn(context):
    return tf.data.Dataset.range(1000).map(lambda i: tf.cast(i, tf.float32)).batch(1)


@tf.function
def per_worker_dataset_fn():
    return strategy.distribute_datasets_from_function(dataset_fn)


iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))


@tf.function
def step(iterator):
    def replica_fn(x):
        total.assign_add(tf.reduce_sum(x) + 1.0)
        return tf.reduce_sum(x)
    return strategy.run(replica_fn, args=(next(iterator),))


for _ in range({steps}):
    coordinator.schedule(step, args=(iterator,))
coordinator.join()
"""
STEPS = 8


def drawn(order: list) -> list:
    """What each step's closure draws where each worker's iterator yields the dataset from its
    start (ClusterCoordinator.create_per_worker_dataset: a dataset per worker): the number of earlier
    closures on the same worker."""
    return [float(order[:k].count(w)) for k, w in enumerate(order)]


def test_each_closure_draws_from_the_iterator_of_the_worker_that_ran_it(ps_spec, pool, tmp_path):
    """A script whose closure returns the element it draws (0, 1, 2, ... on each worker) and adds it
    to a variable: on the cluster, each step's element is the count of earlier closures on its
    worker, by the worker the engine saw run it; the reference, given that order, draws the same,
    and given other orders (all on worker 0; round robin) draws what those imply; the verdict is
    PASS."""
    spec = ps_spec
    path = tmp_path / "counter.py"
    path.write_text(textwrap.dedent(COUNTER.replace("{steps}", str(STEPS))))
    c = scriptcheck.ScriptChecker(pool, str(path), steps=STEPS)
    v = c.check(spec)
    check = Check(spec, case={"steps": STEPS})
    check.equal(v.status, "PASS", "the verdict", render.details(v))
    key = scriptcheck._reference_key(spec)
    ref = c.reference(*key)
    run = c._run(spec, init=ref.initial, init_names=ref.names, init_trainable=ref.trainable)[0]
    order = run.facts.closure_workers
    check.equal(sorted(set(order)) <= list(range(spec.workers)) and len(order) == STEPS, True,
                "every step's closure ran on a worker of the spec", str(order))
    check.equal([s.loss for s in run.steps], drawn(order), f"the elements the cluster's closures drew (order {order})")
    for given in (order, [0] * STEPS, [k % spec.workers for k in range(STEPS)]):
        replayed = c.replay(key, ref, given)
        check.equal((replayed.facts.closure_workers, [s.loss for s in replayed.steps]), (given, drawn(given)),
                    f"the reference's workers and elements given the order {given}")
