"""The version matrix's results folder (#14): each run of ``pytest tests`` or ``pytest benchmarks``
with ``--results-dir ROOT`` writes under ``ROOT/tf<TF>-keras<Keras>/`` (named by the versions
its engines report, so a tox env and a plain venv of the same versions share a folder), and
``python -m suite.report ROOT`` reads every such folder. No TensorFlow here."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from ..engines.versions import as_tuple

CONFORMANCE = "conformance.xml"  # JUnit XML of pytest tests
RERUNS = "conformance.rerun*.xml"  # JUnit XML of reruns of some of its tests (pytest --junitxml, by hand)
BENCH = "bench.json"  # pytest-benchmark JSON of pytest benchmarks
BENCH_REPEATS = "bench.*.json"  # later runs of them (pytest benchmarks --benchmark-json FOLDER/bench.2.json)
VERSIONS = "versions.json"


def folder_name(versions: dict) -> str:
    return f"tf{versions['tensorflow']}-keras{versions['keras']}"


def configure(config, root: str | None, v: dict) -> None:
    """With ``--results-dir ROOT``: point pytest's JUnit XML (tests) or pytest-benchmark's JSON
    (benchmarks) into this run's folder unless given explicitly, and record the versions ``v``
    (the engines')."""
    if not root or hasattr(config, "workerinput"):  # the controller of pytest-xdist writes them
        return
    if not v.get("tensorflow"):
        return  # no TensorFlow: nothing will run; the engines say so
    folder = Path(root) / folder_name(v)
    folder.mkdir(parents=True, exist_ok=True)
    benchmarks = any(Path(a).parts[:1] == ("benchmarks",) for a in config.args)
    if benchmarks and hasattr(config.option, "benchmark_json") and not config.option.benchmark_json:
        config.option.benchmark_json = folder / BENCH
    elif not benchmarks and not config.option.xmlpath:
        config.option.xmlpath = str(folder / CONFORMANCE)
    # one file for both kinds of run of these versions: the versions, and per kind what ran
    path = folder / VERSIONS
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(tensorflow=v["tensorflow"], keras=v["keras"])
    data["benchmarks" if benchmarks else "conformance"] = {
        "profile": os.environ.get("HYPOTHESIS_PROFILE", "dev"),
        "command": " ".join(["pytest", *config.invocation_params.args])}
    path.write_text(json.dumps(data, indent=1) + "\n")


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
    """Every folder of ``root`` with a versions.json, oldest TensorFlow first."""
    points = []
    for sub in sorted(Path(root).iterdir()) if Path(root).is_dir() else []:
        f = sub / VERSIONS
        if sub.is_dir() and f.exists():
            v = json.loads(f.read_text())
            run = v.get("conformance", {})
            points.append(Point(v["tensorflow"], v["keras"], sub, run.get("profile", "?")))
    return sorted(points, key=lambda p: p.order)

