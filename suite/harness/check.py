"""Compare what TensorFlow computed with the reference; every failure reads the same way.

A ``Check`` binds what a test knows once (spec, dtype, case, repro snippet) and offers the
comparisons: ``close`` (within the dtype's tolerance, with a diagnosis of telltale ratios),
``exact`` (bit for bit), ``equal`` (plain data: counts, lists, names), ``raises`` (a probe's
outcome is the documented exception) and ``that`` (a stated condition). A failure message has
the same parts whatever failed::

    [spec] quantity: got ..., but should be ... (detail)
      diagnosis: ...
      case: ...
    Reproduce with plain TensorFlow:   (an exception note)
    ...
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from reference.distribute import local_results
from suite.common.results import Raised
from suite.harness.tolerances import tolerance


class PropertyFailure(AssertionError):
    """A property did not hold; the message says what, where and why it might be."""


def _fmt(x) -> str:
    return np.array2string(np.asarray(x, dtype=np.float64), precision=8, threshold=12, floatmode="maxprec")


def _shown(x) -> str:
    """Plain data as it reads best in a message: arrays with their dtype and shape."""
    if isinstance(x, np.ndarray):
        return f"{x.dtype.name}{list(x.shape)} {x.tolist()}" if x.size <= 24 else f"{x.dtype.name}{list(x.shape)}"
    if isinstance(x, Raised):
        return f"{x.type}: {x.message}"
    return repr(x) if isinstance(x, str) else str(x)


def ratio(actual, expected) -> float | None:
    """Least-squares factor ``k`` with ``actual ~= k * expected`` (None if undefined)."""
    a = np.asarray(actual, dtype=np.float64).ravel()
    e = np.asarray(expected, dtype=np.float64).ravel()
    if a.shape != e.shape:
        return None
    denom = float(e @ e)
    if denom == 0.0 or not np.isfinite(denom):
        return None
    return float(a @ e) / denom


def diagnose(actual, expected, replicas: int | None, elements: int | None = None) -> str:
    """A hint when actual/expected is a telltale factor (replicas, its inverse, elements)."""
    k = ratio(actual, expected)
    if k is None or not np.isfinite(k):
        return ""
    a = np.asarray(actual, dtype=np.float64).ravel()
    e = np.asarray(expected, dtype=np.float64).ravel()
    if not np.allclose(a, k * e, rtol=1e-3, atol=1e-9):
        return f"actual is not a constant multiple of expected (best factor {k:.4g})"
    if replicas and replicas > 1 and np.isclose(k, replicas, rtol=1e-3):
        return (f"values are {k:.2f}x the reference = replicas: loss averaged per replica "
                f"instead of over the global batch, or gradients aggregated twice?")
    if replicas and replicas > 1 and np.isclose(k, 1.0 / replicas, rtol=1e-3):
        return (f"values are {k:.4f}x the reference = 1/replicas: a scaled loss averaged over "
                f"replicas (e.g. a Mean metric of scaled losses), or divided by replicas twice?")
    if elements and elements > 1 and np.isclose(k, elements, rtol=1e-3):
        return (f"values are {k:.2f}x the reference = elements per example: multi-dimensional "
                f"per-example loss not normalised per element?")
    if np.isclose(k, 1.0, rtol=1e-6):
        return "values agree up to a small relative error: a tolerance/precision question?"
    return f"actual = {k:.6g} x expected"


def describe(case: dict) -> str:
    """One line per case: shapes for arrays, values for the rest."""
    parts = []
    for k, v in case.items():
        if isinstance(v, np.ndarray):
            parts.append(f"{k}={v.dtype.name}{list(v.shape)}" if v.size > 8 else f"{k}={v.tolist()}")
        else:
            parts.append(f"{k}={v!r}")
    return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class Check:
    """The comparisons of one test case. ``spec`` (a Spec or a label) heads every message,
    ``dtype`` picks the tolerance, ``case`` and ``repro`` are attached to every failure, and
    ``replicas`` (the spec's, unless given) lets ``close`` diagnose replica factors."""

    spec: Any
    dtype: str | None = None
    case: dict | None = None
    repro: str | None = None
    replicas: int | None = None

    def __post_init__(self):
        if self.replicas is None:
            object.__setattr__(self, "replicas", getattr(self.spec, "replicas", None))

    # -- the failure ---------------------------------------------------------------------
    def fail(self, what: str, problem: str, hint: str = ""):
        """Raise PropertyFailure: ``[spec] what: problem``, the diagnosis, the case, the repro."""
        __tracebackhide__ = True
        lines = [f"[{self.spec}] {what}: {problem}"]
        if hint:
            lines.append(f"  diagnosis: {hint}")
        if self.case:
            lines.append("  case: " + describe(self.case))
        exc = PropertyFailure("\n".join(lines))
        if self.repro:
            exc.add_note("Reproduce with plain TensorFlow:\n" + self.repro)
        raise exc

    # -- comparisons ---------------------------------------------------------------------
    def close(self, actual, expected, what: str, *, kind: str = "value", n_terms: int = 1,
              elements: int | None = None, override: dict | None = None):
        """``actual`` equals ``expected`` within the dtype's tolerance (suite/harness/tolerances.py)."""
        __tracebackhide__ = True
        a = np.asarray(actual, dtype=np.float64)
        e = np.asarray(expected, dtype=np.float64)
        if a.shape != e.shape:
            self.fail(what, f"got shape {a.shape}, but should be {e.shape}")
        tol = tolerance(self.dtype, kind, n_terms, override)
        bad = ~(np.abs(a - e) <= tol.bound(e))
        bad &= ~(np.isnan(a) & np.isnan(e))
        if bad.any():
            err = float(np.max(np.abs(a - e)[bad])) if np.isfinite(a[bad]).all() else float("nan")
            self.fail(what, f"got {_fmt(a)}, but should be {_fmt(e)} (max |diff| {err:.3g} > atol {tol.atol:.1g} + "
                            f"rtol {tol.rtol:.1g}*|expected|, {int(bad.sum())} of {bad.size} elements)",
                      diagnose(a, e, self.replicas, elements))

    def exact(self, actual, expected, what: str, hint: str = ""):
        """Arrays equal bit for bit, with the same dtype and shape (when ``expected`` has a dtype)."""
        __tracebackhide__ = True
        a, e = np.asarray(actual), np.asarray(expected)
        same_kind = a.dtype == e.dtype or not isinstance(expected, np.ndarray)
        if not (same_kind and a.shape == e.shape and np.array_equal(a, e)):
            self.fail(what, f"got {_shown(a)}, but should be exactly {_shown(e)}", hint)

    def equal(self, actual, expected, what: str, hint: str = ""):
        """Plain data (numbers, strings, nested lists) equal."""
        __tracebackhide__ = True
        if actual != expected:
            self.fail(what, f"got {_shown(actual)}, but should be {_shown(expected)}", hint)

    def that(self, holds: bool, what: str, got, should: str, hint: str = ""):
        """A stated condition: ``got`` must be what ``should`` says."""
        __tracebackhide__ = True
        if not holds:
            self.fail(what, f"got {_shown(got)}, but should be {should}", hint)

    def contains(self, text: str, phrases, what: str):
        """``text`` (a message, a program's output) contains every phrase."""
        __tracebackhide__ = True
        missing = [p for p in phrases if p not in text]
        if missing:
            shown = text if len(text) <= 3000 else "..." + text[-3000:]
            self.fail(what, f"got {shown!r}, but should contain {missing}")

    def raises(self, outcome, expected_type: str, what: str, message: str = ""):
        """A probe's outcome is the exception ``expected_type`` (whose message contains ``message``)."""
        __tracebackhide__ = True
        if isinstance(outcome, Raised):
            if outcome.type == expected_type and message in outcome.message:
                return
            got = f"{outcome.type}: {outcome.message}"
        else:
            got = f"no exception ({_shown(outcome)})"
        should = f"raise {expected_type}" + (f" with {message!r}" if message else "")
        self.fail(what, f"got {got}, but should {should}")

    def returned(self, outcome, what: str):
        """A probe's outcome is a value, not a caught exception."""
        __tracebackhide__ = True
        if isinstance(outcome, Raised):
            self.fail(what, f"raised {outcome.type}: {outcome.message} (in {outcome.where}), but should return a value")

    # -- across workers ------------------------------------------------------------------
    def per_replica(self, results: list, expected: list, what: str, attr: str | None = "local", **tol):
        """Every worker's local per-replica values (``experimental_local_results`` order; the
        field ``attr`` of each worker's result, or the result itself) against the reference's
        values for the replicas that worker holds."""
        __tracebackhide__ = True
        workers = len(results)
        for w, result in enumerate(results):
            mine = local_results(expected, w, workers)
            got = result if attr is None else getattr(result, attr)
            where = f"{what} (worker {w})" if workers > 1 else what
            self.equal(len(got), len(mine), f"{where}: local results")
            for r, (a, e) in enumerate(zip(got, mine)):
                self.close(a, e, f"{where} replica {w * len(mine) + r}", **tol)

    def on_workers(self, results: list, attr: str, expected, what: str, **tol):
        """A cross-replica value (a reduce, a metric result) equals the reference on every worker."""
        __tracebackhide__ = True
        for w, result in enumerate(results):
            self.close(getattr(result, attr), expected, f"{what} (worker {w})" if len(results) > 1 else what, **tol)
