"""The engines' resource limits (suite/common/limits.py): the CPU time a call may use, and the output that says
a native allocation failed."""

from __future__ import annotations

from suite.common import limits
from suite.harness.judging.judgment import Check


def test_a_calls_cpu_time_is_the_engine_timeout_on_every_cpu_unless_asked():
    check = Check("limits.call_cpu")
    check.equal(limits.call_cpu(120.0, {}), 120 * limits.usable_cpus(), "the default: the timeout on every CPU")
    check.equal(limits.call_cpu(2.5, {}), -(-2.5 * limits.usable_cpus() // 1), "a fraction of a second rounds up")
    check.equal(limits.call_cpu(120.0, {limits.CPU_ENV: "8"}), 8, "TFDS_ENGINE_CPU")
    check.equal(limits.call_cpu(120.0, {limits.CPU_ENV: "0"}), 0, "no limit")


def test_the_last_line_that_says_an_allocation_failed_is_found_and_no_other():
    check = Check("limits.allocation_failed")
    aborted = "Epoch 1/3\nLLVM ERROR: pthread_create failed: Resource temporarily unavailable"
    check.equal(limits.allocation_failed(aborted), "LLVM ERROR: pthread_create failed: Resource temporarily unavailable",
                "TensorFlow's abort at the limit (TF 2.12, 2.15, 2.21)")
    check.equal(limits.allocation_failed("terminate called after throwing an instance of 'std::bad_alloc'\n"
                                         "  what():  std::bad_alloc"), "what():  std::bad_alloc", "C++'s bad_alloc")
    check.equal(limits.allocation_failed("Segmentation fault\nloss 0.25"), None, "a crash that does not say memory")
