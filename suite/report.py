"""``python -m suite.report`` (installed: ``tf-distribute-report``): the reports, pytest side, no
TensorFlow. Given a results folder (``--results-dir``, tox; one sub-folder per TensorFlow and
Keras), conformance and step time across versions (suite/harness/reporting/across_versions.py);
given result files (pytest-benchmark JSON, JUnit XML), one run's report
(suite/harness/reporting/run_report.py). Either writes ``report.md`` and plots to ``-o DIR``.
This module is the command alone: its parsers, one line and exit 2 for input the report cannot
use; the reporting modules never see argparse."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .harness.judging import deviations
from .harness.reporting import across_versions, measured, results_dir, run_report
from .harness.reporting.benchmark_results import ReportError

_TAKES_VALUE = {"-o", "--output", "--baseline", "--record"}


def _one_run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m suite.report",
                                     description=run_report.__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path,
                        help="pytest-benchmark JSON (the first is the baseline) and/or JUnit XML files")
    parser.add_argument("-o", "--output", type=Path, required=True, help="folder for report.md and the plots")
    parser.add_argument("--noise", type=float, default=None,
                        help="also mark results within noise whose medians differ by at most this fraction "
                             "(the machine's run-to-run variation, e.g. 0.25). Default: measured from files "
                             "of the same TF and Keras versions where given (an A/A pair), else 0")
    return parser


def _across_versions_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m suite.report", description=across_versions.__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="the results folder (pytest --results-dir, tox)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="folder for report.md and the plots")
    parser.add_argument("--baseline", default=None, help="the TensorFlow version the step times are compared with "
                                                         "(default: the newest)")
    parser.add_argument("--record", type=Path, default=None, metavar="FILE",
                        help="also add each conformance run of RESULTS to the measured runs FILE "
                             "(docs/measured_runs.json: what the known-deviations file's ranges must agree with)")
    return parser


def one_run(argv) -> int:
    """The report of result files (run_report.write_report)."""
    parser = _one_run_parser()
    args = parser.parse_args(argv)
    if args.noise is not None and not 0 <= args.noise < 1:
        parser.error(f"--noise {args.noise}: a fraction from 0 to 1")
    missing = [str(p) for p in args.files if not p.exists()]
    if missing:  # one line, like every other input the report cannot use
        print(f"suite.report: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        report = run_report.write_report(args.files, args.output, args.noise)
    except ReportError as exc:
        print(f"suite.report: {exc}", file=sys.stderr)
        return 2
    print(report)
    return 0


def across(argv) -> int:
    """The report of a results folder (across_versions.write), and its runs recorded with --record."""
    parser = _across_versions_parser()
    args = parser.parse_args(argv)
    if not args.results.is_dir():
        parser.error(f"no such folder: {args.results}")
    try:
        if args.record:
            for run in measured.record(args.results, args.record, deviations.load()):
                print(f"recorded TF {run['tensorflow']} / Keras {run['keras']} ({run['profile']}): {run['items']}")
        path = across_versions.write(args.results, args.output, args.baseline)
    except (ReportError, results_dir.FolderError) as exc:
        print(f"suite.report: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


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
        return one_run(argv)
    return across(argv)


if __name__ == "__main__":
    sys.exit(main())
