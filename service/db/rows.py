"""Reading result rows as plain dicts."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Result


def dicts(result: Result[Any]) -> list[dict[str, Any]]:
    """The rows of ``result`` as dicts, the column names read once: a Row's ``_mapping``
    builds a key index of its own for every row (5 ms of CPU for the 330 rows of one context
    read, a sixth of its time)."""
    keys = list(result.keys())
    return [dict(zip(keys, row, strict=True)) for row in result]
