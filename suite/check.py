"""``python -m suite.check`` (installed: ``tf-distribute-check``): the command that checks a training
loop or script under each tf.distribute strategy spec against itself with no strategy (pytest side,
no TensorFlow). This module is the command alone: it builds the parser, turns the options into
specs, maps input errors to one line and exit 2 (the library's exit statuses otherwise,
usercheck.EXIT), prints or writes the report. The checks themselves (suite/harness/loopcheck/:
usercheck.run for a workload factory, scriptcheck.run for a script, upgrade.run across versions)
never see argparse."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from .common import files, limits
from .common.specs import DEFAULT_SPECS, SpecError, parse_specs
from .harness.loopcheck import differential, scriptcheck, upgrade, usercheck
from .harness.loopcheck.usercheck import EXIT, CheckEngineError, CheckInputError
from .harness.pool import agent, interrupts
from .harness.pool.pool import EnginePool


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m suite.check", usage="%(prog)s [options] SCRIPT.py|package.module:factory [-- ARGS]",
        epilog="ARGS after -- are a script's own arguments (its sys.argv[1:]).",
        description="Check that a training loop trains the same model under each tf.distribute strategy spec as "
                    "with no strategy on the global batch, and diagnose where it does not.")
    p.add_argument("workload", help="a training script (path/to/train.py, run unchanged) or a workload factory, "
                                    "package.module:factory (see README and docs/check.md)")
    p.add_argument("--strategies", default=",".join(DEFAULT_SPECS),
                   help="comma-separated strategy specs (default: every default spec)")
    p.add_argument("--steps", type=int, default=3, help="steps to train and compare (default 3)")
    p.add_argument("--global-batch", type=int, default=48, help="the global batch size (default 48)")
    p.add_argument("--rtol", type=float, default=differential.RTOL,
                   help=f"relative tolerance, of each variable's change since the start (default {differential.RTOL:g})")
    p.add_argument("--atol", type=float, default=differential.ATOL,
                   help=f"absolute tolerance per element (default {differential.ATOL:g})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="FILE", help="also write the verdicts as JSON to FILE ('-': stdout)")
    p.add_argument("--engine-python", default=None, help="the interpreter whose TensorFlow runs the engines")
    p.add_argument("--cluster-agents", default=os.environ.get("TFDS_CLUSTER_AGENTS"), metavar="HOST:PORT,...",
                   help="the engine agents of a real cluster, for the 'cluster' spec (docs/running.md, 'A real cluster')")
    p.add_argument("--engine-timeout", type=float, default=300.0, help="seconds an engine call may take")
    p.add_argument("--engine-memory", default=None, metavar="SIZE",
                   help="memory each engine process may allocate (8G, 512M, a share of the machine's like 0.25, or 0 "
                        f"for no limit; default {os.environ.get('TFDS_ENGINE_MEMORY') or '0.4'}): a script beyond it "
                        "ends that spec as ERROR naming memory")
    p.add_argument("--accept-known", action="store_true",
                   help=f"exit 0 when the only findings are known deviations of TensorFlow/Keras (DEVIATION, BLOCKED: "
                        f"the loop is right), instead of {EXIT['KNOWN']}")
    p.add_argument("-j", "--jobs", type=int, default=None,
                   help=f"specs checked at once, each in engine processes of its own (default: the processors this "
                        f"machine gives the check, here {usercheck.default_jobs()}; 1: one after another; the upgrade "
                        f"check, --from, runs its specs one after another)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.add_argument("--from", dest="env_from", metavar="ENV",
                   help="the upgrade check: compare the loop on ENV's TensorFlow/Keras (a tox env of the matrix or an "
                        "interpreter path) with --to's, under every selected spec (docs/check.md, 'Across versions')")
    p.add_argument("--to", dest="env_to", metavar="ENV",
                   help="the version moved to (default: the interpreter that runs the engines, --engine-python)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also the notes (your step against the suite's canonical step on one device) and every "
                        "difference of a diverging step")
    return p


class UsageError(Exception):
    """Options the check cannot use: one line, exit 2."""


def _specs(args) -> list:
    """The selected specs, parsed once for either check. The upgrade check runs each spec on both
    versions, so it takes plain specs only (no @ENV, no cluster)."""
    upgrading = bool(args.env_from)
    resolve = None
    if args.cluster_agents and not upgrading:
        def resolve():
            return agent.resolve_cluster(args.cluster_agents.split(","))
    try:
        specs = parse_specs(args.strategies, resolve)
    except SpecError as exc:
        raise UsageError(f"--strategies: {str(exc).splitlines()[0]}") from None
    except agent.AgentError as exc:
        raise UsageError(f"--cluster-agents: {str(exc).splitlines()[0]}") from None
    if upgrading and any(s.python or s.kind == "cluster" for s in specs):
        raise UsageError("--strategies: with --from/--to give plain specs (no @ENV, no cluster): each runs on both "
                         "versions")
    return specs


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args = argv[argv.index("--") + 1:] if "--" in argv else []
    args = _parser().parse_args(argv[:len(argv) - len(script_args) - 1] if "--" in argv else argv)
    try:
        if args.env_to and not args.env_from:
            raise UsageError("--to needs --from (the version moved from)")
        if args.jobs is not None and args.jobs < 1:
            raise UsageError(f"--jobs {args.jobs}: must be at least 1")
        if args.engine_memory is not None:
            try:
                os.environ[limits.MEMORY_ENV] = str(limits.parse_memory(args.engine_memory))
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        specs = _specs(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT["USAGE"]
    if args.env_from:
        return carry_out(args, lambda pool, progress: upgrade.run(
            args.workload, args.env_from, args.env_to, specs, pool, args.steps, args.global_batch, args.rtol,
            args.atol, args.seed, progress=progress), lambda report: report.text())
    if scriptcheck.is_script(args.workload):
        return carry_out(args, lambda pool, progress: scriptcheck.run(
            args.workload, specs, pool, script_args, args.steps, args.rtol, args.atol, args.seed, progress,
            args.jobs), lambda report: report.text(args.verbose))

    def compute(pool, progress):
        try:
            usercheck.validate_target(args.workload, os.getcwd())
        except CheckInputError:
            pass  # the workload check says what is wrong with it
        else:
            if scriptcheck.is_entry(pool, args.workload):  # package.module:main, which takes no argument
                return scriptcheck.run(args.workload, specs, pool, script_args, args.steps, args.rtol, args.atol,
                                       args.seed, progress, args.jobs)
        if script_args:
            raise CheckInputError(f"{' '.join(script_args)}: arguments after -- are a script's, and "
                                  f"{args.workload!r} is a workload factory")
        return usercheck.run(args.workload, specs, pool, args.steps, args.global_batch, args.rtol, args.atol,
                             args.seed, progress, args.jobs)

    return carry_out(args, compute, lambda report: report.text(args.verbose))


def carry_out(args, compute, text) -> int:
    """Run ``compute(pool, progress)`` in a pool of the options' engines (closed after), print its
    report (``text(report)``, or ``--json -``), write ``--json FILE``; the exit status: the
    report's, or 2 with one line for input the check cannot use (the loop check and the upgrade
    check alike)."""
    pool = EnginePool(python=args.engine_python, call_timeout=args.engine_timeout, memory=limits.engine_memory())
    progress = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    pool.progress = progress  # where a long reference or spec run is, as its engine says
    try:
        with interrupts.interruptible(lambda: [pool]):
            report = compute(pool, progress)
    except CheckInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT["USAGE"]
    except CheckEngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT["ERROR"]
    except KeyboardInterrupt as exc:  # the handler killed the engines first (interrupts.py)
        signum = getattr(exc, "signum", signal.SIGINT)
        report = getattr(exc, "partial", None)  # the specs that finished, if any did
        if report is None or not report.verdicts:
            print(f"error: interrupted ({signal.Signals(signum).name}): engines killed, no report written",
                  file=sys.stderr)
            return 128 + signum
        report.interrupted = signum
        print(f"error: interrupted ({signal.Signals(signum).name}): engines killed; the report holds the "
              f"{len(report.verdicts)} spec(s) that finished", file=sys.stderr)
    finally:
        pool.close()
    if args.json == "-":
        print(files.dumps_strict(report.as_json(), indent=1))
    else:
        print(text(report))
        if args.json:
            files.write_json(args.json, report.as_json(), indent=1)
    return report.exit_code(args.accept_known)


if __name__ == "__main__":
    sys.exit(main())
