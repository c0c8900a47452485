"""Measure how far TensorFlow's float32 results fall from the float64 reference, to derive the
float32 tolerances (docs/reference.md, "Measured error").

    python -m suite.harness.tools.measure_error [--examples N] [--specs default,mirrored:2,mirrored:3]

For each spec it draws cases with the suite's own case strategies (the training property's and
compute_average_loss's, derandomized), runs them in float32 on an engine and records, per
element, the error in the unit the tolerance uses: ``|actual - expected| / (n_terms + |expected|)``
(a tolerance ``atol = rtol = t`` passes exactly the elements whose unit error is at most t). It
prints, per quantity and optimizer, the elements compared and the 50th/99th percentile and
maximum of that error in float32 roundoff units u = 2^-24, and the largest per quantity kind.
"""

from __future__ import annotations

import argparse
import collections

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ... import layout
from ...common.catalog import ADAPTIVE, OPTIMIZERS
from ...common.specs import parse_specs
from ..drawing import cases
from ..drawing.cases import ARCHS, arch_dict, training_cases
from ..pool.pool import EnginePool

ref_model = layout.reference("model")
ref = layout.reference("distribute")

U = 2.0 ** -24
DRAWS = collections.Counter()  # (optimizer, well conditioned) -> drawn training cases


def unit_errors(actual, expected, n_terms: int) -> np.ndarray:
    a = np.asarray(actual, np.float64).ravel()
    e = np.asarray(expected, np.float64).ravel()
    return np.abs(a - e) / (n_terms + np.abs(e))


def measure(pool: EnginePool, spec, examples: int) -> dict:
    """{(kind, quantity): [unit errors]} for one spec."""
    errors = collections.defaultdict(list)
    run = settings(max_examples=examples, derandomize=True, database=None, deadline=None,
                   suppress_health_check=list(HealthCheck))

    for optimizer in sorted(OPTIMIZERS):
        _trained(pool, spec, optimizer, run, errors)

    @run
    @given(data=st.data())
    def value(data):
        sizes = data.draw(cases.splits(spec.replicas))
        losses = data.draw(cases.floats("float32", sum(sizes), 0.0, 8.0))
        weights = data.draw(st.none() | cases.floats("float32", sum(sizes), 0.0, 4.0))
        gbs = data.draw(st.none() | st.integers(max(sum(sizes), 1), 3 * max(sum(sizes), 1)))
        results = pool.call(spec, "losses.compute_average_loss", losses=losses, sizes=sizes,
                            weight_kind="none" if weights is None else "per_example", weights=weights,
                            global_batch_size=gbs)
        per_w = ref.split(weights, sizes) if weights is not None else [None] * len(sizes)
        expected = [ref.compute_average_loss(part, w, gbs, spec.replicas)
                    for part, w in zip(ref.split(losses, sizes), per_w)]
        for w, r in enumerate(results):
            for a, e in zip(r.local, ref.local_results(expected, w, len(results))):
                errors[("value", "compute_average_loss")].extend(unit_errors(a, e, max(sizes + [1])))
    value()
    return errors


def _trained(pool, spec, optimizer: str, run, errors) -> None:
    """The training property's cases under ``optimizer``, in float32: loss and parameter errors."""

    @run
    @given(case=training_cases(spec.replicas, "float32"))
    def trained(case):
        arch_name, params, steps = case
        arch = ARCHS[arch_name]
        history = ref_model.train(arch, params, optimizer, steps, "global")
        conditioned = cases.well_conditioned(history, "float32", optimizer in ADAPTIVE)
        DRAWS[(optimizer, conditioned)] += 1
        assume(conditioned)
        for result in pool.call(spec, "training.train", arch=arch_dict(arch), optimizer=optimizer,
                                dtype="float32", params=params, steps=steps):
            for got, want in zip(result.history, history):
                errors[("trained", f"summed loss ({optimizer})")].extend(unit_errors(got.loss, want["loss"], 1))
                for copies, expected in zip(got.params, want["params"]):
                    for copy in copies:
                        errors[("trained", f"parameters ({optimizer})")].extend(unit_errors(copy, expected, 4))
    trained()


def table(errors: dict) -> list[str]:
    lines = ["| kind | quantity | elements | p50 (u) | p99 (u) | max (u) |", "| --- | --- | --- | --- | --- | --- |"]
    worst = collections.defaultdict(float)
    for (kind, quantity), values in sorted(errors.items()):
        v = np.asarray(values) / U
        worst[kind] = max(worst[kind], float(v.max()) if v.size else 0.0)
        if v.size:
            lines.append(f"| {kind} | {quantity} | {v.size} | {np.percentile(v, 50):.2f} | "
                         f"{np.percentile(v, 99):.2f} | {v.max():.2f} |")
    lines.append("")
    for kind, w in sorted(worst.items()):
        lines.append(f"largest {kind} error: {w:.1f} u = {w * U:.3g} (tolerance t with atol = rtol = t)")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=40, help="drawn cases per optimizer and spec (default 40)")
    parser.add_argument("--specs", default="default,mirrored:2,mirrored:3")
    args = parser.parse_args(argv)
    pool = EnginePool()
    errors = collections.defaultdict(list)
    try:
        for spec in parse_specs(args.specs):
            for key, values in measure(pool, spec, args.examples).items():
                errors[key].extend(values)
    finally:
        pool.close()
    print("\n".join(table(errors)))
    for optimizer in sorted(OPTIMIZERS):
        kept, dropped = DRAWS[(optimizer, True)], DRAWS[(optimizer, False)]
        print(f"{optimizer}: {kept} training cases compared, {dropped} left out by the conditioning filter")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
