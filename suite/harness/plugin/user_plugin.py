"""The pytest plugin a user's own test suite gets by installing tf-distribute-suite (entry point
``pytest11``, as ``tf_distribute_suite.harness.plugin.user_plugin``; pytest side, no TensorFlow):
the fixture ``distribution_check``.

    def test_my_loop_is_distribution_correct(distribution_check):
        distribution_check("mypackage.training:workload", strategies="mirrored:2,multi_worker:2x1")

It runs ``tf-distribute-check``'s comparison (suite/harness/loopcheck/usercheck.py) under the given specs
and fails the test with the same report (verdict table, first divergence, diagnosis) where the
command's exit status would not be 0; it returns the report otherwise. Engines start once per session and close at its end.

It imports the rest of the package only when a fixture is used: pytest loads entry points in
every session of an environment that has the package, the suite's own sessions included.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def distribution_check_pool():
    from ..pool.pool import EnginePool

    pool = EnginePool(call_timeout=300.0)
    yield pool
    pool.close()


@pytest.fixture
def distribution_check(distribution_check_pool):
    """``distribution_check(target, strategies=..., steps=3, global_batch=48, rtol=..., atol=...,
    accept_known=False, args=None)``: fail the test unless the workload (or the training script
    ``path/to/train.py`` or ``package.module:main``, run with its own ``args``) trains under every
    spec what it trains with no strategy (PASS); ``accept_known=True`` also lets specs where only
    known deviations of TensorFlow/Keras differ (DEVIATION, BLOCKED) pass."""
    from ...common.specs import DEFAULT_SPECS, SpecError, parse_specs
    from ..loopcheck import differential, scriptcheck, usercheck

    def check(target: str, strategies: str = ",".join(DEFAULT_SPECS), steps: int = 3, global_batch: int = 48,
              rtol: float = differential.RTOL, atol: float = differential.ATOL,
              accept_known: bool = False, args: list | None = None) -> usercheck.Report:
        __tracebackhide__ = True
        try:
            if scriptcheck.is_script(target) or scriptcheck.is_entry(distribution_check_pool, target):
                # a training script as written (path/to/train.py, or package.module:main), ``args`` its own
                report = scriptcheck.run(target, parse_specs(strategies), distribution_check_pool, args, steps, rtol,
                                         atol)
            else:
                report = usercheck.run(target, parse_specs(strategies), distribution_check_pool, steps, global_batch,
                                       rtol, atol)
        except (SpecError, usercheck.CheckInputError) as exc:
            raise pytest.UsageError(str(exc).splitlines()[0]) from None
        if report.exit_code(accept_known):
            pytest.fail(report.text(), pytrace=False)
        return report

    return check
