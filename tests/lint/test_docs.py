"""The documentation stays true: the README is a front door (short, no lab notes), the generated
tables of docs/ equal what their sources generate (``python -m tests.docs_pages``), every path
the README and docs/ name exists in the repository, .ci/run runs the README's command, and no
comment or docstring of the code carries an internal issue number."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from suite.harness.judging.judgment import Check
from tests import docs_pages
from tests.helpers import ROOT

README = ROOT / "README.md"
PAGES = [README, ROOT / "CHANGELOG.md", ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md",
         *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "research").glob("*.md"))]
# what a path of this repository starts with (a backticked `suite/...` is a claim that it exists)
TOP = ("suite/", "reference/", "tests/", "benchmarks/", "docs/", "examples/", "repros/", ".ci/")
TOP_FILES = ("known_deviations.toml", "tox.ini", "conftest.py", "pyproject.toml", "setup.py", "CHANGELOG.md",
             "README.md", "tox-overrides.txt", "MANIFEST.in")
LAB_NOTES = [(r"\btoday\b", "'today'"), (r"\bthis machine\b", "'this machine'"), (r"(?<![\w&])#\d+\b", "an issue number"),
             (r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", "a commit hash")]


def lab_notes(text: str) -> list[str]:
    """What a front door must not hold: each lab note found, with the line it is on."""
    return [f"{name}: {line.strip()[:100]}" for pattern, name in LAB_NOTES
            for line in text.splitlines() if re.search(pattern, line, re.I)]


def named_paths(text: str) -> set[str]:
    """Repository paths a page names: backticked ``suite/...``-like tokens and relative links."""
    found = set()
    for token in re.findall(r"`([^`\s]+)`", text) + re.findall(r"\]\(([^)#\s]+)\)", text):
        token = token.split("::")[0].rstrip(".,:;")
        token = re.sub(r":\w+$", "", token)  # package.module:factory, path:function
        if "://" in token or "*" in token or "{" in token or "<" in token:
            continue
        if token.startswith(TOP) or token in TOP_FILES:
            found.add(token)
    return found


def missing(page, text: str) -> list[str]:
    out = []
    for token in sorted(named_paths(text)):
        base = ROOT if not token.startswith(("./", "../")) else page.parent
        if not (base / token).exists():
            out.append(token)
    return out


def test_the_readme_is_a_front_door():
    text = README.read_text()
    check = Check("README.md")
    check.that(len(text.splitlines()) <= 200, "lines", len(text.splitlines()), "at most 200")
    check.equal(lab_notes(text), [], "lab notes (measurements and history go to docs/ and CHANGELOG.md)")
    for command in ["pytest tests", "python -m suite.check", "pytest benchmarks", "python -m suite.report"]:
        check.contains(text, [command], "the three uses")


def test_lab_notes_are_found():
    """The front-door check is not vacuous: each kind of lab note is found."""
    found = lab_notes("measured today\non this machine it took 5 min\nfixed in #14\nat a374d0e\nexit 0 in 3:21\n")
    Check("lab notes").equal([f.split(":")[0] for f in found], ["'today'", "'this machine'", "an issue number",
                                                                 "a commit hash"], "lab notes found")


CODE = ["suite", "reference", "benchmarks", "tests", "examples", "repros"]
ISSUE_NUMBER = re.compile(r"(?<![\w&/])#\d+\b")  # keras-team/keras#19363 names another project's thread: allowed


def issue_numbers_in_docs_of(path: Path, root: Path = ROOT) -> list[str]:
    """The internal issue numbers in a Python file's comments and docstrings, with their lines."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        prose = token.type == tokenize.COMMENT or (
            token.type == tokenize.STRING and token.string.lstrip("rbuRBU").startswith(('"""', "'''")))
        if prose and ISSUE_NUMBER.search(token.string):
            found.append(f"{path.relative_to(root)}:{token.start[0]}: {ISSUE_NUMBER.search(token.string)[0]}")
    return found


def test_no_issue_number_in_the_codes_comments_and_docstrings(tmp_path):
    """Code says what it does and why, not which internal issue brought it (history is the
    CHANGELOG's): no ``#N`` in a comment or docstring of the tree's Python files; another project's
    thread (``keras-team/keras#19363``) is a citation, and a ``#N`` in a plain string is data."""
    check = Check("comments and docstrings")
    files = [ROOT / "conftest.py"] + [f for top in CODE for f in sorted((ROOT / top).rglob("*.py"))]
    check.equal([hit for f in files for hit in issue_numbers_in_docs_of(f)], [], "internal issue numbers")
    probe = tmp_path / "probe.py"
    probe.write_text('"""The folder (#14)."""\nx = "deviation #0"  # see keras-team/keras#19363\ny = 1  # from #26\n')
    check.equal([hit.split(": ")[-1] for hit in issue_numbers_in_docs_of(probe, tmp_path)], ["#14", "#26"],
                "the issue numbers found in a file that has two")


def test_ci_runs_the_readmes_test_command():
    command = re.search(r"```bash\n(HYPOTHESIS_PROFILE=ci pytest tests)\n", README.read_text())
    check = Check(".ci/run")
    check.that(command is not None, "the README's test command", None, "HYPOTHESIS_PROFILE=ci pytest tests")
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    check.that(any(line.startswith(command.group(1)) for line in lines), "a line running the README's command",
               command.group(1), "in .ci/run")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_path_a_page_names_exists(page):
    Check(str(page.relative_to(ROOT))).equal(missing(page, page.read_text()), [],
                                             "paths named that the repository does not have")


def test_a_missing_path_is_found():
    text = "see `suite/harness/check.py` and [the page](docs/nowhere.md), `suite/layout.py`, `tox.ini`"
    Check("paths").equal(missing(README, text), ["docs/nowhere.md", "suite/harness/check.py"], "missing paths")


@pytest.mark.parametrize("page", sorted(docs_pages.tables()), ids=lambda p: str(p.relative_to(ROOT)))
def test_generated_tables_equal_their_sources(page):
    rows = docs_pages.tables()[page]
    Check(str(page.relative_to(ROOT))).equal(docs_pages.generated(page.read_text()), rows,
                                             "the generated table (python -m tests.docs_pages rewrites it)")


def test_a_stale_generated_table_is_found():
    page, rows = next(iter(docs_pages.tables().items()))
    stale = docs_pages.rewrite(page.read_text(), rows[:-1])
    Check("docs_pages").that(docs_pages.generated(stale) != rows, "a table missing its last row", "equal", "differs")
