"""The check of a training script as the user wrote it (``python -m suite.check path/to/train.py
[-- ARGS]``; suite/harness/loopcheck/scriptcheck.py): TensorFlow's custom-training tutorial run
unchanged (examples/scripts/tutorial.py) under every one-process spec against one device told
the spec's replica count, and the scripts the check cannot use, each refused in one line."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from suite.common.specs import parse_spec
from suite.harness.judging.judgment import Check
from suite.harness.loopcheck import differential, render, scriptcheck
from suite.harness.loopcheck.causes import CAUSES
from tests.helpers import ROOT
from tests.workloads.test_bad_input import check_cli
from tests.workloads.test_examples import _applies, from_structure_alone, right, trimmed

TUTORIAL = str(ROOT / "examples" / "scripts" / "tutorial.py")
LAZY = "keras3-lazy-optimizer-slots-mirrored"
_CHECKERS: dict = {}


def checker(pool, args=()) -> scriptcheck.ScriptChecker:
    """One checker (its references, one per replica count) per argument list in this process."""
    key = tuple(args)
    if key not in _CHECKERS:
        _CHECKERS[key] = scriptcheck.ScriptChecker(pool, TUTORIAL, list(args))
    return _CHECKERS[key]


def synchronous_scripts(spec) -> bool:
    """Whether a synchronous script (the tutorial's: strategy.run in lockstep) is checked under ``spec``."""
    return scriptcheck.not_checked(spec) is None and spec.synchronous


# the one-process specs scripts are checked under; without --deep one of each kind and count
SCRIPT_SPECS = ("default", "one_device", "mirrored:1", "mirrored:2", "central_storage:2")


@pytest.mark.specs(synchronous_scripts, without_deep=trimmed(SCRIPT_SPECS))
def test_the_tutorial_as_written_is_blocked_only_where_keras_cannot_build_its_optimizer(any_spec, pool, suite_state):
    """The tutorial creates Adam() without building it. Where keras3-lazy-optimizer-slots-mirrored
    applies (Keras 3.5+, 2 or more local replicas over collectives) its first step raises: BLOCKED
    naming that entry, the build in the scope shown as the way around it, no cause of the script's;
    elsewhere (one replica, reduce_to_one, CentralStorage, other Keras) it trains as on one device."""
    v = checker(pool).check(any_spec)
    check = Check(any_spec)
    if _applies(LAZY, f"loop-check[{any_spec.text}]", suite_state.versions):
        check.equal((v.status, v.deviation[0] if v.deviation else None, v.diagnoses), ("BLOCKED", LAZY, []),
                    "the tutorial's verdict", render.details(v))
        check.that(CAUSES["lazy_optimizer_build"].fix in v.deviation[1], "the way around it",
                   v.deviation[1], "the optimizer built in the scope")
    else:
        check.that(right(v), "the tutorial's verdict", (v.status, v.deviations),
                   "PASS, or DEVIATION where a known deviation predicts every difference", render.details(v))
        check.equal(v.steps, 3, "steps compared")


@pytest.mark.specs(synchronous_scripts, without_deep=trimmed(SCRIPT_SPECS))
def test_the_built_tutorial_trains_as_on_one_device(any_spec, pool):
    """With ``--build-optimizer`` (Adam built in the scope) every one-process spec trains what one
    device trains: the same variables, optimizer slots, reported loss and metrics after each of 3
    steps (DEVIATION only where a recorded deviation predicts each difference)."""
    v = checker(pool, ["--build-optimizer"]).check(any_spec)
    check = Check(any_spec)
    check.that(right(v), "examples/scripts/tutorial.py -- --build-optimizer", (v.status, v.deviations),
               "PASS, or DEVIATION where a known deviation predicts every difference", render.details(v))
    check.equal(v.steps, 3, "steps compared")


def test_the_reference_is_told_the_specs_replica_count(pool):
    """The reference runs on one device, but the script reads the spec's num_replicas_in_sync: its
    global batch is 16 per replica times the spec's count, and the report says where it read it."""
    c = checker(pool, ["--build-optimizer"])
    check = Check("the script's reference")
    lines = (ROOT / "examples/scripts/tutorial.py").read_text().splitlines()
    reads = sorted(f"tutorial.py:{n}" for n, line in enumerate(lines, 1) if "strategy.num_replicas_in_sync)" in line
                   or line.endswith("strategy.num_replicas_in_sync"))
    check.equal(len(reads), 2, "lines of the tutorial that read num_replicas_in_sync", str(reads))
    for replicas in (1, 2, 3):
        ref = c.reference(*scriptcheck._reference_key(parse_spec(f"mirrored:{replicas}")))
        check.equal((ref.replicas, ref.facts.first_batch_rows), (1, 16 * replicas),
                    f"replicas and rows of the reference told {replicas}")
        check.equal(sorted(ref.facts.replica_reads), reads, "where the script read num_replicas_in_sync")
        check.equal(ref.facts.constructed, [["MirroredStrategy", ""]], "the strategies the script built")


UNUSABLE = {
    "no_strategy.py": ("""
        import tensorflow as tf
        x = tf.Variable(1.0)
        for batch in tf.data.Dataset.range(4):
            x.assign_add(1.0)
        """, "it constructed no tf.distribute strategy"),
    "no_distributed_dataset.py": ("""
        import tensorflow as tf
        strategy = tf.distribute.MirroredStrategy()
        with strategy.scope():
            x = tf.Variable(1.0)
        for batch in tf.data.Dataset.range(4):
            x.assign_add(1.0)
        """, "it drew no element from a distributed dataset"),
    "raises_first.py": ("""
        import tensorflow as tf
        strategy = tf.distribute.MirroredStrategy()
        raise FileNotFoundError("/data/train.tfrecord")
        """, "on one device (told 2 replicas), it raised FileNotFoundError before its first step at raises_first.py:4 "
            "(raise FileNotFoundError(\"/data/train.tfrecord\")): /data/train.tfrecord"),
    "exits_first.py": ("""
        import sys
        import tensorflow as tf
        strategy = tf.distribute.MirroredStrategy()
        sys.exit(3)
        """, "it exited with status 3 before its first step"),
    "nothing_changes.py": ("""
        import tensorflow as tf
        strategy = tf.distribute.MirroredStrategy()
        with strategy.scope():
            x = tf.Variable(1.0)
        for batch in strategy.experimental_distribute_dataset(tf.data.Dataset.range(8).batch(2)):
            pass
        """, "no variable changed in 3 steps on one device"),
    "coordinator.py": ("""
        import tensorflow as tf
        strategy = tf.distribute.MirroredStrategy()
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        """, "not checked under mirrored:2: the script trains through a ClusterCoordinator (a ParameterServerStrategy's), "
             "which runs on parameter_server specs only"),
    "serves.py": ("""
        import tensorflow as tf
        cluster = tf.train.ClusterSpec({"worker": ["localhost:1"], "ps": ["localhost:2"]})
        server = tf.distribute.Server(cluster, job_name="worker", task_index=0, protocol="grpc")
        server.join()
        """, "it serves as a worker or ps task (tf.distribute.Server.join): under the check only the coordinator's code "
             "runs"),
    "missing.py": (None, "script 'missing.py': no such file"),
}


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("scripts")
    for name, (source, _) in UNUSABLE.items():
        if source is not None:
            (path / name).write_text(textwrap.dedent(source))
    return path


@pytest.mark.parametrize("name", sorted(UNUSABLE))
def test_an_unusable_script_is_one_line_and_exit_2(scripts, name):
    """What the check cannot use is said in one line naming the script, exit 2, no engine left;
    the time each took is shown (the bound is a hang guard, not a performance claim)."""
    began = time.monotonic()
    done, left = check_cli(scripts, name, "--strategies", "mirrored:2")
    took = time.monotonic() - began
    check = Check(f"python -m suite.check {name}")
    check.equal(done.returncode, 2, "exit status", done.stderr[-600:])
    lines = done.stderr.strip().splitlines()
    check.equal(len(lines), 1, "stderr lines", done.stderr[-600:])
    check.contains(lines[0], [UNUSABLE[name][1]], "the error")
    check.equal(left, [], "engine processes alive")
    check.that(took < 60, "seconds to refuse it", round(took, 1), "well under a minute")


ENTRY = """
import numpy as np
import tensorflow as tf


def main():
    x = np.random.default_rng(0).normal(size=(96, 8)).astype(np.float32)
    y = (x[:, :2] * 2).astype(np.float32)
    strategy = tf.distribute.MirroredStrategy()
    batch = 16 * strategy.num_replicas_in_sync
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(2)])
        optimizer = tf.keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
    data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch))

    def step(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(labels - model(features)), axis=-1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch)
            if DIVIDE:
                loss = loss / strategy.num_replicas_in_sync
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    @tf.function
    def train(inputs):
        return strategy.reduce("SUM", strategy.run(step, args=(inputs,)), axis=None)

    for inputs in data:
        train(inputs)
"""


def test_an_entry_function_is_checked_as_a_script(tmp_path):
    """``package.module:main`` (a function that takes no argument) runs as the script's body would;
    ``package.module:factory`` (it takes the context) stays a workload. A right entry passes; one that
    divides the loss by the replica count read in the replica function (which the one-device reference
    answers with its own count, 1) fails, naming no cause and saying why."""
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "right.py").write_text("DIVIDE = False\n" + ENTRY)
    (tmp_path / "mypkg" / "divided.py").write_text("DIVIDE = True\n" + ENTRY)
    check = Check("python -m suite.check mypkg.right:main")
    done, left = check_cli(tmp_path, "mypkg.right:main", "--strategies", "mirrored:2")
    check.equal(done.returncode, 0, "exit status of the right entry", done.stdout[-1500:] + done.stderr[-600:])
    check.contains(done.stdout, ["script mypkg.right:main", "PASS: every spec trains what one device trains"],
                   "the report")
    check.equal(left, [], "engine processes alive")
    done, _ = check_cli(tmp_path, "mypkg.divided:main", "--strategies", "mirrored:2")
    check.equal(done.returncode, 1, "exit status of the entry dividing by the count", done.stdout[-1500:])
    check.contains(done.stdout, ["read strategy.num_replicas_in_sync inside the replica function (divided.py:",
                                 "no cause is named"], "the report")


def test_specs_scripts_are_not_checked_under_are_listed_not_errors():
    """A parameter-server spec beside a one-process one: its line says why the synchronous script is
    not checked there; the verdict and the exit status are the one-process spec's."""
    done, _ = check_cli(Path(TUTORIAL).parent, "tutorial.py", "--strategies", "mirrored:1,parameter_server:2w1ps",
                        "--", "--build-optimizer")
    check = Check("python -m suite.check tutorial.py")
    check.equal(done.returncode, 0, "exit status", done.stdout[-1500:] + done.stderr[-600:])
    check.contains(done.stdout, ["parameter_server:2w1ps: not checked: a parameter-server cluster trains only what a "
                                 "ClusterCoordinator schedules, and the script steps with strategy.run in lockstep",
                                 "PASS: every spec trains what one device trains"], "the report")


def _cases(name: str = "mistakes.py") -> tuple[str, ...]:
    """The cases of an example script, examples/scripts/mistakes.py by default (its CASES, read without
    importing it: it imports TensorFlow)."""
    tree = ast.parse((ROOT / "examples" / "scripts" / name).read_text())
    return next(ast.literal_eval(node.value) for node in tree.body
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "CASES")


@pytest.mark.specs(lambda spec: spec.kind in ("mirrored", "central_storage") and spec.replicas > 1,
                   without_deep=trimmed(("mirrored:2", "central_storage:2")))
@pytest.mark.parametrize("case", _cases())
def test_each_scripts_mistake_is_diagnosed_with_its_cause_only(spec, case, pool, suite_state):
    """examples/scripts/mistakes.py -- --case CASE: a case named after a catalogued cause is FAIL with
    that cause and no other; a case starting ``right_`` (a global batch the replicas do not divide, a
    loss summed by hand and divided by the global batch, a per-replica mean divided by the replica
    count) trains what one device trains (DEVIATION only where a recorded deviation predicts it).
    Keras 2's metrics refuse an update in the cross-replica context (their state is sync-on-read,
    SUM): there the metric fed one replica's value raises in its first step, a FAIL that names no
    cause (the raise says what is wrong)."""
    key = ("mistakes", case)
    if key not in _CHECKERS:
        _CHECKERS[key] = scriptcheck.ScriptChecker(pool, str(ROOT / "examples" / "scripts" / "mistakes.py"),
                                                   ["--case", case])
    v = _CHECKERS[key].check(spec)
    check = Check(spec)
    if case.startswith("right"):
        check.that(right(v) and not v.diagnoses, f"mistakes.py --case {case}", (v.status, v.deviations),
                   "PASS, or DEVIATION where a known deviation predicts every difference", render.details(v))
    elif case == "metric_from_one_replica" and suite_state.versions["keras"].startswith("2.") and v.error:
        check.equal((v.status, v.diagnoses), ("FAIL", []), f"mistakes.py --case {case} on Keras 2",
                    render.details(v))
        check.contains(v.error, ["does not support `assign_add` in cross-replica context"], "what raised")
    elif case in differential.FROM_STRUCTURE:
        from_structure_alone(check, v, case, [case], f"mistakes.py --case {case}")
    else:
        check.equal((v.status, [d.cause for d in v.diagnoses]), ("FAIL", [case]), f"mistakes.py --case {case}",
                    render.details(v))


GET_STRATEGY = ENTRY.replace("def main():", "def main():  # noqa").replace(
    "strategy = tf.distribute.MirroredStrategy()", "strategy = tf.distribute.get_strategy()").replace(
    "            if DIVIDE:\n                loss = loss / strategy.num_replicas_in_sync\n", "") + "\n\nmain()\n"


def test_a_script_on_get_strategy_gets_the_specs_strategy(pool, tmp_path):
    """A script that builds no strategy but takes ``tf.distribute.get_strategy()`` outside any scope
    gets the spec's (the one-device reference: the spec's replica count), and trains as on one device."""
    (tmp_path / "train.py").write_text(GET_STRATEGY)
    c = scriptcheck.ScriptChecker(pool, str(tmp_path / "train.py"))
    v = c.check(parse_spec("mirrored:2"))
    check = Check("mirrored:2")
    check.equal(v.status, "PASS", "a script on get_strategy()", render.details(v))
    ref = c.reference(*scriptcheck._reference_key(parse_spec("mirrored:2")))
    check.equal((ref.facts.constructed, ref.facts.first_batch_rows), ([["get_strategy", ""]], 32),
                "what the reference saw it build, and its global batch")


def test_runs_with_other_variables_are_said_apart_not_compared():
    """Runs are compared variable by variable in creation order: a spec's run that created another
    variable (or another order) is said so, naming the first one apart, instead of being compared."""
    from tests.units.test_differential import run

    ref = run()
    check = Check("scriptcheck._variables_apart")
    check.equal(scriptcheck._variables_apart(ref, run(replicas=2)), None, "the same variables")
    other = dataclasses.replace(run(replicas=2), names=["kernel", "seed_generator_state"])
    check.equal(scriptcheck._variables_apart(ref, other), "model variables: 2 here, 2 there; the first apart is #2: "
                "seed_generator_state here, bias there", "another variable")
    more = dataclasses.replace(run(replicas=2), optimizer_names=["iteration"])
    check.contains(scriptcheck._variables_apart(ref, more), ["optimizer variables: 1 here, 0 there",
                                                             "#1: iteration here, none there"], "one more")
    # tf-keras names a Sequential's layers with an outer scope in one build and not in another (issue 62, finding 7):
    # the same variables, in the same order and shapes
    prefixed = dataclasses.replace(run(replicas=2), names=[f"sequential/{n}" for n in ref.names])
    check.equal(scriptcheck._variables_apart(ref, prefixed), None, "the same variables under an outer scope's prefix")
    # ... and its optimizer's slots with the scope inside their names (Adam/m/sequential/dense/kernel)
    slots = dataclasses.replace(ref, optimizer_names=["iteration", "Adam/m/dense/kernel"])
    inner = dataclasses.replace(prefixed, optimizer_names=["iteration", "Adam/m/sequential/dense/kernel"])
    check.equal(scriptcheck._variables_apart(slots, inner), None, "the same slots under an inner scope")
    other_slot = dataclasses.replace(inner, optimizer_names=["iteration", "Adam/v/sequential/dense/kernel"])
    check.contains(scriptcheck._variables_apart(slots, other_slot), ["#2: Adam/v/sequential/dense/kernel here"],
                   "another slot")
    reshaped = dataclasses.replace(prefixed, initial=[np.zeros((7, 7)), *prefixed.initial[1:]])
    check.contains(scriptcheck._variables_apart(ref, reshaped), [f"#1: sequential/{ref.names[0]} here"],
                   "a variable of another shape")


def test_the_installed_command_runs_outside_the_checkout(tmp_path):
    """``python -m tf_distribute_suite.check`` of an editable install, run from a folder outside the
    checkout (``suite`` not importable there): the engines' replies name their package ``suite``,
    which the command's process maps onto its own modules (suite/layout.py), so a script checks as it
    does from the checkout instead of stopping with ModuleNotFoundError."""
    found = importlib.util.find_spec("tf_distribute_suite")
    if found is None or not str(found.origin).startswith(str(ROOT / "suite")):
        pytest.skip("this checkout is not installed editable in this interpreter (pip install -e .)")
    (tmp_path / "train.py").write_text((ROOT / "examples" / "scripts" / "gan.py").read_text())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PYTEST_XDIST_")}
    done = subprocess.run([sys.executable, "-m", "tf_distribute_suite.check", "train.py", "--strategies", "default",
                           "-q"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    check = Check("python -m tf_distribute_suite.check train.py, outside the checkout")
    check.equal(done.returncode, 0, "exit status", done.stdout[-1500:] + done.stderr[-1500:])
    check.contains(done.stdout, ["PASS: every spec trains what one device trains"], "the report")


NO_INPUT = """
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MirroredStrategy()
GLOBAL_BATCH_SIZE = 16 * strategy.num_replicas_in_sync
rng = np.random.default_rng(4)
x = rng.normal(size=(128, 6)).astype(np.float32)
y = x.sum(axis=1, keepdims=True)
dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH_SIZE))
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(1)])  # no Input
    optimizer = tf.keras.optimizers.SGD(0.05)


def train_step(inputs):
    features, labels = inputs
    with tf.GradientTape() as tape:
        per_example = tf.reduce_mean(tf.square(model(features, training=True) - labels), axis=1)
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH_SIZE)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function
def distributed_train_step(inputs):
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(train_step, args=(inputs,)), axis=None)


for batch in dataset:
    distributed_train_step(batch)
"""
BUILT_IN_THE_STEP = ("keras3-lazy-optimizer-slots-mirrored", "keras3-central-storage-variables-made-in-the-step")


@pytest.mark.specs(synchronous_scripts,
                   without_deep=trimmed(("default", "mirrored:2", "central_storage:2")))
def test_a_model_with_no_input_built_in_the_step(any_spec, pool, suite_state, tmp_path_factory):
    """A model with no Input, as TensorFlow's custom-training tutorial writes it, is built by its
    first call in the step: the check runs it on Keras 2 (whose unbuilt models refuse to list their
    variables) and Keras 3 alike; it trains as on one device, or is BLOCKED naming the entry where
    Keras 3 cannot make variables in the step (mirrored over collectives, central storage)."""
    key = ("no_input",)
    if key not in _CHECKERS:
        folder = tmp_path_factory.mktemp("no_input")
        (folder / "train.py").write_text(NO_INPUT)
        _CHECKERS[key] = scriptcheck.ScriptChecker(pool, str(folder / "train.py"))
    v = _CHECKERS[key].check(any_spec)
    check = Check(any_spec)
    ref = _CHECKERS[key].reference(*scriptcheck._reference_key(any_spec))
    check.equal(len(ref.facts.built_in_step), 4, "model variables made in the first step, said in the report",
                ref.facts.built_in_step)
    check.contains(" ".join(scriptcheck._script_notes(_CHECKERS[key])), ["made in the first step"], "the report's note")
    blocking = [e for e in BUILT_IN_THE_STEP if _applies(e, f"loop-check[{any_spec.text}]", suite_state.versions)]
    if blocking:
        check.equal((v.status, v.deviation[0] if v.deviation else None), ("BLOCKED", blocking[0]),
                    "a model built in the step", render.details(v))
    else:
        check.that(right(v) and not v.diagnoses, "a model built in the step", (v.status, v.deviations),
                   "PASS, or DEVIATION where a known deviation predicts every difference", render.details(v))
        # made with the reference's values at creation: a run seeded otherwise starts from them all the same
        c = scriptcheck.ScriptChecker(pool, _CHECKERS[key].target, seed=1)
        other = c._run(c.on(any_spec), init=ref.initial, init_names=ref.names, init_trainable=ref.trainable,
                       late_init=ref.facts.late_values)[0]
        check.equal((ref.facts.built_in_step_from_creation, other.facts.built_in_step_from_creation), (True, True),
                    "every variable made in the step read at its creation, in the reference and the spec's run")
        late = [i for i, name in enumerate(ref.names) if name in ref.facts.built_in_step]
        check.equal([np.array_equal(other.initial[i], ref.initial[i]) for i in late], [True] * len(late),
                    "each variable made in the step starts from the reference's value (a run with another seed)")


KERAS2_ONLY = """
import tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    optimizer = tf.keras.optimizers.legacy.SGD(0.1)  # Keras 2's legacy optimizers, gone in Keras 3
"""


def test_a_script_written_for_keras_2_is_told_the_env_to_use(tmp_path, suite_state):
    """On Keras 3 engines, a script that stops on what Keras 3 removed (here tf.keras.optimizers.legacy)
    gets one line naming its error and how to check it on a legacy-Keras env's engines."""
    if not suite_state.versions["keras"].startswith("3."):
        pytest.skip(f"Keras {suite_state.versions['keras']} has the legacy optimizers")
    (tmp_path / "train.py").write_text(KERAS2_ONLY)
    done, left = check_cli(tmp_path, "train.py", "--strategies", "mirrored:2")
    check = Check("python -m suite.check train.py")
    check.equal((done.returncode, len(done.stderr.strip().splitlines()), left), (2, 1, []),
                "exit status, stderr lines and engines left", done.stderr[-800:])
    check.contains(done.stderr, ["before its first step", "legacy", "TF_USE_LEGACY_KERAS=1",
                                 "--engine-python .tox/tf221-legacy/bin/python"], "the error and the env to use")


def test_a_replica_count_the_script_cannot_run_is_not_checked_the_others_are(tmp_path):
    """TensorFlow's distributed-training guide picks its learning rate from a table of global batch
    sizes (5, 10, 20): told 3 replicas the script raises before its first step on one device. The
    spec of that count gets a line saying why it is not checked; the others are checked (exit 0)."""
    source = GET_STRATEGY.replace("tf.distribute.get_strategy()", "tf.distribute.MirroredStrategy()").replace(
        "main()\n", "LEARNING_RATES_BY_REPLICAS = {1: 0.1, 2: 0.05}\n"
        "LEARNING_RATES_BY_REPLICAS[tf.distribute.MirroredStrategy().num_replicas_in_sync]\nmain()\n", 1)
    (tmp_path / "train.py").write_text(source)
    done, left = check_cli(tmp_path, "train.py", "--strategies", "mirrored:1,mirrored:3,mirrored:2")
    check = Check("python -m suite.check train.py")
    check.equal((done.returncode, left), (0, []), "exit status and engines left", done.stdout[-1500:] + done.stderr[-600:])
    check.contains(done.stdout, ["mirrored:3: not checked: on one device (told 3 replicas), it raised KeyError before "
                                 "its first step at train.py:", ": 3", "PASS: every spec trains what one device trains"],
                   "the report")


def test_a_check_that_checks_no_spec_is_no_pass(tmp_path):
    """Every spec given is one scripts are not checked under (here a GPU spec): the report lists each
    with why, and says nothing was checked, exit 3, with "passed" false in its JSON; no PASS and no
    exit 0, which would tell the user the script trains right where nothing ran."""
    out = tmp_path / "out.json"
    done, left = check_cli(tmp_path, str(ROOT / "examples" / "scripts" / "fit_guide.py"), "--strategies", "mirrored:gpus",
                           "--json", str(out))
    check = Check("python -m suite.check fit_guide.py --strategies mirrored:gpus")
    check.equal((done.returncode, left), (3, []), "exit status and engines left", done.stdout[-1500:] + done.stderr[-600:])
    check.contains(done.stdout, ["mirrored:gpus: not checked: scripts are not checked on GPU specs yet",
                                 "NOT CHECKED: no spec given was checked"], "the report")
    check.that("PASS" not in done.stdout, "the report", done.stdout[-800:], "no PASS anywhere")
    report = json.loads(out.read_text())
    check.equal((report["passed"], report["exit_code"], report["specs"]), (False, 3, []), "the JSON report")


# a right custom loop (the guide's, as ENTRY) that adds input noise of its own in the replica step: from a
# tf.random.Generator made in the scope, or from a stateful op (issue 62, finding 2: FAIL, no catalogued cause)
NOISE = {
    "generator": ("    gen = tf.random.Generator.from_seed(1)\n", "gen.normal(tf.shape(features))"),
    "stateful op": ("", "tf.random.normal(tf.shape(features), seed=1)"),
}


@pytest.mark.parametrize("draw", sorted(NOISE))
@pytest.mark.specs(lambda spec: spec.kind in ("one_device", "mirrored", "central_storage", "multi_worker"),
                   without_deep=trimmed(("one_device", "mirrored:2", "central_storage:2", "multi_worker:2x1")))
def test_a_script_with_random_draws_of_its_own_is_random_never_fail(any_spec, pool, tmp_path, draw):
    """One device and the spec's replicas cannot draw the same numbers (each replica draws for its own
    batch; a generator made in a strategy's scope gives each its own stream): where the runs differ the
    verdict is RANDOM, naming each random op with the script's line that draws it, never FAIL; where
    they agree, PASS. As the workload check does (test_examples)."""
    made, drawn = NOISE[draw]
    source = ("DIVIDE = False\n" + ENTRY + "\nmain()\n").replace(
        "        optimizer.build(model.trainable_variables)\n",
        "        optimizer.build(model.trainable_variables)\n" + made.replace("    ", "        ", 1)).replace(
        "        features, labels = inputs\n",
        f"        features, labels = inputs\n        features = features + 0.05 * {drawn}  # the draw\n")
    line = next(n for n, text in enumerate(source.splitlines(), 1) if "# the draw" in text)
    (tmp_path / "noise.py").write_text(source)
    v = scriptcheck.ScriptChecker(pool, str(tmp_path / "noise.py")).check(any_spec)
    check = Check(any_spec, case={"draw": draw})
    check.that(v.status in ("PASS", "RANDOM"), "the verdict of a right script with draws of its own", v.status,
               "RANDOM (or PASS where the runs agree)", render.details(v))
    if v.status == "RANDOM":
        check.contains(v.error, [f"at noise.py:{line}"], "where the verdict says the step draws")


# TensorFlow's distributed-training guide shows the default strategy with a variable that no training reads (issue 62,
# finding 3: "FAIL: model or optimizer created outside the strategy's scope" with every step agreeing)
DEMONSTRATED = ("    default = tf.distribute.get_strategy()  # the guide's cell on the default strategy\n"
                "    with default.scope():\n"
                "        print(tf.Variable(1.))\n")


@pytest.mark.specs(lambda spec: spec.kind in ("one_device", "mirrored", "central_storage", "multi_worker"),
                   without_deep=trimmed(("one_device", "mirrored:2", "central_storage:2", "multi_worker:2x1")))
def test_a_variable_the_training_never_touches_is_no_cause(any_spec, pool, tmp_path):
    """A script that also makes a variable under the default strategy's scope, as the guide demonstrates
    it, and never reads or writes it in training: that variable is not the training's, so no cause is
    named from it; the script trains as on one device (PASS, or DEVIATION where a known deviation predicts
    every difference)."""
    distributed = "    data = strategy.experimental_distribute_dataset("
    source = ("DIVIDE = False\n" + ENTRY + "\nmain()\n").replace(distributed, DEMONSTRATED + distributed)
    (tmp_path / "guide.py").write_text(source)
    v = scriptcheck.ScriptChecker(pool, str(tmp_path / "guide.py")).check(any_spec)
    check = Check(any_spec)
    check.that(right(v) and not v.diagnoses, "the verdict of a right loop beside a demonstration variable",
               (v.status, [d.cause for d in v.diagnoses]), "PASS, or DEVIATION where a known deviation predicts every "
               "difference, with no cause", render.details(v))
    check.that(not any("outside the strategy's scope" in n for n in v.notes), "the notes", v.notes,
               "none about the demonstration variable")


def test_a_cause_found_from_structure_is_a_note_where_every_step_agrees(pool, tmp_path):
    """A model and optimizer made outside the scope of a OneDeviceStrategy train what one device trains
    (every step agrees): the structure is said as a note with its fix, never a FAIL, since nothing the
    training computed differs here."""
    source = ("DIVIDE = False\n" + ENTRY + "\nmain()\n").replace("    with strategy.scope():\n", "    if True:\n")
    (tmp_path / "outside.py").write_text(source)
    v = scriptcheck.ScriptChecker(pool, str(tmp_path / "outside.py")).check(parse_spec("one_device"))
    check = Check("one_device")
    check.equal((v.status, v.diagnoses, v.agreed), ("PASS", [], 3), "the verdict where every step agrees",
                render.details(v))
    check.contains(" ".join(v.notes), ["model or optimizer created outside the strategy's scope",
                                       "every step agreed"], "the note")


# a custom loop that computes its accuracy by hand in the replica step and keeps what experimental_local_results gives
# of it (issue 62, finding 5: replica 0's accuracy kept as the epoch's, PASS on every spec)
HAND_ACCURACY = """
import numpy as np
import tensorflow as tf

rng = np.random.default_rng(6)
x = rng.normal(size=(128, 4)).astype(np.float32)
y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int32)
strategy = tf.distribute.MirroredStrategy()
GLOBAL = 16
data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL))
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    optimizer = tf.keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)


@tf.function
def step(batch):
    def replica(features, labels):
        with tf.GradientTape() as tape:
            logits = model(features)
            per_example = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        correct = tf.cast(tf.equal(tf.argmax(logits, axis=1, output_type=tf.int32), labels), tf.float32)
        return loss, tf.reduce_mean(correct)  # the replica's accuracy on its own examples
    losses, accuracy = strategy.run(replica, args=batch)
    return strategy.reduce("SUM", losses, axis=None), accuracy


epoch_accuracy = []
for batch in data:
    loss, accuracy = step(batch)
    epoch_accuracy.append(float(READ))
"""
READS = {"replica 0's": "strategy.experimental_local_results(accuracy)[0]",
         "the replicas' mean": 'strategy.reduce("MEAN", accuracy, axis=None)'}


@pytest.mark.parametrize("read", sorted(READS))
@pytest.mark.specs(lambda spec: spec.kind in ("one_device", "mirrored", "central_storage", "multi_worker"),
                   without_deep=trimmed(("one_device", "mirrored:2", "central_storage:2", "multi_worker:2x1")))
def test_a_value_read_of_one_replica_is_compared_and_named(any_spec, pool, tmp_path, read):
    """What a script reads by index of ``experimental_local_results`` is compared with what one device
    read there, as a metric: a hand-computed accuracy kept as replica 0's value is FAIL under several
    replicas, naming a metric fed one replica's value and replica 0's read; the same loop reading the
    replicas' mean (strategy.reduce) trains and reports as one device (PASS), and one replica's [0] is
    the whole (PASS on one_device)."""
    (tmp_path / "accuracy.py").write_text(HAND_ACCURACY.replace("READ", READS[read]))
    v = scriptcheck.ScriptChecker(pool, str(tmp_path / "accuracy.py")).check(any_spec)
    check = Check(any_spec, case={"read": read})
    if read == "replica 0's" and any_spec.replicas > 1:
        check.equal((v.status, [d.cause for d in v.diagnoses]), ("FAIL", ["metric_from_one_replica"]),
                    "the verdict of a loop that keeps replica 0's accuracy", render.details(v))
        check.contains(" ".join(line for d in v.diagnoses for line in d.evidence),
                       ["read [0] of experimental_local_results", "at accuracy.py:"], "the evidence")
    else:
        check.that(right(v) and not v.diagnoses, "the verdict of a loop that reads the whole", (v.status, v.deviations),
                   "PASS, or DEVIATION where a known deviation predicts every difference", render.details(v))
