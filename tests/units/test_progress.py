"""When a call's progress shows (suite/harness/pool/pool.py, Engine._show_progress): not before it has run
PROGRESS_AFTER seconds, then at each change, and the same text again only PROGRESS_EVERY seconds later."""

from __future__ import annotations

import types

from suite.harness.judging.judgment import Check
from suite.harness.pool import pool


def test_progress_shows_after_its_delay_at_each_change_and_again_only_after_a_while(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(pool.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(pool, "PROGRESS_AFTER", 5.0)
    shown: list[str] = []
    engine = types.SimpleNamespace(on_progress=shown.append, _progress=[None, None, 0.0], _waited_from=(100.0, {}))

    def at(seconds, text):
        clock[0] = 100.0 + seconds
        engine._progress[0] = text
        pool.Engine._show_progress(engine)

    for seconds, text in [(1, "s: step 1 of 3"), (4, "s: step 2 of 3"), (6, "s: step 2 of 3"), (7, "s: step 2 of 3"),
                          (8, "s: step 3 of 3"), (37, "s: step 3 of 3"), (39, "s: step 3 of 3")]:
        at(seconds, text)
    Check("Engine._show_progress").equal(
        shown, ["s: step 2 of 3 (6 s)", "s: step 3 of 3 (8 s)", "s: step 3 of 3 (39 s)"], "the lines shown")
