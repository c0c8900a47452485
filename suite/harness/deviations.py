"""The known-deviations file: every place where installed TF/Keras differs from the reference.

``known_deviations.toml`` holds ``[[deviation]]`` tables with ``id``, ``tests`` (test id
patterns: ``*`` and ``{a,b}``), ``tensorflow`` and ``keras`` version ranges (PEP 440 specifier sets), ``summary``,
``evidence`` (links and/or repro files in the repo) and ``first_seen``. conftest turns the tests
they match into strict xfails for the versions in range, so a fix in TF shows up as an XPASS.
An entry with ``racy = true`` is a race that shows in most runs but not all (lost concurrent
updates): its tests become non-strict xfails, and the summary must say so.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

PATH = Path(__file__).resolve().parents[2] / "known_deviations.toml"
REQUIRED = ("id", "tests", "tensorflow", "keras", "summary", "evidence", "first_seen")


@dataclasses.dataclass(frozen=True)
class Deviation:
    id: str
    tests: tuple[str, ...]
    tensorflow: str
    keras: str
    summary: str
    evidence: tuple[str, ...]
    first_seen: str
    racy: bool = False

    def applies_to(self, tf_version: str | None, keras_version: str | None) -> bool:
        if not tf_version or not keras_version:
            return False
        return (Version(tf_version) in SpecifierSet(self.tensorflow)
                and Version(keras_version) in SpecifierSet(self.keras))

    def matches(self, nodeid: str) -> bool:
        return any(_glob(pattern).fullmatch(nodeid) for pattern in self.tests)


def _glob(pattern: str) -> re.Pattern:
    """``*`` matches anything and ``{a,b}`` either alternative; everything else is literal
    (test ids contain ``[`` and ``]``, which fnmatch would treat as character classes)."""
    out = []
    for token in re.split(r"(\*|\{[^{}]*\})", pattern):
        if token == "*":
            out.append(".*")
        elif token.startswith("{") and token.endswith("}"):
            out.append("(?:" + "|".join(re.escape(alt) for alt in token[1:-1].split(",")) + ")")
        else:
            out.append(re.escape(token))
    return re.compile("".join(out))


def load(path: Path = PATH) -> list[Deviation]:
    """Parse and validate the file; a malformed entry is an error naming the entry."""
    data = tomllib.loads(path.read_text())
    out = []
    for i, entry in enumerate(data.get("deviation", [])):
        missing = [k for k in REQUIRED if k not in entry]
        if missing:
            raise ValueError(f"{path.name}: deviation #{i} ({entry.get('id')}) lacks {missing}")
        SpecifierSet(entry["tensorflow"])
        SpecifierSet(entry["keras"])
        out.append(Deviation(entry["id"], tuple(entry["tests"]), entry["tensorflow"],
                             entry["keras"], entry["summary"].strip(),
                             tuple(entry["evidence"]), entry["first_seen"], bool(entry.get("racy", False))))
    ids = [d.id for d in out]
    if len(ids) != len(set(ids)):
        raise ValueError(f"{path.name}: duplicate deviation ids")
    return out
