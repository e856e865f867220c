"""The dev sets' chats, read where the benches read them: ``../shared/bench`` beside the
repository (tests that use them skip where it is absent)."""

from __future__ import annotations

import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "shared" / "bench"
# The sets whose lines are one JSON object each, a turn's words in ``text``.
JSONL = ("locomo_dev.jsonl", "realtalk_dev.jsonl", "memdaily-zh/memdaily_events_pools.jsonl")


def jsonl_texts(names: tuple[str, ...] = JSONL) -> list[str]:
    """Every turn's text of those of ``names`` that are present, in file order."""
    texts: list[str] = []
    for name in names:
        path = BENCH / name
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            text = json.loads(line).get("text")
            if isinstance(text, str):
                texts.append(text)
    return texts
