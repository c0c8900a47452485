"""The benchmark method, pytest side (no TensorFlow): workloads, how many steps a round runs,
what each result carries in ``extra_info``, and the fidelity check of the timings.

A round is one engine call that runs K train steps and returns after fetching the last
step's loss (which waits for every step before it); the engine also times those K steps with
its own clock. pytest-benchmark times the call, so a round's time is K steps plus one engine
round trip (the harness floor, measured by its own benchmark). K is calibrated so that a
round lasts at least ``ROUND_SECONDS`` and at least ``1 / FLOOR_SHARE`` floors: the floor is
then under 1% of a round and the per-step figure is the round's time divided by K.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
import time

from ...common.catalog import BENCH_BLOCKS, XLA_UNSUPPORTED
from ...common.results import BenchRun, Raised
from ..judging.judgment import Check

ROUND_SECONDS = 0.3  # a round lasts at least this long (0.5 until the default run had to fit 4 minutes)...
FLOOR_SHARE = 0.01  # ...and the harness floor is at most this share of it
MAX_STEPS = 2000  # a cap for steps that take microseconds
FIDELITY = 0.05  # the harness's step time agrees with the engine's own timer within 5%


@dataclasses.dataclass(frozen=True)
class Workload:
    """A model and batch to time. ``per_replica_batch`` holds under weak scaling (the global
    batch grows with the replicas, as in the guides); ``global_batch`` under strong scaling."""

    name: str
    description: str
    per_replica_batch: int
    global_batch: int  # strong scaling only

    def batches(self, replicas: int, scaling: str) -> tuple[int, int]:
        """(global batch, per-replica batch) of one step with ``replicas`` replicas in sync."""
        if scaling == "weak":
            return self.per_replica_batch * replicas, self.per_replica_batch
        if self.global_batch % replicas:
            raise ValueError(f"{self.name}: global batch {self.global_batch} does not split over {replicas} replicas")
        return self.global_batch, self.global_batch // replicas

    def batches_or_none(self, replicas: int, scaling: str) -> tuple[int, int] | None:
        """``batches``, or None where the strong-scaling global batch does not split."""
        try:
            return self.batches(replicas, scaling)
        except ValueError:
            return None


WORKLOADS = {w.name: w for w in (
    Workload("linear", "the distributed-training guide's linear model: Dense(1) on 1 feature with an L2(1e-4) "
                       "kernel regularizer, MSE, SGD(0.001)", per_replica_batch=16, global_batch=48),
    Workload("mlp", "an MLP: 64 features, Dense(256)-relu, Dense(256)-relu, softmax over 10 classes, "
                    "L2(1e-4), sparse crossentropy, Adam", per_replica_batch=64, global_batch=192),
    Workload("cnn", "the custom-training tutorial's Fashion-MNIST CNN (Conv32-Pool-Conv64-Pool-Dense64-Dense10 "
                    "logits) on the generated stand-in data, sparse crossentropy, Adam",
             per_replica_batch=32, global_batch=96),
)}
SCALINGS = ("weak", "strong")


def user_workload(target: str, per_replica_batch: int) -> Workload:
    """A user's workload (``package.module:factory``, ``pytest benchmarks --workload``), timed
    like the built-in ones: ``per_replica_batch`` under weak scaling, 3 x it under strong."""
    return Workload(target, f"the user's workload {target} (its own step and dataset)",
                    per_replica_batch=per_replica_batch, global_batch=3 * per_replica_batch)

# The Keras building blocks a step can switch on (catalog.BENCH_BLOCKS, engine side in
# suite/engine/probes/bench.py), timed on these workloads under weak scaling, each against the
# same block on the plain step.
BLOCKS = BENCH_BLOCKS
BLOCK_WORKLOADS = ("mlp", "cnn")
# What the engine must report it built for each block (BenchState.block, read back from the
# model, optimizer and step): a block that silently fell away would be timed as if it were on.
BLOCK_BUILT = {
    "clipping": {"global_clipnorm": 1.0},
    "mixed_precision": {"compute_dtype": "float16", "variable_dtype": "float32", "loss_scale_optimizer": True},
    "sync_batch_norm": {"batch_norm_layers": 2, "synchronized": True},
    "xla": {"jit_compile": True},
}

# TensorFlow's errors for a block it does not support under a strategy: the block's benchmark is
# skipped with the error; any other error fails it. XLA: the XLA property's errors
# (catalog.XLA_UNSUPPORTED: collectives on CPU, variables on another device). Under
# CentralStorageStrategy Keras 3 cannot update a BatchNormalization layer's moving statistics
# or a dynamic LossScaleOptimizer's scale in replica context (known deviation
# keras3-central-storage-replica-context-updates). Keras 2 refuses mixed_float16 and loss scaling
# under every strategy but Mirrored, MultiWorkerMirrored and OneDevice (its allowlist,
# keras/src/mixed_precision/loss_scale_optimizer.py strategy_supports_loss_scaling: CentralStorage,
# known deviation keras2-mixed-precision-refused-under-central-storage, and parameter servers).
_REPLICA_CONTEXT_UPDATE = r"You must specify an aggregation method to update a AggregatingVariable in Replica Context"
BLOCK_UNSUPPORTED = {
    "xla": XLA_UNSUPPORTED,
    "mixed_precision": _REPLICA_CONTEXT_UPDATE + r"|(Mixed precision|Loss scaling) is not supported with the "
                                                 r"tf.distribute.Strategy: \w+",
    "sync_batch_norm": _REPLICA_CONTEXT_UPDATE,
}


class StepRaised(RuntimeError):
    """A benchmark's step (or its building) raised in the engine: ``raised`` is its Raised."""

    def __init__(self, raised):
        super().__init__(f"{raised.where}: {raised.type}: {raised.message}")
        self.raised = raised


def steps_per_round(step_seconds: float, floor_seconds: float) -> int:
    """K: enough steps for a round of ``ROUND_SECONDS`` and ``floor / FLOOR_SHARE``, at least 1."""
    target = max(ROUND_SECONDS, floor_seconds / FLOOR_SHARE)
    # the quotient can land an ulp above a whole number (1.0568842130350748 / 0.010568842130350748
    # is 100.00000000000001): do not count a step for the rounding
    return max(1, min(MAX_STEPS, math.ceil(target / max(step_seconds, 1e-9) * (1 - 1e-12))))


def median(values) -> float:
    return statistics.median(values)


def fidelity(round_seconds: list[float], engine_seconds: list[float], floor_seconds: float) -> dict:
    """Compare the harness's rounds with the engine's own timer over the same rounds.

    ``error`` is the relative difference of the medians (harness minus engine, over engine);
    ``floor_share`` the median floor over the median round. ``ok`` when the error is within
    ``FIDELITY`` and the floor under ``FLOOR_SHARE`` of a round."""
    outer, inner = median(round_seconds), median(engine_seconds)
    error = (outer - inner) / inner
    share = floor_seconds / outer
    return {"harness_round_s": outer, "engine_round_s": inner, "error": error, "floor_share": share,
            "ok": abs(error) <= FIDELITY and share < FLOOR_SHARE}


def check_fidelity(result: dict, check) -> None:
    """Fail ``check`` (a suite.harness.judging.judgment.Check) naming the figure that is out of bounds."""
    __tracebackhide__ = True
    outer, inner = result["harness_round_s"] * 1e3, result["engine_round_s"] * 1e3
    check.that(abs(result["error"]) <= FIDELITY, "the harness's round vs the engine's timer",
               f"{outer:.2f} ms vs {inner:.2f} ms ({result['error']:+.1%})", f"within {FIDELITY:.0%}")
    check.that(result["floor_share"] < FLOOR_SHARE, "the harness floor's share of a round",
               f"{result['floor_share']:.2%}", f"under {FLOOR_SHARE:.0%}")


def scaling_label(spec, scaling: str, virtual: bool) -> str:
    """What a scaling-efficiency figure means here. Virtual CPU devices share the machine's
    cores, so with them more replicas cannot run faster: the figure measures the strategy's
    overhead, not scaling."""
    if not spec.synchronous:
        kind = "asynchronous (one replica per step, workers in parallel)"
    else:
        kind = f"{scaling} scaling"
    return f"{kind}; overhead, not scaling: virtual devices share cores" if virtual else kind


def step_figures(step_seconds: float, global_batch: int, replicas: int) -> dict:
    return {"step_time_s": step_seconds, "steps_per_s": 1.0 / step_seconds,
            "examples_per_s": global_batch / step_seconds,
            "examples_per_s_per_replica": global_batch / step_seconds / replicas}


def scaling_efficiency(examples_per_s: float, units: int, plain_examples_per_s: float | None) -> float | None:
    """Throughput over ``units`` times the plain step's throughput on one device (1.0 is
    perfect). ``units`` are the replicas in sync, or a parameter-server cluster's workers.
    The plain step runs on the per-replica batch under weak scaling (so the ideal is N times
    its throughput) and on the global batch under strong scaling (the ideal divides its time
    by N)."""
    if plain_examples_per_s is None:
        return None
    return examples_per_s / (units * plain_examples_per_s)


def shares_cores(spec) -> bool:
    """Whether the spec's replicas or workers share this machine's CPU cores: virtual CPU
    devices, and local clusters whose processes all run here (not GPUs, not a real cluster)."""
    return not spec.gpus and spec.kind not in ("cluster", "tpu") and (spec.replicas > 1 or spec.workers > 1)


def devices_label(spec, cores: int | None) -> str:
    if spec.gpus:
        return "GPUs"
    if spec.kind == "cluster":
        return "real cluster (CPU)"
    if spec.kind == "tpu":
        return "TPU"
    where = f" on {cores} cores" if cores else ""
    if spec.strategy == "parameter_server":
        return f"{spec.workers} worker + {spec.ps} ps processes{where}"
    if spec.kind == "multi_worker":
        return f"{spec.workers} worker processes x {spec.devices} CPU{'s' if spec.devices > 1 else ''}{where}"
    if spec.devices > 1:
        return f"{spec.devices} virtual CPUs{where}"
    return f"1 CPU{where}"


class Bencher:
    """Runs the benchmark method on the engines (an ``EngineHandle``, suite/harness/pool/handle.py): prepared states,
    calibrated rounds, the floor per spec and the plain-step controls, shared by the benchmark
    tests of one session."""

    PLAIN_SPEC_TEXT = "default"

    def __init__(self, engines, *, rounds: int, trace_rounds: int, smoke: bool, path: str | None = None):
        from ...common.specs import parse_spec

        self.engines = engines
        self.path = path  # where a user's workload (package.module:factory) imports from: pytest's folder
        self.rounds = rounds
        self.trace_rounds = trace_rounds
        self.smoke = smoke
        self.plain_spec = parse_spec(self.PLAIN_SPEC_TEXT)
        self.floors: dict[str, float] = {}  # spec text -> median empty-call seconds
        # (engine spec text, workload, global batch, block) -> (state key, K, step seconds)
        self.plain: dict[tuple[str, str, int, str | None], tuple] = {}
        self.latest: dict[tuple, tuple[str, dict]] = {}  # (spec, workload, batch, plain, block) -> (key, info)
        self.steps: dict[tuple[str, str, int], float] = {}  # (spec, workload, batch) -> train step seconds
        # (spec text, user's workload, global batch) -> (spec, state key, K, step seconds): bench_workload.py's,
        # the control a SPEC@ENV result of the same workload interleaves
        self.workload_steps: dict[tuple[str, str, int], tuple] = {}
        self._serial = 0

    # -- engine calls ----------------------------------------------------------------
    def replicas(self, spec) -> int:
        """Replicas of one step: ``num_replicas_in_sync`` as the engine reports it (a
        ``mirrored:gpus`` spec knows its GPUs only there; parameter servers report 1)."""
        return int(self.engines.call(spec, "engine.info")[0].num_replicas_in_sync)

    def prepare(self, spec, workload: str, global_batch: int, plain: bool = False,
                block: str | None = None) -> tuple[str, dict]:
        self._serial += 1
        key = f"{workload}-{global_batch}-{'plain' if plain else 'strategy'}-{block or 'none'}-{self._serial}"
        replies = self.engines.call(spec, "bench.prepare", workload=workload, global_batch=global_batch,
                                    key=key, plain=plain, block=block, path=self.path)
        _raise_if_raised(replies)
        self.latest[(spec.text, workload, global_batch, plain, block)] = (key, replies[0])
        return key, replies[0]

    def run(self, spec, key: str, steps: int) -> BenchRun:
        """K steps; the engine time is the slowest worker's (the harness waits for all). A step
        that raised (only states with a block return it) raises StepRaised."""
        replies = self.engines.call(spec, "bench.run", key=key, steps=steps)
        _raise_if_raised(replies)
        losses = [r.loss for r in replies]
        Check(spec, case={"state": key, "steps": steps}).that(
            all(math.isfinite(v) for v in losses), "the train step's loss on each worker", losses, "finite")
        return BenchRun(max(r.seconds for r in replies), losses[0])

    def floor(self, spec) -> float:
        """Median seconds of an empty engine call (a ping) to this spec's engine."""
        if spec.text not in self.floors:
            times = []
            for _ in range(15):
                began = time.perf_counter()
                self.engines.call(spec, "engine.ping")
                times.append(time.perf_counter() - began)
            self.floors[spec.text] = median(times)
        return self.floors[spec.text]

    def traced_state(self, spec, workload: str, global_batch: int, plain: bool = False,
                     block: str | None = None) -> tuple[str, dict]:
        """The state left by the trace benchmark, or a new one traced now."""
        found = self.latest.get((spec.text, workload, global_batch, plain, block))
        if found is not None:
            return found
        key, info = self.prepare(spec, workload, global_batch, plain, block)
        self.run(spec, key, 1)
        return key, info

    def calibrate(self, spec, key: str) -> int:
        """K for this state: one step estimates the step time; rounds at that K, lengthened by
        20% while too short (at most 3), confirm a round lasts the target. These calls warm up."""
        if self.smoke:
            return 1
        floor = self.floor(spec)
        target = max(ROUND_SECONDS, floor / FLOOR_SHARE)
        k = steps_per_round(self.run(spec, key, 1).seconds, floor)
        for _ in range(3):  # the first steps after a trace run slower: lengthen until a round is long enough
            seconds = self.run(spec, key, k).seconds
            if seconds >= target or k == MAX_STEPS:
                break
            k = min(MAX_STEPS, math.ceil(1.2 * steps_per_round(seconds / k, floor)))
        return k

    def control_spec(self, spec):
        """Where the plain control of ``spec`` runs: on CPU specs the ``default`` engine (the
        same cores); on GPU specs the spec's own engine, outside the strategy (on its first
        GPU), so a GPU step is compared with a plain GPU step."""
        return spec if spec.gpus else self.plain_spec

    def measure(self, benchmark, spec, key: str, control: tuple | None = None) -> dict:
        """Time ``rounds`` rounds of K steps with pytest-benchmark (after one warm-up round);
        the rounds' harness and engine seconds.

        ``control`` (the plain step's engine spec, state key and K) interleaves the control:
        before every round, in pytest-benchmark's untimed set-up, the plain step runs one round
        of its own. The overhead ratio then compares rounds taken minutes apart
        by nothing, which matters on a machine whose speed drifts between runs."""
        steps = self.calibrate(spec, key)
        engine_seconds: list[float] = []
        control_seconds: list[float] = []
        losses: list[float] = []

        def one_round():
            r = self.run(spec, key, steps)
            engine_seconds.append(r.seconds)
            losses.append(r.loss)

        def control_round():
            control_seconds.append(self.run(control[0], control[1], control[2]).seconds)

        benchmark.pedantic(one_round, setup=control_round if control else None, rounds=self.rounds, warmup_rounds=1)
        if benchmark.disabled:  # smoke mode: one call, timed by the engine only
            harness = list(engine_seconds)
        else:
            harness = list(benchmark.stats.stats.data)
            engine_seconds = engine_seconds[-len(harness):]  # the warm-up round is not counted
            control_seconds = control_seconds[-len(harness):]
        return {"steps": steps, "harness": harness, "engine": engine_seconds, "loss": losses[-1],
                "control": control_seconds}

    def plain_control(self, workload: str, global_batch: int, spec=None, block: str | None = None) -> tuple:
        """The plain step (with ``block``) on this global batch for ``spec`` (see ``control_spec``;
        None: the ``default`` engine): its engine spec, state key, K and step seconds, from its
        benchmark, or measured here (same method, without pytest-benchmark) when that was not run."""
        where = self.plain_spec if spec is None else self.control_spec(spec)
        got = self.plain.get((where.text, workload, global_batch, block))
        if got is None:
            key, _ = self.traced_state(where, workload, global_batch, plain=True, block=block)
            steps = self.calibrate(where, key)
            rounds = [self.run(where, key, steps).seconds for _ in range(max(self.rounds, 3))]
            got = self.plain[(where.text, workload, global_batch, block)] = (where, key, steps, median(rounds) / steps)
        return got

    def plain_step_seconds(self, workload: str, global_batch: int, spec=None) -> float:
        return self.plain_control(workload, global_batch, spec)[3]


def _raise_if_raised(replies) -> None:
    raised = [r for r in replies if isinstance(r, Raised)]
    if raised:
        raise StepRaised(raised[0])


def block_unsupported(block: str, raised) -> str | None:
    """The part of ``raised`` (a Raised) that makes it TensorFlow's error for ``block``
    unsupported under a strategy (``BLOCK_UNSUPPORTED``), or None."""
    pattern = BLOCK_UNSUPPORTED.get(block)
    found = re.search(pattern, raised.message) if pattern else None
    return found.group(0) if found else None


def round_summary(measured: dict, floor: float) -> dict:
    """Step times from measured rounds, and their fidelity against the engine's timer."""
    k = measured["steps"]
    fid = fidelity(measured["harness"], measured["engine"], floor)
    return {"steps_per_round": k, "rounds": len(measured["harness"]),
            "round_s": fid["harness_round_s"], "step_time_s": fid["harness_round_s"] / k,
            "step_time_engine_s": fid["engine_round_s"] / k, "harness_vs_engine": fid["error"],
            "floor_s": floor, "floor_share_of_round": fid["floor_share"], "loss_last": measured["loss"]}


REQUIRED_EXTRA_INFO = (
    "kind", "workload", "spec", "steps_per_s", "examples_per_s", "examples_per_s_per_replica", "global_batch",
    "per_replica_batch", "replicas", "overhead_ratio", "scaling", "scaling_efficiency", "scaling_label",
    "cross_device_ops", "tensorflow", "keras", "virtual_devices", "shares_cores", "devices",
)


REQUIRED_BLOCK_INFO = (
    "kind", "block", "workload", "spec", "step_time_s", "examples_per_s", "global_batch", "replicas",
    "plain_step_time_s", "overhead_ratio", "block_cost_ratio", "tensorflow", "keras", "shares_cores", "devices",
)


# A user's step per spec and version (benchmarks/bench_workload.py, kind workload_step): the report
# sets a spec's versions side by side by spec_base, tensorflow and keras.
REQUIRED_WORKLOAD_INFO = (
    "kind", "workload", "spec", "spec_base", "env", "step_time_s", "step_time_engine_s", "harness_vs_engine",
    "steps_per_round", "examples_per_s", "global_batch", "replicas", "tensorflow", "keras", "engine_versions",
    "shares_cores", "devices",
)


def missing_extra_info(info: dict, required: tuple[str, ...] = REQUIRED_EXTRA_INFO) -> list[str]:
    return [k for k in required if k not in info]


# -- what `pytest benchmarks` selects, and how long it should take -------------------------
# The default selection ends within minutes on a 2-core CPU machine; `--bench-full` selects the
# whole sweep (every block, every dtype: what the default selected before). Blocks whose cost on
# a CPU means nothing run by default only where a GPU is present: mixed_float16 runs about 100
# times slower than float32 on a CPU without float16 units.
GPU_ONLY_BLOCKS = ("mixed_precision",)


def default_blocks(gpus: bool) -> list[str]:
    """The blocks the default selection times: every block on a GPU machine, else those whose
    cost on a CPU means something (float32)."""
    return [b for b in BLOCKS if gpus or b not in GPU_ONLY_BLOCKS]


# Seconds one benchmark of each kind takes, set-up included (engine starts spread over them),
# measured on the 2-core VM (TF 2.21 / Keras 3.15.1, no GPU) with the default method (5 counted
# rounds of at least 0.3 s, 3 trace rounds): the estimate when no earlier run's JSON times it.
# (the default selection on 2 cores, nothing else running: floors 0.8 s, plain steps 3.0 s, train steps
# 5.3 s, block steps 8.7 s, the check of a workload on the 9 default specs 17.3 s; first calls are
# estimated from three traces, which the round length does not change)
SECONDS_PER_KIND = {"floor": 1.0, "plain_step": 3.0, "first_call": 6.0, "train_step": 5.5, "block_step": 9.0,
                    "workload_step": 5.5, "check": 17.0, "check_size": 25.0}
SECONDS_PER_KIND_SMOKE = 1.5  # --benchmark-disable: each benchmark once, K = 1
SECONDS_DEFAULT = 8.0  # a benchmark of a kind not above


def kind_of(nodeid: str) -> str:
    """``benchmarks/bench_train_step.py::test_train_step[mlp-weak-default]`` -> ``train_step``."""
    name = nodeid.rsplit("::", 1)[-1].split("[", 1)[0]
    return {"test_harness_floor": "floor"}.get(name, name.removeprefix("test_"))


def previous_wall_seconds(data: dict) -> dict[str, float]:
    """``nodeid -> seconds`` the benchmarks of an earlier run took (``extra_info["wall_s"]``, set-up
    and call), from its pytest-benchmark JSON; benchmarks without the field are left out."""
    found = {}
    for b in data.get("benchmarks", []):
        wall = (b.get("extra_info") or {}).get("wall_s")
        if isinstance(wall, (int, float)) and wall >= 0:
            found[b.get("fullname", "")] = float(wall)
    return found


def estimate_seconds(nodeids: list[str], previous: dict[str, float], smoke: bool = False,
                     fallback: dict[str, float] | None = None) -> tuple[float, int]:
    """(seconds, how many of ``nodeids`` were timed in ``previous``): an earlier run's figure for
    each benchmark it has, else its figure in ``fallback`` (the suite's files: the committed cost
    table), else the per-kind figure."""
    total, known = 0.0, 0
    for nodeid in nodeids:
        if nodeid in previous:
            total += previous[nodeid]
            known += 1
        elif (fallback or {}).get(nodeid):
            total += fallback[nodeid]
        elif smoke:
            total += SECONDS_PER_KIND_SMOKE
        else:
            total += SECONDS_PER_KIND.get(kind_of(nodeid), SECONDS_DEFAULT)
    return total, known


def duration_text(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def representative_specs(specs) -> list:
    """One spec of each strategy kind, for the default selection when ``--strategies`` is not
    given: the first of its kind with more than one replica in sync where there is one
    (``mirrored:2`` for MirroredStrategy), else the first; GPU and ``SPEC@ENV`` specs all stay."""
    chosen: dict[str, object] = {}
    for spec in specs:
        if spec.gpus or spec.python:
            continue
        have = chosen.get(spec.kind)
        if have is None or (have.replicas < 2 <= spec.replicas):
            chosen[spec.kind] = spec
    return [s for s in specs if s in chosen.values() or s.gpus or s.python]


DEFAULT_BLOCK_WORKLOADS = ("mlp",)  # the default selection's blocks: on the MLP (the CNN's with --bench-full)


def block_spec(specs):
    """The spec the default selection times the blocks under: the first synchronous one with more
    than one replica (``mirrored:2``: all-reduce, synchronized BatchNormalization across
    replicas), else the first; None without specs."""
    multi = [s for s in specs if s.synchronous and s.replicas > 1 and not s.python]
    return (multi or list(specs) or [None])[0]
