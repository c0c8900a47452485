"""What the engine reads of a script's own source (no TensorFlow here: the pytest process tests it)."""

from __future__ import annotations

import ast
import linecache


def evaluate_follows(filename: str, line: int) -> bool:
    """Whether the statement that runs after the one at ``line`` of ``filename`` (the script's call of ``fit``) calls
    ``evaluate`` (a fit and then an evaluate, as Keras' guides write them): the one statement of the
    script's that may run after the steps compared. The next statement of the call's block, or, where the
    call ends a ``with``, ``if`` or ``try`` block, the one after that block (not out of a loop or a
    function: there the run ends)."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return False

    def blocks(stmt) -> list:
        out = [getattr(stmt, field, None) for field in ("body", "orelse", "finalbody")]
        out += [handler.body for handler in getattr(stmt, "handlers", [])]
        return [b for b in out if isinstance(b, list) and b and isinstance(b[0], ast.stmt)]

    def after(body):
        """The statement after the innermost one spanning ``line`` in ``body``; None where none runs next
        in this function; ``...`` where ``line`` is not in ``body``."""
        for i, stmt in enumerate(body):
            if not stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
                continue
            nxt = body[i + 1] if i + 1 < len(body) else None
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                return ...
            for inner in blocks(stmt):
                found = after(inner)
                if found is ...:
                    continue
                if found is None and isinstance(stmt, (ast.With, ast.If, ast.Try)):
                    return nxt  # the block ended: what follows the compound statement
                return found
            return nxt
        return ...

    def defs(body):
        """The function bodies of ``body``, to find the call in a function of the script's."""
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield stmt.body
            for inner in blocks(stmt):
                yield from defs(inner)

    found = after(tree.body)
    if found is ...:  # the call is in a function of the script's
        found = next((f for f in (after(body) for body in defs(tree.body)) if f is not ...), None)
    if not isinstance(found, ast.stmt):
        return False
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "evaluate"
               for node in ast.walk(found))
