"""SQL of events."""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Collection, Sequence
from datetime import datetime
from functools import cache
from typing import Any

import numpy as np
from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.rows import dicts
from service.db.vector_index import rescoring_ceiling
from service.errors import Invalid
from service.retrieval.floods import indexed, lately, said_lately_sql
from service.retrieval.terms import (
    held_terms_sql,
    term_sample,
    terms,
    to_tsquery_literal,
    to_tsvector_literal,
)

# Upsert by event id: a retried job rewrites the same rows instead of adding new ones, and
# only its own: an event of another turn or conversation under the same id (an imported one
# may be named anyhow; a hand-over's id is made of its conversation and turn) is left as it
# is, not given this turn's text. The same
# statement keeps the event's search vector (event_vectors) in step: written when there is an
# embedding, removed when a rewrite leaves none or the event is a flood's copy (:copies, see
# ``unindex``). updated_at takes EXCLUDED's (its default, now()):
# Citus refuses now() itself in DO UPDATE. One statement writes many rows of one tenant
# ({values}: one parenthesized row of parameters per event, numbered by row, all with the one
# :tenant_id, so that on Citus the whole statement is routed to that tenant's shard).
_UPSERT_SQL = """
    WITH written AS (
        INSERT INTO events (tenant_id, id, conversation_key, request_type, group_id, user_id,
                            sender_id, request_id, end_seq, kind, perspective, text, source_text,
                            is_absolute, warnings, occurred_at, timezone, location_abs,
                            message_ids, metadata, embedding, lexical, job_id)
        VALUES {values}
        ON CONFLICT (tenant_id, id) DO UPDATE SET
            text = EXCLUDED.text, source_text = EXCLUDED.source_text,
            is_absolute = EXCLUDED.is_absolute, warnings = EXCLUDED.warnings,
            metadata = EXCLUDED.metadata, embedding = EXCLUDED.embedding,
            lexical = EXCLUDED.lexical, job_id = EXCLUDED.job_id,
            updated_at = EXCLUDED.updated_at
        WHERE events.conversation_key = EXCLUDED.conversation_key
          AND events.request_id IS NOT DISTINCT FROM EXCLUDED.request_id
          AND events.end_seq IS NOT DISTINCT FROM EXCLUDED.end_seq
        RETURNING tenant_id, id, conversation_key, occurred_at, embedding
    ), searchable AS (
        INSERT INTO event_vectors (tenant_id, event_id, conversation_key, occurred_at, embedding)
        SELECT tenant_id, id, conversation_key, occurred_at,
               CAST(l2_normalize(embedding) AS halfvec)
        FROM written WHERE embedding IS NOT NULL AND id <> ALL(CAST(:copies AS text[]))
        ON CONFLICT (tenant_id, event_id) DO UPDATE SET
            conversation_key = EXCLUDED.conversation_key, occurred_at = EXCLUDED.occurred_at,
            embedding = EXCLUDED.embedding
    )
    DELETE FROM event_vectors v USING written w
    WHERE (w.embedding IS NULL OR w.id = ANY(CAST(:copies AS text[])))
      AND v.tenant_id = :tenant_id AND w.tenant_id = :tenant_id AND v.event_id = w.id
    """

_ROW = """(:tenant_id, :id_{n}, :conversation_key_{n}, :request_type_{n}, :group_id_{n},
          :user_id_{n}, :sender_id_{n}, :request_id_{n}, :end_seq_{n}, :kind_{n},
          :perspective_{n}, :text_{n}, :source_text_{n}, :is_absolute_{n},
          CAST(:warnings_{n} AS jsonb), CAST(:occurred_at_{n} AS timestamptz), :timezone_{n},
          :location_abs_{n}, CAST(:message_ids_{n} AS jsonb), CAST(:metadata_{n} AS jsonb),
          CAST(:embedding_{n} AS vector), CAST(:lexical_{n} AS tsvector), :job_id_{n})"""

# Rows per statement: 23 parameters each, far below PostgreSQL's 65,535.
UPSERT_ROWS = 200


@cache
def _upsert(rows: int) -> TextClause:
    """The upsert of ``rows`` events in one statement (one text per row count, so each is
    prepared once per connection)."""
    return text(_UPSERT_SQL.format(values=", ".join(_ROW.format(n=n) for n in range(rows))))


def lexical_of(text: str) -> str:
    """An event's terms, as its ``lexical`` holds them."""
    return to_tsvector_literal(terms(text))


async def upsert_events(
    session: AsyncSession, rows: list[dict[str, Any]], copies: Collection[str] = ()
) -> None:
    """Write events, many rows of one tenant per statement, with their lexical terms (a
    row's ``lexical`` if it has one). Rows with the same id: the last one is written. The
    ids in ``copies`` are a flood's copies: not searched by meaning (``unindex``)."""
    latest = {(row["tenant_id"], row["id"]): row for row in rows}  # one row per id and statement
    tenants: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for row in latest.values():
        tenants.setdefault(row["tenant_id"], []).append(
            {
                **{name: value for name, value in row.items() if name != "tenant_id"},
                "warnings": json.dumps(row["warnings"], ensure_ascii=False),
                "message_ids": json.dumps(row["message_ids"], ensure_ascii=False),
                "metadata": json.dumps(row["metadata"], ensure_ascii=False),
                "lexical": row["lexical"] if "lexical" in row else lexical_of(row["text"]),
            }
        )
    for tenant_id, prepared in tenants.items():
        for start in range(0, len(prepared), UPSERT_ROWS):
            chunk = prepared[start : start + UPSERT_ROWS]
            params = {
                f"{name}_{n}": value for n, row in enumerate(chunk) for name, value in row.items()
            }
            ids = [row["id"] for row in chunk if row["id"] in copies]
            await session.execute(
                _upsert(len(chunk)), {"tenant_id": tenant_id, "copies": ids, **params}
            )


# What these senders said lately in these conversations on these days (UTC): each event's
# id, time, its text (as far as a flood's copies are compared) and whether its words are
# indexed. Only the latest :window events of a conversation on those days are read (through
# its time index), so that a flood does not make every event after it dearer to store.
_SAID_LATELY = text(
    said_lately_sql("events", "r.id, r.conversation_key, r.sender_id, r.occurred_at", "occurred_at")
)


async def said_lately(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_keys: list[str],
    moments: list[datetime],
) -> list[Any]:
    """The events members told among the latest ``FLOOD_WINDOW`` of each of
    ``conversation_keys`` on the days (UTC) of ``moments``: ``id``, ``conversation_key``,
    ``sender_id``, ``occurred_at``, ``text`` (as far as ``floods.shape`` reads) and
    ``indexed``."""
    if not conversation_keys or not moments:
        return []
    params = lately(tenant_id, conversation_keys, moments)
    return list(await session.execute(_SAID_LATELY, params))


_UNINDEX = text(
    """
    WITH unsearched AS (
        DELETE FROM event_vectors
        WHERE tenant_id = :tenant_id AND event_id = ANY(CAST(:ids AS text[]))
    )
    UPDATE events SET lexical = CAST('' AS tsvector)
    WHERE tenant_id = :tenant_id AND id = ANY(CAST(:ids AS text[]))
    """
)


async def unindex(session: AsyncSession, tenant_id: uuid.UUID, ids: list[str]) -> None:
    """Leave these events unindexed for words, and out of the nearest events' scan: another
    copy of the same statement is in both. A copy keeps its vector (``events.embedding``),
    not its place in the scan (``event_vectors``): a bot farm's 3,000 copies of an ad, each
    varied and so each at its own distance, filled the nearest 30 of a question near the ad,
    and the results, which show a chorus as its indexed copies, held 7 events of 10."""
    if ids:
        await session.execute(_UNINDEX, {"tenant_id": tenant_id, "ids": ids})


_COLUMNS = """id, conversation_key, request_type, group_id, user_id, sender_id, request_id,
              end_seq, kind, perspective, text, source_text, is_absolute, warnings, occurred_at,
              timezone, location_abs, message_ids, metadata, job_id, created_at, updated_at"""
# The same columns of the event aliased ``e``, and whether its words are indexed (a result
# that is a flood's older copy is not shown beside another: ``floods.copy_of``).
_EVENT_COLUMNS = ", ".join("e." + c.strip() for c in _COLUMNS.split(",")) + f", {indexed('e')}"

_LIST = text(
    f"""
    SELECT {_COLUMNS} FROM events
    WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
      AND (CAST(:before_at AS timestamptz) IS NULL OR (occurred_at, id) < (:before_at, :before_id))
    ORDER BY occurred_at DESC, id DESC
    LIMIT :limit
    """
)


async def list_events(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_key: str,
    limit: int,
    before: tuple[datetime, str] | None,
) -> list[dict[str, Any]]:
    """A conversation's events, newest first, strictly before the (time, id) cursor."""
    params = {
        "tenant_id": tenant_id,
        "conversation_key": conversation_key,
        "limit": limit,
        "before_at": before[0] if before else None,
        "before_id": before[1] if before else "",
    }
    return dicts(await session.execute(_LIST, params))


_GET = text(f"SELECT {_COLUMNS} FROM events WHERE tenant_id = :tenant_id AND id = :id")


_BY_IDS = text(
    f"SELECT {_EVENT_COLUMNS}, e.embedding FROM events e"
    " WHERE e.tenant_id = :tenant_id AND e.id = ANY(CAST(:ids AS text[]))"
)


async def events_by_ids(
    session: AsyncSession, tenant_id: uuid.UUID, event_ids: list[str]
) -> dict[str, dict[str, Any]]:
    """Events by id, each with its ``embedding`` and whether its words are ``indexed``
    (``floods``): the ones found."""
    if not event_ids:
        return {}
    rows = dicts(await session.execute(_BY_IDS, {"tenant_id": tenant_id, "ids": list(event_ids)}))
    return {row["id"]: row for row in rows}


async def get_event(
    session: AsyncSession, tenant_id: uuid.UUID, event_id: str
) -> dict[str, Any] | None:
    """One event by id."""
    row = (await session.execute(_GET, {"tenant_id": tenant_id, "id": event_id})).first()
    return dict(row._mapping) if row is not None else None


# Nearest events, exactly. Truth is pgvector's cosine distance between the full-precision
# vectors in ``events``; the scan reads the unit-length half-precision copies in event_vectors
# (half the bytes, contiguous per conversation) and ranks by inner product, then the best
# candidates are re-scored exactly, within ``half_precision_error``.

# Candidates re-scored beyond ``limit``: enough that the proof below almost always closes on
# the first pass (the k-th distance must sit twice the error below the last candidate's).
_EXTRA_CANDIDATES = 24
# Rows that set the bar of the first pass (see there): the cost of this many rows of sorting
# against that of sorting the ~pool x size / sample rows that pass the bar.
_SAMPLE = 1000


def _bounded(
    params: dict[str, Any], time_from: datetime | None, time_to: datetime | None
) -> tuple[bool, bool]:
    """The time bounds given, added to ``params``; which of the two there are (the statement
    writes only those: see ``_filters``)."""
    if time_from is not None:
        params["time_from"] = time_from
    if time_to is not None:
        params["time_to"] = time_to
    return time_from is not None, time_to is not None


def _filters(alias: str, time_from: bool, time_to: bool) -> str:
    # Bounds are only written when given, so the time range is always an index range.
    clauses = (
        f"{alias}.tenant_id = :tenant_id AND {alias}.conversation_key = ANY(:conversation_keys)"
    )
    if time_from:
        clauses += f" AND {alias}.occurred_at >= :time_from"
    if time_to:
        clauses += f" AND {alias}.occurred_at < :time_to"
    return clauses


_RESCORED = f"""
    SELECT {_EVENT_COLUMNS},
           e.embedding, e.embedding <=> CAST(:query AS vector) AS distance, c.approx{{extra}}
    FROM candidates c JOIN events e ON e.tenant_id = :tenant_id AND e.id = c.event_id
    ORDER BY distance, e.id
    LIMIT :limit
"""

# The query vector becomes half precision once (an InitPlan), not once per scanned row.
_QUERY_HALF = "(SELECT CAST(CAST(:query AS vector) AS halfvec))"
# The day of a statement (``said_at``): one sender's words on one day, UTC, as the ranking
# tells statements apart (``ranking._statement``).
_DAY = "(e.occurred_at AT TIME ZONE 'UTC')::date"


def _unskipped(alias: str, skipping: bool) -> str:
    # Vectors left out by their distance to the query (``nearest_events``' ``skipped``).
    if not skipping:
        return ""
    return f" AND {alias}.embedding <#> {_QUERY_HALF} <> ALL(CAST(:skipped AS float8[]))"


@cache
def _first_pass(time_from: bool, time_to: bool, skipping: bool) -> TextClause:
    # The best :pool by approx. Feeding every scanned row to the sort would cost as much as
    # the scan itself (each row is copied into the sort), so a bar is set first: the
    # :pool-th best approx among the first :sample rows. At least :pool rows are under it,
    # so the best :pool of all are too, and only rows under it (a few hundred) are sorted.
    return text(
        f"""
        WITH candidates AS MATERIALIZED (
            SELECT v.event_id, v.embedding <#> {_QUERY_HALF} AS approx
            FROM event_vectors v
            WHERE {_filters("v", time_from, time_to)}{_unskipped("v", skipping)}
              AND v.embedding <#> {_QUERY_HALF} <= COALESCE((
                  SELECT sample.approx FROM (
                      SELECT s.embedding <#> {_QUERY_HALF} AS approx FROM event_vectors s
                      WHERE {_filters("s", time_from, time_to)}{_unskipped("s", skipping)}
                      LIMIT :sample
                  ) sample
                  ORDER BY sample.approx OFFSET :pool - 1 LIMIT 1
              ), 'Infinity')
            ORDER BY approx
            LIMIT :pool
        )
        """
        + _RESCORED.format(extra=", max(c.approx) OVER () AS horizon, count(*) OVER () AS pooled")
    )


@cache
def _second_pass(time_from: bool, time_to: bool, skipping: bool) -> TextClause:
    return text(
        f"""
        WITH candidates AS MATERIALIZED (
            SELECT v.event_id, v.embedding <#> {_QUERY_HALF} AS approx FROM event_vectors v
            WHERE {_filters("v", time_from, time_to)}{_unskipped("v", skipping)}
              AND v.embedding <#> {_QUERY_HALF} <= :ceiling
        )
        """
        + _RESCORED.format(extra="")
    )


@cache
def _said_at(time_from: bool, time_to: bool) -> TextClause:
    # Every statement (one sender's words on one day, UTC) among the events at these
    # approx distances, its nearest copy each.
    return text(
        f"""
        WITH candidates AS MATERIALIZED (
            SELECT v.event_id, v.embedding <#> {_QUERY_HALF} AS approx FROM event_vectors v
            WHERE {_filters("v", time_from, time_to)}
              AND v.embedding <#> {_QUERY_HALF} = ANY(CAST(:approx AS float8[]))
        ), copies AS (
            SELECT DISTINCT ON (e.sender_id, e.text, {_DAY})
                   {_EVENT_COLUMNS}, e.embedding,
                   e.embedding <=> CAST(:query AS vector) AS distance, c.approx
            FROM candidates c JOIN events e ON e.tenant_id = :tenant_id AND e.id = c.event_id
            ORDER BY e.sender_id, e.text, {_DAY},
                     distance, e.id
        )
        SELECT * FROM copies ORDER BY distance, id LIMIT :limit
        """
    )


async def nearest_events(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_keys: list[str],
    query: np.ndarray,
    limit: int,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
    skipped: Sequence[float] = (),
) -> list[dict[str, Any]]:
    """The exact ``limit`` events nearest to ``query`` by cosine distance, nearest first,
    each with its ``approx`` (the half-precision inner product of the unit vectors, negated).

    Only events of the tenant in ``conversation_keys`` with ``time_from <= occurred_at <
    time_to`` (either bound optional) and with an embedding take part, and none at an
    ``approx`` in ``skipped`` (a flood's copies: one vector, one distance).
    """
    if limit <= 0 or not conversation_keys:
        return []
    params: dict[str, Any] = {
        "tenant_id": tenant_id,
        "conversation_keys": list(conversation_keys),
        "query": _unit_query(query),
        "limit": limit,
        "pool": limit + _EXTRA_CANDIDATES,
        "sample": max(_SAMPLE, 8 * (limit + _EXTRA_CANDIDATES)),
        "skipped": list(skipped),
    }
    bounds = (*_bounded(params, time_from, time_to), bool(skipped))

    rows = dicts(await session.execute(_first_pass(*bounds), params))
    if not rows:
        return []
    pooled, horizon = rows[0].pop("pooled"), rows[0].pop("horizon")
    for row in rows[1:]:
        del row["pooled"], row["horizon"]
    # Else every event that could still be nearer, all re-scored.
    dimensions = len(params["query"])
    ceiling = rescoring_ceiling(rows[-1]["distance"], horizon, pooled < params["pool"], dimensions)
    if ceiling is None:
        return rows
    params["ceiling"] = ceiling
    return dicts(await session.execute(_second_pass(*bounds), params))


async def said_at(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_keys: list[str],
    query: np.ndarray,
    approx: Sequence[float],
    limit: int,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
) -> list[dict[str, Any]]:
    """Of the events ``nearest_events`` would give at these ``approx`` distances, the nearest
    ``limit`` statements: one copy (the nearest) of each sender's words on each day (UTC)."""
    if limit <= 0 or not conversation_keys or not approx:
        return []
    params: dict[str, Any] = {
        "tenant_id": tenant_id,
        "conversation_keys": list(conversation_keys),
        "query": _unit_query(query),
        "approx": list(approx),
        "limit": limit,
    }
    bounds = _bounded(params, time_from, time_to)
    return dicts(await session.execute(_said_at(*bounds), params))


def _unit_query(query: np.ndarray) -> np.ndarray:
    vector = np.asarray(query, dtype=np.float64).ravel()
    norm = float(np.linalg.norm(vector))
    if not np.isfinite(norm) or norm == 0.0:
        raise Invalid("the query vector must be finite and non-zero", field="query")
    return (vector / norm).astype(np.float32)


# The events one sender told nearest to the query: in a group of a hundred members telling
# alike news, "where is the event I signed up for?" is about the asker's own, which the
# conversation's nearest few may all pass over. The sender's latest :recent events (their
# index gives them newest first) are scored exactly, with the full-precision vectors; an older
# one is left to the conversation's own nearest.
SENDER_RECENT = 1000


@cache
def _told_by(time_from: bool, time_to: bool) -> TextClause:
    return text(
        f"""
        SELECT {_EVENT_COLUMNS},
               e.embedding, m.distance
        FROM (
            SELECT r.id, r.embedding <=> CAST(:query AS vector) AS distance
            FROM (
                SELECT e.id, e.embedding FROM events e
                WHERE {_filters("e", time_from, time_to)}
                  AND e.sender_id = :sender AND e.embedding IS NOT NULL
                ORDER BY e.occurred_at DESC
                LIMIT :recent
            ) r
            ORDER BY distance, r.id
            LIMIT :limit
        ) m
        JOIN events e ON e.tenant_id = :tenant_id AND e.id = m.id
        ORDER BY m.distance, e.id
        """
    )


async def nearest_told_by(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_keys: list[str],
    sender_id: str,
    query: np.ndarray,
    limit: int,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
    *,
    recent: int = SENDER_RECENT,
) -> list[dict[str, Any]]:
    """The ``limit`` events of ``sender_id`` nearest to ``query`` among their ``recent``
    latest in ``conversation_keys`` (same filters as ``nearest_events``), nearest first, as
    ``nearest_events`` gives them."""
    if limit <= 0 or recent <= 0 or not conversation_keys:
        return []
    params: dict[str, Any] = {
        "tenant_id": tenant_id,
        "conversation_keys": list(conversation_keys),
        "sender": sender_id,
        "query": np.asarray(query, dtype=np.float32).ravel(),
        "limit": limit,
        "recent": recent,
    }
    statement = _told_by(*_bounded(params, time_from, time_to))
    return dicts(await session.execute(statement, params))


# Lexical candidates: events of the conversations holding any query term (the GIN index),
# scored by BM25. At most :max_matches events holding any term are scored, and where more
# hold one, as many more as the terms' own look-ups add (see matched). Where the
# conversations hold fewer events than that, every query term is asked for: all matches are
# scored, and BM25's idf, computed on these conversations, weighs a term by how telling it is
# there (a tenant of ten events must not lose its words to what is common in the whole
# table). In bigger ones only the informative terms are (see common_terms), so the matches
# rarely pass the bound, and past it the cost stays bounded (lexical evidence is a ranking
# signal; exactness is the dense side's). The collection is the filtered events, counted up to
# :max_documents (an index-only count: beyond it a term's idf changes by the same amount for
# every term, and counting a 50,000-event conversation in full would cost 5 ms a query);
# lengths are normalized by the mean over the matching events, close to the collection's for
# short one-sentence events.
MAX_LEXICAL_MATCHES = 2000
MAX_COUNTED_DOCUMENTS = 10_000
# A term in at least this share of all events is left out of lexical search (it would match
# thousands of events of a busy group and barely tell them apart: idf about ln(1/share)).
COMMON_TERM_SHARE = 0.01
_COMMON_TTL_SECONDS = 300.0
_common: tuple[float, frozenset[str]] = (-math.inf, frozenset())


async def common_terms(session: AsyncSession) -> frozenset[str]:
    """Terms in at least COMMON_TERM_SHARE of all events, by the table's statistics (cached
    for a few minutes: they change only as ANALYZE runs)."""
    global _common
    checked, terms_ = _common
    if time.monotonic() - checked < _COMMON_TTL_SECONDS:
        return terms_
    rows = await session.execute(
        text("SELECT term FROM memoria_common_event_terms(:share)"), {"share": COMMON_TERM_SHARE}
    )
    _common = (time.monotonic(), frozenset(r.term for r in rows))
    return _common[1]


# Summed in the terms' order: the same score to the last bit whatever the plan (a flood's
# copies are skipped by their score in one statement and read apart by it in another).
_BM25 = """sum(i.idf * h.tf * (CAST(:k1 AS float8) + 1)
                / (h.tf + CAST(:k1 AS float8) * (1 - CAST(:b AS float8)
                         + CAST(:b AS float8) * h.length / s.mean_length))
                ORDER BY h.term)"""


@cache
def _lexical(time_from: bool, time_to: bool, reading: str = "best") -> TextClause:
    # reading: "best" (the best :limit), "skipping" (the best :limit scored none of
    # :skipped) or "said_at" (the best :limit statements scored one of :scores, one copy
    # each).
    having = {
        "best": "",
        "skipping": f"HAVING {_BM25} <> ALL(CAST(:skipped AS float8[]))",
        "said_at": f"HAVING {_BM25} = ANY(CAST(:scores AS float8[]))",
    }[reading]
    matches = "" if reading == "said_at" else "ORDER BY bm25 DESC, h.id LIMIT :limit"
    columns = f"{_EVENT_COLUMNS}, e.embedding, b.bm25, b.terms, b.idfs"
    joined = "FROM best b JOIN events e ON e.tenant_id = :tenant_id AND e.id = b.id"
    found = f"SELECT {columns} {joined}"
    if reading == "said_at":
        found = f"""SELECT * FROM (
            SELECT DISTINCT ON (e.sender_id, e.text, {_DAY}) {columns} {joined}
            ORDER BY e.sender_id, e.text, {_DAY}, e.id
        ) e"""
    return text(
        f"""
        WITH counted AS MATERIALIZED (
            SELECT count(*) AS documents
            FROM (SELECT 1 FROM events e WHERE {_filters("e", time_from, time_to)}
                  LIMIT :max_documents) c
        ),
        asked AS MATERIALIZED (
            -- Every term where all matches can be scored; else the informative ones.
            SELECT CASE WHEN small THEN CAST(:all_terms AS text[])
                        ELSE CAST(:terms AS text[]) END AS terms,
                   CASE WHEN small THEN CAST(:all_tsquery AS tsquery)
                        ELSE CAST(:tsquery AS tsquery) END AS tsquery
            FROM (SELECT documents < CAST(:max_matches AS integer) AS small FROM counted) c
        ),
        anywhere AS MATERIALIZED (
            -- The GIN index, through the tenant-bound function (see migration 0020): up to
            -- :max_matches events holding any term (only in bigger conversations: below).
            SELECT m.id, m.lexical
            FROM memoria_event_term_matches(
                CAST(:conversation_keys AS text[]), (SELECT tsquery FROM asked),
                CAST(:time_from AS timestamptz), CAST(:time_to AS timestamptz),
                CAST(:max_matches AS integer)
            ) m
            WHERE NOT (SELECT documents < CAST(:direct_below AS integer) FROM counted)
        ),
        held AS MATERIALIZED (
            -- The asked terms of its matches (see held_terms_sql).
            SELECT a.id, t.lexeme AS term, coalesce(cardinality(t.positions), 1) AS tf,
                   length(a.lexical) AS length
            FROM anywhere a, unnest({held_terms_sql("a.lexical", "(SELECT terms FROM asked)")}) t
        ),
        cut AS MATERIALIZED (
            -- Where more events hold a term than that look-up took, the terms it found
            -- fewer of than a term's share (``term_sample``) are looked up again, without
            -- the others, for their shares summed: a frequent term's matches (a flood's)
            -- cannot fill the look-up and leave out the few events holding a rare one (a
            -- name). A term it found that many of is sampled enough. One look-up for all
            -- of them: a pasted paragraph's hundred rare terms cost one, not a hundred.
            SELECT CAST(string_agg(q.query, ' | ') AS tsquery) AS tsquery,
                   count(*) * CAST(:per_term AS integer) AS most
            FROM unnest(CAST(:terms AS text[]), CAST(:term_queries AS text[])) q(term, query)
            WHERE (SELECT count(*) FROM anywhere) >= CAST(:max_matches AS integer)
              AND q.term NOT IN (
                  SELECT term FROM held GROUP BY term
                  HAVING count(*) >= CAST(:per_term AS integer))
        ),
        matched AS MATERIALIZED (
            -- Conversations this small are read by their own index and the terms checked
            -- row by row: the table-wide GIN index would visit every event of every
            -- conversation that holds a common query term (130 ms for a group of 900
            -- events among a million). Only one of the two branches runs.
            SELECT e.id, e.lexical
            FROM events e
            WHERE (SELECT documents < CAST(:direct_below AS integer) FROM counted)
              AND {_filters("e", time_from, time_to)}
              AND e.lexical @@ (SELECT tsquery FROM asked)
            UNION ALL
            SELECT t.id, t.lexical
            FROM cut c, memoria_event_term_matches(
                CAST(:conversation_keys AS text[]), c.tsquery,
                CAST(:time_from AS timestamptz), CAST(:time_to AS timestamptz),
                CAST(c.most AS integer)
            ) t
            WHERE c.tsquery IS NOT NULL AND t.id NOT IN (SELECT id FROM anywhere)
        ),
        hits AS MATERIALIZED (
            SELECT * FROM held
            UNION ALL
            SELECT m.id, t.lexeme AS term, coalesce(cardinality(t.positions), 1) AS tf,
                   length(m.lexical) AS length
            FROM matched m, unnest({held_terms_sql("m.lexical", "(SELECT terms FROM asked)")}) t
        ),
        stats AS (
            SELECT greatest(documents, 1)::float8 AS documents,
                   (SELECT greatest(avg(length), 1.0) FROM hits)::float8 AS mean_length
            FROM counted
        ),
        idf AS (
            SELECT h.term,
                   ln(1 + (s.documents - least(count(DISTINCT h.id), s.documents) + 0.5)
                          / (least(count(DISTINCT h.id), s.documents) + 0.5)) AS idf
            FROM hits h CROSS JOIN stats s
            GROUP BY h.term, s.documents
        ),
        best AS (
            SELECT h.id,
                   {_BM25} AS bm25,
                   -- The query terms it holds and their idf (for its neighbours).
                   array_agg(h.term ORDER BY h.term) AS terms,
                   array_agg(i.idf ORDER BY h.term) AS idfs
            FROM hits h JOIN idf i USING (term) CROSS JOIN stats s
            GROUP BY h.id
            {having}
            {matches}
        )
        {found}
        ORDER BY bm25 DESC, id
        LIMIT :limit
        """
    )


async def lexical_events(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_keys: list[str],
    query_terms: list[str],
    limit: int,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
    *,
    common: frozenset[str] = frozenset(),
    k1: float = 1.2,
    b: float = 0.75,
    direct_below: int = MAX_LEXICAL_MATCHES,
    skipped: Sequence[float] = (),
    said_at: Sequence[float] = (),
) -> list[dict[str, Any]]:
    """The ``limit`` events of ``conversation_keys`` best matching the query terms by BM25,
    best first, each with its ``embedding`` (None without one), its ``bm25`` score and the
    query ``terms`` it holds with their ``idfs``. Same filters as ``nearest_events``. Needs
    no query vector: it can run while one is computed. A flood's copies (one text, one
    score) are read past with ``skipped``: none scored one of these; and ``said_at``: only
    those scored one of these, the best ``limit`` statements (one copy of each sender's
    words on each day, UTC).

    Terms in ``common`` are left out where the conversations hold too many events for every
    match to be scored. Conversations of fewer than ``direct_below`` events (at most
    ``MAX_LEXICAL_MATCHES``, so that no match is cut) are matched row by row instead of
    through the GIN index: the same events, found without the index's table-wide lists."""
    if limit <= 0 or not conversation_keys or not query_terms:
        return []
    asked = list(dict.fromkeys(query_terms))
    informative = [t for t in asked if t not in common]
    params: dict[str, Any] = {
        "tenant_id": tenant_id,
        "conversation_keys": list(conversation_keys),
        "all_terms": list(query_terms),
        "all_tsquery": to_tsquery_literal(query_terms),
        "terms": informative,
        "tsquery": to_tsquery_literal(informative),
        "term_queries": [to_tsquery_literal([t]) for t in informative],
        "per_term": term_sample(MAX_LEXICAL_MATCHES, len(informative)),
        "limit": limit,
        "k1": k1,
        "b": b,
        "max_matches": MAX_LEXICAL_MATCHES,
        "max_documents": MAX_COUNTED_DOCUMENTS,
        "direct_below": min(direct_below, MAX_LEXICAL_MATCHES),
        "time_from": time_from,
        "time_to": time_to,
        "skipped": list(skipped),
        "scores": list(said_at),
    }
    reading = "said_at" if said_at else "skipping" if skipped else "best"
    statement = _lexical(time_from is not None, time_to is not None, reading)
    return dicts(await session.execute(statement, params))


# An event's neighbours: the events told just before and after it in its conversation (in
# time order, ties in the order they were written), under the same time filters. The ranking
# reads a short reply ("Sure, next week!") together with the turn that names its topic.
# The tenant is bound in the subqueries too: a join condition alone does not let Citus route
# the statement to the tenant's one shard.
@cache
def _neighbours(time_from: bool, time_to: bool, terms: bool) -> TextClause:
    bounds = ""
    if time_from:
        bounds += " AND e.occurred_at >= :time_from"
    if time_to:
        bounds += " AND e.occurred_at < :time_to"
    names = ("id", "conversation_key", "sender_id", "kind", "text", "occurred_at", "created_at")
    columns = ", ".join(f"e.{c}" for c in names)
    similarity = "coalesce(1 - (e.embedding <=> CAST(:query AS vector)), 0) AS similarity"
    window = f"""{columns}, {similarity}, e.lexical FROM events e
             WHERE e.tenant_id = :tenant_id AND e.conversation_key = c.conversation_key"""
    # The asked terms each holds and how often, from its stored terms (the same segmentation
    # the ranking would do again in Python for every neighbour), once per event (windows
    # overlap; see held_terms_sql); only for the events holding one (most hold none).
    hits = (
        f"""
        LEFT JOIN LATERAL (
            SELECT array_agg(t.lexeme ORDER BY t.lexeme) AS hit_terms,
                   array_agg(coalesce(cardinality(t.positions), 1) ORDER BY t.lexeme)
                       AS hit_counts
            FROM unnest({held_terms_sql("n.lexical", "CAST(:terms AS text[])")}) t
            WHERE n.lexical @@ CAST(:tsquery AS tsquery)
        ) h ON true"""
        if terms
        else """
        CROSS JOIN (SELECT CAST(NULL AS text[]) AS hit_terms,
                           CAST(NULL AS int[]) AS hit_counts) h"""
    )
    return text(
        f"""
        SELECT {", ".join(f"n.{c}" for c in names)}, n.similarity, h.hit_terms, h.hit_counts
        FROM (
            SELECT DISTINCT ON (n.id) n.*
            FROM events c CROSS JOIN LATERAL (
                (SELECT {window}
                   AND (e.occurred_at, e.created_at, e.id) < (c.occurred_at, c.created_at, c.id)
                   {bounds}
                 ORDER BY e.occurred_at DESC, e.created_at DESC, e.id DESC
                 LIMIT :reach)
                UNION ALL
                (SELECT {window}
                   AND (e.occurred_at, e.created_at, e.id) > (c.occurred_at, c.created_at, c.id)
                   {bounds}
                 ORDER BY e.occurred_at, e.created_at, e.id
                 LIMIT :reach)
            ) n
            WHERE c.tenant_id = :tenant_id AND c.id = ANY(CAST(:ids AS text[]))
            ORDER BY n.id
        ) n
        {hits}
        ORDER BY n.id
        """
    )


async def neighbour_events(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    event_ids: list[str],
    query: np.ndarray,
    reach: int,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
    *,
    terms: list[str] | None = None,
) -> list[dict[str, Any]]:
    """The events within ``reach`` before and after each of ``event_ids`` in its
    conversation (each once), with their cosine ``similarity`` to ``query`` (0 without a
    vector), and which of ``terms`` each holds: ``hit_terms`` with their ``hit_counts``
    (None for none)."""
    if not event_ids or reach <= 0:
        return []
    params: dict[str, Any] = {
        "tenant_id": tenant_id,
        "ids": list(event_ids),
        "query": np.asarray(query, dtype=np.float32).ravel(),
        "reach": reach,
        "terms": list(terms or []),
        "tsquery": to_tsquery_literal(terms or []),
    }
    statement = _neighbours(*_bounded(params, time_from, time_to), bool(terms))
    return dicts(await session.execute(statement, params))
