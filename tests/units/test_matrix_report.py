"""The version matrix's results folder and ``python -m suite.report`` (suite/harness/reporting/results_dir.py,
across_versions.py) on synthetic runs (no engines): the conformance grid across versions, what
changed, each deviation's first and last version, step time across versions, and one-line errors;
and a real ``pytest --results-dir`` writing its folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from suite.harness.judging import deviations
from suite.harness.judging.judgment import Check
from suite.harness.reporting import across_versions, results_dir
from tests.helpers import run_pytest
from tests.units.test_report import _results, _write

REPO = Path(__file__).resolve().parents[2]

PASS, FAIL = "", '<failure message="PropertyFailure: got 1, but should be 2"/>'


def _dev(*ids):
    reason = "; ".join(f"known deviation {i} (signature matched 2x): what it does" for i in ids)
    return f'<skipped type="pytest.xfail" message="{reason}"/>'


def _point(root: Path, tf: str, keras: str, cases: dict, profile="ci", bench=None) -> Path:
    """A run's folder: versions.json and a JUnit file of ``{test id: outcome element}``."""
    folder = root / results_dir.folder_name({"tensorflow": tf, "keras": keras})
    folder.mkdir(parents=True)
    (folder / results_dir.VERSIONS).write_text(json.dumps({"tensorflow": tf, "keras": keras,
                                                      "conformance": {"profile": profile, "command": "pytest tests"}}))
    body = "".join(f'<testcase classname="tests.properties.{m}" name="{n}" time="0.1">{o}</testcase>'
                   for (m, n), o in cases.items())
    (folder / results_dir.CONFORMANCE).write_text(f'<testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')
    if bench is not None:
        (folder / results_dir.BENCH).write_text(bench.read_text())
    return folder


def _row(text: str, start: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith(start))
    return [c.strip() for c in line.strip("|").split("|")]


def _entry(id_, tf, keras, tests=("tests/properties/x.py::f",)):
    return deviations.Deviation(id_, tests, tf, keras, "s", (), "now")


def test_report_shows_the_grid_what_changed_and_each_deviations_range(tmp_path):
    loss, bn = ("test_losses", "test_loss[mirrored:2-float32]"), ("test_blocks", "test_bn[mirrored:2]")
    loss_mw = ("test_losses", "test_loss[multi_worker:2x1-float32]")
    same = ("test_input", "test_same[mirrored:2]")
    gap = ("test_input", "test_gap[mirrored:2]")  # gap-dev: seen in 2.12 and 2.21; 2.15, outside its range, lacks it
    runs = tmp_path / "results"
    # out of order on purpose: the report orders by TensorFlow, then Keras
    _point(runs, "2.21.0", "3.15.1", {loss: PASS, loss_mw: PASS, bn: _dev("bn-one-pass"), same: PASS,
                                      gap: _dev("gap-dev")})
    _point(runs, "2.12.1", "2.12.0", {loss: _dev("empty-replica"), loss_mw: FAIL, bn: _dev("bn-one-pass", "bn-f64"),
                                      same: PASS, gap: _dev("gap-dev")}, profile="quick")
    _point(runs, "2.15.1", "2.15.0", {loss: PASS, loss_mw: PASS, bn: _dev("bn-one-pass"), same: PASS})
    entries = [_entry("gap-dev", ">=2.12,!=2.15.*", ">=2"), _entry("bn-one-pass", ">=2.12", ">=2"),
               _entry("empty-replica", ">=2.12,<2.13", ">=2"), _entry("bn-f64", ">=2.12,<2.16", ">=2,<3",
                                                                   ("tests/properties/test_blocks.py::test_bn[*]",)),
               _entry("never-seen", ">=2.16", ">=3")]
    text = across_versions.write(runs, tmp_path / "out", entries=entries).read_text()
    check = Check("suite.report")
    header = _row(text, "| property |")
    check.equal(header, ["property", "`2.12.1 / 2.12.0 (quick)`", "`2.15.1 / 2.15.0`", "`2.21.0 / 3.15.1`"],
                "the grid's columns (oldest first; a quick run marked)")
    check.equal(_row(text, "| `test_losses::test_loss`"), ["`test_losses::test_loss`", "**FAIL** 1/2", "✓", "✓"],
                "the loss property's row (the worst of its specs' items)")
    check.equal(_row(text, "| `test_blocks::test_bn`"), ["`test_blocks::test_bn`", "dev [1, 2]", "dev [2]", "dev [2]"],
                "the batch-norm property's row (the deviations by number)")
    check.contains(text, ["Deviations: [1] `bn-f64` · [2] `bn-one-pass` · [3] `empty-replica`"], "the grid's legend")
    first, full = text.split("## What changed", 1)[0], text.split("## Every property across versions", 1)[1]
    check.that("test_input::test_same" not in first, "a property with one outcome everywhere in the first grid",
               first, "left to the full grid")
    check.contains(first, ["The other 1 properties have one outcome"], "the first grid's note of the rest")
    check.equal(_row(full, "| `test_input::test_same`"), ["`test_input::test_same`", "✓", "✓", "✓"],
                "the full grid's row of that property")
    changed = text.split("## What changed", 1)[1].split("\n## ", 1)[0]
    check.contains(changed, ["`test_losses::test_loss`: Keras 2, 2.12.1 / 2.12.0 (quick) → 2.15.1 / 2.15.0: "
                             "**FAIL** 1/2 → ✓", "`test_blocks::test_bn`: Keras 2, 2.12.1 / 2.12.0 (quick) → "
                             "2.15.1 / 2.15.0", "gone: bn-f64"],
                   "what changed")
    check.that("2.15.1 / 2.15.0 → 2.21.0" not in changed, "what changed from 2.15 to 2.21", changed, "nothing")
    check.equal(_row(text, "| `bn-one-pass`"), ["`bn-one-pass`", "TF >=2.12; Keras >=2", "2.12.1 / 2.12.0 (quick)",
                                                "2.21.0 / 3.15.1", "3 of 3", "–", "2.12.0 – 3.15.1", "–"],
                "the one-pass deviation's declared range, first and last version and Keras seen")
    check.equal(_row(text, "| `empty-replica`")[2:5], ["2.12.1 / 2.12.0 (quick)", "2.12.1 / 2.12.0 (quick)", "1 of 1"],
                "a deviation seen in one version only")
    check.equal(_row(text, "| `bn-f64`")[4:], ["1 of 2", "–", "2.12.0", "2.15.0, 3.15.1"],
                "a deviation declared for two runs and seen in one; the Keras versions that ran its test without it")
    check.equal(_row(text, "| `never-seen`")[2:5], ["not observed", "–", "0 of 1"], "an entry no run observed")
    check.equal(_row(text, "| `gap-dev`")[4:6], ["2 of 2", "–"], "a run between first and last outside the range")


def test_what_changed_follows_each_keras_generation_and_groups_the_switch(tmp_path):
    """Runs of Keras 2 (tf-keras) and Keras 3 interleave in TensorFlow order; what changed compares
    each with the previous run of its own generation (a TensorFlow upgrade), and Keras 2 with Keras 3
    on the same TensorFlow, one line for the TensorFlow versions where the switch changes alike."""
    clip, loss = ("test_blocks", "test_clip[mirrored:2]"), ("test_losses", "test_loss[mirrored:2]")
    runs = tmp_path / "results"
    _point(runs, "2.16.2", "2.16.0", {clip: PASS, loss: PASS})
    _point(runs, "2.16.2", "3.15.1", {clip: _dev("clip-per-replica"), loss: PASS})
    _point(runs, "2.17.1", "2.17.0", {clip: PASS, loss: FAIL})
    _point(runs, "2.17.1", "3.15.1", {clip: _dev("clip-per-replica"), loss: PASS})
    text = across_versions.write(runs, tmp_path / "out", entries=[]).read_text()
    changed = text.split("## What changed", 1)[1].split("\n## ", 1)[0]
    check = Check("suite.report")
    check.contains(changed, ["- `test_blocks::test_clip`: Keras 2 → 3 on TF 2.16.2, 2.17.1: ✓ → dev "
                             "(`clip-per-replica`); appears: clip-per-replica\n",
                             "- `test_losses::test_loss`: Keras 2, 2.16.2 / 2.16.0 → 2.17.1 / 2.17.0: ✓ → **FAIL** "
                             "1/1; Keras 2 → 3 on TF 2.17.1: **FAIL** 1/1 → ✓\n"], "what changed")
    check.that("2.16.2 / 3.15.1 → 2.17.1 / 2.17.0" not in changed and "2.16.2 / 2.16.0 → 2.16.2 / 3.15.1" not in changed,
               "what changed compares across generations only on the same TensorFlow", changed,
               "no change between runs of different generations and versions")


def test_a_rerun_replaces_the_outcomes_of_the_tests_it_ran(tmp_path):
    """``conformance.rerun*.xml`` beside a run's conformance.xml (a rerun of its failures after a
    deviation was recorded): its outcome of a test id replaces the run's, the others stay."""
    bn, bn3 = ("test_blocks", "test_bn[mirrored:2]"), ("test_blocks", "test_bn[mirrored:3]")
    loss = ("test_losses", "test_loss[mirrored:2]")
    runs = tmp_path / "results"
    folder = _point(runs, "2.16.2", "2.16.0", {bn: FAIL, bn3: FAIL, loss: FAIL})
    body = f'<testcase classname="tests.properties.{bn[0]}" name="{bn[1]}" time="0.1">{_dev("bn-empty")}</testcase>'
    (folder / "conformance.rerun.xml").write_text(f"<testsuites><testsuite>{body}</testsuite></testsuites>")
    text = across_versions.write(runs, tmp_path / "out", entries=[]).read_text()
    check = Check("suite.report")
    check.equal(_row(text, "| property |")[1], "`2.16.2 / 2.16.0 (+ rerun)`", "the column of a run with a rerun")
    check.equal(_row(text, "| `test_blocks::test_bn`")[1], "**FAIL** 1/2",
                "test_bn: mirrored:2 from the rerun (a deviation), mirrored:3 still the run's failure")
    check.equal(_row(text, "| `test_losses::test_loss`")[1], "**FAIL** 1/1", "a test the rerun did not run")
    (folder / "conformance.rerun.2.xml").write_text(f"<testsuites><testsuite>{body.replace('mirrored:2', 'mirrored:3')}"
                                                   "</testsuite></testsuites>")
    again = across_versions.write(runs, tmp_path / "out2", entries=[]).read_text()
    check.equal(_row(again, "| `test_blocks::test_bn`")[1], "dev [1]", "test_bn after a second rerun")


def test_step_time_across_versions_with_the_ratio_to_the_newest(tmp_path):
    runs = tmp_path / "results"
    old = _write(tmp_path, "old.json", _results(round_scale=2.0, iqr=0.02), tf="2.15.1", keras="2.15.0")
    new = _write(tmp_path, "new.json", _results(iqr=0.02))
    _point(runs, "2.15.1", "2.15.0", {}, bench=old)
    _point(runs, "2.21.0", "3.15.1", {}, bench=new)
    text = across_versions.write(runs, tmp_path / "out").read_text()
    check = Check("suite.report")
    # 1.0 s per round of 100 steps on 2.21: 10 ms; twice that on 2.15
    check.equal(_row(text, "| `mirrored:2`"), ["`mirrored:2`", "20 (x2.00)", "10"], "mirrored:2's step time row")
    check.that((tmp_path / "out" / "versions-cnn-weak.png").exists(), "the plot across versions",
               sorted(p.name for p in (tmp_path / "out").iterdir()), "versions-cnn-weak.png")
    base = across_versions.write(runs, tmp_path / "out2", baseline="2.15.1").read_text()
    check.equal(_row(base, "| `mirrored:2`"), ["`mirrored:2`", "20", "10 (x0.50)"], "the ratio to --baseline 2.15.1")


def test_repeated_benchmark_runs_give_the_median_and_the_run_to_run_noise(tmp_path):
    """bench.json and bench.2.json of a version: the cell is the median of the runs' medians, and
    the difference between runs of the same versions is the allowance that marks a change within
    noise (an A/A comparison), as the benchmark report does."""
    runs = tmp_path / "results"
    new = _point(runs, "2.21.0", "3.15.1", {}, bench=_write(tmp_path, "a.json", _results(iqr=0.001)))
    old = _point(runs, "2.15.1", "2.15.0", {},
                 bench=_write(tmp_path, "c.json", _results(round_scale=1.3, iqr=0.001), tf="2.15.1", keras="2.15.0"))
    # 2.21's second run: its three train steps 20% slower (its plain step the same); 2.15's two runs
    # agree: of the 8 differences 3 are 20%, the 90th percentile
    _write(new, "bench.2.json", _results(round_scale=1.2, iqr=0.001))
    _write(old, "bench.2.json", _results(round_scale=1.3, iqr=0.001), tf="2.15.1", keras="2.15.0")
    text = across_versions.write(runs, tmp_path / "out", entries=[]).read_text()
    check = Check("suite.report")
    # mirrored:2: 10 and 12 ms on 2.21 (median 11), 13 ms on 2.15: x1.18, within the 20% the runs differ by
    check.equal(_row(text, "| `mirrored:2`"), ["`mirrored:2`", "13 (x1.18 ≈)", "11"], "mirrored:2 over two runs each")
    check.equal(_row(text, "| spec |")[1:], ["`2.15.1 / 2.15.0` (2 runs)", "`2.21.0 / 3.15.1` (2 runs)"],
                "the columns name their runs")
    check.contains(text, ["differ by at most 20%", "of 8 step benchmarks"], "the measured run-to-run variation")
    (new / "bench.2.json").unlink()
    (old / "bench.2.json").unlink()
    once = across_versions.write(runs, tmp_path / "out2", entries=[]).read_text()
    check.equal(_row(once, "| `mirrored:2`"), ["`mirrored:2`", "13 (x1.30)", "10"], "one run each: no allowance")
    check.contains(once, ["no version was run twice"], "the section says the variation is not measured")


def test_an_empty_results_folder_is_a_one_line_error(tmp_path):
    (tmp_path / "results").mkdir()
    proc = subprocess.run([sys.executable, "-m", "suite.report", str(tmp_path / "results"), "-o", str(tmp_path / "o")],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    check = Check("suite.report")
    check.equal(proc.returncode, 2, "the exit code for a folder without runs", proc.stderr)
    check.contains(proc.stderr, ["no results of a run in it"], "the error")
    check.equal(proc.stderr.strip().count("\n"), 0, "line breaks in the error")


def test_results_dir_writes_the_runs_folder_named_by_its_versions(tmp_path, suite_state):
    proc = run_pytest(["tests/units/test_specs.py", "--results-dir", str(tmp_path)], 300, HYPOTHESIS_PROFILE="quick")
    v = suite_state.versions
    folder = tmp_path / f"tf{v['tensorflow']}-keras{v['keras']}"
    check = Check("--results-dir")
    check.equal(proc.returncode, 0, "the child pytest's exit code", proc.stdout[-2000:])
    check.equal(sorted(p.name for p in folder.iterdir()), ["conformance.xml", "versions.json"], f"files in {folder}")
    written = json.loads((folder / "versions.json").read_text())
    check.equal((written["tensorflow"], written["keras"], written["conformance"]["profile"]),
                (v["tensorflow"], v["keras"], "quick"), "versions.json")
    point = results_dir.load(tmp_path)[0]
    check.that(sum(o.counts["pass"] for o in across_versions.load_outcomes(point.conformance).values()) > 0,
               "passes in the folder's conformance.xml", point.conformance.read_text()[:300], "some")
    check.equal(results_dir.file_run_id(folder / "conformance.xml"), written["conformance"]["tfds_run_id"],
                "the run id of conformance.xml and the one versions.json records")
    # a versions.json cut short (as a killed run of an older suite left it): the next run replaces it
    (folder / "versions.json").write_text('{"tensorflow": "2.')
    again = run_pytest(["tests/units/test_specs.py", "--results-dir", str(tmp_path)], 300, HYPOTHESIS_PROFILE="quick")
    check.equal(again.returncode, 0, "the next run's exit code", again.stdout[-2000:])
    check.equal(results_dir.file_run_id(folder / "conformance.xml"),
                json.loads((folder / "versions.json").read_text())["conformance"]["tfds_run_id"], "the next run's ids")


def test_a_column_of_a_tensorflow_with_the_keras_it_shipped_with_says_so():
    check = Check("suite.report column heads")
    for tf, keras, want in [("2.17.1", "3.4.1", True), ("2.21.0", "3.13.2", True), ("2.17.1", "3.15.1", False),
                            ("2.15.1", "2.15.0", False), ("2.16.2", "2.16.0", False)]:
        label = across_versions.point_label(results_dir.Point(tf, keras, Path("x"), "ci"))
        check.equal("as shipped" in label, want, f"the head of TF {tf} / Keras {keras} ({label})")


def _config(xmlpath=None, args=("tests",)):
    """What results_dir.configure reads of a pytest config."""
    from types import SimpleNamespace
    return SimpleNamespace(option=SimpleNamespace(xmlpath=xmlpath), args=list(args),
                           invocation_params=SimpleNamespace(args=tuple(args)))


def _junit(path: Path, name: str):
    path.write_text(f'<testsuites><testsuite name="pytest"><testcase classname="tests.properties.test_x" '
                    f'name="{name}" time="0.1"/></testsuite></testsuites>')


def test_a_run_writes_its_files_at_its_end_each_with_its_run_id(tmp_path):
    """Until a run ends its folder holds the previous run's files, untouched (a run killed in between
    leaves them, all of one run); at its end its JUnit gets its run id and its name, then versions.json
    records the same id. A versions.json cut short is replaced, not read."""
    v = {"tensorflow": "2.21.0", "keras": "3.15.1"}
    check = Check("results_dir")
    first = _config()
    run_a = results_dir.configure(first, str(tmp_path), v)
    _junit(Path(first.option.xmlpath), "test_a")
    results_dir.finish(run_a)
    folder = tmp_path / results_dir.folder_name(v)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    check.equal(sorted(before), ["conformance.xml", "versions.json"], "the folder after run A")
    check.equal(results_dir.file_run_id(folder / "conformance.xml"),
                json.loads((folder / "versions.json").read_text())["conformance"]["tfds_run_id"], "run A's ids")

    second = _config()
    run_b = results_dir.configure(second, str(tmp_path), v)
    _junit(Path(second.option.xmlpath), "test_b")  # run B is under way (or was killed here)
    check.equal({p.name: p.read_bytes() for p in folder.iterdir() if not p.name.startswith(".")}, before,
                "the folder's files while run B runs")
    check.equal([p.name for p in results_dir.load(tmp_path)[0].path.iterdir() if p.name.startswith(".")],
                [Path(second.option.xmlpath).name], "run B's file, under its temporary name")
    (folder / "versions.json").write_text('{"tensorflow": "2.21')  # as an older suite's killed run left it
    stale = folder / ".conformance.xml.0123456789abcdef.partial"  # a run killed before its end, long ago
    _junit(stale, "test_killed")
    os.utime(stale, (run_b["started"] - 3600, run_b["started"] - 3600))
    results_dir.finish(run_b)
    check.equal(sorted(p.name for p in folder.iterdir()), ["conformance.xml", "versions.json"],
                "after run B (a killed run's temporary file removed)")
    check.equal(results_dir.file_run_id(folder / "conformance.xml"), run_b["run_id"], "conformance.xml's run")
    written = json.loads((folder / "versions.json").read_text())
    check.equal((written["tensorflow"], written["conformance"]["tfds_run_id"]), ("2.21.0", run_b["run_id"]),
                "versions.json after run B")
    check.contains((folder / "conformance.xml").read_text(), ['name="test_b"'], "run B's JUnit")


def _report(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "suite.report", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def test_the_report_refuses_what_a_killed_run_could_leave_in_one_line(tmp_path):
    """A versions.json cut short, a folder whose conformance.xml comes from another run than its
    versions.json records, and a --json cut short: one line naming the file, exit 2 (not a traceback)."""
    check = Check("suite.report")
    cases = {}
    truncated = tmp_path / "truncated"
    folder = _point(truncated, "2.21.0", "3.15.1", {("test_x", "test_a"): PASS})
    (folder / results_dir.VERSIONS).write_text('{"tensorflow": "2.2')
    cases["a versions.json cut short"] = ([truncated, "-o", tmp_path / "o1"], ["versions.json: unreadable"])
    mixed = tmp_path / "mixed"
    folder = _point(mixed, "2.21.0", "3.15.1", {("test_x", "test_a"): PASS})
    data = json.loads((folder / results_dir.VERSIONS).read_text())
    data["conformance"]["tfds_run_id"] = "run-a"
    (folder / results_dir.VERSIONS).write_text(json.dumps(data))
    xml = (folder / results_dir.CONFORMANCE).read_text().replace(
        '<testsuite name="pytest">', '<testsuite name="pytest"><properties><property name="tfds_run_id" '
        'value="run-b"/></properties>')
    (folder / results_dir.CONFORMANCE).write_text(xml)
    cases["files of two runs"] = ([mixed, "-o", tmp_path / "o2"], ["conformance.xml comes from another run (run-b)",
                                                                   "records for it (run-a)"])
    cut = tmp_path / "check.json"
    cut.write_text('{"kind": "upgrade", "specs": [{"spec": "mirrored:2", "sta')
    cases["a --json cut short"] = ([cut, "-o", tmp_path / "o3"], ["check.json: not a readable JSON file"])
    for what, (args, says) in cases.items():
        proc = _report(*args)
        check.equal(proc.returncode, 2, f"the exit status for {what}", proc.stderr[-1000:])
        check.contains(proc.stderr, says, f"the error for {what}")
        check.equal(proc.stderr.strip().count("\n"), 0, f"line breaks in the error for {what}")
