"""The known-deviations file: every place where installed TF/Keras differs from the reference.

``known_deviations.toml`` holds ``[[deviation]]`` tables with ``id``, ``tests`` (test id
patterns: ``*`` and ``{a,b}``: the tests the entry may excuse), ``tensorflow`` and ``keras``
version ranges (PEP 440 specifier sets), ``summary``, ``evidence`` (links and/or repro files in
the repo), ``first_seen`` and one or more ``[[deviation.signature]]`` tables that say what
TensorFlow does instead (suite/harness/judging/signatures.py).

The suite's plugin runs each test inside ``in_force(Ledger(entries in scope))``; every Check
comparison consults ``ledger_in_force()``, and the check of a user's loop asks a Ledger of the entries whose
``tests`` name its scope (``loop-check[SPEC]``) the same question (``Ledger.judge``). A
mismatch that a signature explains is tolerated and counted; any other mismatch fails as usual.
After the test, one with tolerated mismatches is reported as an expected failure naming the
entries and counts; a test whose results equal the reference where an entry predicts otherwise
fails ("update the entry").
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import json
import os
import tomllib
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ... import layout
from .quantity import probe_raised
from .signatures import CONDITIONS, NOTHING, Seen, Signature, glob

PATH = layout.DEVIATIONS_FILE
REQUIRED = ("id", "tests", "tensorflow", "keras", "summary", "evidence", "first_seen", "signature")
# ``remedy``: a change to the training the engine can make that removes the deviation's effect
# (REMEDIES); the upgrade check tries ``dense_gradients`` where the entry applies to one version only, the
# check of a script ``scaled_keras_losses`` and ``global_batch_loss`` on a FAIL nothing else explained
# (controls.by_remedy). ``workaround``:
# the catalogued cause (suite/harness/loopcheck/causes.py: CAUSES) whose fix avoids the deviation
# in the user's code; where the loop check diagnoses that cause beside this entry's raise, the loop is
# right but BLOCKED (the code is right elsewhere), and the cause's fix is shown as the way around it
OPTIONAL = ("remedy", "workaround")
REMEDIES = {
    "dense_gradients": "the gradients handed to apply_gradients made dense (tf.convert_to_tensor of each "
                       "tf.IndexedSlices), so the optimizer takes its dense path",
    "scaled_keras_losses": "Keras 3.8's loss scaling (each Keras loss reduced to a mean, and the regularization, "
                           "times 1/replicas; the loss tracker fed the unscaled loss)",
    "global_batch_loss": "a global-batch loss divisor (each replica's compiled loss divided by the global batch's "
                         "rows, tf.nn.compute_average_loss's rule, not by its own rows times the replicas)",
}


@dataclasses.dataclass(frozen=True)
class Deviation:
    id: str
    tests: tuple[str, ...]
    tensorflow: str
    keras: str
    summary: str
    evidence: tuple[str, ...]
    first_seen: str
    signatures: tuple[Signature, ...] = ()
    remedy: str | None = None  # REMEDIES
    workaround: str | None = None  # a cause id of the loop check (see OPTIONAL)

    def applies_to(self, tf_version: str | None, keras_version: str | None) -> bool:
        if not tf_version or not keras_version:
            return False
        return (Version(tf_version) in SpecifierSet(self.tensorflow)
                and Version(keras_version) in SpecifierSet(self.keras))

    def matches(self, nodeid: str) -> bool:
        return any(glob(pattern).fullmatch(nodeid) for pattern in self.tests)


def load(path: Path = PATH) -> list[Deviation]:
    """Parse and validate the file; a malformed entry is an error naming the entry."""
    data = tomllib.loads(path.read_text())
    out = []
    for i, entry in enumerate(data.get("deviation", [])):
        where = f"{path.name}: deviation #{i} ({entry.get('id')})"
        missing = [k for k in REQUIRED if k not in entry]
        if missing:
            raise ValueError(f"{where} lacks {missing}")
        unknown = set(entry) - set(REQUIRED) - set(OPTIONAL)
        if unknown:
            raise ValueError(f"{where} has unknown keys {sorted(unknown)}")
        SpecifierSet(entry["tensorflow"])
        SpecifierSet(entry["keras"])
        signatures = tuple(Signature.parse(t, where) for t in entry["signature"])
        if entry.get("remedy", next(iter(REMEDIES))) not in REMEDIES:
            raise ValueError(f"{where}: remedy {entry['remedy']!r} is none of {sorted(REMEDIES)}")
        out.append(Deviation(entry["id"], tuple(entry["tests"]), entry["tensorflow"],
                             entry["keras"], entry["summary"].strip(),
                             tuple(entry["evidence"]), entry["first_seen"], signatures, entry.get("remedy"),
                             entry.get("workaround")))
    ids = [d.id for d in out]
    if len(ids) != len(set(ids)):
        raise ValueError(f"{path.name}: duplicate deviation ids")
    return out


@dataclasses.dataclass
class Ledger:
    """The deviations in scope of one running test, and what their signatures did in it."""

    entries: tuple[Deviation, ...]
    explained: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    compared: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    given: dict = dataclasses.field(default_factory=dict)  # quantity -> its Given, what a condition reads (Check.given_for)
    scope: str = ""  # the test id (or ``loop-check[SPEC]``) the entries were chosen for

    def covering(self, what) -> list[tuple[Deviation, Signature]]:
        if QUANTITY_LOG in os.environ:
            log_quantity(os.environ[QUANTITY_LOG], self.scope, what)
        return [(d, s) for d in self.entries for s in d.signatures if s.covers(what)]

    def judge(self, seen: Seen, raised: bool = False) -> Deviation | None:
        """The one judgment, for properties and users' loops alike: the entry in scope with a
        signature for ``seen.what`` (``raises`` ones when ``raised``, value ones otherwise) that
        explains the observation, counted as explained; None when no entry does."""
        for entry, sig in self.covering(seen.what):
            if (sig.kind == "raises") == raised and sig.explains(seen):
                self.explained[entry.id] += 1
                return entry
        return None

    def stale(self, seen: Seen) -> list[tuple[Deviation, Any]]:
        """For an observation that equals the reference: each entry in scope whose model
        predicts another value for it (the entry is out of date), with that prediction. None
        where another entry's model predicts the reference's value here too: two deviations at
        once (a model that composes them) can land on the reference in a case, and the entry
        that says so speaks for the observation."""
        out = []
        for entry, sig in self.covering(seen.what):
            if sig.kind == "raises":
                continue
            predicted = sig.predicts(seen)
            if predicted is NOTHING:
                continue
            if seen.same(predicted, seen.expected):
                if sig.kind == "model":
                    return []  # an entry's model predicts the reference's value here: it speaks for it
                continue
            out.append((entry, predicted))
        return out

    def explains_error(self, exc: BaseException) -> bool:
        """Whether a test's failure is a probe that raised (pool.ProbeError) what a ``raises``
        signature in scope says TensorFlow raises instead, for quantity ``probe <name>``: every
        member, for a group (a hypothesis FlakyFailure). Counted like any explained mismatch.
        (``quantity.probe_raised``: the quantity is ``{kind = "probe", probe = NAME}``.)"""
        members = list(exc.exceptions) if isinstance(exc, BaseExceptionGroup) else [exc]
        found = []
        for member in members:
            raised, probe = getattr(member, "raised", None), getattr(member, "probe", None)
            if raised is None or probe is None:
                return False
            what = probe_raised(probe)
            entry = self.judge(Seen(what, raised, None, lambda x, y: x == y, None, self.given.get(what)), raised=True)
            if entry is None:
                return False
            found.append(entry.id)
        return bool(found)

    def expected_failure(self) -> str | None:
        """The xfail reason when some mismatch was tolerated, else None."""
        if not self.explained:
            return None
        by_id = {d.id: d for d in self.entries}
        return "; ".join(f"known deviation {i} (signature matched {n}x): {by_id[i].summary.splitlines()[0]}"
                         for i, n in sorted(self.explained.items()))

    def band_counts(self) -> list[list]:
        """``[id, quantity, band, comparisons covered, mismatches explained]`` of each rounding
        band or bounds in scope (summed over the session by conftest: ``stale_bands``)."""
        return [[d.id, str(s.quantity), s.describe(), self.compared[(d.id, s.quantity)], self.explained[d.id]]
                for d in self.entries for s in d.signatures
                if s.kind in ("band", "bounds") and self.compared[(d.id, s.quantity)]]

    def stale_raises(self) -> list[str]:
        """After a test that passed: each raises signature with a condition whose probe returned
        although the test confirmed the condition held (``given_for``): the entry is stale."""
        out = []
        for what, given in self.given.items():
            for entry, sig in self.covering(what):
                if sig.kind == "raises" and sig.condition and CONDITIONS[sig.condition](
                        Seen(what, None, None, None, None, given)):
                    out.append(f"{what}: returned a value where its condition {sig.condition} held, but known "
                               f"deviation {entry.id} predicts {sig.describe()}: update or retire the entry")
        return out


# Where a run records every quantity a ledger is asked of (suite/harness/tools/quantity_log.py:
# which signatures cover each, under two versions of the file: a signature rewritten by field
# must cover what its text covered)
QUANTITY_LOG = "TFDS_QUANTITY_LOG"


def log_quantity(path: str, scope: str, what) -> None:
    """Append one line ``{scope, text, kind, fields}`` (one write: lines of parallel workers stay whole)."""
    record = {"scope": scope or os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0], "text": str(what),
              "kind": getattr(what, "kind", None), "fields": [list(f) for f in getattr(what, "qualifiers", ())]}
    with open(path, "a") as out:
        out.write(json.dumps(record, default=repr) + "\n")


# A rounding band shows only where a value is not representable in the rounded format, so one
# test (a few cases) may never see it; over a session's comparisons it always has. Below this
# many comparisons a band (or a bounds signature) that never showed is not judged.
BAND_JUDGED_AFTER = 50


def merge_bands(into: dict, counts: list[list]):
    """Add ``band_counts`` rows to ``into`` ({(id, quantity, band): [compared, explained]})."""
    for ident, quantity, band, compared, explained in counts:
        cell = into.setdefault((ident, quantity, band), [0, 0])
        cell[0] += compared
        cell[1] += explained


def stale_bands(totals: dict) -> list[str]:
    """A message per rounding band or bounds that covered at least BAND_JUDGED_AFTER comparisons
    in the session and never had to explain one: the deviation is gone and the entry is stale."""
    return [f"known deviation {ident}: its {band} covered {compared} comparisons of {quantity!r} "
            f"and every one equalled the reference within its tolerance: TensorFlow no longer deviates here; "
            f"update the entry in known_deviations.toml"
            for (ident, quantity, band), (compared, explained) in sorted(totals.items())
            if compared >= BAND_JUDGED_AFTER and not explained]


# The running test's ledger: a context (like decimal's), entered around a test's call by the
# suite's plugin (suite/harness/plugin/suite_plugin.py) and read by Check (judgment.py).
_IN_FORCE: contextvars.ContextVar[Ledger | None] = contextvars.ContextVar("tfds_ledger", default=None)


def ledger_in_force() -> Ledger | None:
    """The ledger of the test that is running (None outside a test of the suite)."""
    return _IN_FORCE.get()


@contextlib.contextmanager
def in_force(ledger: Ledger):
    """Run the block with ``ledger`` consulted by every comparison; yields it."""
    token = _IN_FORCE.set(ledger)
    try:
        yield ledger
    finally:
        _IN_FORCE.reset(token)


def _range(name: str, spec: str) -> str:
    """``TF >=2.12, <2.13``: the entry's specifier set as written."""
    return f"{name} {spec.replace(',', ', ')}"


def table(entries: list[Deviation] | None = None) -> list[str]:
    """The table of the entries (docs/known_deviations.md, ``python -m tests.docs_pages``): id, the version
    ranges, what TensorFlow does (the summary, one paragraph), its repro and where it was first seen."""
    entries = load() if entries is None else entries
    lines = ["| id | TF / Keras | what | first seen |", "| --- | --- | --- | --- |"]
    for d in entries:
        what = " ".join(d.summary.split()).replace("|", "\\|")
        repros = [e.split()[0] for e in d.evidence if e.startswith("repros/")]
        if repros:
            what += " Repro: " + ", ".join(f"`{r}`" for r in repros)
        lines.append(f"| `{d.id}` | {_range('TF', d.tensorflow)}; {_range('Keras', d.keras)} | {what} | "
                     f"{' '.join(d.first_seen.split())} |")
    return lines


if __name__ == "__main__":
    print("\n".join(table()))
