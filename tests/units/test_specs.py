"""The spec grammar (pure Python) and its command-line errors."""

from __future__ import annotations

import re

import pytest

from suite.common.specs import DEFAULT_SPECS, SpecError, id_parts, parse_spec, parse_specs
from suite.harness.judging.judgment import Check
from suite.harness.pool import machine
from tests.helpers import run_pytest


@pytest.mark.parametrize("text, kind, replicas, workers", [
    ("default", "default", 1, 1), ("one_device", "one_device", 1, 1), ("mirrored:3", "mirrored", 3, 1),
    ("mirrored:4:reduce_to_one", "mirrored", 4, 1), ("central_storage:2", "central_storage", 2, 1),
    ("multi_worker:2x1", "multi_worker", 2, 2), ("multi_worker:3x1:ring", "multi_worker", 3, 3),
    ("multi_worker:2x2", "multi_worker", 4, 2), ("multi_worker:3x2:auto", "multi_worker", 6, 3),
    ("parameter_server:2w1ps", "parameter_server", 1, 2), ("parameter_server:1w2ps", "parameter_server", 1, 1),
])
def test_valid_specs_parse(text, kind, replicas, workers):
    spec = parse_spec(text)
    assert (spec.kind, spec.replicas, spec.workers) == (kind, replicas, workers)


@pytest.mark.parametrize("text", ["mirrored", "mirrored:0", "mirrored:9", "mirrored:2:nccl", "bogus",
                                  "multi_worker:2", "central_storage:x", "parameter_server:2w",
                                  "parameter_server:0w1ps", "multi_worker:2x9", "multi_worker:2x1:nccl"])
def test_invalid_specs_raise_with_the_grammar(text):
    with pytest.raises(SpecError, match="grammar"):
        parse_spec(text)


def test_parameter_server_specs_are_not_synchronous():
    assert parse_spec("parameter_server:2w1ps").ps == 1
    assert not parse_spec("parameter_server:2w1ps").synchronous
    assert parse_spec("multi_worker:2x2").synchronous and parse_spec("multi_worker:2x2").devices == 2


def test_cluster_spec_needs_agents():
    with pytest.raises(SpecError, match="--cluster-agents"):
        parse_spec("cluster")


def test_default_specs_parse_and_are_distinct():
    assert [s.text for s in parse_specs(",".join(DEFAULT_SPECS))] == list(DEFAULT_SPECS)
    with pytest.raises(SpecError, match="twice"):
        parse_specs("default,default")


@pytest.mark.parametrize("names, visible, count", [
    (["GPU 0", "GPU 1"], None, 2), (["GPU 0", "GPU 1"], "1", 1), (["GPU 0", "GPU 1"], "", 0),
    (["GPU 0", "GPU 1"], "0,-1,1", 1), ([], None, 0), (["GPU 0"], "0,1,2", 1)])
def test_gpu_spec_replicas_are_the_visible_gpus(names, visible, count):
    assert machine.gpu_count(names, visible) == count


def test_gpu_spec_without_gpus_skips_before_drawing_a_case():
    """Where no GPU is visible, mirrored:gpus has no replicas to draw cases for: its tests skip
    with the reason, they do not fail in a case strategy."""
    proc = run_pytest(["tests/properties/test_reduce.py", "--strategies", "mirrored:gpus", "-rs"], 300,
                      CUDA_VISIBLE_DEVICES="")
    check = Check("mirrored:gpus", case={"CUDA_VISIBLE_DEVICES": ""})
    check.equal(proc.returncode, 0, "pytest's exit code", proc.stdout[-3000:])
    check.contains(proc.stdout, [" skipped", "no GPU visible here"], "pytest's summary")
    summary = proc.stdout.strip().splitlines()[-1]
    check.that(not re.search(r"passed|failed|error", summary), "pytest's last line", summary, "only skips")


def test_unknown_spec_is_a_usage_error_before_any_engine_starts():
    proc = run_pytest(["tests/units/test_specs.py", "--strategies", "mirrored:2,warp_drive"], 120)
    check = Check("mirrored:2,warp_drive")
    check.equal(proc.returncode, 4, "pytest's exit code (4: a usage error)", proc.stdout + proc.stderr)
    check.contains(proc.stderr, ["unknown strategy spec 'warp_drive'", "mirrored:N"], "pytest's error")


def test_a_spec_at_an_env_is_the_spec_run_by_another_interpreter():
    """``SPEC@ENV``: the spec's semantics, its own text (its own engine), ``base`` the spec alone;
    a missing env is a one-line usage error before any engine starts."""
    spec = parse_spec("multi_worker:2x1@tf216-legacy")
    check = Check("SPEC@ENV")
    check.equal((spec.kind, spec.replicas, spec.workers, spec.python, spec.text),
                ("multi_worker", 2, 2, "tf216-legacy", "multi_worker:2x1@tf216-legacy"), "the parsed spec")
    check.equal((spec.base.text, spec.base.python), ("multi_worker:2x1", None), "its base spec")
    for text, phrase in [("cluster@tf215", "takes no '@'"), ("mirrored:2@", "a tox env name"),
                         ("mirrored:9@tf215", "outside 1..8")]:
        with pytest.raises(SpecError) as info:
            parse_spec(text)
        check.contains(str(info.value), [phrase], f"the error for {text!r}")
    proc = run_pytest(["tests/units/test_specs.py", "--strategies", "mirrored:2@no-such-env"], 120)
    check.equal(proc.returncode, 4, "pytest's exit code for an env that does not exist (a usage error)")
    check.contains(proc.stderr, [".tox/no-such-env/bin/python", "tox -e no-such-env --notest"], "the usage error")


def test_test_ids_keep_a_legacy_env_whole():
    check = Check("id_parts")
    check.equal(id_parts("mirrored:2@tf216-legacy-float32"), ["mirrored:2@tf216-legacy", "float32"], "a legacy env")
    check.equal(id_parts("mirrored:2-legacy-x"), ["mirrored:2", "legacy", "x"], "'legacy' after a plain spec")
    check.equal(id_parts("mirrored:2@tf218-keras37-float32"), ["mirrored:2@tf218-keras37", "float32"], "a Keras 3 minor env")
    check.equal(id_parts("mirrored:2-keras37"), ["mirrored:2", "keras37"], "'keras37' after a plain spec")
    check.equal(id_parts("multi_worker:2x1@tf212-sgd"), ["multi_worker:2x1@tf212", "sgd"], "a plain env")
