"""What the version matrix measured, kept in the repository (``docs/measured_runs.json``), and what
the known-deviations file's version ranges must agree with. No TensorFlow here.

``python -m suite.report RESULTS --record docs/measured_runs.json`` adds (or replaces, for the
same versions and profile) one run per results folder of ``RESULTS``: its versions, profile and
command, how many items passed, deviated, failed and were skipped, and for every known deviation
how many of the items its ``tests`` name ran (were not skipped) and how many it excused.

``disagreements`` is the meta test's judgment: an entry whose declared range includes the
versions of a recorded ci-profile run that ran some of its tests but never observed it (its range
is wider than what was measured), and an entry a run observed outside its declared range (the
record is older than the range)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from ... import layout
from ...common.files import write_atomically
from ..pool.versions import as_tuple
from . import results_dir
from .run_report import case_outcome

PATH = (layout.REPO_ROOT or layout.IMPORT_ROOT) / "docs" / "measured_runs.json"  # the repository's record
# the profiles whose runs exercise an entry whose tests they ran: the ci profile draws enough cases on
# every default spec; a quick run (four examples on two specs) may not draw the entry's condition
EXERCISING = ("ci",)


def node_id(case: ET.Element) -> str:
    """A JUnit test case's pytest node id (``tests/properties/test_x.py::test_y[...]``)."""
    return f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name', '')}"


def summarize(point: results_dir.Point, entries) -> dict:
    """One run of the record from a results folder's conformance XML (and its reruns)."""
    cases: dict[str, ET.Element] = {}
    for path in [point.conformance, *point.reruns]:
        for case in ET.parse(path).getroot().iter("testcase"):
            cases[node_id(case)] = case
    items = {"pass": 0, "deviation": 0, "fail": 0, "skip": 0}
    per: dict[str, dict] = {d.id: {"ran": 0, "observed": 0} for d in entries}
    for nodeid, case in sorted(cases.items()):
        outcome, named = case_outcome(case)
        items[outcome] += 1
        for d in entries:
            if outcome != "skip" and d.matches(nodeid):
                per[d.id]["ran"] += 1
        for d in named:
            per.setdefault(d, {"ran": 0, "observed": 0})["observed"] += 1
    versions = json.loads((point.path / results_dir.VERSIONS).read_text())
    return {"tensorflow": point.tensorflow, "keras": point.keras, "profile": point.profile,
            "command": versions.get("conformance", {}).get("command", "?"), "items": items,
            "deviations": {k: v for k, v in sorted(per.items()) if v["ran"] or v["observed"]}}


def load(path: Path = PATH) -> list[dict]:
    return json.loads(path.read_text())["runs"] if path.exists() else []


def record(results: Path, path: Path, entries) -> list[dict]:
    """Add each results folder's run to the record at ``path`` (a run of the same versions and
    profile replaces the recorded one); returns the runs added."""
    runs = load(path)
    added = [summarize(p, entries) for p in results_dir.load(results) if p.conformance]
    keys = {(r["tensorflow"], r["keras"], r["profile"]) for r in added}
    runs = [r for r in runs if (r["tensorflow"], r["keras"], r["profile"]) not in keys] + added
    runs.sort(key=lambda r: (as_tuple(r["tensorflow"]), as_tuple(r["keras"]), r["profile"]))
    write_atomically(path, json.dumps({"runs": runs}, indent=1) + "\n")
    return added


def disagreements(entries, runs: list[dict]) -> list[str]:
    """Where a declared Keras/TensorFlow range and the measured runs disagree, one line each."""
    out = []
    for d in entries:
        for run in runs:
            seen = run["deviations"].get(d.id, {"ran": 0, "observed": 0})
            where = f"TF {run['tensorflow']} / Keras {run['keras']} ({run['profile']})"
            inside = d.applies_to(run["tensorflow"], run["keras"])
            if inside and seen["ran"] and not seen["observed"] and run["profile"] in EXERCISING:
                out.append(f"{d.id}: declared for TF {d.tensorflow}, Keras {d.keras}, but {where} ran "
                           f"{seen['ran']} of its tests and none showed it")
            if not inside and seen["observed"]:
                out.append(f"{d.id}: observed in {where}, outside its declared TF {d.tensorflow}, Keras {d.keras}")
    return out


def measured_keras(d, runs: list[dict]) -> tuple[list[str], list[str]]:
    """The Keras versions of the recorded runs that observed entry ``d``, and of those that ran
    its tests without observing it, oldest first."""
    shown = {r["keras"] for r in runs if r["deviations"].get(d.id, {}).get("observed")}
    quiet = {r["keras"] for r in runs if r["deviations"].get(d.id, {}).get("ran")} - shown
    return sorted(shown, key=as_tuple), sorted(quiet, key=as_tuple)
