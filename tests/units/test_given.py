"""A signature's ``given`` is a typed record (suite/common/given.py): a misspelt field fails where a
test builds it, Check refuses anything else, and every deviation model and condition reads only the
fields it declares (``signatures.reads``), each a field of Given."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

import pytest

from suite.common.given import FIELDS, Given
from suite.common.specs import parse_spec
from suite.harness.judging import signatures
from suite.harness.judging.judgment import Check
from suite.harness.judging.signatures import CONDITIONS, MODELS, Seen, reads

DECLARING = {**MODELS, **CONDITIONS}


def _given_reads(f) -> set[str]:
    """The fields of ``given`` that ``f`` reads by its source: attributes of ``seen.given`` or
    ``seen.inputs`` and of the names bound to either, and the declared reads of the models and
    conditions it calls, less the fields it hands them itself (``dataclasses.replace(g, field=...)``,
    ``Given(field=...)``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(f)))

    def is_given(node) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr in ("given", "inputs")
                and isinstance(node.value, ast.Name) and node.value.id == "seen")

    aliases = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and is_given(node.value)
               for target in node.targets if isinstance(target, ast.Name)}
    read, handed = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (is_given(node.value) or (
                isinstance(node.value, ast.Name) and node.value.id in aliases)):
            read.add(node.attr)
        elif isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name in DECLARING and DECLARING[name] is not f:
                read |= DECLARING[name].reads
            if name in ("replace", "Given"):
                handed |= {k.arg for k in node.keywords if k.arg in FIELDS}
    return read - handed


def test_a_misspelt_field_fails_where_the_test_builds_it():
    with pytest.raises(TypeError, match="alternitive"):
        Given(alternitive=1.0)
    with pytest.raises(TypeError, match="unsumed"):
        dataclasses.replace(Given(alternative=1.0), unsumed=2.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Given().alternative = 1.0


def test_check_refuses_a_given_that_is_not_a_given():
    check = Check(parse_spec("mirrored:2"), "float64")
    for call in (lambda: check.close(1.0, 1.0, "loss", given={"alternative": 2.0}),
                 lambda: check.equal(1, 1, "count", given={"alternative": 2}),
                 lambda: check.returned(1.0, "step", given={"optimizer_built": False}),
                 lambda: check.per_replica([[1.0]], [1.0], "loss", attr=None, given=[{"empty": True}])):
        with pytest.raises(TypeError, match=r"given must be a suite\.common\.given\.Given") as info:
            call()
        Check("handed").equal(len(str(info.value).splitlines()), 1, "lines of the refusal")
    check.close(1.0, 1.0, "loss", given=Given(alternative=2.0))  # a Given, a list of them or None: accepted
    check.per_replica([[1.0]], [1.0], "loss", attr=None, given=[Given(empty=True)])


@pytest.mark.parametrize("name", sorted(DECLARING))
def test_each_model_reads_exactly_the_fields_it_declares(name):
    f = DECLARING[name]
    read = _given_reads(f)
    Check(name).equal(sorted(read - f.reads), [], "fields it reads without declaring them (add them to its @reads)")
    Check(name).equal(sorted(f.reads - read), [], "fields it declares and never reads (drop them from its @reads)")
    Check(name).equal(sorted(read - FIELDS), [], "fields it reads that Given has not")


def test_a_model_reading_an_undeclared_field_fails_the_check():
    @reads("alternative")
    def careless(seen: Seen):
        g = seen.inputs
        return g.alternative if g.unsummed is None else g.unsummed

    Check("careless").equal(sorted(_given_reads(careless) - careless.reads), ["unsummed"], "undeclared reads found")
    with pytest.raises(ValueError, match=r"careless: unknown given fields \['alternitive'\]"):
        reads("alternitive")(careless)


def test_a_model_handing_its_callee_a_field_need_not_declare_it():
    """per_replica_metric_copies_of_unsummed_steps hands metric_variables_per_replica_copy its
    ``replica_increments`` and reads the rest of that model's fields through it."""
    f = signatures.per_replica_metric_copies_of_unsummed_steps
    Check("delegation").equal(sorted(_given_reads(f)), sorted(f.reads), "fields read, its callee's included")
