"""What the engine reads of a script's source (suite/common/source.py): whether the statement that runs
after a script's call of fit calls evaluate, the one statement of the script's that may run after the
steps the check compares (issue 63: nothing else of the script runs after them)."""

from __future__ import annotations

import textwrap

import pytest

from suite.common.source import evaluate_follows
from suite.harness.judging.judgment import Check

SCRIPTS = {
    # Keras' guide: fit then evaluate in the scope's block
    "guide": ("""
        with strategy.scope():
            model = build()
        model.fit(train, epochs=2,
                  validation_data=val)
        model.evaluate(test)
        """, True),
    "assigned": ("""
        model.fit(train)
        loss, accuracy = model.evaluate(test)
        """, True),
    "printed": ("""
        model.fit(train)
        print(model.evaluate(test))
        """, True),
    # the fit ends a with block: the statement after the block runs next
    "after_the_block": ("""
        with strategy.scope():
            model.fit(train)
        model.evaluate(test)
        """, True),
    # something else first: it must not run, so no evaluate either
    "load_first": ("""
        model.fit(train)
        model.load_weights(path)
        model.evaluate(test)
        """, False),
    "print_first": ("""
        model.fit(train)
        print("done")
        model.evaluate(test)
        """, False),
    "last": ("""
        model.fit(train)
        """, False),
    # in a loop the next statement is the loop's next turn: no evaluate
    "in_a_loop": ("""
        for epoch in range(3):
            model.fit(train)
        model.evaluate(test)
        """, False),
    "in_a_function": ("""
        def train(model):
            model.fit(train)
            return model.evaluate(test)

        train(model)
        """, True),
    "function_ends": ("""
        def train(model):
            model.fit(train)

        train(model)
        model.evaluate(test)
        """, False),
    "in_a_method": ("""
        class Trainer:
            def run(self):
                self.model.fit(self.data)
                self.model.evaluate(self.test)
        """, True),
    # a name evaluate that is not called
    "not_a_call": ("""
        model.fit(train)
        evaluate = 3
        """, False),
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_only_an_evaluate_right_after_fit_may_run(tmp_path, name):
    source, want = SCRIPTS[name]
    source = textwrap.dedent(source).lstrip("\n")
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    line = next(i for i, text in enumerate(source.splitlines(), 1) if ".fit(" in text)
    Check("source.evaluate_follows", case={"script": name}).equal(
        evaluate_follows(str(path), line), want, f"an evaluate runs after the fit at line {line}", source)


def test_a_line_of_a_multi_line_call_and_a_file_that_does_not_parse(tmp_path):
    path = tmp_path / "multi.py"
    path.write_text("model.fit(\n    train,\n    epochs=2,\n)\nmodel.evaluate(test)\n")
    check = Check("source.evaluate_follows")
    check.equal(evaluate_follows(str(path), 3), True, "the fit's call spans lines 1-4: line 3 is in it")
    broken = tmp_path / "broken.py"
    broken.write_text("model.fit(train)\nmodel.evaluate(\n")
    check.equal(evaluate_follows(str(broken), 1), False, "a file that does not parse: no evaluate")
