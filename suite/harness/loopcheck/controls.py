"""The controls of the check of a user's loop (pytest side, no TensorFlow): runs of known-right
code beside the loop's that tell TensorFlow's/Keras' divergence from the loop's, where no cause
names it.

- The control (``control_of``): the suite's canonical step on the workload's own model, optimizer
  and data, under the spec and on one device; where it diverges as the loop does and the loop equals
  it, what differs is TensorFlow's/Keras'.
- The stand-in control (suite/engine/workloads/stand_in.py): the suite's own Keras model with the
  run's optimizer class and hyper-parameters. Beside a control that cannot speak for the user's
  classes (``stand_in_of``), or alone where no control could run: a script, batches the canonical
  step cannot train (``by_stand_in``).

The loop's verdict (differential.verdict_of) takes a ``Control``; ``by_stand_in`` judges a verdict
already made.
"""

from __future__ import annotations

import dataclasses

from ..pool.pool import EngineError
from .diagnosis import diagnose
from .differential import ATOL, RTOL, Verdict, compare, verdict_of
from .render import short_error
from .runs import stitch


@dataclasses.dataclass
class Control:
    """The suite's known-right step (the guide's compute_average_loss of the workload's loss) on
    the workload's own model, optimizer and data under the spec, from the same initial values:
    ``run``; ``same_as_loop``: it diverges from its own one-device run, and the loop's run equals
    it, step for step (so what differs is TensorFlow's/Keras', not the loop's); ``evidence``."""

    run: object
    same_as_loop: bool
    evidence: str
    causes: tuple = ()  # the catalogued causes the control's own divergence shows: not the loop's where it shows them too
    user_classes: bool = False  # it diverges as the loop does, but the model or optimizer has classes of the user's own
    entries: tuple | None = None  # the only known deviations it may name (those the stand-in control's divergence shows)
    notes: tuple = ()  # what the verdict says beside it (the user's classes not verified)
    first: str = ""  # where and how it first diverged from its own one-device run
    comparable: bool = True  # both ran and the loop's step equals the canonical step on one device (else it says nothing)


def control_of(loop_ref, canonical_ref, control_run: list, dist_runs: list, rtol: float = RTOL,
               atol: float = ATOL, global_batch: int = 0, judge=None) -> Control:
    """Judge the control: the loop equals the canonical step on one device (else no control can
    speak for it), the control diverges from its own one-device run, and the loop's run under the
    spec equals the control's. Where a known deviation in scope (``judge``, as ``compare`` takes
    it) explains every difference of the control's own divergence, the causes that divergence
    shows (``causes``) are TensorFlow's/Keras', wherever the loop shows them too; a divergence of
    the control that no entry explains may come from the workload's own model or data, which the
    control shares, so it excuses no cause."""
    dist = stitch(dist_runs)
    control = stitch(control_run)
    if control.raised is not None or canonical_ref is None:
        return Control(control, False, "the suite's canonical step could not train this workload here either"
                       if control.raised is not None else "no control: the canonical step did not run on one device",
                       comparable=False)
    _, _, own = compare(loop_ref, canonical_ref, rtol, atol, metrics=False)
    if own:
        return Control(control, False, "no control: on one device the loop's step differs from the suite's canonical "
                       f"step ({own[0].line()})", comparable=False)
    _, _, loops = compare(loop_ref, dist, rtol, atol)
    if loops and all(m.role == "metric" for m in loops):
        return Control(control, False, "the control (the suite's canonical step) does not update the workload's "
                       "metrics, so it cannot tell whose this metric's difference is")
    agreed, _, found = compare(canonical_ref, control, rtol, atol, metrics=False)
    causes = ()
    if found and judge is not None:
        recorded: list = []
        _, _, unexplained = compare(canonical_ref, control, rtol, atol, metrics=False, judge=judge, explained=recorded,
                                    control=control)
        if recorded and not unexplained:
            causes = tuple(d.cause for d in diagnose(canonical_ref, control, found, global_batch))

    def judged(same: bool, evidence: str) -> Control:
        return Control(control, same, evidence, causes, first=f"step {found[0].step}: {found[0].line()}" if found else "")

    if not found:
        return judged(False, f"the control (the suite's canonical step on this workload) trains here what it "
                      f"trains on one device ({agreed} steps): the divergence is the loop's")
    _, _, apart = compare(control, dist, rtol, atol, metrics=False)
    if not apart and not loop_ref.facts.keras_own_model:
        return dataclasses.replace(
            judged(False, f"the control diverges here the same way (step {found[0].step}: "
                   f"{found[0].line()}), so the loop's step is not the cause; the model or "
                   "optimizer has classes of the user's own, so the control cannot tell their "
                   "code from TensorFlow's/Keras'"), user_classes=True)
    if apart:
        return judged(False, f"the control diverges here too (step {found[0].step}: {found[0].line()}), but "
                      f"not as the loop does ({apart[0].line()})")
    return judged(True, f"the control, the suite's canonical step on the workload's own model, optimizer and "
                  f"data, diverges here the same way (step {found[0].step}: {found[0].line()}), and the "
                  "loop's run equals it step for step: TensorFlow/Keras, not the loop; no known "
                  "deviation records it")


def stand_in_of(control: Control, stand_ref, stand_runs: list, rtol: float = RTOL, atol: float = ATOL,
                judge=None) -> Control:
    """Judge the stand-in control (suite/engine/workloads/stand_in.py: the suite's own Keras model
    with the user's optimizer class and hyper-parameters) where ``control`` diverges as the loop
    does but cannot speak for the user's classes: where the stand-in diverges under the spec too,
    TensorFlow/Keras diverges with that optimizer there, so ``control`` speaks for the loop, naming
    only the known deviations that explain every difference of the stand-in's own divergence
    (none: an unrecorded one); where it trains what it trains on one device, ``control`` as it was."""
    stand = stitch(stand_runs)
    unverified = ("the model has classes of the user's own, which no control verifies: the stand-in (the suite's "
                  "own Keras model with the loop's optimizer) speaks for TensorFlow/Keras and the optimizer only",)
    if stand.raised is not None:
        return dataclasses.replace(control, evidence=control.evidence + f"; the stand-in control (the suite's own Keras "
                                   f"model with the loop's optimizer) raised {stand.raised.type} here")
    agreed, _, found = compare(stand_ref, stand, rtol, atol, metrics=False)
    if not found:
        return dataclasses.replace(control, evidence=control.evidence + f"; the stand-in control (the suite's own Keras "
                                   f"model with the loop's optimizer) trains here what it trains on one device "
                                   f"({agreed} steps): the divergence comes from the workload's own model or data")
    recorded: list = []
    _, _, unexplained = compare(stand_ref, stand, rtol, atol, metrics=False, judge=judge, explained=recorded,
                                control=stand) if judge is not None else (0, 0.0, found)
    entries = tuple(dict.fromkeys(i for i, _ in recorded)) if recorded and not unexplained else ()
    shown = (f"as known deviation {', '.join(entries)} predicts" if entries
             else "as no known deviation predicts")
    evidence = (f"the control, the suite's canonical step on the workload's own model, optimizer and data, diverges "
                f"here the same way ({control.first}), and so does the stand-in control, the suite's own "
                f"Keras model with the loop's optimizer class and hyper-parameters, {shown} (step {found[0].step}: "
                f"{found[0].line()}): TensorFlow/Keras, not the loop")
    return dataclasses.replace(control, same_as_loop=True, entries=entries, evidence=evidence,
                               notes=(evidence,) + unverified)


def by_stand_in(v: Verdict, stand_ref, stand_runs: list, global_batch: int, rtol: float = RTOL, atol: float = ATOL,
                judge=None) -> Verdict:
    """A FAIL that no control spoke for (a script's, or a workload's that the canonical step cannot
    train), judged by the stand-in control alone (suite/engine/workloads/stand_in.py: the suite's own
    Keras model with the run's optimizer class and hyper-parameters, on the spec and on one device).
    It becomes DEVIATION only where the stand-in diverges too, at the same step, every difference of
    the stand-in's is a known deviation's prediction (``judge``), and every cause diagnosed for the
    run is one the stand-in's own divergence shows; otherwise the FAIL stands, with what the stand-in
    showed as a note. The stand-in's values are another model's, so they predict no value of the run:
    what the DEVIATION rests on is that the same rule, with Keras' own classes, diverges there."""
    if v.status != "FAIL" or v.error is not None or not v.mismatches:
        return v
    stand = stitch(stand_runs)
    name = "the stand-in control (the suite's own Keras model with this run's optimizer class and hyper-parameters)"
    if stand.raised is not None:
        v.notes.append(f"{name} raised {stand.raised.type} here: {short_error(stand.raised.message, 160)}")
        return v
    agreed, _, found = compare(stand_ref, stand, rtol, atol, metrics=False)
    if not found:
        v.notes.append(f"{name} trains here what it trains on one device ({agreed} steps): the divergence is the run's")
        return v
    recorded: list = []
    _, _, unexplained = compare(stand_ref, stand, rtol, atol, metrics=False, judge=judge, explained=recorded,
                                control=stand) if judge is not None else (0, 0.0, found)
    entries = tuple(dict.fromkeys(i for i, _ in recorded)) if recorded and not unexplained else ()
    shown = f"step {found[0].step}: {found[0].line()}"
    if not entries:
        v.notes.append(f"{name} diverges here too ({shown}), as no known deviation predicts: TensorFlow/Keras may be "
                       "wrong here, but nothing recorded says how, so the verdict stands")
        return v
    theirs = {d.cause for d in diagnose(stand_ref, stand, found, global_batch)}
    if any(m.role in ("replicas", "optimizer variable") for m in found):
        # the stand-in's optimizer is built before its first step: where its copies or state differ too, an
        # optimizer built lazily in the run is not what made the run's differ (that cause's observation)
        theirs.add("lazy_optimizer_build")
    own = [d for d in v.diagnoses if d.cause not in theirs]
    if own or v.first_step != found[0].step:
        v.notes.append(f"{name} diverges here too, as known deviation {', '.join(entries)} predicts ({shown}), but "
                       + (f"not with this run's cause ({own[0].title})" if own else
                          f"from step {found[0].step}, the run from step {v.first_step}"))
        if own and v.first_step == found[0].step and len(own) < len(v.diagnoses):
            # the causes the stand-in shows too are Keras': the run's own cause stands alone
            shared = sorted({d.title for d in v.diagnoses if d.cause in theirs})
            v.notes.append(f"what the stand-in shows too ({', '.join(shared)}) is TensorFlow's/Keras' there, as known "
                           f"deviation {', '.join(entries)} predicts, not named as the run's")
            v.diagnoses = own
        return v
    evidence = (f"{name} diverges here the same way from the same step ({shown}), as known deviation "
                f"{', '.join(entries)} predicts, and the run shows no cause of its own"
                + (f" (what it shows, {', '.join(d.title for d in v.diagnoses)}, the stand-in shows too)"
                   if v.diagnoses else "") + ": TensorFlow/Keras, not the run")
    v.status, v.diagnoses = "DEVIATION", []
    v.deviations = [[e, evidence] for e in entries] + v.deviations
    return v


def by_remedy(v: Verdict, ref, entries, rerun, global_batch: int, rtol: float = RTOL, atol: float = ATOL,
              spec=None, versions=None) -> Verdict:
    """A FAIL judged by the remedies of the known deviations in scope (``entries``: those with a
    ``remedy``, suite/harness/judging/deviations.py REMEDIES): ``rerun(remedy)`` runs the spec once
    more with the entry's change applied in the engine (suite/engine/remedies.py): one a later Keras
    made, or one that would make Keras train as one device. Where that run trains what the run trains
    on one device (PASS, or DEVIATION by other entries), the difference is exactly what the change
    removes, so it is TensorFlow's/Keras' and the verdict is DEVIATION naming the entry; otherwise the
    FAIL stands, with what the remedied run showed as a note."""
    from ..judging import deviations

    if v.status != "FAIL" or v.error is not None or not v.mismatches:
        return v
    for entry in entries:
        what = deviations.REMEDIES[entry.remedy]
        try:
            runs = rerun(entry.remedy)
        except EngineError as exc:  # the remedy says nothing
            v.notes.append(f"no control: the run with {what} (the remedy of known deviation {entry.id}) could not be "
                           f"made ({str(exc).splitlines()[0]})")
            continue
        r = verdict_of(v.spec, ref, runs, global_batch, rtol, atol, spec_obj=spec, versions=versions)
        if r.status in ("PASS", "DEVIATION"):
            others = f", but for known deviation {', '.join(dict.fromkeys(i for i, _ in r.deviations))}" \
                if r.deviations else ""
            evidence = (f"with {what} applied in the engine (the remedy of known deviation {entry.id}), the run "
                        f"trains what it trains on one device ({r.steps} steps{others}): "
                        "TensorFlow/Keras, not the script"
                        + (f" (what it showed, {', '.join(d.title for d in v.diagnoses)}, is gone with it)"
                           if v.diagnoses else ""))
            v.status, v.diagnoses = "DEVIATION", []
            v.deviations = [[entry.id, evidence]] + [d for d in r.deviations if d[0] != entry.id] + v.deviations
            return v
        shown = f"step {r.first_step}: {r.mismatches[0].line()}" if r.mismatches else r.error or r.status
        v.notes.append(f"with {what} applied in the engine (the remedy of known deviation {entry.id}), the run still "
                       f"differs from one device's ({shown})")
    return v
