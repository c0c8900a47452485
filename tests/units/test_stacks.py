"""Where a hung engine waited (suite/harness/pool/stacks.py): from a faulthandler dump, the user's
frames in every thread that holds one, innermost first, replica threads named, the main thread last."""

from __future__ import annotations

from suite.harness.judging.judgment import Check
from suite.harness.pool import stacks

SITE = "/venv/lib/python3.11/site-packages"
REPLICA = f'''Thread 0x00007f0000000001 (most recent call first):
  File "/home/u/train.py", line 27 in wait_forever
  File "/home/u/train.py", line 44 in step
  File "{SITE}/tensorflow/python/autograph/impl/api.py", line 643 in wrapper
  File "{SITE}/tensorflow/python/distribute/mirrored_run.py", line 403 in run
  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap_inner
'''
IDLE = '''Thread 0x00007f0000000003 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
'''
MAIN = f'''Current thread 0x00007f0000000000 (most recent call first):
  File "{SITE}/tensorflow/python/distribute/mirrored_run.py", line 226 in _call_for_each_replica
  File "/tmp/x/__autograph_generated_file04fs5w62.py", line 14 in tf__train
  File "{SITE}/tensorflow/python/autograph/impl/api.py", line 439 in converted_call
  File "/home/u/train.py", line 58 in main
  File "/work/suite/engine/worker.py", line 80 in main
'''


def test_the_users_frames_in_replica_threads_come_before_the_main_threads():
    """Two replica threads blocked at the same line are quoted once with their count; a thread with
    no frame of the user's is left out; autograph's generated module is not the user's frame."""
    got = stacks.waiting_frames(REPLICA + REPLICA.replace("01 (", "02 (") + IDLE + MAIN)
    want = ("2 replica threads: /home/u/train.py:27 in wait_forever <- /home/u/train.py:44 in step "
            "<- tensorflow/python/autograph/impl/api.py:643 in wrapper"
            " | the main thread: tensorflow/python/distribute/mirrored_run.py:226 in _call_for_each_replica "
            "<- /home/u/train.py:58 in main")
    Check("stacks.waiting_frames").equal(got, want, "where a process with blocked replica threads waited")


def test_a_process_whose_only_user_frames_are_the_main_threads_quotes_that_thread_alone():
    got = stacks.waiting_frames(IDLE + MAIN)
    Check("stacks.waiting_frames").equal(
        got, "tensorflow/python/distribute/mirrored_run.py:226 in _call_for_each_replica <- /home/u/train.py:58 in main",
        "where a process waited in its main thread")
