"""A training script that hangs is ERROR, exit 3, saying where it waited: the pool asks a hung
engine for its stacks (faulthandler, protocol.STACKS_SIGNAL) before it kills it, and the check
quotes the user's frame, in whichever thread holds it (a replica function's, in MirroredStrategy's
replica thread, before the main thread's). In the reference run (the check cannot go on: one line on stderr), under
a one-process spec and on one worker of a multi-worker spec (that spec's verdict). Not exit 2: a
hang is not input the check refused."""

from __future__ import annotations

import re
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from suite.harness.judging.judgment import Check
from tests.workloads.test_bad_input import check_cli
from tests.workloads.test_scripts import ENTRY

# test_scripts.ENTRY (the guide's custom loop) told when to hang: after its first step, always (the
# reference hangs), on a spec's engine (more than one virtual CPU), or on worker 1 of a cluster
HANG_WHEN = textwrap.dedent('''
    import argparse
    import json
    import os
    import threading

    parser = argparse.ArgumentParser()
    parser.add_argument("--hang", choices=["always", "replicas", "worker1", "replica_function"], required=True)
    args = parser.parse_args()
    DIVIDE = False


    def should_hang(in_replica_function=False):
        if (args.hang == "replica_function") != in_replica_function:
            return False
        if args.hang == "always":
            return True
        if args.hang in ("replicas", "replica_function"):
            return len(tf.config.list_logical_devices("CPU")) > 1
        return json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index") == 1


    def wait_forever():
        threading.Event().wait()  # the line the check must quote
''')
HANGS = ENTRY.replace("import tensorflow as tf\n", "import tensorflow as tf\n" + HANG_WHEN).replace(
    "strategy = tf.distribute.MirroredStrategy()",
    "strategy = tf.distribute.MultiWorkerMirroredStrategy() if 'TF_CONFIG' in os.environ else "
    "tf.distribute.MirroredStrategy()").replace(
    "    for inputs in data:\n        train(inputs)\n",
    "    for i, inputs in enumerate(data):\n        train(inputs)\n        if i == 0 and should_hang():\n"
    "            wait_forever()\n").replace(
    "        features, labels = inputs\n",
    "        features, labels = inputs\n        if should_hang(in_replica_function=True):\n"
    "            wait_forever()\n") + "\n\nmain()\n"
WAIT_LINE = next(n for n, line in enumerate(HANGS.splitlines(), 1) if "the line the check must quote" in line)
TIMEOUT = "20"  # seconds: --engine-timeout (a multi-worker collective's own timeout is 7 s shorter)

CASES = {  # --hang, spec, where the hang is reported
    "the reference": ("always", "mirrored:2", "stderr"),
    "a one-process spec": ("replicas", "mirrored:2", "report"),
    "worker 1 of a multi-worker spec": ("worker1", "multi_worker:2x1", "report"),
    "the replica function under mirrored:2": ("replica_function", "mirrored:2", "report"),
}


@pytest.fixture(scope="module")
def hung(tmp_path_factory) -> dict:
    """Each case's check, run at once (each waits out its engine's timeout, which they share)."""
    def run(case):
        hang, spec, _ = CASES[case]
        folder = tmp_path_factory.mktemp(case.replace(" ", "-"))
        (folder / "train.py").write_text(HANGS)
        return check_cli(folder, "train.py", "--strategies", spec, "--engine-timeout", TIMEOUT, "--", "--hang", hang)

    with ThreadPoolExecutor(max_workers=len(CASES)) as pool:
        return dict(zip(sorted(CASES), pool.map(run, sorted(CASES))))


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hanging_script_is_error_exit_3_quoting_the_users_frame(hung, case):
    hang, spec, where = CASES[case]
    done, left = hung[case]
    check = Check(f"suite.check train.py --strategies {spec} -- --hang {hang}")
    check.equal(done.returncode, 3, "exit status of a check whose script hangs", done.stderr[-2000:])
    frame = f"train.py:{WAIT_LINE} in wait_forever"
    if where == "stderr":
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        check.equal(len(errors), 1, "error lines on stderr", done.stderr[-2000:])
        check.contains(errors[0] if errors else "", ["the reference run did not finish", "where it waited", frame],
                       "the one line of a hung reference run")
    else:
        check.contains(done.stdout, [spec, "ERROR", "where it waited", frame], "the report of a spec that hung")
        if hang == "replica_function":  # the user's frame is in the replica's thread, not the main one
            # (MirroredStrategy runs its replica threads one at a time while tracing: one is blocked)
            check.that(re.search(rf"a replica thread: [^|;]*{re.escape(frame)} <- [^|;]*train.py:\d+ in step "
                                 r"<- [^|;]*\| the main thread: [^|;]*mirrored_run.py", done.stdout) is not None,
                       "the replica thread's frames", done.stdout[-2000:],
                       "quoted innermost first, named a replica thread, before the main thread's")
        if spec.startswith("multi_worker"):
            check.that(re.search(rf"worker 1: [^;]*{re.escape(frame)}", done.stdout) is not None,
                       "the hung worker's frame", done.stdout[-2000:], "named after 'worker 1:'")
    check.equal(left, [], "engine processes left running")
