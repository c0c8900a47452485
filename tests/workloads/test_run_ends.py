"""A checked script's run ends where the check says (issue 63): no code of the script's runs after the last
step compared, whatever follows it (examples/scripts/zoo/fit_then.py: a fit under MirroredStrategy, then the
Keras tutorial's load_weights of its checkpoint, code that raises, a 40 GB allocation, an hour's wait, a
second training, a callback of the script's own at the epoch's end, a Sequence's fit), on Keras 3 here and on
tf-keras engines in test_other_versions.py; where a script raises, the report names its line; and an engine
that allocates beyond its memory limit ends as ERROR naming memory."""

from __future__ import annotations

import re

import pytest

from suite.common.specs import parse_spec
from suite.harness.judging.judgment import Check
from suite.harness.loopcheck import render
from suite.harness.loopcheck.usercheck import CheckInputError
from tests.helpers import ROOT
from tests.workloads.test_bad_input import check_cli
from tests.workloads.test_cluster_scripts import checker
from tests.workloads.test_examples import right

FIT_THEN = ROOT / "examples" / "scripts" / "zoo" / "fit_then.py"
CASES = ("load_weights", "raises", "allocates", "hangs", "second_fit", "epoch_end", "sequence")


def judged(v, check, case: str) -> None:
    check.that(right(v) and not v.diagnoses, f"fit_then.py --case {case}", (v.status, v.error, v.deviations),
               "PASS, or DEVIATION where a known deviation predicts every difference: what follows the steps "
               "compared never ran", render.details(v))
    check.equal(v.steps, 3, "steps compared")


@pytest.mark.parametrize("case", CASES)
def test_no_code_of_the_script_runs_after_the_last_step_compared(pool, case):
    """On TF 2.21 / Keras 3 under mirrored:2: fit ends at the last step compared, before its epoch's end
    (the script's callbacks, its ModelCheckpoint), and the run with it, so what the script does next (the
    tutorial's load_weights, a raise, an allocation beyond the machine, an hour's wait, a second fit) never
    runs. On today's main each but the second fit ended as an error or an engine's timeout."""
    spec = parse_spec("mirrored:2")
    judged(checker(pool, FIT_THEN, ["--case", case]).check(spec), Check(spec, case={"case": case}), case)


RAISES_IN_A_CALLBACK = '''
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")


class Stops(tf.keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == 1:
            raise RuntimeError("the script's callback at batch 1")


model.fit(np.ones((32, 3), np.float32), np.zeros((32, 1), np.float32), batch_size=8, epochs=1, verbose=0,
          callbacks=[Stops()])
'''


def test_a_raise_is_reported_with_its_step_and_the_scripts_line(pool, tmp_path):
    """A script whose own callback raises as fit's second batch begins: the report says step 2 (the batch that
    began, not the one before it) and the script's line, here where one device raises too."""
    path = tmp_path / "raises_in_a_callback.py"
    path.write_text(RAISES_IN_A_CALLBACK)
    with pytest.raises(CheckInputError) as info:
        checker(pool, path).check(parse_spec("mirrored:2"))
    Check("default").contains(str(info.value), ["step 2 raised RuntimeError at raises_in_a_callback.py:14 "
                                                "(raise RuntimeError(\"the script's callback at batch 1\"))"],
                              "the report of the raise")


# the scripts below: a MirroredStrategy, a variable in its scope and a distributed dataset, then a loop of their own
PROLOGUE = '''
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    w = tf.Variable(1.0)
data = strategy.experimental_distribute_dataset(tf.data.Dataset.range(64).batch(8))
'''
ALLOCATES = PROLOGUE + '''kept = []
for x in data:
    kept.append(np.ones((GIB_PER_STEP << 27,), np.float64))
    strategy.run(lambda x: w.assign_add(tf.cast(tf.reduce_sum(x), tf.float32)), args=(x,))
'''


def one_line_error(tmp_path, name: str, script: str, *args: str, status: int = 3, env: dict | None = None) -> str:
    """The check of ``script`` (written to ``tmp_path/name``) with ``args``, checked to end with exit ``status``
    and one line on stderr, no engine left: that stderr."""
    (tmp_path / name).write_text(script)
    done, left = check_cli(tmp_path, name, *args, env=env)
    Check(f"python -m suite.check {name} {' '.join(args)}", case=env).equal(
        (done.returncode, len(done.stderr.strip().splitlines()), left), (status, 1, []),
        "exit status, stderr lines and engines left", done.stderr[-800:])
    return done.stderr


@pytest.mark.parametrize("gib,limit", [(40, None), (1, "3G")], ids=["40GiB-at-once", "1GiB-a-step-under-3G"])
def test_an_allocation_beyond_an_engines_memory_ends_as_error_naming_memory(tmp_path, gib, limit):
    """A script that allocates 40 GiB in its first step (the machine has less), or keeps 1 GiB more each step
    under --engine-memory 3G (where the host's OOM killer would act at the machine's memory): the engine's own
    limit (RLIMIT_DATA, suite/common/limits.py) refuses the allocation in the script's step, and the check
    ends as ERROR (exit 3) in one line naming memory, the limit, the step and the script's line, with no engine
    left. On today's main the first was the script's MemoryError reported as its input (exit 2), the second
    unbounded."""
    script = ALLOCATES.replace("GIB_PER_STEP", str(gib))
    stderr = one_line_error(tmp_path, "allocates.py", script, "--strategies", "mirrored:2",
                            *(["--engine-memory", limit] if limit else []))
    line = next(n for n, text in enumerate(script.splitlines(), 1) if "kept.append(" in text)
    check = Check("python -m suite.check allocates.py", case={"GiB a step": gib, "--engine-memory": limit})
    check.contains(stderr, ["the engine ran out of memory", "allocated beyond its memory limit",
                            "3.0 GiB" if limit else "GiB (TFDS_ENGINE_MEMORY, --engine-memory)",
                            f"at allocates.py:{line} (kept.append(", "MemoryError"], "the error")
    check.that(re.search(r"step \d+ allocated beyond", stderr) is not None, "the step named", stderr[-400:],
               "step N allocated beyond ...")


def test_an_engine_memory_the_check_cannot_read_is_one_line(tmp_path):
    stderr = one_line_error(tmp_path, "allocates.py", ALLOCATES.replace("GIB_PER_STEP", "1"), "--engine-memory",
                            "lots", status=2)
    Check("python -m suite.check --engine-memory lots").contains(stderr, ["engine memory 'lots'", "8G, 512M"],
                                                                 "the error")


def test_a_runs_progress_says_its_step_on_stderr_never_in_json_or_with_q(tmp_path):
    """While the reference and a spec run (here shown from their first second: TFDS_PROGRESS_AFTER=0), the
    check's stderr says which step each is at, as its engine reports it; with --json - stdout stays one JSON
    document, and -q says nothing. On today's main nothing showed until a spec had finished."""
    import json

    from tests.workloads.test_scripts import ENTRY

    (tmp_path / "train.py").write_text("DIVIDE = False\n" + ENTRY + "\n\nmain()\n")
    check = Check("python -m suite.check train.py --strategies mirrored:2 --json -")
    for quiet in (False, True):
        done, left = check_cli(tmp_path, "train.py", "--strategies", "mirrored:2", "--json", "-", quiet=quiet,
                               env={"TFDS_PROGRESS_AFTER": "0"})
        check.equal((done.returncode, left), (0, []), "exit status and engines left", done.stderr[-800:])
        check.equal([s["status"] for s in json.loads(done.stdout)["specs"]], ["PASS"], "the JSON report on stdout")
        lines = re.findall(r"^(reference \(one device, told 2 replicas\)|mirrored:2): step (\d) of 3 \(\d+ s\)$",
                           done.stderr, re.MULTILINE)
        want = [] if quiet else [(who, str(k)) for who in ("reference (one device, told 2 replicas)", "mirrored:2")
                                 for k in (1, 2, 3)]
        check.equal(sorted(set(lines)), sorted(want), f"the progress lines{' with -q' if quiet else ''}",
                    done.stderr[-1500:])


FILLS = PROLOGUE + '''kept = []
for x in data:
    try:
        while True:  # every MiB the process may map
            kept.append(np.empty(1 << 20, np.uint8))
    except MemoryError:
        pass
    more = tf.data.Dataset.range(100).map(lambda v: v * 2, num_parallel_calls=8)  # threads of TensorFlow's own
    strategy.run(lambda x: w.assign_add(tf.cast(tf.reduce_sum(x), tf.float32)), args=(x,))
    w.assign_add(float(sum(int(v) for v in more)))
'''


def test_an_abort_inside_tensorflow_at_the_memory_limit_is_error_naming_memory(tmp_path):
    """A script that keeps every MiB its engine may map, then iterates a dataset whose map runs on threads of
    TensorFlow's: TensorFlow cannot map a thread's stack and aborts the process ("LLVM ERROR: pthread_create
    failed", SIGABRT; measured on TF 2.21). The check ends as ERROR (exit 3, one line) naming memory, the limit
    and the step the run was at, quoting that output. On today's main the line said only SIGABRT."""
    stderr = one_line_error(tmp_path, "fills.py", FILLS, "--strategies", "mirrored:2", "--engine-memory", "4G")
    Check("python -m suite.check fills.py --engine-memory 4G").contains(
        stderr, ["the reference run did not finish", "SIGABRT", "it ran out of memory at step 1 of 3",
                 "a native allocation failed at its memory limit, 4.0 GiB", "pthread_create failed"], "the error")


SPINS = PROLOGUE + '''for i, x in enumerate(data):
    strategy.run(lambda x: w.assign_add(tf.cast(tf.reduce_sum(x), tf.float32)), args=(x,))
    while i == 1:  # step 2 computes for ever
        pass
'''


def test_a_call_beyond_its_cpu_time_ends_as_error_naming_cpu_time(tmp_path):
    """A script that computes for ever in its second step, its engines' CPU time per call at 8 s (TFDS_ENGINE_CPU;
    by default the engine timeout on every CPU, which the pool's deadline meets first): the kernel ends the
    engine (SIGXCPU) and the check ends as ERROR (exit 3, one line) naming CPU time, the limit and the step, long
    before the engine timeout (120 s), with no engine left and no core file. On today's main nothing bounded an
    engine's CPU time but the pool's deadline."""
    stderr = one_line_error(tmp_path, "spins.py", SPINS, "--strategies", "mirrored:2", env={"TFDS_ENGINE_CPU": "8"})
    check = Check("TFDS_ENGINE_CPU=8 python -m suite.check spins.py")
    check.contains(stderr, ["the reference run did not finish", "SIGXCPU",
                            "it used more CPU time than its limit at step 2 of 3: 8 s in one call"], "the error")
    check.equal(sorted(p.name for p in tmp_path.iterdir()), ["spins.py"], "files left beside the script")
