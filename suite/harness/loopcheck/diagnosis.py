"""The diagnosis of a loop's first diverging step: every catalogued cause's evidence (causes.py,
``found_by``: the predicates of evidence.py) is evaluated on its own, then the precedence the
catalogue declares (``SHOWN``, ``ENDS``, ``SUBSUMES``, ``FALLBACKS``, ``TOGETHER``) chooses which of
the causes found are named, and in what order. In a workload of several models and optimizers, each
model's causes are found on its own gradients, loss and variables (``_per_model``)."""

from __future__ import annotations

import dataclasses
import math

from . import causes
from .causes import CAUSES
from .evidence import Observed, returned_by_train_step


@dataclasses.dataclass
class Diagnosis:
    cause: str
    evidence: list
    model: str = ""  # the model (and its optimizer) it concerns, in a workload of several

    @property
    def title(self) -> str:
        return f"{self.model}: {CAUSES[self.cause].title}" if self.model else CAUSES[self.cause].title

    @property
    def fix(self) -> str:
        return CAUSES[self.cause].fix


def _cause_of() -> dict:
    """Each predicate's cause, from the catalogue's ``found_by``."""
    return {p: name for name, cause in CAUSES.items() for p in cause.found_by}


def evaluate(observed: Observed) -> dict:
    """Every predicate of the catalogue evaluated on its own: ``{predicate: evidence lines}`` of those
    that hold (no predicate reads another's outcome)."""
    found = {}
    for cause in CAUSES.values():
        for predicate in cause.found_by:
            lines = predicate(observed)
            if lines is not None:
                found[predicate] = list(lines)
    return found


def named(found: dict, observed: Observed, shown=None, ends=None, subsumes=None, fallbacks=None,
          together=None) -> list:
    """``(cause, evidence)`` of the predicates that hold (``found``) that the report names, in its
    order: walking ``shown`` (causes.SHOWN), a predicate is left out where a root cause before it
    holds (``ends``), where one that holds subsumes it (``subsumes``), where it is a fallback and a
    cause is already named (``fallbacks``), or where its cause is already named; the predicates of
    one place are ordered by ``together``'s key."""
    shown = causes.SHOWN if shown is None else shown
    ends = causes.ENDS if ends is None else ends
    subsumes = causes.SUBSUMES if subsumes is None else subsumes
    fallbacks = causes.FALLBACKS if fallbacks is None else fallbacks
    together = causes.TOGETHER if together is None else together
    cause_of = _cause_of()
    out: list = []
    ended = False
    left_out = {p for holder, theirs in subsumes.items() if holder in found for p in theirs}
    for place in shown:
        if ended:
            break
        preds = list(place) if isinstance(place, tuple) else [place]
        if isinstance(place, tuple):
            key = together[place]
            preds.sort(key=lambda p: key(observed, p))
        for predicate in preds:
            if predicate not in found or predicate in left_out:
                continue
            if predicate in fallbacks and out:
                continue
            if cause_of[predicate] not in [c for c, _ in out]:
                out.append((cause_of[predicate], found[predicate]))
            if predicate in ends:
                ended = True
    return out


def diagnose(ref, dist, mismatches: list, global_batch: int) -> list[Diagnosis]:
    """The catalogued causes the evidence of the first diverging step supports, in the order the
    catalogue declares (causes.SHOWN); empty when none does. In a workload of several models and
    optimizers, each model's (``_per_model``)."""
    several = len(dist.facts.gradient_groups or ()) > 1 or len(dist.facts.models or ()) > 1
    if several and dist.facts.gradient_groups and dist.raised is None:
        return _per_model(ref, dist, mismatches, global_batch)
    observed = Observed(ref, dist, mismatches, global_batch)
    return [Diagnosis(cause, lines) for cause, lines in named(evaluate(observed), observed)]


def _group(run, name: str, offset: int, count: int):
    """``run`` as the diagnosis of one model and its optimizer sees it, in a workload of several: the
    gradients of that optimizer, the loss the step returned for that model and its weight penalty."""
    def step(st):
        named = (st.named or {}).get(name)
        return dataclasses.replace(
            st, gradients=None if st.gradients is None else [rep[offset:offset + count] for rep in st.gradients],
            **({"loss": named["loss"], "replica_losses": list(named["replicas"]),
                "regularization": named["regularization"], "named": None} if named else
               {"loss": math.nan, "replica_losses": [math.nan] * len(st.replica_losses), "named": None}))
    return dataclasses.replace(run, steps=[step(st) for st in run.steps],
                               facts=dataclasses.replace(run.facts, gradient_groups=None))


def _per_model(ref, dist, mismatches: list, global_batch: int) -> list[Diagnosis]:
    """The causes of each model of several, each from its own optimizer's gradients, the loss the
    step returned for it and the differences of its own variables and optimizer state; a cause is
    named with the model (``generator: loss averaged per replica``)."""
    out, offset = [], 0
    outside = dist.facts.outside_scope or []
    if mismatches and all(m.role == "metric" for m in mismatches):
        # only metrics differ, and no metric is any one model's: judged as one model's metrics are
        alone = dataclasses.replace(dist.facts, gradient_groups=None, models=None)
        return diagnose(ref, dataclasses.replace(dist, facts=alone),
                        mismatches, global_batch)
    for name, count in dist.facts.gradient_groups:
        mine = [m for m in mismatches if (m.what.name == name if m.role == "loss"
                                          else m.role != "metric" and m.what.name.startswith(f"{name}/"))]
        if mine:
            found = diagnose(_group(ref, name, offset, count), _group(dist, name, offset, count), mine, global_batch)
            out.extend(dataclasses.replace(d, model=name) for d in found)
        theirs = [q for q in outside if q.removeprefix("optimizer: ").startswith(f"{name}/")]
        if theirs and not any(d.model == name and d.cause == "created_outside_scope" for d in out):
            # a mistake whether or not this spec's numbers show it (as for one model)
            shown = ", ".join(theirs[:4]) + (" ..." if len(theirs) > 4 else "")
            out.append(Diagnosis("created_outside_scope", [f"not created in the strategy's scope: {shown}"], model=name))
        offset += count
    # a metric of no model at one over the replica count, exactly, while every model's loss agrees: what a Mean
    # fed each replica's scaled loss shows, whatever else differs (the variables, where Keras < 3.5 applies each
    # replica's own gradients); a metric that differs otherwise is no cause's evidence
    n, metrics = dist.replicas, [m for m in mismatches if m.role == "metric"]
    if n > 1 and metrics and not any(m.role == "loss" for m in mismatches):
        exact = next((m for m in metrics if m.ratio is not None and abs(m.ratio * n - 1) <= 1e-4
                      and not returned_by_train_step(dist.facts, m.what.name)), None)  # fit's reduction: its own cause
        if exact is not None:
            out.append(Diagnosis("metric_fed_scaled_loss", [f"{exact.quantity} after step {exact.step} is "
                                                            f"{exact.ratio:.7g} of one device's (1/{n} for {n} replicas) "
                                                            "while every model's loss agrees"]))
    return out
