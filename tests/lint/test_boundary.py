"""The process line, enforced from the tree: every module on the pytest side (suite/harness,
suite/common, suite/check.py, suite/report.py, suite/layout.py, reference/, tests/, benchmarks/,
conftest.py) imports neither TensorFlow nor Keras nor the engine package; every module on the
engine side (suite/engine, suite/common, suite/layout.py and the workloads in examples/) imports
neither the reference nor the harness, by an import statement (relative ones resolved) or by
``layout.reference``. Modules are found by walking the folders, so a new module is covered the
day it is added."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
import textwrap

import pytest

from suite.harness.judging.judgment import Check
from tests.helpers import ROOT

PYTEST_SIDE = ("suite/harness", "suite/common", "suite/check.py", "suite/report.py", "suite/layout.py", "reference",
               "tests", "benchmarks", "conftest.py")
# examples/ holds workloads of users' kind: they run in engines (suite/engine/workload.py), never judge
ENGINE_SIDE = ("suite/engine", "suite/common", "suite/layout.py", "examples")
# what each side must not import (top-level package, or a package prefix)
NOT_ON_PYTEST_SIDE = ("tensorflow", "keras", "tf_keras", "suite.engine")
NOT_ON_ENGINE_SIDE = ("reference", "suite.harness")


def modules(roots) -> dict[str, str]:
    """Repository-relative path -> source of every .py file under ``roots``."""
    out = {}
    for root in roots:
        path = ROOT / root
        for f in [path] if path.is_file() else sorted(path.rglob("*.py")):
            out[str(f.relative_to(ROOT))] = f.read_text()
    return out


@functools.cache
def imports(path: str, source: str) -> frozenset[str]:
    """Every module an import statement in ``source`` (the file ``path``) names, relative imports
    resolved against the file's package as the repository lays it out, and ``reference.NAME`` for
    each ``layout.reference("NAME")``; cached, so the injection test parses only the module it
    changed."""
    parts = path.removesuffix(".py").split("/")
    package = parts[:-1]  # a module's package; a package's __init__ is in its own
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] if node.level else [])
            module = ".".join(p for p in (base, node.module or "") if p)
            names.add(module)
            names |= {f"{module}.{a.name}" for a in node.names}
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "reference"
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "layout"):
            names.add("reference." + (node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else "?"))
    return frozenset(names)


def violations(sources: dict[str, str], forbidden: tuple[str, ...]) -> list[str]:
    """``path: imports NAME`` for each import of a forbidden package in ``sources``."""
    out = []
    for path, source in sorted(sources.items()):
        for name in sorted(imports(path, source)):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                out.append(f"{path}: imports {name}")
    return out


def test_pytest_side_imports_no_tensorflow_and_no_engine_module():
    Check("pytest side").equal(violations(modules(PYTEST_SIDE), NOT_ON_PYTEST_SIDE), [],
                               "imports of TensorFlow, Keras or the engine package")


def test_engine_side_imports_no_reference_and_no_harness_module():
    Check("engine side").equal(violations(modules(ENGINE_SIDE), NOT_ON_ENGINE_SIDE), [],
                               "imports of the reference or the harness")


@pytest.mark.parametrize("side, forbidden, added", [
    (PYTEST_SIDE, NOT_ON_PYTEST_SIDE, "import tensorflow as tf"),
    (PYTEST_SIDE, NOT_ON_PYTEST_SIDE, "from keras import layers"),
    (ENGINE_SIDE, NOT_ON_ENGINE_SIDE, "from reference import distribute"),
    (ENGINE_SIDE, NOT_ON_ENGINE_SIDE, "import reference.model as ref_model"),
    (ENGINE_SIDE, NOT_ON_ENGINE_SIDE, "ref = layout.reference('model')"),
    (ENGINE_SIDE, NOT_ON_ENGINE_SIDE, "from {to_suite}harness.judging import judgment"),
    (PYTEST_SIDE, NOT_ON_PYTEST_SIDE, "from {to_suite}engine import steps"),
], ids=["tensorflow-on-pytest-side", "keras-on-pytest-side", "reference-on-engine-side",
        "reference-module-on-engine-side", "reference-by-layout-on-engine-side", "harness-relative-on-engine-side",
        "engine-relative-on-pytest-side"])
def test_boundary_check_catches_an_import_added_to_any_module(side, forbidden, added):
    """The check is not vacuous: the forbidden import, added inside a function of any one
    module of the side (a lazy import counts too), is reported for that module and no other.
    ``{to_suite}`` is the relative way up to ``suite`` in modules of suite/, ``suite.`` elsewhere."""
    sources = modules(side)
    check = Check(" + ".join(side), case={"added": added})
    check.that(len(sources) > 5, "modules found on the side", len(sources), "more than 5")
    for path, source in sources.items():
        to_suite = "." * path.count("/") if path.startswith("suite/") else "suite."
        line = added.replace("{to_suite}", to_suite)
        mutated = dict(sources, **{path: source + f"\n\ndef _late():\n    {line}\n"})
        found = violations(mutated, forbidden)
        check.that(bool(found) and all(line.startswith(f"{path}:") for line in found),
                   f"violations reported with the import added to {path}", found, f"lines naming {path} only")


def test_pytest_side_modules_import_no_tensorflow_when_imported():
    """Importing every pytest-side package module (walked from the tree) in a fresh interpreter
    loads no TensorFlow, not even through a dependency."""
    names = sorted(path[:-3].replace("/", ".").removesuffix(".__init__")
                   for path in modules(("suite/harness", "suite/common", "suite/report.py", "suite/layout.py",
                                        "reference"))) + ["conftest"]
    code = textwrap.dedent(f"""
        import importlib, sys
        for name in {names!r}:
            importlib.import_module(name)
        bad = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "tf_keras"))
        assert not bad, bad
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    Check("pytest side").equal(proc.returncode, 0, f"importing {len(names)} modules without TensorFlow (exit code)",
                               proc.stderr[-2000:])


def duplicate_names(paths: list[str]) -> dict[str, list[str]]:
    """Module file names used by more than one module of ``paths``."""
    by_name: dict[str, list[str]] = {}
    for path in paths:
        by_name.setdefault(path.rsplit("/", 1)[-1], []).append(path)
    return {name: where for name, where in sorted(by_name.items()) if len(where) > 1}


def test_no_two_modules_of_the_suite_share_a_name():
    """One word, one job: every module of suite/ has a file name of its own. The engine's probes are
    the exception by design: one module per area (``losses``, ``bench``, ``workload``), the engine
    half of that area, named as the probes are called (``area.name``)."""
    paths = [p for p in modules(("suite",)) if not p.endswith("__init__.py") and not p.startswith("suite/engine/probes/")]
    check = Check("suite/")
    check.equal(duplicate_names(paths), {}, "module file names used twice")
    check.equal(duplicate_names(["suite/check.py", "suite/harness/judging/check.py"]),
                {"check.py": ["suite/check.py", "suite/harness/judging/check.py"]},
                "a duplicate found (the check's own test)")


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the modules of ``sources`` it imports (anywhere in it: a lazy import inside a function
    counts), by dotted name; packages are left out (every ``__init__`` of suite/ imports nothing)."""
    dotted = {path: path.removesuffix(".py").replace("/", ".") for path in sources if not path.endswith("__init__.py")}
    known = set(dotted.values())
    return {name: {n for n in imports(path, sources[path]) if n in known and n != name} for path, name in dotted.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: each strongly connected set of two or more modules, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(node):  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(out)


def test_no_modules_of_the_suite_import_each_other():
    """The suite's modules form layers: no two import each other, directly or through others (a lazy
    import inside a function counts). The commands (suite/check.py, suite/report.py) sit on top of the
    library modules they call, and a module that builds on another never imports it back."""
    sources = modules(("suite",))
    check = Check("suite/ imports")
    check.equal(cycles(import_graph(sources)), [], "import cycles among the suite's modules")
    # the check's own test: a lazy import of the command from the loop check closes a cycle through every
    # module of the check the command calls
    path = "suite/harness/loopcheck/usercheck.py"
    changed = dict(sources, **{path: sources[path] + "\n\ndef _f():\n    from ... import check  # noqa\n"})
    check.equal(cycles(import_graph(changed)), [["suite.check", "suite.harness.loopcheck.scriptcheck",
                                                 "suite.harness.loopcheck.upgrade", "suite.harness.loopcheck.usercheck"]],
                "a cycle added to a module found (the check's own test)")


def mentioning_mutants(sources: dict[str, str]) -> list[str]:
    """The modules of ``sources`` outside the mutants package whose code or text names a mutant."""
    return sorted(path for path, source in sources.items()
                  if not path.startswith("suite/engine/mutants/") and re.search(r"\bmutants?\b", source))


def test_no_engine_module_outside_the_mutants_package_names_a_mutant():
    """The step a user's loop is compared with reads as the guide's step, and every probe as what it
    computes: the mutants are patches applied from suite/engine/mutants/, which an engine imports only
    when the pool names it (TFDS_ENGINE_IMPORTS) and which registers its own probe; no other module of
    suite/engine/ mentions a mutant."""
    sources = modules(("suite/engine",))
    check = Check("suite/engine")
    check.equal(mentioning_mutants(sources), [], "modules outside suite/engine/mutants/ that mention a mutant")
    path = "suite/engine/steps.py"
    changed = dict(sources, **{path: sources[path] + "\nfrom . import mutants  # noqa\n"})
    check.equal(mentioning_mutants(changed), [path], "a mutant's import added to the step found (the check's own test)")


def facts_named(sources: dict[str, str]) -> dict[str, set[str]]:
    """Each NAME ``sources`` take of a workload run's facts by attribute (``facts.NAME``,
    ``run.facts.NAME``, in code, not in text) -> the modules taking it."""
    out: dict[str, set[str]] = {}
    for path, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Attribute) and (
                    isinstance(node.value, ast.Name) and node.value.id == "facts"
                    or isinstance(node.value, ast.Attribute) and node.value.attr == "facts"):
                out.setdefault(node.attr, set()).add(path)
    return out


def test_a_misspelt_fact_fails_where_it_is_named():
    """A workload run's ``facts`` is a ``Facts`` (suite/common/facts.py), which both sides import: a
    misspelt fact is an AttributeError when read or written (slots), a TypeError when built, a one-line
    ValueError where a module names the facts a deviation's condition reads, never a silent None. And
    every ``facts.NAME`` in the code of the suite and its tests is a field of Facts (or one of its
    methods), so a misspelling on a path no test runs is found too."""
    from suite.common import facts as facts_module
    from suite.common.facts import FIELDS, Facts, named
    from suite.harness.loopcheck.differential import CONDITION_FACTS

    check = Check("facts")
    check.that(len(FIELDS) > 40, "the facts declared", len(FIELDS), "those of the workload and script probes")
    check.equal(sorted(set(CONDITION_FACTS) - FIELDS), [], "condition facts that are no field of Facts")
    known = FIELDS | set(dir(Facts)) | set(vars(facts_module))
    used = facts_named(modules(("suite", "tests")))
    check.that(len(used) > 30, "facts the code names", len(used), "those the probes write and the checks read")
    check.equal({k: sorted(v) for k, v in used.items() if k not in known}, {}, "facts named that Facts does not have")
    check.equal(sorted(facts_named({"x.py": "ref.facts.optimizer_bulit"})), ["optimizer_bulit"],
                "a misspelt attribute found (the check's own test)")
    outcomes = []
    for attempt in (lambda: Facts().optimizer_bulit, lambda: setattr(Facts(), "optimizer_bulit", False),
                    lambda: Facts(optimizer_bulit=False), lambda: named(("optimizer_bulit",), "CONDITION_FACTS")):
        try:
            attempt()
            outcomes.append(None)
        except (AttributeError, TypeError, ValueError) as exc:
            outcomes.append(type(exc).__name__)
    check.equal(outcomes, ["AttributeError", "AttributeError", "TypeError", "ValueError"],
                "a misspelt fact read, written, built and named by a condition")
    try:
        named(("optimizer_bulit",), "differential.CONDITION_FACTS")
    except ValueError as exc:
        check.equal(str(exc).count("\n"), 0, "the unknown condition fact in one line", str(exc))
