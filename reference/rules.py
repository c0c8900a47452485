"""What kind of rule each reference function states, and where it comes from.

``@documented(source)``: a TensorFlow/Keras API page, docstring or guide states it (cited).
``@observed(source, since)``: no documentation promises it; it is the pinned behaviour of the
versions tested, cited by the source line that implements it. A failure of an observed rule
says the behaviour changed since those versions, not that TensorFlow has a bug.
``@helper``: plain arithmetic the rules use (a formula, a slice), stating nothing about TF.

``tests/reference/test_reference.py`` requires every public function of ``reference/`` to carry one.
"""

from __future__ import annotations

import dataclasses

KINDS = ("documented", "observed", "helper")
TESTED = "TF 2.15.1 / Keras 2.15 and TF 2.21.0 / Keras 3.15.1"


@dataclasses.dataclass(frozen=True)
class Rule:
    kind: str
    source: str
    since: str = ""

    def describe(self) -> str:
        if self.kind == "observed":
            return (f"observed behaviour, pinned on {self.since or TESTED} ({self.source}): a failure means "
                    f"the behaviour changed since then, not necessarily a bug")
        return f"{self.kind} ({self.source})"


def documented(source: str):
    def mark(fn):
        fn.rule = Rule("documented", source)
        return fn
    return mark


def observed(source: str, since: str = TESTED):
    def mark(fn):
        fn.rule = Rule("observed", source, since)
        return fn
    return mark


def helper(fn):
    fn.rule = Rule("helper", "arithmetic")
    return fn
