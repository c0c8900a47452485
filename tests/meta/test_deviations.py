"""The known-deviations file: well-formed, its evidence exists, its patterns name real tests,
and the README lists every entry."""

from __future__ import annotations

import re
from pathlib import Path

from suite.harness import deviations
from suite.harness.check import Check

ROOT = Path(__file__).resolve().parents[2]


def test_file_parses_and_every_entry_has_existing_evidence():
    entries = deviations.load()
    assert entries
    for d in entries:
        for item in d.evidence:
            path = item.split()[0]
            if path.startswith(("repros/", "tests/")):
                Check(d.id).that((ROOT / path.split("::")[0]).exists(), "evidence file", path, "in the repository")


def test_patterns_name_existing_test_functions():
    for d in deviations.load():
        for pattern in d.tests:
            module, rest = pattern.split("::", 1)
            function = re.match(r"\w+", rest).group(0)
            Check(d.id).that(f"def {function}(" in (ROOT / module).read_text(), "test function of a pattern",
                             f"{module}::{function}", "defined in that module")


def test_readme_lists_every_deviation():
    readme = (ROOT / "README.md").read_text()
    for d in deviations.load():
        Check(d.id).that(d.id in readme, "the README's deviation table", "no row for it", "a row for it")


def test_patterns_match_only_what_they_say():
    d = deviations.Deviation("x", ("t.py::f[mirrored:{2,3}-{Adam,Nadam}]", "t.py::g[*-float64]"),
                             ">=2.16", ">=3", "s", (), "now")
    assert d.matches("t.py::f[mirrored:2-Adam]") and d.matches("t.py::f[mirrored:3-Nadam]")
    assert not d.matches("t.py::f[mirrored:1-Adam]") and not d.matches("t.py::f[mirrored:2-SGD]")
    assert d.matches("t.py::g[default-scalar-float64]") and not d.matches("t.py::g[default-float32]")
    assert d.applies_to("2.21.0", "3.15.1") and not d.applies_to("2.15.1", "2.15.0")
