"""Turn benchmark results (and conformance results) into a Markdown report with PNG plots.

    python -m suite.report out.json [more.json ...] [results.xml ...] -o DIR

``*.json`` files are pytest-benchmark output of ``pytest benchmarks --benchmark-json`` (or the
upgrade check's ``--json``, shown in a section of its own); the
first is the baseline and every later one gets a column with its ratio to the first, marked
``≈`` where the two differ by less than the noise (their rounds' inter-quartile ranges of step
time overlap). ``*.xml`` files are JUnit reports of ``pytest tests --junitxml``: a grid of pass,
known deviation (an XFAIL: a mismatch a known_deviations.toml signature explains), fail and skip per
property and spec.
Writes ``DIR/report.md`` and ``DIR/*.png``. No TensorFlow needed.
"""

from __future__ import annotations

import collections
import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from ...common.files import save_figure, write_atomically
from ...common.specs import SpecError, id_parts, parse_spec
from . import workload_versions
from .benchmark_results import (
    NOISE_MARK,
    Entry,
    ReportError,
    Results,
    load_benchmarks,
    markdown_table,
    run_to_run_noise,
    unique_labels,
    within_noise,
)


def family(spec_text: str, info: dict) -> tuple[str, int]:
    """The line a spec belongs to in a plot, and its x (replicas; workers for parameter
    servers, whose steps each run on one replica)."""
    try:
        spec = parse_spec(spec_text)
    except SpecError:
        return spec_text, int(info.get("replicas", 1))
    if spec.kind == "parameter_server":
        return f"parameter_server ({spec.ps} ps; x = workers)", spec.workers
    if spec.kind == "mirrored":
        return ("mirrored:reduce_to_one" if spec.cross_device_ops else "mirrored"), int(info.get("replicas", 1))
    if spec.kind == "multi_worker":
        return f"multi_worker (x{spec.devices} per worker, {spec.communication})", spec.replicas
    return spec.kind, int(info.get("replicas", 1))


# -- formatting ------------------------------------------------------------------------------
def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    return f"{seconds * 1e3:.3f}" if seconds < 0.01 else f"{seconds * 1e3:.2f}" if seconds < 1 else f"{seconds * 1e3:.0f}"


def _num(x, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, float):
        return f"{x:,.{digits}f}" if abs(x) < 1000 else f"{x:,.0f}"
    return str(x)


def _groups(res: Results) -> dict:
    """(workload, scaling) -> train-step entries, in file order."""
    groups: dict = collections.OrderedDict()
    for e in res.of_kind("train_step"):
        groups.setdefault((e.info["workload"], e.info.get("scaling", "?")), []).append(e)
    return groups


def _first_calls(res: Results) -> dict:
    return {(e.info["workload"], e.info.get("scaling"), e.info["spec"]): e for e in res.of_kind("first_call")}


# -- plots ---------------------------------------------------------------------------------
def _plot_group(res: Results, workload: str, scaling: str, entries: list[Entry], out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines: dict = collections.OrderedDict()
    for e in entries:
        name, x = family(e.info["spec"], e.info)
        lines.setdefault(name, []).append((x, e))
    per_replica = entries[0].info["per_replica_batch"] if scaling == "weak" else None
    plain = sorted((e.info["global_batch"], e) for e in res.of_kind("plain_step") if e.info["workload"] == workload)
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.4))
    ax_t, ax_x, ax_o = axes
    markers = "osD^v<>ph*"
    for i, (name, points) in enumerate(lines.items()):
        points.sort(key=lambda p: p[0])
        xs = [p[0] for p in points]
        ax_t.errorbar(xs, [p[1].median * 1e3 for p in points],
                      yerr=[[max((p[1].median - p[1].q1) * 1e3, 0) for p in points],
                            [max((p[1].q3 - p[1].median) * 1e3, 0) for p in points]],
                      marker=markers[i % len(markers)], capsize=3, label=name)
        ax_x.plot(xs, [p[1].info["examples_per_s"] for p in points], marker=markers[i % len(markers)], label=name)
    if plain and scaling == "weak" and per_replica:
        px = [(b // per_replica, e) for b, e in plain if b % per_replica == 0]
        if px:
            ax_t.plot([p[0] for p in px], [p[1].median * 1e3 for p in px], "k--", marker="x",
                      label="plain step (no strategy) on the same global batch")
            ax_x.plot([p[0] for p in px], [p[1].info["examples_per_s"] for p in px], "k--", marker="x",
                      label="plain step, same global batch")
    ax_t.set(xlabel="replicas (parameter servers: workers)", ylabel="step time (ms), median and IQR",
             title=f"{workload}: step time ({scaling} scaling)")
    ax_x.set(xlabel="replicas (parameter servers: workers)", ylabel="examples / s (global)",
             title=f"{workload}: throughput")
    specs = [e.info["spec"] for e in entries]
    overhead = [e.info.get("overhead_ratio") or float("nan") for e in entries]
    bars = ax_o.barh(range(len(specs)), overhead, color="tab:gray")
    ax_o.bar_label(bars, labels=[f"{v:.2f}" for v in overhead], padding=2, fontsize=8)
    ax_o.set_xlim(0, max([v for v in overhead if math.isfinite(v)] + [1.0]) * 1.15)
    ax_o.axvline(1.0, color="k", lw=1)
    ax_o.set_yticks(range(len(specs)), specs)
    ax_o.invert_yaxis()
    ax_o.set(xlabel="step time / plain step on the same global batch", title=f"{workload}: overhead vs plain step")
    for ax in (ax_t, ax_x):
        ax.grid(alpha=0.3)
        ax.set_xticks(sorted({p[0] for pts in lines.values() for p in pts}))
        ax.set_ylim(bottom=0)
    handles, labels = ax_t.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    virtual = any(e.info.get("shares_cores") for e in entries)
    fig.suptitle(f"{res.label}, {res.machine.get('cpu_cores', '?')} CPU cores"
                 + ("; replicas share the cores: overhead, not scaling" if virtual else ""), fontsize=10)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    name = f"{slug(workload)}-{scaling}-{slug(res.label)}.png"
    save_figure(fig, out / name, dpi=110)
    plt.close(fig)
    return name


def _plot_comparison(all_results: list[Results], workload: str, scaling: str, out: Path) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = [e for e in _groups(all_results[0]).get((workload, scaling), [])]
    specs = [e.info["spec"] for e in base]
    if not specs:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(specs) * len(all_results)), 4.2))
    width = 0.8 / len(all_results)
    for j, res in enumerate(all_results):
        by_spec = {e.info["spec"]: e for e in _groups(res).get((workload, scaling), [])}
        got = [by_spec.get(s) for s in specs]
        vals = [e.median * 1e3 if e else float("nan") for e in got]
        err = [[(e.median - e.q1) * 1e3 if e else 0 for e in got], [(e.q3 - e.median) * 1e3 if e else 0 for e in got]]
        ax.bar([i + j * width for i in range(len(specs))], vals, width, yerr=err, capsize=2, label=res.label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(specs))], specs, rotation=30, ha="right")
    ax.set(ylabel="step time (ms), median and IQR", title=f"{workload} ({scaling} scaling): step time per result file")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    name = f"{slug(workload)}-{scaling}-comparison.png"
    save_figure(fig, out / name, dpi=110)
    plt.close(fig)
    return name


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()


# -- conformance -----------------------------------------------------------------------------
OUTCOME_ORDER = ("fail", "deviation", "pass", "skip")
OUTCOME_MARK = {"pass": "✓", "deviation": "dev", "fail": "**FAIL**", "skip": "skip"}


def _spec_of(params: str) -> str | None:
    for part in id_parts(params):
        try:
            return parse_spec(part).text
        except SpecError:
            continue
    return None


def load_conformance(path: Path) -> dict:
    """``{(property, spec): Counter(outcome)}`` from a JUnit XML file; the property is
    ``module::test`` and the spec the parameter that parses as a strategy spec ('-' if none)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise ReportError(f"{path}: not a readable JUnit XML file ({exc})") from None
    grid: dict = collections.defaultdict(collections.Counter)
    cases = list(root.iter("testcase"))
    if not cases:
        raise ReportError(f"{path}: no test cases in it (is it pytest --junitxml output?)")
    for case in cases:
        name = case.get("name", "?")
        module = case.get("classname", "?").rsplit(".", 1)[-1]
        func, _, params = name.partition("[")
        spec = _spec_of(params.rstrip("]")) or "-"
        grid[(f"{module}::{func}", spec)][case_outcome(case)[0]] += 1
    return grid


DEVIATION_ID = re.compile(r"known deviation ([\w.-]+) \(signature matched")


def case_outcome(case) -> tuple[str, set[str]]:
    """A JUnit test case's outcome (fail, deviation: an xfail, pass, skip) and the known
    deviations its xfail reason names (the plugin's Ledger.expected_failure)."""
    skipped = case.find("skipped")
    if case.find("failure") is not None or case.find("error") is not None:
        return "fail", set()
    if skipped is None:
        return "pass", set()
    if skipped.get("type") == "pytest.xfail":
        return "deviation", set(DEVIATION_ID.findall(skipped.get("message", "") + (skipped.text or "")))
    return "skip", set()


def cell(counter: collections.Counter) -> str:
    """The worst outcome of a property under a spec: fail > deviation > pass > skip."""
    for outcome in OUTCOME_ORDER:
        if counter.get(outcome):
            return outcome
    return "skip"


def _cell_text(counter: collections.Counter) -> str:
    """The worst outcome's mark; for fail and deviation also how many of the items it was."""
    outcome = cell(counter)
    total = sum(counter.values())
    if outcome in ("fail", "deviation") and total > 1:
        return f"{OUTCOME_MARK[outcome]} {counter[outcome]}/{total}"
    return OUTCOME_MARK[outcome]


def conformance_section(path: Path, grid: dict) -> list[str]:
    specs = sorted(dict.fromkeys(s for _, s in grid), key=lambda s: s == "-")  # run order; '-' last
    props = sorted({p for p, _ in grid})
    totals = collections.Counter()
    for c in grid.values():
        totals.update(c)
    lines = [f"## Conformance: `{path.name}`", "",
             f"{sum(totals.values())} test items: " + ", ".join(f"{totals[o]} {o}" for o in OUTCOME_ORDER) + ". "
             "A cell is the worst outcome of the property's items under the spec: "
             "**FAIL** (a failure, or a strict XPASS: a deviation that TF fixed), dev (a known deviation, "
             "known_deviations.toml), ✓ (passed), skip; 'dev 2/12' counts the items with that outcome. "
             "'-' is the column of tests without a spec.", ""]
    rows = []
    for prop in props:
        rows.append([f"`{prop}`"] + [_cell_text(grid[(prop, s)]) if (prop, s) in grid else "" for s in specs])
    return lines + markdown_table(["property"] + [f"`{s}`" for s in specs], rows) + [""]


# -- the report --------------------------------------------------------------------------------
def benchmark_sections(all_results: list[Results], out: Path, noise: float) -> list[str]:
    base = all_results[0]
    lines = ["## Machines and versions", ""]
    rows = []
    for r in all_results:
        m = r.machine
        cpu = (m.get("cpu") or {}).get("brand_raw", "?")
        rows.append([r.label, f"`{r.path.name}`", cpu, m.get("cpu_cores", "?"), ", ".join(m.get("gpus") or []) or "none",
                     ", ".join(m.get("strategy_specs") or [])])
    lines += markdown_table(["results", "file", "CPU", "cores", "GPUs", "specs"], rows) + [""]

    floors = base.of_kind("floor")
    if floors:
        lines += ["## Harness floor", "",
                  "An empty engine call (`engine.ping`): what the harness adds to every round. Its share of a "
                  "round is the median floor over the median round of the spec's train steps.", ""]
        rounds = collections.defaultdict(list)
        for e in base.of_kind("train_step"):
            rounds[e.info["spec"]].append(e.info.get("round_s"))
        rows = []
        for e in floors:
            r = [x for x in rounds.get(e.info["spec"], []) if x]
            share = (e.median / min(r)) if r else None
            rows.append([f"`{e.info['spec']}`", f"{e.median * 1e6:.0f}", f"{(e.q3 - e.q1) * 1e6:.0f}",
                         f"{share:.2%}" if share is not None else "–"])
        lines += markdown_table(["spec", "floor (µs, median)", "IQR (µs)", "largest share of a round"], rows) + [""]

    for (workload, scaling), entries in _groups(base).items():
        lines += [f"## {workload}, {scaling} scaling", ""]
        first = entries[0].info
        lines.append(f"Per-replica batch {first['per_replica_batch']} " if scaling == "weak" else
                     f"Global batch {first['global_batch']} ")
        lines[-1] += ("(parameter servers: one replica per step, the same batch). Step time is the median round "
                      "over its K steps; IQR across rounds. Overhead: step time over the plain `tf.function` step "
                      "(no strategy) on the same global batch. Efficiency: throughput over units x the plain "
                      "step's on one replica's batch (weak) or over units x 1/step on the global batch (strong).")
        if any(e.info.get("shares_cores") for e in entries):
            lines[-1] += (" Replicas that share cores (virtual CPUs, local clusters) cannot run faster than one "
                          "device: read efficiency as overhead, not scaling.")
        lines.append("")
        traces = _first_calls(base)
        rows = []
        for e in entries:
            i = e.info
            tr = traces.get((workload, scaling, i["spec"]))
            rows.append([f"`{i['spec']}`", i["replicas"], i.get("workers", 1), i["global_batch"],
                         f"{_ms(e.median)} ({_ms(e.q3 - e.q1)})", _num(i["examples_per_s"], 0),
                         _num(i["examples_per_s_per_replica"], 0), _num(i.get("overhead_ratio")),
                         _num(i.get("scaling_efficiency")), f"{tr.median:.2f}" if tr else "–",
                         i.get("cross_device_ops") or "–", f"{i.get('harness_vs_engine', 0):+.1%}",
                         i.get("steps_per_round", "?")])
        used = {e.info["global_batch"] for e in entries}
        if scaling == "weak":
            used |= {e.info["per_replica_batch"] for e in entries}
        plain = [e for e in base.of_kind("plain_step")
                 if e.info["workload"] == workload and e.info["global_batch"] in used]
        for e in sorted(plain, key=lambda e: e.info["global_batch"]):
            rows.append([f"plain (no strategy), batch {e.info['global_batch']}", 1, 1, e.info["global_batch"],
                         f"{_ms(e.median)} ({_ms(e.q3 - e.q1)})", _num(e.info["examples_per_s"], 0),
                         _num(e.info["examples_per_s"], 0), "1.00", "–", "–", "–",
                         f"{e.info.get('harness_vs_engine', 0):+.1%}", e.info.get("steps_per_round", "?")])
        lines += markdown_table(["spec", "replicas", "workers", "global batch", "step ms (IQR)", "examples/s",
                         "per replica", "overhead", "efficiency", "first call s", "cross-device ops",
                         "harness vs engine", "K"], rows) + [""]
        for res in all_results:
            group = _groups(res).get((workload, scaling))
            if group:
                lines += [f"![{workload} {scaling} {res.label}]({_plot_group(res, workload, scaling, group, out)})", ""]
        if len(all_results) > 1:
            lines += comparison(all_results, workload, scaling, noise)
            name = _plot_comparison(all_results, workload, scaling, out)
            if name:
                lines += [f"![{workload} comparison]({name})", ""]
    for res in all_results:
        lines += block_section(res)
    return lines + workload_versions.section(all_results, noise)


def block_section(res: Results) -> list[str]:
    """The building blocks' step times (``block_step`` results of one file): per workload, a
    row per spec and block with the strategy's overhead over the same block on the plain step
    and the block's cost over the spec's step without it."""
    entries = res.of_kind("block_step")
    if not entries:
        return []
    lines = ["## Building blocks", "",
             f"`{res.path.name}` ({res.label}). Each block switched on in the train step (weak scaling): "
             "step ms is the median round over K (IQR across rounds). *Overhead*: over the same block on the "
             "plain `tf.function` step with no strategy on the same global batch, interleaved round by round. "
             "*Block cost*: over the spec's train step without the block (its `train_step` result; – where that "
             "did not run). Blocks TensorFlow does not support under a spec are skipped with its error and "
             "do not appear.", ""]
    blocks = {e.info["block"]: e.info.get("block_description", "") for e in entries}
    lines += [f"- `{b}`: {d}" for b, d in blocks.items()] + [""]
    by_workload: dict = collections.OrderedDict()
    for e in entries:
        by_workload.setdefault(e.info["workload"], []).append(e)
    for workload, group in by_workload.items():
        rows = []
        for e in sorted(group, key=lambda e: (list(blocks).index(e.info["block"]))):
            i = e.info
            rows.append([f"`{i['block']}`", f"`{i['spec']}`", i["replicas"], i["global_batch"],
                         f"{_ms(e.median)} ({_ms(e.q3 - e.q1)})", _ms(i.get("plain_step_time_s")),
                         _num(i.get("overhead_ratio")), _ms(i.get("step_without_block_s")),
                         _num(i.get("block_cost_ratio"))])
        lines += [f"### {workload}", ""]
        lines += markdown_table(["block", "spec", "replicas", "global batch", "step ms (IQR)",
                                 "plain step with the block ms", "overhead", "step without the block ms",
                                 "block cost"], rows) + [""]
    return lines


def comparison(all_results: list[Results], workload: str, scaling: str, noise: float = 0.0) -> list[str]:
    """One column per result file: step time, and for later files the ratio to the first,
    marked ≈ where the difference is within noise."""
    base = {e.info["spec"]: e for e in _groups(all_results[0]).get((workload, scaling), [])}
    others = [{e.info["spec"]: e for e in _groups(r).get((workload, scaling), [])} for r in all_results[1:]]
    specs = list(base) + [s for o in others for s in o if s not in base]
    rows = []
    for s in specs:
        row = [f"`{s}`", _ms(base[s].median) if s in base else "–"]
        for o in others:
            if s not in o:
                row.append("–")
            elif s not in base:
                row.append(_ms(o[s].median))
            else:
                ratio = o[s].median / base[s].median
                mark = f" {NOISE_MARK}" if within_noise(base[s], o[s], noise) else ""
                row.append(f"{_ms(o[s].median)} (x{ratio:.2f}{mark})")
        rows.append(row)
    header = ["spec"] + [f"{r.label} step ms" for r in all_results]
    rule = f"{NOISE_MARK} where the rounds' inter-quartile ranges overlap"
    if noise:
        rule += f" or the medians differ by at most {noise:.0%} (--noise, the machine's run-to-run variation)"
    return ([f"Step time per result file; (xR) is the ratio to `{all_results[0].path.name}`, {rule}: "
             "the difference is within noise.", ""]
            + markdown_table(header, rows) + [""])


def _upgrade_json(path: Path) -> dict | None:
    """The upgrade check's ``--json`` output (``"kind": "upgrade"``), or None for any other file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("kind") == "upgrade" else None


def upgrade_section(path: Path, data: dict) -> list[str]:
    """The upgrade check of one loop (``python -m suite.check TARGET --from A --to B --json F``):
    its rows, what each difference is attributed to, and the summary."""
    def side(s):
        return f"{s['label']} (TensorFlow {s.get('tensorflow')}, Keras {s.get('keras')})"
    header = ["spec", "from", "to", "verdict", "steps agreed", "allowance", "first difference", "attribution"]
    rows = []
    for r in data["specs"]:
        named = ", ".join(f"{d['id']} ({d['change']})" for d in r["known_deviations"] if d["change"] != "both")
        step = r.get("first_diverging_step")
        rows.append([f"`{r['spec']}`", r["loop_check"]["from"] or "–", r["loop_check"]["to"] or "–", r["status"],
                     f"{r['agreed_steps']}/{r['steps']}", f"{r['rounding_allowance']:.2g}",
                     "" if step is None else f"step {step}", named or r["attribution_text"]])
    details = [f"- `{r['spec']}`: " + "; ".join(r["lines"]) for r in data["specs"] if r["status"] != "PASS"]
    return ([f"## Upgrade check of `{data['workload']}` (`{path.name}`)", "",
             f"From {side(data['from'])} to {side(data['to'])}: global batch {data['global_batch']}, {data['steps']} "
             f"steps; from/to: the loop check of each spec against that version's own one device.", ""]
            + markdown_table(header, rows) + [""] + details + (["", ""] if details else [""])
            + [f"{data['summary']} (exit {data['exit_code']})", ""])


def write_report(paths: list[Path], out: Path, noise: float | None = None) -> Path:
    """Write ``out/report.md`` and its plots. ``noise``: the run-to-run allowance for the
    comparison columns; None measures it from files of the same versions where there are
    such (else 0: overlapping IQRs only)."""
    out.mkdir(parents=True, exist_ok=True)
    upgrades = [(Path(p), data) for p in paths if str(p).endswith(".json") and (data := _upgrade_json(Path(p)))]
    bench_paths = [Path(p) for p in paths if str(p).endswith(".json") and Path(p) not in {q for q, _ in upgrades}]
    xml_paths = [Path(p) for p in paths if str(p).endswith(".xml")]
    unknown = [str(p) for p in paths if not str(p).endswith((".json", ".xml"))]
    if unknown:
        raise ReportError(f"{', '.join(unknown)}: expected pytest-benchmark .json or JUnit .xml files")
    results = [load_benchmarks(p) for p in bench_paths]
    unique_labels(results)
    lines = ["# tf-distribute-suite report", "",
             f"From {', '.join(f'`{p.name}`' for p in paths)}. Benchmarks: `pytest benchmarks --benchmark-json F`; "
             "conformance: `pytest tests --junitxml F`. The method is in benchmarks/README.md.", ""]
    if results:
        measured = run_to_run_noise(results)
        if noise is None:
            noise = measured[0] if measured else 0.0
        if measured:
            lines += [f"Run-to-run variation: files of the same TensorFlow and Keras versions differ by up to "
                      f"{measured[0]:.0%} in step time (90th percentile of {measured[1]} pairs). Differences "
                      f"between versions smaller than the allowance used ({noise:.0%}) are marked within noise.", ""]
        lines += benchmark_sections(results, out, noise)
    for p in xml_paths:
        lines += conformance_section(p, load_conformance(p))
    for p, data in upgrades:
        lines += upgrade_section(p, data)
    report = out / "report.md"
    write_atomically(report, "\n".join(lines) + "\n")
    return report
