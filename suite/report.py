"""``python -m suite.report`` (installed: ``tf-distribute-report``): the reports, pytest side, no
TensorFlow. Given a results folder (``--results-dir``, tox; one sub-folder per TensorFlow and
Keras), conformance and step time across versions (suite/harness/reporting/across_versions.py);
given result files (pytest-benchmark JSON, JUnit XML), one run's report
(suite/harness/reporting/run_report.py). Either writes ``report.md`` and plots to ``-o DIR``."""

from __future__ import annotations

import os
import sys

from .harness.reporting import across_versions, run_report

_TAKES_VALUE = {"-o", "--output", "--baseline", "--record"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    skip, first = False, None
    for arg in argv:
        if skip:
            skip = False
        elif arg in _TAKES_VALUE:
            skip = True
        elif not arg.startswith("-"):
            first = arg
            break
    if first is not None and not os.path.isdir(first):
        return run_report.main(argv)
    return across_versions.main(argv)


if __name__ == "__main__":
    sys.exit(main())
