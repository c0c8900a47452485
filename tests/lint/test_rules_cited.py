"""Every check in tests/properties names the reference rule its expected values come from, so a
failure cites the documented (or observed) source it breaks: a ``rule=`` on each ``Check(...)``
(the rule of the whole check) and, where one check compares values of different rules, a
``rule=`` on the comparison (that comparison's own). No rule names a helper of reference/, which
states nothing about TensorFlow."""

from __future__ import annotations

import ast
import importlib
import io
import tokenize
import types

import pytest

from reference import distribute as ref
from reference import input as ref_input
from reference.rules import Rule
from suite.common.results import Raised, ReplicaValues
from suite.harness.judging.judgment import Check, PropertyFailure
from tests.helpers import ROOT

PROPERTIES = ROOT / "tests" / "properties"
RULE_POSITION = 5  # Check(spec, dtype, case, repro, replicas, rule)


def _is_check(call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Name) and f.id == "Check") or (isinstance(f, ast.Attribute) and f.attr == "Check")


def _none(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def check_calls(source: str) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and _is_check(n)]


def uncited(source: str, filename: str) -> list[str]:
    """``file:line`` of each ``Check(...)`` in ``source`` that names no rule: no ``rule=``
    keyword and no sixth positional argument (``None`` names none)."""
    out = []
    for call in check_calls(source):
        given = [k.value for k in call.keywords if k.arg == "rule"]
        if len(call.args) > RULE_POSITION and not isinstance(call.args[RULE_POSITION], ast.Starred):
            given.append(call.args[RULE_POSITION])
        if not given or all(_none(v) for v in given):
            out.append(f"{filename}:{call.lineno}")
    return out


def _reference_names(tree: ast.AST) -> dict[str, object]:
    """What each name imported from reference/ is in this file: a module or a function."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "reference":
            for alias in node.names:
                if node.module == "reference":
                    names[alias.asname or alias.name] = importlib.import_module(f"reference.{alias.name}")
                else:
                    names[alias.asname or alias.name] = getattr(importlib.import_module(node.module), alias.name)
    return names


def _kinds(node, names: dict) -> list[str]:
    """The kinds of rule an expression names, where it can be read from the source: a
    function of reference/ (``ref.reduce``, an imported name), ``Rule(kind, ...)``, either
    branch of a conditional; nothing for what only runs (``example.rule``, a constant)."""
    if isinstance(node, ast.IfExp):
        return _kinds(node.body, names) + _kinds(node.orelse, names)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Rule" and node.args \
            and isinstance(node.args[0], ast.Constant):
        return [node.args[0].value]
    target = None
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names:
        target = getattr(names[node.value.id], node.attr, None)
    elif isinstance(node, ast.Name) and node.id in names:
        target = names[node.id]
    rule = getattr(target, "rule", None)
    return [rule.kind] if isinstance(rule, Rule) else []


def helper_rules(source: str, filename: str) -> list[str]:
    """``file:line`` of each ``rule=`` (of a check, a comparison, or ``dataclasses.replace``)
    that names a helper, or a module-level ``Rule`` constant of kind helper."""
    tree = ast.parse(source)
    names = _reference_names(tree)
    for node in tree.body:  # module constants: NAME = Rule("documented", ...)
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Call) and _kinds(node.value, names):
            names[node.targets[0].id] = types.SimpleNamespace(rule=Rule(_kinds(node.value, names)[0], "?"))
    out = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        values = [k.value for k in call.keywords if k.arg == "rule"]
        if _is_check(call) and len(call.args) > RULE_POSITION:
            values.append(call.args[RULE_POSITION])
        out += [f"{filename}:{v.lineno}" for v in values if "helper" in _kinds(v, names)]
    return out


def _token_count(source: str) -> int:
    """Calls of ``Check`` counted from the tokens (code only: no strings, no comments)."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT)]
    return sum(1 for a, b in zip(tokens, tokens[1:]) if a.type == tokenize.NAME and a.string == "Check"
               and b.type == tokenize.OP and b.string == "(")


def _properties() -> list:
    return sorted(PROPERTIES.glob("*.py"))


def test_every_check_in_the_properties_names_its_rule():
    missing, walked, counted = [], 0, 0
    for path in _properties():
        source = path.read_text()
        missing += uncited(source, str(path.relative_to(ROOT)))
        walked += len(check_calls(source))
        counted += _token_count(source)
    Check("tests/properties").equal(walked, counted, "Check(...) calls the walker sees (vs the calls in the code)")
    Check("tests/properties").equal(missing, [], "Check(...) calls naming no rule=")


def test_no_rule_in_the_properties_is_a_helper():
    found = [line for path in _properties()
             for line in helper_rules(path.read_text(), str(path.relative_to(ROOT)))]
    Check("tests/properties").equal(found, [], "rule= naming a helper of reference/ (it states nothing about TF)")


def test_the_walkers_report_a_check_without_a_rule_and_a_helper_rule():
    source = "\n".join([
        "from reference import distribute as ref",
        "from reference.rules import Rule",
        "check = Check(spec, 'float64', {'sizes': sizes})",               # 3: no rule
        "Check(spec, rule=ref.reduce).equal(1, 1, 'x')",                 # a documented rule
        "Check(spec, 'float64', None, None, None, ref.local_results)",   # an observed rule, by position
        "judgment.Check(spec, rule=None)",                               # 6: None names no rule
        "Check(spec, rule=ref.split)",                                   # 7: a helper
        "check.equal(a, b, 'x', rule=ref.replica_weights if c else ref.reduce)",  # 8: a helper on one branch
        "check = dataclasses.replace(check, rule=Rule('helper', 'arithmetic'))",  # 9: a helper Rule
        "LOCAL = Rule('observed', 'input_lib.py')",
        "Check(spec, rule=LOCAL)",                                       # a module constant, observed
    ])
    Check("walker").equal(uncited(source, "t.py"), ["t.py:3", "t.py:6"], "checks reported as naming no rule")
    Check("walker").equal(helper_rules(source, "t.py"), ["t.py:7", "t.py:8", "t.py:9"], "rules reported as helpers")
    Check("walker").equal(_token_count(source + "\n# Check(x)\n'Check(y)'\n"), 6, "Check( counted in the code alone")


def test_a_failure_cites_the_documented_rule_and_its_source():
    with pytest.raises(PropertyFailure) as info:
        Check("mirrored:2", "float64", rule=ref.compute_average_loss).close(2.0, 1.0, "q")
    Check("rule").contains(str(info.value), ["\n  rule: documented (" + ref.compute_average_loss.rule.source + ")"],
                           "the failure of a check with a documented rule")


OVERRIDES = {  # a comparison's own rule: a documented function, an observed one, a Rule written in the test
    "documented": ref.reduce,
    "observed": ref_input.batch_sizes_for_worker,
    "inline": Rule("documented", "tf.distribute.DistributedIterator.get_next_as_optional docstring"),
}
FAILING = {  # every comparison that can fail, failing, with rule= passed through
    "close": lambda c, rule: c.close(2.0, 1.0, "q", rule=rule),
    "exact": lambda c, rule: c.exact([1.0], [2.0], "q", rule=rule),
    "equal": lambda c, rule: c.equal([1, 2], [2, 1], "q", rule=rule),
    "that": lambda c, rule: c.that(False, "q", 3, "4", rule=rule),
    "contains": lambda c, rule: c.contains("abc", ["d"], "q", rule=rule),
    "raises": lambda c, rule: c.raises(ReplicaValues([1.0]), "ValueError", "q", rule=rule),
    "returned": lambda c, rule: c.returned(Raised("ValueError", "boom", "probe 'x'"), "q", rule=rule),
    "per_replica": lambda c, rule: c.per_replica([ReplicaValues([1.0]), ReplicaValues([2.0])], [1.0, 3.0], "q",
                                                 rule=rule),
    "per_replica count": lambda c, rule: c.per_replica([ReplicaValues([1.0, 2.0])], [1.0], "q", rule=rule),
    "on_workers": lambda c, rule: c.on_workers([types.SimpleNamespace(total=1.0)], "total", 2.0, "q", rule=rule),
}


@pytest.mark.parametrize("override", sorted(OVERRIDES))
@pytest.mark.parametrize("comparison", sorted(FAILING))
def test_a_comparisons_own_rule_is_the_one_its_failure_cites(comparison, override):
    """``rule=`` on a comparison: its failure cites that rule's source, not the check's; the
    check keeps its own rule for the comparisons that name none."""
    mine = OVERRIDES[override]
    check = Check("multi_worker:2x1", "float64", rule=ref.compute_average_loss)
    with pytest.raises(PropertyFailure) as info:
        FAILING[comparison](check, mine)
    message = str(info.value)
    cited = getattr(mine, "rule", mine)
    Check("rule").contains(message, [f"\n  rule: {cited.describe()}"], f"the failure of {comparison} with rule=")
    Check("rule").that(ref.compute_average_loss.rule.source not in message, f"the failure of {comparison} with rule=",
                       message, "without the check's own rule")
    with pytest.raises(PropertyFailure) as info:
        FAILING[comparison](check, None)
    Check("rule").contains(str(info.value), [f"\n  rule: documented ({ref.compute_average_loss.rule.source})"],
                           f"the failure of {comparison} without rule= after one with it")
