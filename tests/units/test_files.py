"""What the suite writes for later reading (suite/common/files.py): strict JSON, whose non-finite
numbers are strings, and files replaced whole, never left half-written or beside a temporary."""

from __future__ import annotations

import json

import numpy as np

from suite.common import files
from suite.harness.judging.judgment import Check


def _strict(text: str):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_json_is_strict_with_non_finite_numbers_as_strings(tmp_path):
    data = {"nan": float("nan"), "inf": [np.float32(np.inf), -float("inf")], "x": 1.5, "n": 3, "s": "NaN?",
            "nested": {"y": np.float64(2.0)}}
    check = Check("files.dumps_strict")
    check.equal(_strict(files.dumps_strict(data)), {"nan": "NaN", "inf": ["Infinity", "-Infinity"], "x": 1.5, "n": 3,
                                                    "s": "NaN?", "nested": {"y": 2.0}}, "the JSON read back")
    path = files.write_json(tmp_path / "out.json", data, indent=1)
    check.equal(_strict(path.read_text())["inf"], ["Infinity", "-Infinity"], "the file read back strictly")
    check.equal(sorted(p.name for p in tmp_path.iterdir()), ["out.json"], "files in the folder (no temporary)")


def test_a_file_is_replaced_whole(tmp_path):
    path = tmp_path / "report.md"
    files.write_atomically(path, "old\n")
    inode = path.stat().st_ino
    files.write_atomically(path, "new\n")
    check = Check("files.write_atomically")
    check.equal(path.read_text(), "new\n", "the file's text")
    check.that(path.stat().st_ino != inode, "the file's inode", path.stat().st_ino, "a new file renamed over the old")
    check.equal(sorted(p.name for p in tmp_path.iterdir()), ["report.md"], "files in the folder")
