"""What a comparison is of, as a value: a ``Quantity`` has a kind (``compute_average_loss``),
qualifiers (``sample_weight=True``, ``reduced="SUM"``, and the ``worker`` and ``replica`` that
``Check.per_replica`` adds) and the text a failure message shows. A known deviation's signature
names the quantities it covers by field (``quantity = {kind = "...", sample_weight = true}`` in
known_deviations.toml), so an entry's scope is a statement about the comparison, never a glob over
its wording: the text is for display only. No TensorFlow here."""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any


@dataclasses.dataclass(frozen=True)
class Quantity:
    text: str  # what the failure message says
    kind: str
    qualifiers: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, kind: str, text: str | None = None, **qualifiers) -> Quantity:
        """``text`` defaults to the kind, followed by ``(with Q)`` for each true boolean qualifier."""
        if text is None:
            text = kind + "".join(f" (with {k})" for k, v in qualifiers.items() if v is True)
        return cls(text, kind, tuple(qualifiers.items()))

    def get(self, key: str, default=None):
        return dict(self.qualifiers).get(key, default)

    def at(self, **where) -> Quantity:
        """The same quantity on a worker and/or replica: ``(worker W)`` and `` replica R`` appended."""
        text = self.text + (f" (worker {where['worker']})" if "worker" in where else "") + (
            f" replica {where['replica']}" if "replica" in where else "")
        return Quantity(text, self.kind, self.qualifiers + tuple(where.items()))

    def __str__(self) -> str:
        return self.text


def probe_raised(name: str) -> Quantity:
    """A probe that raised as a whole (a test's ProbeError), as a raises signature names it: ``{kind = "probe",
    probe = "training.train"}``."""
    return Quantity.of("probe", f"probe {name}", probe=name)


def part(what, kind: str, text: str):
    """A part of ``what`` (a Quantity or plain text) that its comparison checks first, such as how
    many local results it has: a quantity of its own ``kind`` (no signature of ``what``'s kind
    covers it), ``of`` what, with what's fields and ``text`` appended (``: local results``)."""
    if isinstance(what, Quantity):
        return Quantity(what.text + text, kind, (("of", what.kind), *what.qualifiers))
    return what + text


def at(what, **where):
    """``what`` (a Quantity or plain text) on a worker and/or replica, as ``Quantity.at`` says."""
    if isinstance(what, Quantity):
        return what.at(**where)
    return what + (f" (worker {where['worker']})" if "worker" in where else "") + (
        f" replica {where['replica']}" if "replica" in where else "")


@dataclasses.dataclass(frozen=True)
class Pattern:
    """The quantities a signature covers, by field: the kind (a glob) and qualifiers that must
    equal (a string value is a glob; ``"*"`` asks only that the field is there, whatever its
    type: ``replica = "*"``). Plain text never matches a Pattern."""

    kind: str
    qualifiers: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, table: dict, where: str) -> Pattern:
        if not isinstance(table.get("kind"), str):
            raise ValueError(f"{where}: a quantity table needs a kind (a glob over quantity kinds)")
        for key, value in table.items():
            if not isinstance(value, (str, bool, int)):
                raise ValueError(f"{where}: quantity field {key} = {value!r}: a string, boolean or integer")
        return cls(table["kind"], tuple((k, v) for k, v in table.items() if k != "kind"))

    def matches(self, what) -> bool:
        if not isinstance(what, Quantity) or not glob(self.kind).fullmatch(what.kind):
            return False
        mine = dict(what.qualifiers)
        for key, want in self.qualifiers:
            got = mine.get(key)
            if want == "*":  # the field is there, whatever its value (a replica, a step)
                if key not in mine:
                    return False
            elif isinstance(want, str):
                if not isinstance(got, str) or not glob(want).fullmatch(got):
                    return False
            elif type(got) is not type(want) or got != want:
                return False
        return True

    def __str__(self) -> str:
        return "{" + ", ".join(f"{k} = {v!r}".replace("True", "true").replace("False", "false")
                               for k, v in (("kind", self.kind), *self.qualifiers)) + "}"

    __repr__ = __str__


@functools.cache
def glob(pattern: str) -> re.Pattern:
    """``*`` matches anything and ``{a,b}`` either alternative; everything else is literal
    (test ids contain ``[`` and ``]``, which fnmatch would treat as character classes)."""
    out = []
    for token in re.split(r"(\*|\{[^{}]*\})", pattern):
        if token == "*":
            out.append(".*")
        elif token.startswith("{") and token.endswith("}"):
            out.append("(?:" + "|".join(re.escape(alt) for alt in token[1:-1].split(",")) + ")")
        else:
            out.append(re.escape(token))
    return re.compile("".join(out), re.DOTALL)
