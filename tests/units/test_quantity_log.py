"""``python -m suite.harness.tools.quantity_log``: which signatures cover each quantity a run
asked of, under two versions of the known-deviations file (synthetic files, no engines)."""

from __future__ import annotations

import subprocess
import sys

from suite.harness.judging import deviations
from suite.harness.judging.judgment import Check
from suite.harness.judging.quantity import Quantity
from suite.harness.tools import quantity_log
from tests.helpers import ROOT

ENTRY = ('[[deviation]]\nid = "d"\ntests = ["tests/properties/test_x.py::test_a[*]", "loop-check[mirrored:*]"]\n'
         'tensorflow = ">=2.16"\nkeras = ">=3,<3.5"\nsummary = "s"\nevidence = []\nfirst_seen = "now"\n'
         '[[deviation.signature]]\nkind = "model"\nmodel = "alternative_rule"\nquantity = {quantity}\n')


def _file(path, quantity: str):
    path.write_text(ENTRY.replace("{quantity}", quantity))
    return path


def test_a_rewritten_signature_that_covers_less_or_more_is_found(tmp_path, monkeypatch):
    """Every variable recorded has a step: ``step = "*"`` keeps what ``{kind = "variable"}`` covered;
    ``local_replica = "*"`` leaves out the loop check's variable (its copy is ``replica``)."""
    log = tmp_path / "q.jsonl"
    monkeypatch.setenv(deviations.QUANTITY_LOG, str(log))
    asked = [("tests/properties/test_x.py::test_a[mirrored:2]",
              Quantity.of("variable", "variable 0 on local replica 1 after step 2", name=0, local_replica=1, step=2)),
             ("tests/properties/test_x.py::test_a[mirrored:2]",
              Quantity.of("summed loss", "summed loss at step 2", step=2)),
             ("loop-check[mirrored:2]", Quantity.of("variable", "variable k (replica 0) after step 1", name="k",
                                                    replica=0, step=1))]
    for scope, what in asked:
        deviations.Ledger((), scope=scope).covering(what)  # what a run's ledgers write
    monkeypatch.delenv(deviations.QUANTITY_LOG)  # this test's own Checks consult a ledger too
    before = _file(tmp_path / "before.toml", '{ kind = "variable" }')
    same = _file(tmp_path / "same.toml", '{ kind = "variable", step = "*" }')
    narrower = _file(tmp_path / "narrower.toml", '{ kind = "variable", local_replica = "*" }')
    check = Check("quantity_log")
    logged = quantity_log.records(log)
    check.equal(len(logged), 3, "the quantities recorded")
    check.equal(quantity_log.differences(logged, deviations.load(before), deviations.load(same)), [],
                "differences where the new fields cover what the old covered")
    check.equal(quantity_log.differences(logged, deviations.load(before), deviations.load(narrower)),
                ["loop-check[mirrored:2]: variable k (replica 0) after step 1 (variable): no longer covered by d "
                 "signature 0"], "differences where the fields leave out the loop check's variables")
    proc = subprocess.run([sys.executable, "-m", "suite.harness.tools.quantity_log", str(log), "--before", str(before),
                           "--after", str(narrower)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    check.equal(proc.returncode, 1, "exit status with a difference", proc.stderr)
    check.contains(proc.stdout, ["3 quantities recorded; 1 differences"], "the command's summary")
