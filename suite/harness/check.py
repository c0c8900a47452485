"""Compare what TensorFlow computed with the reference; explain a mismatch.

Every property asserts through ``assert_close`` (or ``assert_raises_as``). A failure message
names the spec and the quantity, shows actual vs expected, diagnoses ratios that point at a
classic distributed-loss mistake, describes the case, and carries a runnable snippet that
reproduces it with plain TensorFlow (``exc.add_note``).
"""

from __future__ import annotations

import numpy as np

from suite.harness.tolerances import tolerance


class PropertyFailure(AssertionError):
    """A property did not hold; the message says what, where and why it might be."""


def _fmt(x) -> str:
    return np.array2string(np.asarray(x, dtype=np.float64), precision=8, threshold=12,
                           floatmode="maxprec")


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


def assert_close(actual, expected, *, what: str, spec, dtype, case: dict | None = None,
                 kind: str = "value", n_terms: int = 1, replicas: int | None = None,
                 elements: int | None = None, repro: str | None = None, override=None):
    """Assert ``actual`` equals ``expected`` within the dtype's tolerance (see tolerances.py)."""
    __tracebackhide__ = True
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    header = f"[{spec}] {what}"
    problem = None
    if a.shape != e.shape:
        problem = f"shape {a.shape}, but should be {e.shape}"
    else:
        tol = tolerance(dtype, kind, n_terms, override)
        bad = ~(np.abs(a - e) <= tol.bound(e))
        bad &= ~(np.isnan(a) & np.isnan(e))
        if bad.any():
            err = float(np.max(np.abs(a - e)[bad])) if np.isfinite(a[bad]).all() else float("nan")
            problem = (f"got {_fmt(a)}, but should be {_fmt(e)} "
                       f"(max |diff| {err:.3g} > atol {tol.atol:.1g} + rtol {tol.rtol:.1g}*|expected|, "
                       f"{int(bad.sum())} of {bad.size} elements)")
    if problem is None:
        return
    lines = [f"{header}: {problem}"]
    hint = diagnose(a, e, replicas, elements) if a.shape == e.shape else ""
    if hint:
        lines.append(f"  diagnosis: {hint}")
    if case:
        lines.append("  case: " + describe(case))
    exc = PropertyFailure("\n".join(lines))
    if repro:
        exc.add_note("Reproduce with plain TensorFlow:\n" + repro)
    raise exc


def assert_raises_as(outcome: dict, expected_type: str, *, what: str, spec, case=None, repro=None):
    """Assert a probe outcome is the documented exception (a probe returns {"raised": ...})."""
    __tracebackhide__ = True
    got = outcome.get("raised")
    if got == expected_type:
        return
    shown = f"raised {got}: {outcome.get('message')}" if got else f"returned {outcome.get('local')}"
    exc = PropertyFailure(f"[{spec}] {what}: {shown}, but should raise {expected_type}"
                          + ("\n  case: " + describe(case) if case else ""))
    if repro:
        exc.add_note("Reproduce with plain TensorFlow:\n" + repro)
    raise exc


def describe(case: dict) -> str:
    """One line per case: shapes for arrays, values for the rest."""
    parts = []
    for k, v in case.items():
        if isinstance(v, np.ndarray):
            parts.append(f"{k}={v.dtype.name}{list(v.shape)}" if v.size > 8 else f"{k}={v.tolist()}")
        else:
            parts.append(f"{k}={v!r}")
    return ", ".join(parts)


def assert_per_replica(results: list, expected: list, *, what: str, spec, dtype, key: str = "local",
                       **kwargs):
    """Check every worker's local per-replica values against the reference's values for the
    replicas that worker holds (``experimental_local_results`` order)."""
    __tracebackhide__ = True
    from reference.distribute import local_results

    workers = len(results)
    for w, result in enumerate(results):
        mine = local_results(expected, w, workers)
        got = result[key]
        where = f"{what} (worker {w})" if workers > 1 else what
        if len(got) != len(mine):
            raise PropertyFailure(f"[{spec}] {where}: {len(got)} local results, but should be {len(mine)}")
        for r, (a, e) in enumerate(zip(got, mine)):
            assert_close(a, e, what=f"{where} replica {w * len(mine) + r}", spec=spec, dtype=dtype,
                         **kwargs)


def assert_same_on_workers(results: list, key: str, expected, *, what: str, spec, dtype, **kwargs):
    """A cross-replica value (a reduce, a metric result) must equal the reference on every worker."""
    __tracebackhide__ = True
    for w, result in enumerate(results):
        where = f"{what} (worker {w})" if len(results) > 1 else what
        assert_close(result[key], expected, what=where, spec=spec, dtype=dtype, **kwargs)
