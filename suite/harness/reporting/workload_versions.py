"""The user's step across TensorFlow versions in a benchmark report (``workload_step`` results of
``pytest benchmarks --workload package.module:factory --strategies mirrored:2,mirrored:2@ENV``,
benchmarks/bench_workload.py): per workload and spec, the step time in each version's engines side
by side, the ratio of each newer version to the oldest, marked within noise as the rest of the
report marks it (benchmark_results.within_noise: overlapping inter-quartile ranges, or medians within the
run-to-run allowance), and the ratio from rounds interleaved with the other version's.

A spec's versions are told apart by the TensorFlow and Keras its engines reported; ``SPEC`` and
``SPEC@ENV`` are one row (``spec_base``). Several files (repeats of the same command) are combined:
the median of their medians and the span of their inter-quartile ranges. No TensorFlow here."""

from __future__ import annotations

import collections
import statistics

from ..pool.versions import as_tuple
from .benchmark_results import NOISE_MARK, Entry, Results, markdown_table, within_noise

KIND = "workload_step"


def _version(info: dict) -> tuple[str, str]:
    return str(info.get("tensorflow")), str(info.get("keras"))


def _label(version: tuple[str, str]) -> str:
    return f"TF {version[0]} / Keras {version[1]}"


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3f}" if ms < 10 else f"{ms:.2f}" if ms < 1000 else f"{ms:.0f}"


def _combined(entries: list[Entry]) -> Entry:
    """One version's result over repeated files: the median of the medians, the span of the IQRs
    (so that within noise errs towards "no change")."""
    if len(entries) == 1:
        return entries[0]
    e = entries[0]
    return Entry(e.name, e.info, statistics.median(x.median for x in entries), min(x.q1 for x in entries),
                 max(x.q3 for x in entries), sum(x.rounds for x in entries))


def _interleaved(entries: list[Entry], newer: tuple, older: tuple) -> float | None:
    """Newer over older from a SPEC@ENV result's rounds each preceded by a round of the session's
    spec (``versus_ratio``: the env's step over the session's), where the pair is these versions."""
    ratios = []
    for e in entries:
        i = e.info
        if i.get("versus_ratio") is None or not i.get("versus_versions"):
            continue
        env, session = _version(i), tuple(i["versus_versions"])
        if (env, session) == (newer, older):
            ratios.append(i["versus_ratio"])
        elif (env, session) == (older, newer):
            ratios.append(1.0 / i["versus_ratio"])
    return statistics.median(ratios) if ratios else None


def _drift(entries: list[Entry]) -> float | None:
    """A/A within the session: the session's step in the rounds interleaved with a SPEC@ENV result
    over the same step in its own benchmark (the SPEC result of the same file), the largest
    ``|ratio - 1|`` over the files."""
    own = {id(e.info): e for e in entries if not e.info.get("env")}
    diffs = []
    for e in entries:
        if not e.info.get("versus_step_time_s"):
            continue
        same_file = [o for o in own.values() if o.info.get("file") == e.info.get("file")]
        if same_file:
            diffs.append(abs(e.info["versus_step_time_s"] / same_file[0].median - 1.0))
    return max(diffs) if diffs else None


def section(results: list[Results], noise: float = 0.0) -> list[str]:
    """The report's section on ``workload_step`` results (none: no section)."""
    # (workload, spec base) -> version -> entries, in file order
    groups: dict = collections.OrderedDict()
    for res in results:
        for e in res.of_kind(KIND):
            i = e.info = dict(e.info, file=str(res.path))  # which file: the A/A drift pairs results of one run
            groups.setdefault((i["workload"], i.get("spec_base", i["spec"])), {}).setdefault(_version(i), []).append(e)
    if not groups:
        return []
    rule = f"{NOISE_MARK} where the rounds' inter-quartile ranges overlap"
    if noise:
        rule += f" or the medians differ by at most {noise:.0%} (the run-to-run allowance)"
    lines = []
    for workload in dict.fromkeys(w for w, _ in groups):
        specs = {base: by_version for (w, base), by_version in groups.items() if w == workload}
        versions = sorted({v for by_version in specs.values() for v in by_version},
                          key=lambda v: (as_tuple(v[0]), as_tuple(v[1])))
        oldest = versions[0]
        lines += [f"## `{workload}`: your step across versions", "",
                  "The workload's own step (or the suite's canonical step on its model where it gives none) in "
                  "`strategy.run` inside a `tf.function`, per spec and per TensorFlow/Keras of the spec's engines "
                  "(`SPEC@ENV`: another interpreter's). Step ms is the median round over its K steps (IQR across "
                  f"rounds); (xR) is the ratio to `{_label(oldest)}`, the oldest, {rule}: the difference is within "
                  "noise. *Interleaved* is the same ratio from the `SPEC@ENV` rounds, each preceded by a round of "
                  "`SPEC` in the session's engines, so drift between benchmarks cancels. *A/A drift* is the session's "
                  "step in those interleaved rounds against its own benchmark minutes earlier: the run-to-run "
                  "variation of this machine within the session.", ""]
        rows = []
        for base, by_version in specs.items():
            combined = {v: _combined(es) for v, es in by_version.items()}
            first = next(iter(combined.values())).info
            ref = combined.get(oldest)
            row = [f"`{base}`", first.get("replicas", "?"), first.get("global_batch", "?")]
            interleaved = []
            for v in versions:
                e = combined.get(v)
                if e is None:
                    row.append("–")
                    continue
                cell = f"{_ms(e.median)} ({_ms(e.q3 - e.q1)})"
                if ref is not None and v != oldest:
                    mark = f" {NOISE_MARK}" if within_noise(ref, e, noise) else ""
                    cell += f" (x{e.median / ref.median:.2f}{mark})"
                    got = _interleaved([x for es in by_version.values() for x in es], v, oldest)
                    if got is not None:
                        interleaved.append(f"x{got:.2f}" if len(versions) == 2 else f"{_label(v)}: x{got:.2f}")
                row.append(cell)
            drift = _drift([x for es in by_version.values() for x in es])
            row += [", ".join(interleaved) or "–", f"{drift:.1%}" if drift is not None else "–"]
            rows.append(row)
        header = (["spec", "replicas", "global batch"] + [f"{_label(v)} step ms (IQR)" for v in versions]
                  + ["interleaved", "A/A drift"])
        lines += markdown_table(header, rows) + [""]
    return lines
