"""The version matrix's results folder: each run of ``pytest tests`` or ``pytest benchmarks``
with ``--results-dir ROOT`` writes under ``ROOT/tf<TF>-keras<Keras>/`` (named by the versions
its engines report, so a tox env and a plain venv of the same versions share a folder), and
``python -m suite.report ROOT`` reads every such folder. No TensorFlow here."""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

from ...common import files
from ..pool.versions import as_tuple

CONFORMANCE = "conformance.xml"  # JUnit XML of pytest tests
RERUNS = "conformance.rerun*.xml"  # JUnit XML of reruns of some of its tests (pytest --junitxml, by hand)
BENCH = "bench.json"  # pytest-benchmark JSON of pytest benchmarks
BENCH_REPEATS = "bench.*.json"  # later runs of them (pytest benchmarks --benchmark-json FOLDER/bench.2.json)
VERSIONS = "versions.json"


def folder_name(versions: dict) -> str:
    return f"tf{versions['tensorflow']}-keras{versions['keras']}"


RUN_ID = "tfds_run_id"  # the key (JSON) and the JUnit testsuite property that name a file's run


def configure(config, root: str | None, v: dict) -> dict | None:
    """With ``--results-dir ROOT``: point pytest's JUnit XML (tests) or pytest-benchmark's JSON
    (benchmarks) into this run's folder unless given explicitly, under a temporary name that
    ``finish`` renames at the session's end, and return what ``finish`` needs (the versions ``v``
    are the engines'). Nothing in the folder is touched before then: a run killed in between
    leaves the previous run's files, all of one run."""
    if not root or hasattr(config, "workerinput"):  # the controller of pytest-xdist writes them
        return None
    if not v.get("tensorflow"):
        return None  # no TensorFlow: nothing will run; the engines say so
    folder = Path(root) / folder_name(v)
    folder.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:16]
    benchmarks = any(Path(a).parts[:1] == ("benchmarks",) for a in config.args)
    if benchmarks and hasattr(config.option, "benchmark_json") and not config.option.benchmark_json:
        final = folder / BENCH
        config.option.benchmark_json = _partial(final, run_id)
    elif not benchmarks and not config.option.xmlpath:
        final = folder / CONFORMANCE
        config.option.xmlpath = str(_partial(final, run_id))
    else:
        return None  # a file the user named: written where they said
    return {"folder": folder, "final": final, "kind": "benchmarks" if benchmarks else "conformance", "run_id": run_id,
            "started": time.time(),
            "versions": {"tensorflow": v["tensorflow"], "keras": v["keras"]},
            "run": {"profile": os.environ.get("HYPOTHESIS_PROFILE", "dev"),
                    "command": " ".join(["pytest", *config.invocation_params.args])}}


def _partial(final: Path, run_id: str) -> Path:
    return final.with_name(f".{final.name}.{run_id}.partial")


def finish(run: dict | None) -> None:
    """At the session's end: the run's file gets its run id and its final name, and versions.json
    records the run (both written atomically, the file first). An unreadable versions.json is
    replaced; a run that wrote no file leaves the folder as it was."""
    if run is None:
        return
    partial = _partial(run["final"], run["run_id"])
    if not partial.exists():
        return
    if run["kind"] == "benchmarks":
        data = json.loads(partial.read_text())
        data[RUN_ID] = run["run_id"]
        files.write_json(run["final"], data, indent=4)
    else:
        tree = ET.parse(partial)
        suites = [tree.getroot()] if tree.getroot().tag == "testsuite" else list(tree.getroot().iter("testsuite"))
        for suite in suites:
            props = suite.find("properties")
            if props is None:
                props = ET.Element("properties")
                suite.insert(0, props)
            ET.SubElement(props, "property", name=RUN_ID, value=run["run_id"])
        files.write_atomically(run["final"], ET.tostring(tree.getroot(), encoding="utf-8", xml_declaration=True))
    partial.unlink()
    for stale in run["folder"].glob(f".{run['final'].name}.*.partial"):  # left by runs killed before their end
        if stale.stat().st_mtime < run["started"]:
            stale.unlink(missing_ok=True)
    path = run["folder"] / VERSIONS
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        data = {}  # a file a killed run cut short (before this suite wrote it atomically)
    data = data if isinstance(data, dict) else {}
    data.update(run["versions"])
    data[run["kind"]] = {**run["run"], RUN_ID: run["run_id"]}
    files.write_json(path, data, indent=1)


class FolderError(ValueError):
    """A results folder the report cannot use; the message is one line naming it."""


def file_run_id(path: Path) -> str | None:
    """The run id a conformance JUnit or a bench JSON carries (None: none, as before run ids)."""
    try:
        if path.suffix == ".json":
            return json.loads(path.read_text()).get(RUN_ID)
        for prop in ET.parse(path).getroot().iter("property"):
            if prop.get("name") == RUN_ID:
                return prop.get("value")
    except (OSError, ValueError, ET.ParseError) as exc:
        raise FolderError(f"{path}: unreadable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") \
            from None
    return None


@dataclasses.dataclass
class Point:
    """One point of the matrix: its versions and the files a run left there."""

    tensorflow: str
    keras: str
    path: Path
    profile: str = "?"  # the hypothesis profile of the conformance run (quick: the version matrix's quick selection)

    @property
    def label(self) -> str:
        return f"TF {self.tensorflow} / Keras {self.keras}"

    @property
    def conformance(self) -> Path | None:
        p = self.path / CONFORMANCE
        return p if p.exists() else None

    @property
    def reruns(self) -> list[Path]:
        """``conformance.rerun*.xml``: JUnit files of reruns of some of the run's tests (after a
        deviation was recorded, say), oldest first; a rerun's outcome of a test id replaces the
        run's."""
        return sorted(self.path.glob(RERUNS), key=lambda f: (f.stat().st_mtime, f.name))

    @property
    def bench(self) -> Path | None:
        p = self.path / BENCH
        return p if p.exists() else None

    @property
    def benches(self) -> list[Path]:
        """``bench.json`` and its repeats ``bench.*.json`` (runs of the same benchmarks, for the
        machine's run-to-run variation), bench.json first."""
        return ([self.bench] if self.bench else []) + sorted(self.path.glob(BENCH_REPEATS))

    @property
    def order(self) -> tuple:
        """TensorFlow first, then the Keras generation (legacy Keras 2 before Keras 3)."""
        return as_tuple(self.tensorflow), as_tuple(self.keras)


def load(root: Path) -> list[Point]:
    """Every folder of ``root`` with a versions.json, oldest TensorFlow first. FolderError for a
    folder whose versions.json is unreadable or whose files come from another run than it records."""
    points = []
    for sub in sorted(Path(root).iterdir()) if Path(root).is_dir() else []:
        f = sub / VERSIONS
        if sub.is_dir() and f.exists():
            try:
                v = json.loads(f.read_text())
                tensorflow, keras = v["tensorflow"], v["keras"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise FolderError(f"{f}: unreadable ({type(exc).__name__}: {exc}); run the suite again into "
                                  "that folder, or remove it") from None
            for kind, name in (("conformance", CONFORMANCE), ("benchmarks", BENCH)):
                if not (sub / name).exists():
                    continue
                recorded, found = (v.get(kind) or {}).get(RUN_ID), file_run_id(sub / name)
                if recorded != found:  # both None: a folder written before run ids
                    raise FolderError(f"{sub}: {name} comes from another run ({found or 'no run id'}) than "
                                      f"{VERSIONS} records for it ({recorded or 'none'}); run the suite again into "
                                      "that folder, or remove it")
            run = v.get("conformance", {})
            points.append(Point(tensorflow, keras, sub, run.get("profile", "?")))
    return sorted(points, key=lambda p: p.order)

