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

Inside a running test every comparison consults the known deviations in scope
(``deviations.ledger_in_force()``, entered by the suite's plugin): a mismatch is tolerated only when an entry's signature
explains what was observed (suite/harness/judging/signatures.py); a result equal to the reference where an
entry predicts otherwise fails. ``given`` hands a comparison's inputs to deviation models: a
``suite.common.given.Given`` (or None; a list of them per replica or worker), anything else a TypeError.

``rule`` names the reference function (or a ``reference.rules.Rule``) the expected values come
from; a failure cites it (``rule: documented (SOURCE)``, or observed behaviour pinned on the
versions tested). Every comparison also takes ``rule=``: the rule of that comparison alone, for a
check whose comparisons take their expected values from different rules.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ... import layout
from ...common.given import handed
from ...common.results import Raised
from . import deviations
from .quantity import at, part
from .signatures import CONDITIONS, Seen
from .tolerances import tolerance

local_results = layout.reference("distribute").local_results


class PropertyFailure(AssertionError):
    """A property did not hold; the message says what, where and why it might be."""


def _fmt(x) -> str:
    return np.array2string(np.asarray(x, dtype=np.float64), precision=8, threshold=12, floatmode="maxprec")


def _shown(x) -> str:
    """Plain data as it reads best in a message: arrays with their dtype and shape."""
    if isinstance(x, np.ndarray):
        return f"{x.dtype.name}{list(x.shape)} {x.tolist()}" if x.size <= 24 else f"{x.dtype.name}{list(x.shape)}"
    if isinstance(x, Raised):
        return f"{x.type}: {_short(x.message)}"
    return repr(x) if isinstance(x, str) else str(x)


def _short(message: str, chars: int = 600) -> str:
    """A long exception message as its head and tail (TF's carry the whole traced stack)."""
    return message if len(message) <= chars else message[:200] + " ... " + message[-(chars - 205):]


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


def factor_hint(actual, expected, replicas: int | None, elements: int | None = None) -> str:
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
    ``dtype`` picks the tolerance, ``case`` and ``repro`` are attached to every failure,
    ``replicas`` (the spec's, unless given) lets ``close`` diagnose replica factors, and
    ``rule`` (the reference function behind the expected values) says whether a failure
    breaks documented behaviour or changes observed behaviour."""

    spec: Any
    dtype: str | None = None
    case: dict | None = None
    repro: str | None = None
    replicas: int | None = None
    rule: Any = None  # the reference function (reference/rules.py) the expected values come from

    def __post_init__(self):
        if self.replicas is None:
            object.__setattr__(self, "replicas", getattr(self.spec, "replicas", None))

    def citing(self, rule) -> Check:
        """This check under another rule (a comparison's own ``rule=``); itself when ``rule`` is None."""
        return self if rule is None else dataclasses.replace(self, rule=rule)

    # -- the failure ---------------------------------------------------------------------
    def fail(self, what: str, problem: str, hint: str = ""):
        """Raise PropertyFailure: ``[spec] what: problem``, the diagnosis, the case, the repro."""
        __tracebackhide__ = True
        lines = [f"[{self.spec}] {what}: {problem}"]
        if hint:
            lines.append(f"  diagnosis: {hint}")
        rule = getattr(self.rule, "rule", self.rule)
        if rule is not None:
            lines.append(f"  rule: {rule.describe()}")
        if self.case:
            lines.append("  case: " + describe(self.case))
        exc = PropertyFailure("\n".join(lines))
        if self.repro:
            exc.add_note("Reproduce with plain TensorFlow:\n" + self.repro)
        raise exc

    # -- known deviations ------------------------------------------------------------------
    def _consult(self, what: str, ok: bool, actual, expected, same, given) -> tuple[bool, str]:
        """Ask the known deviations in scope about one value comparison: ``(True, "")`` when it
        stands (it passed, or a signature explains the mismatch), else ``(False, hint)`` naming
        the entries in scope that did not explain it. A pass where an entry predicts another
        value fails here: the entry is out of date."""
        __tracebackhide__ = True
        handed(given, f"{what}")
        ledger = deviations.ledger_in_force()
        covering = [(d, s) for d, s in ledger.covering(what) if s.kind != "raises"] if ledger else []
        if not covering:
            return ok, ""
        seen = Seen(what, actual, expected, same, self.spec, given)
        if ok:
            for dev, sig in covering:
                if sig.kind in ("band", "bounds") and np.any(np.asarray(expected, np.float64) != 0):
                    ledger.compared[(dev.id, sig.quantity)] += 1
            for dev, predicted in ledger.stale(seen):
                self.fail(what, f"got the reference's value {_shown(actual)}, but known deviation {dev.id} "
                                f"predicts {_shown(predicted)}",
                          "TensorFlow no longer deviates here: update or retire the entry in known_deviations.toml")
            return True, ""
        if ledger.judge(seen) is not None:
            return True, ""
        return False, "; ".join(f"known deviation {d.id} in scope does not explain it ({s.describe()})"
                                for d, s in covering)

    # -- comparisons ---------------------------------------------------------------------
    def close(self, actual, expected, what: str, *, kind: str = "value", n_terms: int = 1,
              elements: int | None = None, override: dict | None = None, given=None, rule=None):
        """``actual`` equals ``expected`` within the dtype's tolerance (suite/harness/judging/tolerances.py)."""
        __tracebackhide__ = True
        me = self.citing(rule)
        tol = tolerance(self.dtype, kind, n_terms, override)

        def mismatches(x, y):
            x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
            return ~(np.abs(x - y) <= tol.bound(y)) & ~(np.isnan(x) & np.isnan(y))

        a = np.asarray(actual, dtype=np.float64)
        e = np.asarray(expected, dtype=np.float64)
        if a.shape != e.shape:
            me.fail(what, f"got shape {a.shape}, but should be {e.shape}")
        bad = mismatches(a, e)
        stands, hint = me._consult(what, not bad.any(), a, e,
                                   lambda x, y: np.shape(x) == np.shape(y) and not mismatches(x, y).any(), given)
        if not stands:
            err = float(np.max(np.abs(a - e)[bad])) if np.isfinite(a[bad]).all() else float("nan")
            me.fail(what, f"got {_fmt(a)}, but should be {_fmt(e)} (max |diff| {err:.3g} > atol {tol.atol:.1g} + "
                          f"rtol {tol.rtol:.1g}*|expected|, {int(bad.sum())} of {bad.size} elements)",
                    "; ".join(h for h in (factor_hint(a, e, self.replicas, elements), hint) if h))

    def exact(self, actual, expected, what: str, hint: str = "", given=None, rule=None):
        """Arrays equal bit for bit, with the same dtype and shape (when ``expected`` has a dtype)."""
        __tracebackhide__ = True
        me = self.citing(rule)

        def same(x, y):
            x, y = np.asarray(x), np.asarray(y)
            return (x.dtype == y.dtype or not isinstance(expected, np.ndarray)) and x.shape == y.shape \
                and bool(np.array_equal(x, y))

        stands, why = me._consult(what, same(actual, expected), actual, expected, same, given)
        if not stands:
            me.fail(what, f"got {_shown(np.asarray(actual))}, but should be exactly {_shown(np.asarray(expected))}",
                    "; ".join(h for h in (hint, why) if h))

    def equal(self, actual, expected, what: str, hint: str = "", given=None, rule=None):
        """Plain data (numbers, strings, nested lists) equal."""
        __tracebackhide__ = True
        me = self.citing(rule)
        stands, why = me._consult(what, actual == expected, actual, expected, lambda x, y: x == y, given)
        if not stands:
            me.fail(what, f"got {_shown(actual)}, but should be {_shown(expected)}",
                    "; ".join(h for h in (hint, why) if h))

    def that(self, holds: bool, what: str, got, should: str, hint: str = "", rule=None):
        """A stated condition: ``got`` must be what ``should`` says."""
        __tracebackhide__ = True
        if not holds:
            self.citing(rule).fail(what, f"got {_shown(got)}, but should be {should}", hint)

    def contains(self, text: str, phrases, what: str, rule=None):
        """``text`` (a message, a program's output) contains every phrase."""
        __tracebackhide__ = True
        missing = [p for p in phrases if p not in text]
        if missing:
            shown = text if len(text) <= 3000 else "..." + text[-3000:]
            self.citing(rule).fail(what, f"got {shown!r}, but should contain {missing}")

    def raises(self, outcome, expected_type: str, what: str, message: str = "", rule=None):
        """A probe's outcome is the exception ``expected_type`` (whose message contains ``message``)."""
        __tracebackhide__ = True
        if isinstance(outcome, Raised):
            if outcome.type == expected_type and message in outcome.message:
                return
            got = f"{outcome.type}: {_short(outcome.message)}"
        else:
            got = f"no exception ({_shown(outcome)})"
        should = f"raise {expected_type}" + (f" with {message!r}" if message else "")
        self.citing(rule).fail(what, f"got {got}, but should {should}")

    def returned(self, outcome, what: str, given=None, rule=None) -> bool:
        """A probe's outcome is a value, not a caught exception. False when it is an exception
        that a known deviation in scope predicts, from its origin and, for a deadlock, under its
        condition (``given``: what the condition reads) (the caller skips what needs the value)."""
        __tracebackhide__ = True
        handed(given, f"{what}")
        me = self.citing(rule)
        ledger = deviations.ledger_in_force()
        covering = [(d, s) for d, s in ledger.covering(what) if s.kind == "raises"] if ledger else []
        if isinstance(outcome, Raised):
            if covering and ledger.judge(Seen(what, outcome, None, lambda x, y: x == y, self.spec, given),
                                         raised=True) is not None:
                return False
            me.fail(what, f"raised {outcome.type}: {_short(outcome.message)} (in {outcome.where}), "
                          "but should return a value",
                    "; ".join(f"known deviation {d.id} in scope does not explain it ({s.describe()})"
                              for d, s in covering))
        for dev, sig in covering:
            if sig.condition is None or CONDITIONS[sig.condition](Seen(what, outcome, None, None, self.spec, given)):
                me.fail(what, f"returned a value, but known deviation {dev.id} predicts it {sig.describe()}",
                        "TensorFlow no longer deviates here: update or retire the entry in known_deviations.toml")
        return True

    def given_for(self, what: str, given) -> None:
        """Hand a raises signature's condition what it reads, for a probe that may raise as a
        whole (a ProbeError, judged after the test: deviations.Ledger.explains_error)."""
        handed(given, f"{what}")
        ledger = deviations.ledger_in_force()
        if ledger is not None:
            ledger.given[what] = given

    # -- across workers ------------------------------------------------------------------
    def per_replica(self, results: list, expected: list, what: str, attr: str | None = "local",
                    given: list | None = None, rule=None, **tol):
        """Every worker's local per-replica values (``experimental_local_results`` order; the
        field ``attr`` of each worker's result, or the result itself) against the reference's
        values for the replicas that worker holds (``given``: per-replica inputs of deviation
        models, in the same order as ``expected``)."""
        __tracebackhide__ = True
        handed(given, f"{what}", many=True)
        workers = len(results)
        for w, result in enumerate(results):
            mine = local_results(expected, w, workers)
            inputs = local_results(given, w, workers) if given is not None else [None] * len(mine)
            got = result if attr is None else getattr(result, attr)
            where = at(what, worker=w) if workers > 1 else what
            self.equal(len(got), len(mine), part(where, "local results", ": local results"), rule=rule)
            for r, (a, e, g) in enumerate(zip(got, mine, inputs)):
                self.close(a, e, at(where, replica=w * len(mine) + r), given=g, rule=rule, **tol)

    def on_workers(self, results: list, attr: str, expected, what: str, given_per_worker: list | None = None,
                   rule=None, **tol):
        """A cross-replica value (a reduce, a metric result) equals the reference on every worker
        (``given_per_worker``: each worker's inputs of deviation models, instead of ``given``)."""
        __tracebackhide__ = True
        handed(given_per_worker, f"{what}", many=True)
        for w, result in enumerate(results):
            if given_per_worker is not None:
                tol["given"] = given_per_worker[w]
            self.close(getattr(result, attr), expected, at(what, worker=w) if len(results) > 1 else what,
                       rule=rule, **tol)
