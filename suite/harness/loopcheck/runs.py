"""A spec's runs as plain data: a cluster's replies stitched into one run of every replica, and
what is asked of the reference before any spec is compared with it (that it repeats itself bit for
bit, that it stays finite)."""

from __future__ import annotations

import dataclasses

import numpy as np


def norm(x) -> float:
    """The Euclidean norm of an array of any shape, in float64."""
    return float(np.linalg.norm(np.asarray(x, np.float64).ravel()))


# -- combining a cluster's replies -------------------------------------------------------------
def stitch(runs: list):
    """One run of every replica from the replies of a spec's processes (each holds its local
    replicas): per step the replica lists concatenated in worker order."""
    first = runs[0]
    if len(runs) == 1:
        return first
    count = min(len(r.steps) for r in runs)
    # a custom train_step under fit: each worker's loss per model is its own replicas' (what they took gradients
    # of; fit reduces no loss the script gives), so the cluster's is their sum; a loss the script reduced is global
    local = first.facts.step_mode == "fit"
    steps = []
    for k in range(count):
        parts = [r.steps[k] for r in runs]
        grads = None if any(p.gradients is None for p in parts) else [g for p in parts for g in p.gradients]
        named = None if any(p.named is None for p in parts) else {
            name: {**value, "replicas": [v for p in parts for v in p.named[name]["replicas"]],
                   **({"loss": sum(p.named[name]["loss"] for p in parts)} if local else {})}
            for name, value in parts[0].named.items()}
        steps.append(dataclasses.replace(
            parts[0], loss=sum(v["loss"] for v in named.values()) if local and named else parts[0].loss,
            replica_losses=[v for p in parts for v in p.replica_losses], rows=[v for p in parts for v in p.rows],
            weights=None if any(p.weights is None for p in parts) else [v for p in parts for v in p.weights],
            variables=[[c for p in parts for c in p.variables[i]] for i in range(len(parts[0].variables))],
            optimizer=[[c for p in parts for c in p.optimizer[i]] for i in range(len(parts[0].optimizer))],
            gradients=grads, named=named,
            examples=None if any(p.examples is None for p in parts) else [e for p in parts for e in p.examples]))
    raised = next((r.raised for r in runs if r.raised is not None), None)
    masks = None if first.masks is None else [m for r in runs for m in (r.masks or [])]
    facts = dataclasses.replace(first.facts, workers=len(runs))
    return dataclasses.replace(first, steps=steps, raised=raised, masks=masks, facts=facts,
                               local_replica_ids=[i for r in runs for i in r.local_replica_ids])


# -- repeatability of the reference ------------------------------------------------------------
def first_difference(a, b) -> str | None:
    """Where two runs of the reference first differ bit for bit (None: they repeat exactly)."""
    if (a.raised is None) != (b.raised is None):
        return "one run raised and the other did not"
    for k, (sa, sb) in enumerate(zip(a.steps, b.steps), 1):
        for name, va, vb in zip(a.names, sa.variables, sb.variables):
            if not np.array_equal(va[0], vb[0]):
                return f"variable {name} after step {k} (largest difference {_largest(va[0], vb[0]):.3g})"
        for name, va, vb in zip(a.optimizer_names, sa.optimizer, sb.optimizer):
            if not np.array_equal(va[0], vb[0]):
                return f"optimizer variable {name} after step {k} (largest difference {_largest(va[0], vb[0]):.3g})"
        if sa.loss != sb.loss:
            return f"the loss of step {k} ({sa.loss!r} then {sb.loss!r})"
        for name in sa.metrics:
            if sa.metrics[name] != sb.metrics.get(name):
                return f"metric {name} after step {k}"
    if len(a.steps) != len(b.steps):
        return f"the number of steps ({len(a.steps)} then {len(b.steps)})"
    return None


def first_non_finite(run) -> str | None:
    """The first quantity of a run that is NaN or infinite, and its step (None: all finite)."""
    def bad(value) -> str | None:
        try:
            a = np.asarray(value, np.float64)
        except (TypeError, ValueError):
            return None  # not numbers (a metric's other result)
        if np.isnan(a).any():
            return "NaN"
        return "infinite" if np.isinf(a).any() else None

    for k, step in enumerate(run.steps, 1):
        for kind, names, values in (("variable", run.names, step.variables),
                                    ("optimizer variable", run.optimizer_names, step.optimizer)):
            for name, copies in zip(names, values):  # every local replica's copy
                what = next((b for b in map(bad, copies) if b), None)
                if what:
                    return f"{kind} {name} is {what} after step {k}"
        if step.loss is not None and bad(step.loss):
            return f"the loss of step {k} is {bad(step.loss)}"
        for name, value in step.metrics.items():
            if value is not None and bad(value):
                return f"metric {name} is {bad(value)} after step {k}"
    return None


def _largest(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) if np.size(a) else 0.0
