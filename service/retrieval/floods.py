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
filled by one flood's copies. Each copy keeps its vector, but the copies left unindexed are
not searched by meaning either (a message's ``flood_copy``, an event out of
``event_vectors``): a spammer's varied copies each lie at their own distance, and filled the
nearest of a question near the ad.

The same words on another day, or from another member, are indexed again: another occasion,
other news. Unless more than ``CHORUS_SENDERS`` members say them on one day, a chorus: 300
accounts of a bot farm sending one ad naming 王芳 ten times each (no account a flood by
itself) filled a search for her name with the accounts' copies, and none of her own lines
was shown. A chorus is indexed for words twice: its first copy, and its latest. The first
is who said it before the others echoed: eleven accounts repeating a member's line on the day
she said it do not take it over. Ten members' "我也去", or two members' alike news, stay
each their own.

The latest copy is the one a person means (a memory written down twice, asked about by its
second entry), and outlives the older ones wherever old rows go. A statement said a few
times is left as it is: MADial's memories written down two or three times over, asked about
by their last entry, lost two questions of 262 when all but the latest were unindexed
(hit@10 .950 -> .943; their neighbours' words count too).

The message archive applies this as messages are stored, the events as the historian and the
importer write them; each reads its own table's latest rows of every member
(``FLOOD_WINDOW``), so that the look-up costs as much in a group holding 20,000 rows that
day as in one holding 2,000: reading the whole day would grow with it, and a flood would
make every row after it dearer to store. A batch of 20 costs about 4 ms in a busy group's
day, 13 ms where the window is full of 300-character copies (2026-11; a chorus is seen only
by reading every member's rows, where a flood needs the sender's alone: 2 and 1.4 ms).
"""

from __future__ import annotations

import hashlib
import string
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from typing import Any, NamedTuple

from sqlalchemy import text as sql

from service.retrieval.terms import compact, terms

FLOOD_COPIES = 10
# More members than this saying the same words on one day are a chorus (a bot farm's ad, a
# chain line reposted by the whole group, "生日快乐" all round): one statement for words.
CHORUS_SENDERS = 10
FLOOD_WINDOW = 500
# Copies are compared by their first characters, as many as a stored copy's are read back:
# the look-up reads 500 rows' texts, whatever their length.
SHAPE_CHARS = 300


class Copy(NamedTuple):
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


def lately(tenant_id: Any, keys: Iterable[str], moments: Iterable[datetime]) -> dict[str, Any]:
    """The parameters of a look-up of what was said lately in the conversations ``keys``:
    the latest ``window`` rows of each on the UTC ``days`` of ``moments``, between ``since``
    and ``until`` (the start of the first day, the end of the last)."""
    days = sorted({_day(at) for at in moments})
    return {
        "tenant_id": tenant_id,
        "keys": sorted(set(keys)),
        "days": days,
        "since": datetime.combine(days[0], time.min, UTC),
        "until": datetime.combine(days[-1] + timedelta(days=1), time.min, UTC),
        "window": FLOOD_WINDOW,
    }


def said_lately_sql(table: str, columns: str, at: str) -> str:
    """SQL of what members said lately in the conversations :keys (the parameters of
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
    WHERE r.sender_id IS NOT NULL
      AND CAST(r.{at} AT TIME ZONE 'UTC' AS date) = ANY(CAST(:days AS date[]))
    """


def copy_state(alias: str) -> str:
    """SQL of what a stored row is as a copy: its ``text`` as far as its ``shape`` reads, and
    whether its words are ``indexed``."""
    return f"left({alias}.text, {SHAPE_CHARS}) AS text, {indexed(alias)}"


def indexed(alias: str) -> str:
    """SQL of whether a row's words are ``indexed``: not a flood's other copy (or wordless)."""
    return f"coalesce(length({alias}.lexical), 0) > 0 AS indexed"


# Stored copies are read a page at a time (``stored_copies``).
_PAGE = 5000


def stored_copies(
    execute: Callable[..., Any], table: str, key: tuple[str, ...]
) -> Iterator[tuple[Any, list[tuple[Any, ...]]]]:
    """The stored copies of ``table`` (its rows left unindexed although their text has words,
    as told by the same code as at write time: a row without words is no copy), read through
    ``execute`` (a synchronous connection's or session's) a page at a time, in the order of
    their ``key`` (the columns after ``tenant_id`` of its primary key): each tenant's keys
    of a page in turn."""
    columns = ", ".join(key)
    after = ", ".join(f":{column}" for column in key)
    page = sql(
        f"""
        SELECT tenant_id, {columns}, text FROM {table}
        WHERE coalesce(length(lexical), 0) = 0
          AND (tenant_id, {columns}) > (CAST(:tenant_id AS uuid), {after})
        ORDER BY tenant_id, {columns}
        LIMIT :limit
        """
    )
    last: dict[str, Any] = {"tenant_id": "00000000-0000-0000-0000-000000000000"}
    last |= {column: "" for column in key}
    while rows := execute(page, {**last, "limit": _PAGE}).all():
        copies: dict[Any, list[tuple[Any, ...]]] = {}
        for row in rows:
            if terms(row.text):
                copies.setdefault(row.tenant_id, []).append(tuple(row)[1:-1])
        yield from copies.items()
        last = {"tenant_id": rows[-1].tenant_id} | {c: getattr(rows[-1], c) for c in key}


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
    """The copies to leave unindexed: of each chorus (the same words from more than
    ``CHORUS_SENDERS`` members of a conversation on one day), every indexed one but the
    first (who said it before the others echoed) and the latest; of each other statement
    with more than ``FLOOD_COPIES`` copies, every indexed one but the latest. One whose
    latest copy is unindexed is left as it is (so left by a batch stored beside this one)."""
    copies = list(copies)
    # Most words come once; only those said more often than either rule allows are grouped.
    said = Counter((c.conversation_key, c.digest) for c in copies)
    often = min(FLOOD_COPIES, CHORUS_SENDERS)
    ordered = sorted(
        (c for c in copies if said[c.conversation_key, c.digest] > often),
        key=lambda c: (c.at, c.order),
    )
    choruses: dict[tuple[Any, ...], list[Copy]] = defaultdict(list)
    for copy in ordered:
        choruses[copy.conversation_key, _day(copy.at), copy.digest].append(copy)
    out: set[int] = set()
    for found in choruses.values():
        if len({c.sender_id for c in found}) > CHORUS_SENDERS:
            out |= _indexed(found[1:-1], found[-1])
            continue
        by_sender: dict[str, list[Copy]] = defaultdict(list)
        for copy in found:
            by_sender[copy.sender_id].append(copy)
        for one in by_sender.values():
            if len(one) > FLOOD_COPIES:
                out |= _indexed(one[:-1], one[-1])
    return [copy for copy in ordered if id(copy) in out]


def _indexed(copies: list[Copy], latest: Copy) -> set[int]:
    """The ``id``s of the indexed ``copies``, where the ``latest`` is indexed too."""
    return {id(copy) for copy in copies if copy.indexed} if latest.indexed else set()


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


def copy_of(
    said: Sequence[tuple[str, str | None, datetime | None, bool]],
) -> Callable[[int, int], bool]:
    """Whether the ``n``-th of these results (text, sender, time, whether its words are
    indexed) is shown already as the ``m``-th: the same words (``digest``) on the same day
    (UTC; any, without a time), and ``n`` a copy left unindexed (a flood's or a chorus's: its
    words are indexed in another), or ``m`` so and both the same sender's. A chorus's copies,
    each their own sender's statement said once, are shown as its indexed ones (its first and
    its latest, a day), not one an account, and a member forwarding a flood's words stays a
    member who said them."""

    def repeats(n: int, m: int) -> bool:
        (text, sender, at, indexed), (other, other_sender, other_at, other_indexed) = (
            said[n],
            said[m],
        )
        if indexed and (other_indexed or sender != other_sender):
            return False
        if at is not None and other_at is not None and _day(at) != _day(other_at):
            return False
        return digest(text) == digest(other)

    return repeats


def _day(at: datetime) -> date:
    return at.astimezone(UTC).date()
