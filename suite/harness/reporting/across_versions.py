"""``python -m suite.report RESULTS -o report/``: the report across TensorFlow versions, from
a results folder that ``--results-dir`` runs filled (suite/harness/reporting/results_dir.py), one sub-folder per
TensorFlow and Keras version:

- a conformance grid, property x version: the worst outcome of the property's items in that
  version's run (fail, known deviation with the deviations' numbers, pass, skip), first of the properties
  that fail, deviate or change somewhere, and last of every property;
- "what changed": per property, the versions at which its outcome changes from the version
  before of the same Keras generation, and the TensorFlow versions where Keras 2 and Keras 3
  differ, with the deviations that appear or go;
- each deviation of the deviations file and each one seen: its declared versions, the first and
  last version it was observed in, and the runs in its range that observed it;
- each env's TensorFlow against the session's (``RESULTS/across-versions.xml``: the cross-version
  properties over ``SPEC@ENV`` specs, .ci/run's quick selection);
- step time across versions per workload and spec (from each folder's bench.json and its repeats
  bench.*.json: the median of their medians), with the ratio to a baseline version (default the
  newest), marked within noise as the benchmark report does (suite/harness/reporting/run_report.py: overlapping
  inter-quartile ranges, or a difference within the run-to-run variation that the repeats
  measure), and a plot of step time against version per workload.

No TensorFlow here."""

from __future__ import annotations

import collections
import statistics
import xml.etree.ElementTree as ET
from pathlib import Path

from ...common.files import save_figure, write_atomically
from ...common.specs import id_parts
from ..judging import deviations
from ..pool.versions import as_shipped, as_tuple
from . import benchmark_results, measured, results_dir, run_report
from .benchmark_results import NOISE_MARK, ReportError, markdown_table
from .run_report import OUTCOME_MARK, OUTCOME_ORDER, case_outcome


class Outcomes:
    """A property's outcomes in one run: the count of each outcome and the deviations named."""

    def __init__(self):
        self.counts: collections.Counter = collections.Counter()
        self.deviations: set[str] = set()

    def add(self, outcome: str, deviations: set[str]):
        self.counts[outcome] += 1
        self.deviations |= deviations

    @property
    def worst(self) -> str:
        return run_report.cell(self.counts)

    def key(self) -> tuple:
        """What "changed" compares: the worst outcome and, for a deviation, which ones."""
        return self.worst, tuple(sorted(self.deviations)) if self.worst == "deviation" else ()

    def text(self, refs: dict[str, int] | None = None) -> str:
        """The cell; with ``refs`` (deviation id -> number) a deviation's ids as their numbers."""
        mark = OUTCOME_MARK[self.worst]
        if self.worst == "deviation":
            if refs:
                return f"dev [{', '.join(str(n) for n in sorted(refs[d] for d in self.deviations))}]"
            return f"dev ({', '.join(f'`{d}`' for d in sorted(self.deviations))})"
        if self.worst == "fail":
            return f"{mark} {self.counts['fail']}/{sum(self.counts.values())}"
        return mark


def _cases(path: Path) -> dict[tuple[str, str], ET.Element]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise ReportError(f"{path}: not a readable JUnit XML file ({exc})") from None
    return {(c.get("classname", "?"), c.get("name", "?")): c for c in root.iter("testcase")}


def load_outcomes(path: Path, reruns: list[Path] = ()) -> dict[str, Outcomes]:
    """``{module::test: Outcomes}`` from a JUnit file of ``pytest tests``, each test id's outcome
    taken from the last of ``reruns`` that ran it, if any did."""
    cases = _cases(path)
    for rerun in reruns:
        cases.update(_cases(rerun))
    out: dict[str, Outcomes] = collections.defaultdict(Outcomes)
    for (classname, name), case in cases.items():
        func = name.partition("[")[0]
        out[f"{classname.rsplit('.', 1)[-1]}::{func}"].add(*case_outcome(case))
    return dict(out)


def _ran(point: results_dir.Point) -> set[str]:
    """The node ids of the test items a run ran (not skipped), its reruns included."""
    cases = _cases(point.conformance)
    for rerun in point.reruns:
        cases.update(_cases(rerun))
    return {measured.node_id(case) for case in cases.values() if case_outcome(case)[0] != "skip"}


def point_label(point: results_dir.Point, profile: bool = True) -> str:
    """A column head: ``TF / Keras`` (a legacy env's Keras is tf-keras, 2.x), and (``profile``)
    the conformance run's profile where it is not ci (``quick``: the matrix's quick selection), and
    ``+ rerun`` where some of its outcomes come from a rerun (``conformance.rerun*.xml``)."""
    shown = profile and point.profile not in ("ci", "?")
    rerun = profile and point.conformance and point.reruns
    return (f"{point.tensorflow} / {point.keras}" + (" as shipped" if as_shipped(point.tensorflow, point.keras) else "")
            + (f" ({point.profile})" if shown else "") + (" (+ rerun)" if rerun else ""))


def conformance_sections(points: list[results_dir.Point], entries=()) -> tuple[list[str], list[str]]:
    """The grid of the notable properties, what changed and the deviations by version; and the
    full grid (the report's last section). ``entries``: the deviations file's."""
    runs = [(p, load_outcomes(p.conformance, p.reruns)) for p in points if p.conformance]
    if not runs:
        return [], []
    props = sorted({prop for _, grid in runs for prop in grid})
    lines = ["## Conformance across versions", "",
             "A cell is the worst outcome of the property's test items in that version's run: **FAIL** (a "
             "failure, or a strict XPASS), dev [n] (a known deviation whose signature matched: the numbers of the "
             "deviations under the grid), ✓, skip; empty where the run did not collect the property (a quick "
             "selection). A run's selection and profile are its own: compare cells of runs of the same command.", ""]
    header = ["property"] + [f"`{point_label(p)}`" for p, _ in runs]
    refs = {d: n for n, d in enumerate(sorted({d for _, grid in runs for o in grid.values() for d in o.deviations}), 1)}
    legend = (["Deviations: " + " · ".join(f"[{n}] `{d}`" for d, n in refs.items()), ""] if refs else [])
    rows = {prop: [f"`{prop}`"] + [grid[prop].text(refs) if prop in grid else "" for _, grid in runs]
            for prop in props}
    totals = ["**items**"] + [", ".join(f"{sum(o.counts[k] for o in grid.values())} {k}" for k in OUTCOME_ORDER)
                              for _, grid in runs]
    # the rows an upgrade decision reads: a failure or a deviation somewhere, or outcomes that differ
    notable = [prop for prop in props if len({grid[prop].key() for _, grid in runs if prop in grid}) > 1
               or any(grid[prop].worst in ("fail", "deviation") for _, grid in runs if prop in grid)]
    lines += markdown_table(header, [rows[prop] for prop in notable] + [totals]) + [""] + legend
    rest = len(props) - len(notable)
    if rest:
        lines += [f"The other {rest} properties have one outcome in every run that collected them (✓, or skip where "
                  "the run had nothing to run them on): the full grid is the last section.", ""]
    full = (["## Every property across versions", ""] + markdown_table(header, [rows[prop] for prop in props] + [totals])
            + [""] + legend)

    lines += ["## What changed", "",
              "Per property, where its outcome differs (deviations that appear or go included): between "
              "consecutive TensorFlow versions of one Keras generation (an upgrade of TensorFlow), and from Keras 2 "
              "to Keras 3 on the same TensorFlow (the TensorFlow versions where the switch changes it alike are "
              "listed together).", ""]
    changed = [f"- `{prop}`: " + "; ".join(steps) for prop in props if (steps := _changes(prop, runs))]
    lines += (changed or ["Nothing: every property has the same outcome in every run."]) + [""]

    seen: dict[str, list[results_dir.Point]] = collections.defaultdict(list)
    for p, grid in runs:
        for o in grid.values():
            for d in o.deviations:
                if p not in seen[d]:
                    seen[d].append(p)
    declared = {d.id: d for d in entries}
    ran = {p.path: _ran(p) for p, _ in runs}
    if seen or declared:
        lines += ["## Deviations by version", "",
                  "Each known deviation: the versions the deviations file declares it for, the first and last run "
                  "that observed it (a signature matched), how many runs observed it of those in its declared range, "
                  "and the runs in its range between first and last that did not; an entry no run observed is listed "
                  "too. A run observes only what its selection ran (a quick run, two specs).", ""]
        rows = []
        for d in sorted(set(seen) | set(declared)):
            where, entry = seen.get(d, []), declared.get(d)
            scope = f"TF {entry.tensorflow}; Keras {entry.keras}" if entry else "(not in the deviations file)"
            in_range = [p for p, _ in runs if entry and entry.applies_to(p.tensorflow, p.keras)]
            counted = f"{len(where)} of {len(in_range)}" if entry else str(len(where))
            if not where:
                rows.append([f"`{d}`", scope, "not observed", "–", counted, "–", "–", "–"])
                continue
            missing = [point_label(p) for p, _ in runs if p not in where and p.order > where[0].order
                       and p.order < where[-1].order and (entry is None or p in in_range)]
            keras = sorted({p.keras for p in where}, key=as_tuple)
            quiet = sorted({p.keras for p, grid in runs if p not in where and entry is not None and
                            any(entry.matches(t) for t in ran[p.path])} - set(keras), key=as_tuple)
            rows.append([f"`{d}`", scope, point_label(where[0]), point_label(where[-1]), counted, ", ".join(missing) or "–",
                         f"{keras[0]} – {keras[-1]}" if len(keras) > 1 else keras[0], ", ".join(quiet) or "–"])
        lines += markdown_table(["deviation", "declared for", "first seen", "last seen", "runs (of those in range)",
                         "not seen in between", "Keras seen (first – last)", "Keras that ran its tests, not seen"],
                        rows) + [""]
    return lines, full


def _transition(prop: str, before: tuple, now: tuple) -> str | None:
    """``A → B`` of a property between two runs (each ``(point, grid)``), with the deviations that
    appear or go; None where its outcome is the same or a run did not collect it."""
    a, b = before[1].get(prop), now[1].get(prop)
    if a is None or b is None or a.key() == b.key():
        return None
    gone = a.deviations - b.deviations if a.worst == "deviation" else set()
    came = b.deviations - a.deviations if b.worst == "deviation" else set()
    return "".join([f"{a.text()} → {b.text()}", f"; appears: {', '.join(sorted(came))}" if came else "",
                    f"; gone: {', '.join(sorted(gone))}" if gone else ""])


def _generation(point: results_dir.Point) -> int:
    return as_tuple(point.keras)[0]


def _changes(prop: str, runs: list[tuple]) -> list[str]:
    """What changed of ``prop``: per Keras generation, each run against the previous run of that
    generation that collected the property (a TensorFlow upgrade); then, per TensorFlow version with
    runs of both generations, the Keras 2 run against the Keras 3 run, grouped where alike."""
    steps = []
    for gen in sorted({_generation(p) for p, _ in runs}):
        line = [r for r in runs if _generation(r[0]) == gen and prop in r[1]]
        for before, now in zip(line, line[1:]):
            if (t := _transition(prop, before, now)):
                steps.append(f"Keras {gen}, {point_label(before[0])} → {point_label(now[0])}: {t}")
    switch: dict[str, list[str]] = {}
    by_tf = collections.defaultdict(dict)
    for r in runs:
        by_tf[r[0].tensorflow].setdefault(_generation(r[0]), r)  # the first (lowest Keras) of a generation
    for tf, gens in by_tf.items():
        if 2 in gens and 3 in gens and (t := _transition(prop, gens[2], gens[3])):
            switch.setdefault(t, []).append(tf)
    steps += [f"Keras 2 → 3 on TF {', '.join(tfs)}: {t}" for t, tfs in switch.items()]
    return steps


ACROSS = "across-versions.xml"  # JUnit of tests/properties/test_across_versions.py over SPEC@ENV specs


def across_section(path: Path) -> list[str]:
    """The cross-version properties of one run (``RESULTS/across-versions.xml``): property x the
    other env whose TensorFlow was compared with the session's, the worst outcome over its specs."""
    cells: dict = collections.defaultdict(Outcomes)
    for (_, name), case in _cases(path).items():
        func, _, params = name.partition("[")
        env = next((part.split("@", 1)[1] for part in id_parts(params.rstrip("]")) if "@" in part), None)
        if env is None:
            continue
        cells[(func, env)].add(*case_outcome(case))
    if not cells:
        return []
    envs = sorted({e for _, e in cells}, key=lambda e: (e.removesuffix("-legacy"), e.endswith("-legacy")))
    props = sorted({p for p, _ in cells})
    lines = ["## Each version against the session's", "",
             f"`{path.name}`: tests/properties/test_across_versions.py, the same drawn cases under each env's "
             "TensorFlow and the session's (the quick selection of .ci/run); a cell is the worst outcome over the "
             "env's specs.", ""]
    rows = [[f"`{p}`"] + [cells[(p, e)].text() if (p, e) in cells else "" for e in envs] for p in props]
    return lines + markdown_table(["property"] + [f"`{e}`" for e in envs], rows) + [""]


def _combined(entries: list) -> benchmark_results.Entry:
    """One version's result of a benchmark over its runs: the median of their medians, and the
    span of their rounds' inter-quartile ranges (so that within noise errs towards "no change")."""
    if len(entries) == 1:
        return entries[0]
    e = entries[0]
    return benchmark_results.Entry(e.name, e.info, statistics.median(x.median for x in entries), min(x.q1 for x in entries),
                        max(x.q3 for x in entries), sum(x.rounds for x in entries))


def benchmark_sections(points: list[results_dir.Point], baseline: str | None, out: Path) -> list[str]:
    runs = [(p, [benchmark_results.load_benchmarks(f) for f in p.benches]) for p in points if p.benches]
    if not runs:
        return []
    base = next((r for r in runs if baseline and (r[0].tensorflow == baseline or point_label(r[0], False) == baseline)),
                runs[-1])
    measured = benchmark_results.run_to_run_noise([res for _, results in runs for res in results])
    noise = measured[0] if measured else 0.0
    if measured:
        rule = (f"the rounds' inter-quartile ranges overlap or the medians differ by at most {noise:.0%}, the machine's "
                f"run-to-run variation (the 90th percentile of the differences of {measured[1]} step benchmarks "
                "between runs of the same versions)")
    else:
        rule = ("the rounds' inter-quartile ranges overlap; no version was run twice (bench.2.json), so differences "
                "within the machine's run-to-run variation are not marked")
    lines = ["## Step time across versions", "",
             f"Median step time of the train step (ms), per workload and spec, over a version's runs (bench.json, "
             f"bench.2.json, ...: the median of their medians); (xR) is the ratio to `{point_label(base[0], False)}`, "
             f"marked {NOISE_MARK} where within noise: {rule}. Same machine; the method (every version run twice, "
             "the versions interleaved) is in benchmarks/README.md.", ""]
    groups: dict = collections.OrderedDict()
    for p, results in runs:
        for res in results:
            for e in res.of_kind("train_step"):
                i = e.info
                groups.setdefault((i["workload"], i.get("scaling", "weak")), collections.OrderedDict()).setdefault(
                    i["spec"], {}).setdefault(p.path, []).append(e)
    for (workload, scaling), specs in groups.items():
        specs = {spec: {path: _combined(es) for path, es in by_run.items()} for spec, by_run in specs.items()}
        lines += [f"### {workload}, {scaling} scaling", ""]
        rows = []
        for spec, by_run in specs.items():
            ref = by_run.get(base[0].path)
            row = [f"`{spec}`"]
            for p, _ in runs:
                e = by_run.get(p.path)
                if e is None:
                    row.append("–")
                elif ref is None or p is base[0]:
                    row.append(f"{e.median * 1e3:.3g}")
                else:
                    mark = f" {NOISE_MARK}" if benchmark_results.within_noise(ref, e, noise) else ""
                    row.append(f"{e.median * 1e3:.3g} (x{e.median / ref.median:.2f}{mark})")
            rows.append(row)
        heads = [f"`{point_label(p, False)}`" + (f" ({len(results)} runs)" if len(results) > 1 else "")
                 for p, results in runs]
        lines += markdown_table(["spec"] + heads, rows) + [""]
        name = _plot(workload, scaling, specs, runs, out)
        if name:
            lines += [f"![{workload} {scaling} across versions]({name})", ""]
    return lines


def _plot(workload, scaling, specs, runs, out: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = list(range(len(runs)))
    for spec, by_run in specs.items():
        ys = [by_run[p.path].median * 1e3 if p.path in by_run else float("nan") for p, _ in runs]
        ax.plot(xs, ys, marker="o", label=spec)
    ax.set_xticks(xs, [point_label(p, False) for p, _ in runs], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("step time (ms, median)")
    ax.set_yscale("log")
    ax.set_title(f"{workload}, {scaling} scaling: step time per TensorFlow / Keras version")
    ax.legend(fontsize=7)
    fig.tight_layout()
    name = f"versions-{run_report.slug(workload)}-{scaling}.png"
    save_figure(fig, out / name, dpi=110)
    plt.close(fig)
    return name


def write(results: Path, out: Path, baseline: str | None = None, entries=None) -> Path:
    """report.md (and the plots) in ``out``; ``entries``: the deviations to range (default the file's)."""
    points = results_dir.load(results)
    across = Path(results) / ACROSS
    if not points and not across.exists():
        raise ReportError(f"{results}: no results of a run in it (run pytest with --results-dir {results}, or tox)")
    out.mkdir(parents=True, exist_ok=True)
    def files(p: results_dir.Point) -> str:
        bench = f"benchmarks ×{len(p.benches)}" if len(p.benches) > 1 else "benchmarks"
        return ", ".join(name for name, path in (("conformance", p.conformance), (bench, p.benches)) if path)

    lines = ["# tf-distribute-suite across TensorFlow versions", "",
             f"From `{results}`: " + ", ".join(f"`{p.path.name}` ({files(p)})" for p in points)
             + (f"; `{ACROSS}`" if across.exists() else "") + ".", ""]
    conformance, full = conformance_sections(points, deviations.load() if entries is None else entries)
    body = (conformance + (across_section(across) if across.exists() else [])
            + benchmark_sections(points, baseline, out) + full)
    write_atomically(out / "report.md", "\n".join(lines + body) + "\n")
    return out / "report.md"
