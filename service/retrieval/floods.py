"""Floods: one statement said over and over, indexed for words once.

A statement is what one sender said on one day (UTC), word for word as a reader reads it:
what a spammer varies from copy to copy to pass for new text, and a reader passes over
(emoji, punctuation, spacing, case, full-width forms, zero-width characters, a number
before or after the words such as "【1372】"), is not read (``shape``). A number within the
words is read: a bot's "PR #1234 merged" and "PR #1235 merged" are two statements, each
indexed, however many a day. More copies of it than
``FLOOD_COPIES`` among a conversation's latest ``FLOOD_WINDOW`` rows of that day are a
flood, such as a spammer's ad sent 3,000 times or a member's "收到" said twenty times: only
its latest copy is indexed for words, the others are left unindexed (an empty ``lexical``),
and a stored copy loses its index when a later one comes. So the lexical side matches a
statement once, as the searches show it, and a big conversation's matches of a term are not
filled by one flood's copies. Each copy keeps its vector: the nearest find it by meaning.

The same words on another day, or from another member, are indexed again: another occasion,
other news. The latest copy is the one a person means (a memory written down twice, asked
about by its second entry), and outlives the older ones wherever old rows go. A statement
said a few times is left as it is: MADial's memories written down two or three times over,
asked about by their last entry, lost two questions of 262 when all but the latest were
unindexed (hit@10 .950 -> .943; their neighbours' words count too).

The message archive applies this as messages are stored, the events as the historian and the
importer write them; each reads its own table's latest rows (``FLOOD_WINDOW``), so that the
look-up costs as much in a group holding 20,000 rows that day as in one holding 2,000 (about
2 ms a batch, 2026-11): reading the whole day would grow with it, and a flood would make
every row after it dearer to store.
"""

from __future__ import annotations

import hashlib
import string
import unicodedata
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from typing import Any

from service.retrieval.terms import compact

FLOOD_COPIES = 10
FLOOD_WINDOW = 500
# Copies are compared by their first characters, as many as a stored copy's are read back:
# the look-up reads 500 rows' texts, whatever their length.
SHAPE_CHARS = 300


@dataclass(frozen=True)
class Copy:
    """One copy of a statement: stored already, or about to be."""

    conversation_key: str
    sender_id: str
    at: datetime
    digest: str  # of the text's shape (``digest``)
    # Its place among copies said at the same moment: stored ones before new ones, each in
    # the order it was stored or given.
    order: tuple[int, Any]
    ref: Any  # the stored row's key, or the new row
    indexed: bool

    @property
    def statement(self) -> tuple[str, str, date, str]:
        return self.conversation_key, self.sender_id, self.at.astimezone(UTC).date(), self.digest


def shape(text: str) -> str:
    """A text as a reader reads it, of its first ``SHAPE_CHARS`` characters: folded (NFKC,
    casefold), its letters and digits only, without the number before or after them; a text
    of digits alone ("666") is its digits, one of neither ("？？") itself without spaces."""
    folded = unicodedata.normalize("NFKC", text[:SHAPE_CHARS]).casefold()
    words = compact(folded)
    return words.strip(string.digits) or words or "".join(folded.split())


def digest(text: str) -> str:
    """The digest of a text's ``shape``: two copies of a statement have the same."""
    return _digest(text[:SHAPE_CHARS])


# A flood's stored copies are read back with every batch of its sender: their digests are
# kept rather than made again (500 copies of 300 characters: about 40 ms, 2026-11).
@lru_cache(maxsize=4096)
def _digest(text: str) -> str:
    return hashlib.md5(shape(text).encode(), usedforsecurity=False).hexdigest()


def lately(
    tenant_id: Any, keys: Iterable[str], senders: Iterable[str], moments: Iterable[datetime]
) -> dict[str, Any]:
    """The parameters of a look-up of what ``senders`` said lately in the conversations
    ``keys``: the latest ``window`` rows of each on the UTC ``days`` of ``moments``, between
    ``since`` and ``until`` (the start of the first day, the end of the last)."""
    days = sorted({at.astimezone(UTC).date() for at in moments})
    return {
        "tenant_id": tenant_id,
        "keys": sorted(set(keys)),
        "senders": sorted(set(senders)),
        "days": days,
        "since": datetime.combine(days[0], time.min, UTC),
        "until": datetime.combine(days[-1] + timedelta(days=1), time.min, UTC),
        "window": FLOOD_WINDOW,
    }


def said_lately_sql(table: str, columns: str, at: str) -> str:
    """SQL of what :senders said lately in the conversations :keys (the parameters of
    ``lately``): ``columns`` (of the rows, as ``r``), the ``text`` of each as far as its
    ``shape`` reads, and whether its words are ``indexed``, of the rows among each
    conversation's latest :window on the :days, read through its time index (``at``, the
    time column)."""
    return f"""
    SELECT {columns}, {copy_state("r")}
    FROM unnest(CAST(:keys AS text[])) k(conversation_key)
    CROSS JOIN LATERAL (
        SELECT * FROM {table} r
        WHERE r.tenant_id = :tenant_id AND r.conversation_key = k.conversation_key
          AND r.{at} >= :since AND r.{at} < :until
        ORDER BY r.{at} DESC
        LIMIT :window
    ) r
    WHERE r.sender_id = ANY(CAST(:senders AS text[]))
      AND CAST(r.{at} AT TIME ZONE 'UTC' AS date) = ANY(CAST(:days AS date[]))
    """


def copy_state(alias: str) -> str:
    """SQL of what a stored row is as a copy: its ``text`` as far as its ``shape`` reads, and
    whether its words are ``indexed``."""
    return (
        f"left({alias}.text, {SHAPE_CHARS}) AS text,"
        f" coalesce(length({alias}.lexical), 0) > 0 AS indexed"
    )


def new_copies(rows: Iterable[dict[str, Any]], at: str) -> list[Copy]:
    """New rows (``conversation_key``, ``sender_id``, ``text`` and the time column ``at``)
    as copies, in the order given, each after the stored ones said at the same moment."""
    return [
        Copy(
            row["conversation_key"],
            row["sender_id"],
            row[at],
            digest(row["text"]),
            (1, n),
            row,
            True,
        )
        for n, row in enumerate(rows)
    ]


def flooded(copies: Iterable[Copy]) -> list[Copy]:
    """The copies to leave unindexed: of each statement with more than ``FLOOD_COPIES``
    copies, every indexed one but the latest. A statement whose latest copy is unindexed
    is left as it is (so left by a batch stored beside this one)."""
    statements: dict[tuple[Any, ...], list[Copy]] = defaultdict(list)
    for copy in copies:
        statements[copy.statement].append(copy)
    out = []
    for found in statements.values():
        found.sort(key=lambda c: (c.at, c.order))
        *older, latest = found
        if len(found) > FLOOD_COPIES and latest.indexed:
            out += [copy for copy in older if copy.indexed]
    return out


def unindexed(copies: Iterable[Copy]) -> list[Any]:
    """Leave the flooded copies among these unindexed (``flooded``): the new rows' by an
    empty ``lexical``; the stored ones' keys are returned, for the caller to update."""
    stored = []
    for copy in flooded(copies):
        if isinstance(copy.ref, dict):
            copy.ref["lexical"] = ""
        else:
            stored.append(copy.ref)
    return stored
