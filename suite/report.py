"""``python -m suite.report RESULTS -o report/``: conformance and step time across TensorFlow
versions from a results folder (pytest --results-dir, tox); the work is in
suite/harness/matrix_report.py. No TensorFlow."""

import sys

from suite.harness.matrix_report import main

if __name__ == "__main__":
    sys.exit(main())
