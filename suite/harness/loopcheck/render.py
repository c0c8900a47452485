"""What a user reads of the check of a loop: the table of the specs' verdicts and, for a spec that
did not pass, the details (where it diverged, got against expected, the diagnoses with their
evidence and fix, or the known deviations); and a TensorFlow error shortened for them. Text only:
the verdicts are made in differential.py, which this module does not import."""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def short_error(message: str, limit: int = 220) -> str:
    """A TensorFlow error without its traceback lines: graph errors repeat the Python stack
    ("File ..., line N, in f") before what went wrong."""
    message = ANSI.sub("", message)  # Keras' bold/reset codes: noise outside a terminal
    tail = re.split(r'File "[^"]*", line \d+, in \S+', message)[-1].strip()
    tail = re.sub(r"\[\[\{\{node [^]]*\]\]|\[Op:[^]]*\]", "", tail).strip(" .")
    return tail[:limit] if tail else message[:limit]


def _label(note: str) -> str:
    """How a verdict's note is shown: what a control showed, or what was observed of the runs."""
    controls = ("the control", "the stand-in control", "no control")
    return "control" if note.startswith(controls) or ": the control (" in note else "note"


def table(verdicts: list) -> str:
    """A row per spec's verdict (differential.Verdict)."""
    rows = [("spec", "replicas", "verdict", "steps agreed", "worst rel. diff agreeing", "first divergence", "diagnosis",
             "time", "engine start")]
    for v in verdicts:
        first = "" if v.first_step is None else f"step {v.first_step}"
        if v.status == "ERROR":
            first = "error"
        elif v.error and not first:
            first = "raised"
        cause = v.diagnoses[0].title if v.diagnoses else ("" if v.status == "PASS" else "no catalogued cause")
        if v.status == "RANDOM":
            cause = "random draws of the step's own"
        if v.status == "INCOMPARABLE":
            cause = "one replica differs too"
        if v.status in ("DEVIATION", "BLOCKED"):
            named = [i for i, _ in v.deviations if i != "unrecorded"]
            cause = ("known deviation " + ", ".join(dict.fromkeys(named))) if named else "unrecorded deviation"
        rows.append((v.spec, str(v.replicas), v.status, f"{v.agreed}/{v.steps}",
                     f"{v.worst:.2g}" if v.agreed else "–", first, cause,
                     f"{v.seconds:.1f} s", f"{v.start_seconds:.1f} s"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines[:1] + ["  ".join("-" * w for w in widths)] + lines[1:])


def details(v, limit: int | None = 6) -> str:
    """What a user reads for a spec that did not pass: where it diverged, got vs expected, the
    diagnosis, or the known deviation and its evidence."""
    if v.status == "PASS":
        return ""
    if v.status in ("RANDOM", "INCOMPARABLE"):
        out = [f"{v.spec}: {v.status}: the runs cannot be compared" + (f" (they differ from step {v.first_step})"
                                                                       if v.first_step else ""), f"  {v.error}"]
        out.extend(f"  note: {n}" for n in v.notes)
        return "\n".join(out)
    if v.status in ("DEVIATION", "BLOCKED"):
        head = ("DEVIATION: the loop is right; TensorFlow/Keras computes something else" if v.status == "DEVIATION"
                else "BLOCKED: the loop is right but cannot train on this spec with these versions")
        out = [f"{v.spec}: {head}"]
        out.extend(f"  known deviation {i}: {e}" if i != "unrecorded" else f"  unrecorded deviation: {e}"
                   for i, e in v.deviations[:limit])
        out.extend(f"  {_label(n)}: {n}" for n in v.notes if all(n != e for _, e in v.deviations))
        return "\n".join(out)
    out = [f"{v.spec}: {v.status}" + (f", first divergence at step {v.first_step}" if v.first_step else "")]
    if v.error:
        out.append(f"  {v.error}")
    for m in v.mismatches[:limit]:
        out.append(f"  {m.line()}")
    if limit is not None and len(v.mismatches) > limit:
        out.append(f"  ... and {len(v.mismatches) - limit} more differences at that step")
    if v.status == "FAIL" and not v.diagnoses:
        out.append("  diagnosis: no catalogued cause fits the evidence (see docs/check.md for the catalogue)")
    for d in v.diagnoses:
        out.append(f"  diagnosis: {d.title}")
        out.extend(f"    evidence: {e}" for e in d.evidence)
        out.append(f"    fix: {d.fix}")
    for i, e in v.deviations[:limit]:
        out.append(f"  known deviation {i} (TensorFlow/Keras, not the loop) explains other differences: {e}")
    out.extend(f"  {_label(n)}: {n}" for n in v.notes)
    return "\n".join(out)
