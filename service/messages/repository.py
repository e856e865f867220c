"""SQL of messages and conversation bookkeeping."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import cache
from typing import Any, NamedTuple

import numpy as np
from pgvector import Vector
from sqlalchemy import Row, TextClause, text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.engine import uses_citus
from service.db.vector_index import rescoring_ceiling
from service.messages.vectors import MESSAGE_VECTORS_SCAN
from service.retrieval.floods import copy_state, indexed, lately, said_lately_sql
from service.retrieval.fusion import distinct_nearest
from service.retrieval.terms import held_terms_sql, term_sample, to_tsquery_literal

# One statement for the whole batch; duplicates (by conversation and message_id) are skipped.
# Rows get their seq in array order, so seq follows the batch's order.
_INSERT = text(
    """
    INSERT INTO messages (tenant_id, conversation_key, message_id, request_type, group_id,
                          user_id, sender_id, sender_name, text, sent_at, lexical, flood_copy)
    SELECT :tenant_id, * FROM unnest(
        CAST(:keys AS text[]), CAST(:ids AS text[]), CAST(:types AS text[]),
        CAST(:groups AS text[]), CAST(:users AS text[]), CAST(:senders AS text[]),
        CAST(:names AS text[]), CAST(:texts AS text[]), CAST(:sent AS timestamptz[]),
        CAST(:lexicals AS tsvector[]), CAST(:copies AS boolean[]))
    ON CONFLICT (tenant_id, conversation_key, message_id) DO NOTHING
    RETURNING conversation_key, seq, text, sent_at, length(lexical) AS term_count
    """
)


# Writers of a conversation's messages, one at a time from before their insert to their commit,
# in the order of the keys (two batches of the same conversations never wait on each other
# in a circle). A message's seq is given at its insert, and the extraction reads a
# conversation's messages up to the newest seq it was told of: without this, a batch that
# inserted seq 100 and then waited (on another conversation's row, say) while a later batch
# inserted 101 and committed, had 100 read past, before it existed, and never extracted.
# The locks are a statement of their own, sent before the batch's flood look-up
# (``said_lately``), which must see the copies of the batch it waited for: a statement reads
# what was committed when it began, so a look-up (or the insert after it) that took the locks
# itself would not, and two batches sent at once, each with a copy of a flood, would leave
# both copies indexed.
_LOCK_CONVERSATIONS = text(
    """
    SELECT pg_advisory_xact_lock(hashtextextended(CAST(:tenant_id AS text) || '/' || k, 0))
    FROM (SELECT DISTINCT k FROM unnest(CAST(:keys AS text[])) AS k ORDER BY k) AS keys
    """
)


async def lock_conversations(session: AsyncSession, tenant_id: uuid.UUID, keys: list[str]) -> None:
    """Take the conversations' write locks, held to the end of the transaction."""
    await session.execute(_LOCK_CONVERSATIONS, {"tenant_id": str(tenant_id), "keys": keys})


async def insert_messages(
    session: AsyncSession, tenant_id: uuid.UUID, rows: list[dict[str, Any]]
) -> list[Any]:
    """Store new messages (a row's ``flood_copy``: one of a flood's copies, see ``unindex``);
    returns the rows actually inserted."""
    params = {
        "tenant_id": tenant_id,
        "keys": [r["conversation_key"] for r in rows],
        "ids": [r["message_id"] for r in rows],
        "types": [r["request_type"] for r in rows],
        "groups": [r["group_id"] for r in rows],
        "users": [r["user_id"] for r in rows],
        "senders": [r["sender_id"] for r in rows],
        "names": [r["sender_name"] for r in rows],
        "texts": [r["text"] for r in rows],
        "sent": [r["sent_at"] for r in rows],
        "lexicals": [r["lexical"] for r in rows],
        "copies": [r.get("flood_copy", False) for r in rows],
    }
    return list(await session.execute(_INSERT, params))


# What a batch's senders said lately in its conversations on its days (UTC): each message's
# id, time, its text (as far as a flood's copies are compared) and whether its words are
# indexed. Only the latest :window messages of a conversation on those days are read
# (through its time index), so that a flood does not make every message after it dearer to
# store; and the batch's own ids wherever they are (a batch sent again: its messages are
# stored already).
_SAID_COLUMNS = "r.conversation_key, r.message_id, r.seq, r.sender_id, r.sent_at"
_SAID_LATELY = text(
    said_lately_sql("messages", _SAID_COLUMNS, "sent_at")
    + f"""
    UNION
    SELECT {_SAID_COLUMNS}, {copy_state("r")}
    FROM unnest(CAST(:batch_keys AS text[]), CAST(:batch_ids AS text[]))
         AS b(conversation_key, message_id)
    JOIN messages r ON r.tenant_id = :tenant_id AND r.conversation_key = b.conversation_key
                   AND r.message_id = b.message_id
    """
)


async def said_lately(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    batch: list[tuple[str, str]],
    moments: list[datetime],
) -> list[Any]:
    """The members' messages among the latest ``FLOOD_WINDOW`` of each conversation of
    ``batch`` (conversation, message id) on the days (UTC) of ``moments``, and those of
    ``batch`` stored already: ``conversation_key``, ``message_id``, ``seq``,
    ``sender_id``, ``sent_at``, ``text`` (as far as ``floods.shape`` reads) and ``indexed``
    (its words are)."""
    if not batch or not moments:
        return []
    params = lately(tenant_id, (key for key, _ in batch), moments)
    params["batch_keys"] = [key for key, _ in batch]
    params["batch_ids"] = [message_id for _, message_id in batch]
    return list(await session.execute(_SAID_LATELY, params))


# The names the conversation's latest messages were sent under (through its seq index).
_SPEAKERS = text(
    """
    SELECT DISTINCT sender_name FROM (
        SELECT sender_name FROM messages
        WHERE tenant_id = :tenant_id AND conversation_key = :key
        ORDER BY seq DESC LIMIT :limit) latest
    WHERE sender_name IS NOT NULL
    """
)


async def speakers(
    session: AsyncSession, tenant_id: uuid.UUID, key: str, limit: int = 200
) -> list[str]:
    """The names the last ``limit`` messages of a conversation were sent under."""
    found = await session.execute(_SPEAKERS, {"tenant_id": tenant_id, "key": key, "limit": limit})
    return [name for (name,) in found]


# Messages whose words are no longer indexed: another copy of the same statement is.
_UNINDEX = text(
    """
    UPDATE messages AS m SET lexical = CAST('' AS tsvector), flood_copy = true
    FROM unnest(CAST(:keys AS text[]), CAST(:ids AS text[])) AS v(conversation_key, message_id)
    WHERE m.tenant_id = :tenant_id AND m.conversation_key = v.conversation_key
      AND m.message_id = v.message_id
    """
)


async def unindex(
    session: AsyncSession, tenant_id: uuid.UUID, messages: list[tuple[str, str]]
) -> None:
    """Leave these (conversation, message id) unindexed for words, and out of the dense
    search (``_SEARCHED``): another copy of the same statement is in both. A copy keeps its
    vector (its neighbours' ranking reads it), not its place in the dense scan: a bot farm's
    varied copies of an ad each lie at their own distance, and filled the nearest of a
    question near the ad, so that the other members' nearest messages were not found."""
    if messages:
        keys, ids = zip(*messages, strict=True)
        params = {"tenant_id": tenant_id, "keys": list(keys), "ids": list(ids)}
        await session.execute(_UNINDEX, params)


# Count what arrived; pending_count is what no extraction job has been asked to read yet.
# updated_at takes EXCLUDED's (its default, now()): Citus refuses now() itself in DO UPDATE.
_TOUCH = text(
    """
    INSERT INTO conversations AS c (tenant_id, conversation_key, request_type, group_id, user_id,
                                    group_name, message_count, term_count, last_message_at,
                                    last_seq, pending_count)
    VALUES (:tenant_id, :conversation_key, :request_type, :group_id, :user_id, :group_name,
            CAST(:count AS bigint), CAST(:term_count AS bigint), :last_at, :last_seq,
            CAST(:count AS integer))
    ON CONFLICT (tenant_id, conversation_key) DO UPDATE SET
        message_count = c.message_count + EXCLUDED.message_count,
        term_count = c.term_count + EXCLUDED.term_count,
        last_message_at = GREATEST(c.last_message_at, EXCLUDED.last_message_at),
        last_seq = GREATEST(c.last_seq, EXCLUDED.last_seq),
        pending_count = c.pending_count + EXCLUDED.pending_count,
        group_name = COALESCE(EXCLUDED.group_name, c.group_name),
        updated_at = EXCLUDED.updated_at
    RETURNING pending_count, last_seq
    """
)


async def touch_conversation(session: AsyncSession, row: dict[str, Any]) -> tuple[int, int]:
    """Add a batch's counts; returns (pending messages, newest seq)."""
    result = (await session.execute(_TOUCH, row)).one()
    return int(result.pending_count), int(result.last_seq)


_RESET_PENDING = text(
    """
    UPDATE conversations SET pending_count = 0
    WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
    """
)


async def reset_pending(session: AsyncSession, tenant_id: uuid.UUID, conversation_key: str) -> None:
    """An extraction job was queued for everything pending."""
    await session.execute(
        _RESET_PENDING, {"tenant_id": tenant_id, "conversation_key": conversation_key}
    )


# The pause trigger, across tenants (runs as the owner): conversations quiet for a while with
# messages no extraction job has been asked to read. Claimed in the same statement.
_QUIET = text(
    """
    UPDATE conversations SET pending_count = 0
    WHERE (tenant_id, conversation_key) IN (
        SELECT tenant_id, conversation_key FROM conversations
        WHERE pending_count > 0 AND updated_at < now() - make_interval(secs => :quiet)
        ORDER BY updated_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    RETURNING tenant_id, conversation_key, last_seq
    """
)


# On Citus, conversations are spread over the workers by tenant, and a row lock taken across
# shards (FOR UPDATE in a multi-shard query) is refused. One multi-shard UPDATE claims them
# instead: its row locks serialize two workers, and the second one re-checks pending_count > 0
# after the first commits, so a conversation is still claimed once. Without LIMIT: the batch is
# every quiet conversation (each one becomes one small job).
_QUIET_DISTRIBUTED = text(
    """
    UPDATE conversations SET pending_count = 0
    WHERE pending_count > 0 AND updated_at < now() - make_interval(secs => :quiet)
    RETURNING tenant_id, conversation_key, last_seq
    """
)


async def take_quiet_conversations(
    session: AsyncSession, quiet_seconds: float, limit: int
) -> list[Any]:
    """Quiet conversations with pending messages, their pending count reset."""
    if await uses_citus(session):
        return list(await session.execute(_QUIET_DISTRIBUTED, {"quiet": quiet_seconds}))
    return list(await session.execute(_QUIET, {"quiet": quiet_seconds, "limit": limit}))


_CLAIM_EXTRACTION = text(
    """
    SELECT extracted_seq FROM conversations
    WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
    FOR UPDATE
    """
)

_UNREAD = text(
    """
    SELECT seq, message_id, sender_id, sender_name, text, sent_at FROM messages
    WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
      AND seq > :after AND seq <= :upto
    ORDER BY seq
    LIMIT :limit
    """
)

_ADVANCE = text(
    """
    UPDATE conversations SET extracted_seq = GREATEST(extracted_seq, :seq)
    WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
    """
)


async def unread_messages(
    session: AsyncSession, tenant_id: uuid.UUID, conversation_key: str, upto: int, limit: int
) -> tuple[int, list[Any]]:
    """Lock the conversation's bookkeeping; return its high-water mark and the messages after it."""
    key = {"tenant_id": tenant_id, "conversation_key": conversation_key}
    mark = (await session.execute(_CLAIM_EXTRACTION, key)).scalar_one_or_none()
    if mark is None:
        return 0, []
    rows = await session.execute(_UNREAD, {**key, "after": mark, "upto": upto, "limit": limit})
    return int(mark), list(rows)


async def advance_extracted(
    session: AsyncSession, tenant_id: uuid.UUID, conversation_key: str, seq: int
) -> None:
    """Mark messages up to ``seq`` as processed."""
    await session.execute(
        _ADVANCE, {"tenant_id": tenant_id, "conversation_key": conversation_key, "seq": seq}
    )


# SKIP LOCKED: two embedding jobs of one tenant split the work instead of repeating it.
_UNEMBEDDED = text(
    """
    SELECT conversation_key, message_id, sender_name, text FROM messages
    WHERE tenant_id = :tenant_id AND embedding IS NULL
    ORDER BY seq
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
    """
)

# Only the vector: the terms are written with the text (at ingest, by a redaction), and a
# flood's copy's stay empty (see ``service.messages.service.copies``).
_SET_EMBEDDINGS = text(
    """
    UPDATE messages AS m SET embedding = v.embedding
    FROM unnest(CAST(:keys AS text[]), CAST(:ids AS text[]), CAST(:vectors AS vector[]))
         AS v(conversation_key, message_id, embedding)
    WHERE m.tenant_id = :tenant_id AND m.conversation_key = v.conversation_key
      AND m.message_id = v.message_id
    """
)


async def unembedded_messages(session: AsyncSession, tenant_id: uuid.UUID, limit: int) -> list[Any]:
    """The oldest messages still without a vector, locked for this transaction."""
    return list(await session.execute(_UNEMBEDDED, {"tenant_id": tenant_id, "limit": limit}))


async def set_embeddings(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    rows: list[Any],
    vectors: list[np.ndarray[Any, Any]],
) -> None:
    """Store the vectors of messages."""
    await session.execute(
        _SET_EMBEDDINGS,
        {
            "tenant_id": tenant_id,
            "keys": [r.conversation_key for r in rows],
            "ids": [r.message_id for r in rows],
            # pgvector's Vector, not bare arrays: asyncpg would read an array as a dimension.
            "vectors": [Vector(v) for v in vectors],
        },
    )


# Up to this many messages, matching a conversation's rows one by one (~1 µs each) costs
# less than the GIN index's lists of a common term over the whole table.
DIRECT_LEXICAL_BELOW = 5000

# A conversation that big is matched a term at a time through the GIN index, reading at most
# this many messages in all (shared among the query's terms: see ``term_sample``): ~20 us
# each, so the lexical side stays near 40 ms however big the group and however long the query.
SAMPLED_MATCHES = 2000

# Candidates re-scored beyond the dense limit, so that the proof closes on the first pass.
# Where texts repeat (a bot's notices, "ok", the same sticker), copies with equal vectors sit
# side by side at the top and the pool must reach past them: with 24 extra, a conversation of
# every text eight times took a second pass over all its messages on 70 of 300 questions
# (50,000 messages: 60 ms instead of 30), with 100 extra on none, for about 1 ms more.
DENSE_EXTRA = 100
# A side's seeds are read past a flood while fewer than this many statements differ among
# them (``distinct_nearest``): about what a search shows (its default top_k, 12). Where
# every text comes seven times (the 50,000-message benchmark), a quarter of the seeds (25)
# took a second scan of the conversation on most questions: p95 52 -> 122 ms. Seeds holding
# enough are kept as they are (their repeats dropped by the search's own pass): telling
# their statements apart costs a look-up, 1 ms a search where templated lines match alike.
DISTINCT_ENOUGH = 12

# Within the search's time range (either bound optional), a message's or (_M) alias m's.
_IN_RANGE = (
    "(CAST(:time_from AS timestamptz) IS NULL OR sent_at >= :time_from)"
    " AND (CAST(:time_to AS timestamptz) IS NULL OR sent_at <= :time_to)"
)
_IN_RANGE_M = _IN_RANGE.replace("sent_at", "m.sent_at")

# Hybrid search, step one: the lexical side, which needs no query vector (it is read while
# the question is embedded): every message holding a query term, with its BM25 score and the
# terms it holds. Everything stays inside one conversation and time range.
_LEXICAL = text(
    f"""
    WITH stats AS (
        -- BM25's collection size and mean length, kept per conversation at ingest.
        SELECT greatest(message_count, 1)::float8 AS documents,
               greatest(term_count::float8 / greatest(message_count, 1), 1.0) AS mean_length
        FROM conversations
        WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
    ),
    -- Messages containing any query term, with their terms. A conversation of fewer than
    -- :direct_below messages is read by its own index and the terms checked row by row;
    -- a bigger one through the GIN index, one term at a time and at most :per_term
    -- messages a term: every message of a rare term, a sample of a common one's (in a
    -- group of 50,000 the common words of a question match thousands, which barely differ
    -- in score; each one found is still scored on every query term). Only one branch runs.
    matched AS MATERIALIZED (
        SELECT m.seq, m.lexical FROM messages m
        WHERE (SELECT documents < CAST(:direct_below AS integer) FROM stats)
          AND m.tenant_id = :tenant_id AND m.conversation_key = :conversation_key
          AND m.lexical @@ CAST(:tsquery AS tsquery)
          AND {_IN_RANGE_M}
        UNION ALL
        -- The GIN index, through the tenant-bound function (see migration 0015).
        SELECT DISTINCT ON (x.seq) x.seq, x.lexical
        FROM unnest(CAST(:term_queries AS text[])) q(term),
             memoria_message_term_sample(
                 :conversation_key, CAST(q.term AS tsquery), CAST(:time_from AS timestamptz),
                 CAST(:time_to AS timestamptz), CAST(:per_term AS integer)) x
        WHERE NOT coalesce((SELECT documents < CAST(:direct_below AS integer) FROM stats), false)
    ),
    hits AS MATERIALIZED (
        SELECT x.seq, t.lexeme AS term, coalesce(cardinality(t.positions), 1) AS tf,
               length(x.lexical) AS length
        FROM matched x, unnest({held_terms_sql("x.lexical", "CAST(:terms AS text[])")}) t
    ),
    idf AS (
        SELECT h.term,
               ln(1 + (s.documents - least(count(*), s.documents) + 0.5)
                      / (least(count(*), s.documents) + 0.5)) AS idf
        FROM hits h CROSS JOIN stats s
        GROUP BY h.term, s.documents
    ),
    bm25 AS (
        SELECT h.seq,
               sum(i.idf * h.tf * (CAST(:k1 AS float8) + 1)
                   / (h.tf + CAST(:k1 AS float8)
                      * (1 - CAST(:b AS float8) + CAST(:b AS float8) * h.length / s.mean_length)))
                   AS score,
               array_agg(h.term) AS terms, array_agg(h.tf) AS tfs, array_agg(i.idf) AS idfs
        FROM hits h JOIN idf i USING (term) CROSS JOIN stats s
        GROUP BY h.seq
    )
    SELECT seq, score, terms, tfs, idfs FROM bm25
    """
)

# Step two: the nearest messages, exactly. The half-precision copies in the covering index
# (an index-only scan of the conversation) pick :dense_pool candidates, their full vectors
# decide; ``rescoring_ceiling`` tells whether they hold the answer, else ``_dense_rest``
# scores every message that could still be among the nearest.
_QUERY_HALF = "(SELECT CAST(CAST(:query_unit AS vector) AS halfvec))"


def _unskipped(skipping: bool) -> str:
    # Messages left out by their distance to the query (``nearest_messages``' flood reading).
    if not skipping:
        return ""
    return f"AND embedding_half <#> {_QUERY_HALF} <> ALL(CAST(:skipped AS float8[]))"


# What the dense search reads: the messages with a vector, but a flood's copies (the partial
# covering index's own condition, so that it is read by an index-only scan).
_SEARCHED = f"embedding_half IS NOT NULL AND {MESSAGE_VECTORS_SCAN.where}"


@cache
def _dense(skipping: bool) -> TextClause:
    return text(
        f"""
        WITH pool AS MATERIALIZED (
            SELECT seq, embedding_half <#> {_QUERY_HALF} AS approx
            FROM messages
            WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
              AND {_SEARCHED}
              AND {_IN_RANGE} {_unskipped(skipping)}
            ORDER BY approx
            LIMIT :dense_pool
        )
        SELECT p.seq, p.approx, m.embedding <=> :query AS distance
        FROM pool p
        JOIN messages m ON m.tenant_id = :tenant_id AND m.conversation_key = :conversation_key
                       AND m.seq = p.seq
        ORDER BY distance, p.seq
        """
    )


@cache
def _dense_rest(skipping: bool) -> TextClause:
    return text(
        f"""
        SELECT seq, embedding_half <#> {_QUERY_HALF} AS approx,
               embedding <=> :query AS distance
        FROM messages
        WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
          AND {_SEARCHED}
          AND {_IN_RANGE} {_unskipped(skipping)}
          AND embedding_half <#> {_QUERY_HALF} <= :ceiling
        ORDER BY embedding <=> :query, seq
        LIMIT :dense_limit
        """
    )


# Every statement (one sender's words) among the messages at these approx distances, its
# nearest copy each (``nearest_messages``' flood reading).
_SAID_AT = text(
    f"""
    WITH copies AS (
        SELECT DISTINCT ON (sender_id, md5(text))
               seq, embedding <=> :query AS distance,
               embedding_half <#> {_QUERY_HALF} AS approx, sender_id, md5(text) AS said
        FROM messages
        WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
          AND {_SEARCHED}
          AND {_IN_RANGE}
          AND embedding_half <#> {_QUERY_HALF} = ANY(CAST(:approx AS float8[]))
        ORDER BY sender_id, md5(text), distance, seq
    )
    SELECT * FROM copies ORDER BY distance, seq LIMIT :dense_limit
    """
)


# Step three: the seeds (the nearest and the lexical side's best), each with its
# neighbourhood, and the per-message features the ranking needs. The neighbours are read
# from the seq index (their time and sender: revision 0016), a message itself only near a
# seed, where the ranking reads its similarity and its sender's name.
_AROUND_SEEDS = f"""
    seeds AS (SELECT DISTINCT unnest(CAST(:seeds AS bigint[])) AS seq),
    -- Each seed's neighbours by arrival order, with their distance to it.
    around AS (
        SELECT n.seq, min(n.distance) AS distance, min(n.sent_at) AS sent_at,
               min(n.sender_id) AS sender_id
        FROM seeds s CROSS JOIN LATERAL (
            SELECT b.seq, b.sent_at, b.sender_id,
                   row_number() OVER (ORDER BY b.seq DESC) - 1 AS distance
            FROM (SELECT seq, sent_at, sender_id FROM messages
                  WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
                    AND seq <= s.seq
                    AND {_IN_RANGE}
                  ORDER BY seq DESC LIMIT CAST(:reach AS integer) + 1) b
            UNION ALL
            SELECT a.seq, a.sent_at, a.sender_id, row_number() OVER (ORDER BY a.seq) AS distance
            FROM (SELECT seq, sent_at, sender_id FROM messages
                  WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
                    AND seq > s.seq
                    AND {_IN_RANGE}
                  ORDER BY seq LIMIT :reach) a
        ) n
        GROUP BY n.seq
    )
"""

# A small conversation is read whole, in order, once (about 1.5 us a message): cheaper than
# two look-ups around each of 200 seeds. A message's distance is to the nearest seed before
# or after it, by position.
_AROUND_WHOLE = f"""
    stream AS (
        SELECT m.seq, m.sent_at, m.sender_id, row_number() OVER (ORDER BY m.seq) AS position,
               s.seq IS NOT NULL AS seed
        FROM messages m
        LEFT JOIN (SELECT DISTINCT unnest(CAST(:seeds AS bigint[])) AS seq) s ON s.seq = m.seq
        WHERE m.tenant_id = :tenant_id AND m.conversation_key = :conversation_key
          AND {_IN_RANGE_M}
    ),
    marked AS (
        SELECT seq, sent_at, sender_id,
               position - max(position) FILTER (WHERE seed) OVER (ORDER BY position) AS back,
               min(position) FILTER (WHERE seed) OVER (ORDER BY position DESC) - position
                   AS ahead
        FROM stream
    ),
    around AS (
        SELECT seq, sent_at, sender_id, least(back, ahead) AS distance FROM marked
        WHERE back <= CAST(:reach AS integer) OR ahead <= CAST(:reach AS integer)
    )
"""

_NEIGHBOURHOOD_ROWS = """
    -- One row of arrays, in conversation order: a big group's thousands of rows decode
    -- several times faster as arrays than as rows.
    SELECT array_agg(a.seq ORDER BY a.seq) AS seq,
           array_agg(a.distance <= CAST(:spread AS integer) ORDER BY a.seq) AS candidate,
           array_agg(m.message_id ORDER BY a.seq) FILTER (WHERE CAST(:with_ids AS boolean))
               AS message_id,
           array_agg(a.sender_id ORDER BY a.seq) AS sender_id,
           array_agg(m.sender_name ORDER BY a.seq) AS sender_name,
           array_agg(CAST(extract(epoch FROM a.sent_at) AS float8) ORDER BY a.seq) AS sent_at,
           array_agg(coalesce(m.similarity, 0) ORDER BY a.seq) AS similarity
    FROM around a
    -- The message itself (its vector is out of line) only where the ranking reads it: the
    -- candidates and their close neighbours; the rest of a window counts its words. OFFSET 0
    -- keeps the distance test before the look-up (pulled up into a join, it ran after it).
    LEFT JOIN LATERAL (
        SELECT m.message_id, m.sender_name,
               CASE WHEN a.distance <= CAST(:spread AS integer)
                                       + CAST(:similarity_reach AS integer)
                    THEN 1 - (m.embedding <=> :query) END AS similarity
        FROM messages m
        WHERE (a.distance <= CAST(:spread AS integer) + CAST(:similarity_reach AS integer)
               OR CAST(:with_ids AS boolean))
          AND m.tenant_id = :tenant_id AND m.conversation_key = :conversation_key
          AND m.seq = a.seq
        OFFSET 0
    ) m ON true
"""

# By seeds, or (``whole``) the conversation read whole.
_NEIGHBOURHOODS = {
    whole: text("WITH" + (_AROUND_WHOLE if whole else _AROUND_SEEDS) + _NEIGHBOURHOOD_ROWS)
    for whole in (False, True)
}

# Conversations smaller than this are read whole for the neighbourhoods (1,000 messages:
# 7 ms instead of 9.5; 50,000 would take 76 ms instead of 22).
WHOLE_BELOW = 3000


# Step four: what the caller sees of the best candidates, and their vectors for MMR.
_SEARCH_HITS = text(
    f"""
    SELECT seq, message_id, text, sender_id, sender_name, sent_at, embedding, {indexed("m")}
    FROM messages m
    WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
      AND seq = ANY(CAST(:seqs AS bigint[]))
    """
)


@dataclass(frozen=True)
class SearchPlan:
    """How wide the candidate search casts its net (in messages)."""

    dense_limit: int
    lexical_limit: int
    spread: int  # seeds' neighbours that are ranked too
    context: int  # neighbours a ranked message needs around it
    similarity_reach: int  # the neighbours whose similarity it needs
    k1: float
    b: float
    # Conversations smaller than this are matched row by row, not through the GIN index.
    direct_below: int = DIRECT_LEXICAL_BELOW
    # Bigger ones: messages looked up by their terms, at most, shared among the query terms.
    sampled_matches: int = SAMPLED_MATCHES


def _unit(query: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    vector = np.asarray(query, dtype=np.float64).ravel()
    norm = float(np.linalg.norm(vector))
    return (vector / norm if norm > 0 else vector).astype(np.float32)


class CandidateRow(NamedTuple):
    """One candidate of a search, as the tests and the benchmark read it (``Candidates``
    holds them column by column)."""

    seq: int
    candidate: bool
    message_id: str | None  # None unless asked for (the ranking never reads it)
    sender_id: str | None
    sender_name: str | None
    sent_at: datetime
    similarity: float
    bm25: float
    terms: list[str] | None = None
    tfs: list[int] | None = None
    idfs: list[float] | None = None


class LexicalMatch(NamedTuple):
    """A message holding query terms: its BM25 score and the terms with their frequency here
    and idf."""

    seq: int
    score: float
    terms: list[str]
    tfs: list[int]
    idfs: list[float]


@dataclass(frozen=True)
class Candidates:
    """A search's candidates and their neighbourhoods column by column, in conversation
    order: the seeds' rows (``candidate``) and the rows around them that the ranking reads as
    context. The lexical side joins them by seq."""

    seq: list[int]
    candidate: list[bool]
    sender_id: list[str | None]
    sender_name: list[str | None]
    sent_at: list[float]  # seconds since the epoch
    similarity: list[float]  # 0 where the ranking does not read it
    matches: Mapping[int, LexicalMatch]
    message_id: Sequence[str | None] | None = None  # only when asked for

    def __len__(self) -> int:
        return len(self.seq)

    def __iter__(self) -> Iterator[CandidateRow]:
        ids: Sequence[str | None] = self.message_id or [None] * len(self.seq)
        for n, seq in enumerate(self.seq):
            found = self.matches.get(seq)
            yield CandidateRow(
                seq,
                self.candidate[n],
                ids[n],
                self.sender_id[n],
                self.sender_name[n],
                datetime.fromtimestamp(self.sent_at[n], UTC),
                self.similarity[n],
                *((found.score, found.terms, found.tfs, found.idfs) if found else (0.0,)),
            )

    @classmethod
    def of(cls, rows: Sequence[CandidateRow]) -> Candidates:
        """Rows made column by column (rows holding query terms become their matches)."""
        return cls(
            seq=[r.seq for r in rows],
            candidate=[r.candidate for r in rows],
            sender_id=[r.sender_id for r in rows],
            sender_name=[r.sender_name for r in rows],
            sent_at=[r.sent_at.timestamp() for r in rows],
            similarity=[r.similarity for r in rows],
            matches={
                r.seq: LexicalMatch(r.seq, r.bm25, r.terms, r.tfs or [], r.idfs or [])
                for r in rows
                if r.terms
            },
            message_id=[r.message_id for r in rows],
        )


_SIZE = text(
    """
    SELECT message_count FROM conversations
    WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
    """
)


async def conversation_size(
    session: AsyncSession, tenant_id: uuid.UUID, conversation_key: str
) -> int:
    """How many messages the conversation has received (0: none)."""
    params = {"tenant_id": tenant_id, "conversation_key": conversation_key}
    return int((await session.execute(_SIZE, params)).scalar_one_or_none() or 0)


async def lexical_matches(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_key: str,
    terms: list[str],
    plan: SearchPlan,
    time_from: datetime | None,
    time_to: datetime | None,
) -> dict[int, LexicalMatch]:
    """The conversation's messages holding query terms (a bounded sample of a big
    conversation's common ones), by seq. Needs no query vector."""
    if not terms:
        return {}
    distinct = list(dict.fromkeys(terms))
    params = {
        "tenant_id": tenant_id,
        "conversation_key": conversation_key,
        "terms": terms,
        "tsquery": to_tsquery_literal(terms),
        "term_queries": [to_tsquery_literal([t]) for t in distinct],
        "per_term": term_sample(plan.sampled_matches, len(distinct)),
        "time_from": time_from,
        "time_to": time_to,
        "k1": plan.k1,
        "b": plan.b,
        "direct_below": plan.direct_below,
    }
    found = await session.execute(_LEXICAL, params)
    return {row[0]: LexicalMatch._make(row) for row in found}


async def nearest_messages(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_key: str,
    query: np.ndarray[Any, Any],
    plan: SearchPlan,
    time_from: datetime | None,
    time_to: datetime | None,
) -> list[int]:
    """The seqs of the conversation's ``plan.dense_limit`` messages nearest to ``query`` by
    cosine distance (exactly), nearest first. Where they hold fewer than ``DISTINCT_ENOUGH``
    statements (a sender's flood), one of each statement, read past the flood
    (``distinct_nearest``)."""
    unit = _unit(query)
    params = {
        "tenant_id": tenant_id,
        "conversation_key": conversation_key,
        "query": query,
        "query_unit": unit,
        "time_from": time_from,
        "time_to": time_to,
    }

    async def nearest(depth: int, skipped: list[float]) -> list[Row[Any]]:
        # At least the nearest ``depth``: as many of the pool as are proven the nearest
        # (where a sender's repeats fill the first, the rest may hold the statements wanted).
        limits = {"dense_limit": depth, "dense_pool": depth + DENSE_EXTRA, "skipped": skipped}
        pool = list(await session.execute(_dense(bool(skipped)), {**params, **limits}))
        if not pool:
            return []
        horizon = max(row.approx for row in pool)
        complete = len(pool) < depth + DENSE_EXTRA
        proven = [
            r for r in pool if rescoring_ceiling(r.distance, horizon, complete, len(unit)) is None
        ]
        if len(proven) >= min(depth, len(pool)):
            return proven
        ceiling = rescoring_ceiling(pool[depth - 1].distance, horizon, complete, len(unit))
        rest = {**params, **limits, "ceiling": ceiling}
        return list(await session.execute(_dense_rest(bool(skipped)), rest))

    first = await nearest(plan.dense_limit, [])
    head = first[: plan.dense_limit]
    # One statement's copies lie at one distance: the nearest at enough distances hold
    # enough statements, and only the search's own pass drops their repeats.
    if len(head) < plan.dense_limit or len({row.distance for row in head}) >= DISTINCT_ENOUGH:
        return [row.seq for row in head]

    async def read(depth: int, skipped: list[float]) -> list[Told]:
        rows = head if depth == len(head) and not skipped else await nearest(depth, skipped)
        return await _told(session, tenant_id, conversation_key, rows[:depth])

    async def said_at(approx: list[float]) -> list[Told]:
        found = await session.execute(
            _SAID_AT, {**params, "approx": approx, "dense_limit": plan.dense_limit}
        )
        return [Told(r, r.sender_id, r.said) for r in found]

    told = await distinct_nearest(
        read,
        said_at,
        plan.dense_limit,
        statement,
        DISTINCT_ENOUGH,
        lambda row: (row.item.distance, row.item.seq),
        lambda row: row.item.approx,
    )
    return [row.item.seq for row in told]


class Told(NamedTuple):
    """A message read (a nearest row, a lexical match: anything with its ``seq``), who said
    it and what (its text's digest)."""

    item: Any
    sender_id: str | None
    said: str


def statement(row: Any) -> tuple[Any, ...]:
    """Who said a message and what (its text's digest): one sender's repeats of the same
    words are one statement (the message search shows one of them)."""
    return row.sender_id, row.said


async def neighbourhoods(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_key: str,
    query: np.ndarray[Any, Any],
    seeds: list[int],
    matches: Mapping[int, LexicalMatch],
    plan: SearchPlan,
    time_from: datetime | None,
    time_to: datetime | None,
    size: int,
    with_ids: bool = False,
) -> Candidates:
    """The ``seeds`` (messages of the conversation within the time range) and their
    neighbourhoods in conversation order, each row with its similarity and (from
    ``matches``) its BM25 score and the query terms it holds (``with_ids``: and its
    message_id). ``size`` is the conversation's (see WHOLE_BELOW).

    Rows away from every seed (beyond ``spread + similarity_reach``) are context: their
    similarity is 0 and their sender's name None, the ranking reads neither."""
    params = {
        "tenant_id": tenant_id,
        "conversation_key": conversation_key,
        "query": query,
        "seeds": seeds,
        "time_from": time_from,
        "time_to": time_to,
        "spread": plan.spread,
        "reach": plan.spread + plan.context,
        "similarity_reach": plan.similarity_reach,
        "with_ids": with_ids,
    }
    statement = _NEIGHBOURHOODS[size < WHOLE_BELOW]
    columns = (await session.execute(statement, params)).one()._mapping
    return Candidates(
        **{name: columns[name] or [] for name in _COLUMNS},
        message_id=columns["message_id"],
        matches=matches,
    )


_STATEMENTS = text(
    """
    SELECT seq, sender_id, md5(text) AS said FROM messages
    WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
      AND seq = ANY(CAST(:seqs AS bigint[]))
    """
)


async def _told(
    session: AsyncSession, tenant_id: uuid.UUID, conversation_key: str, items: Sequence[Any]
) -> list[Told]:
    """Who said each of the messages ``items`` (anything with its ``seq``) and what (see
    ``statement``), in that order (one deleted meanwhile left out)."""
    seqs = [item.seq for item in items]
    params = {"tenant_id": tenant_id, "conversation_key": conversation_key, "seqs": seqs}
    found = {row.seq: row for row in await session.execute(_STATEMENTS, params)}
    return [
        Told(item, found[item.seq].sender_id, found[item.seq].said)
        for item in items
        if item.seq in found
    ]


async def lexical_seeds(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_key: str,
    matches: Mapping[int, LexicalMatch],
    plan: SearchPlan,
) -> list[int]:
    """The best of the lexical matches (equal BM25 scores: the newer message). Where they
    hold fewer than ``DISTINCT_ENOUGH`` statements (a sender's flood), one of each, read past
    the flood (``distinct_nearest``). One statement's copies match alike (the same terms, as
    often, in as long a text): only where the best match in fewer ways than that are their
    senders and texts read, and the ways a repeated statement matches are skipped."""
    best = sorted(matches.values(), key=lambda m: (-m.score, -m.seq))
    head = best[: plan.lexical_limit]
    if len(head) < plan.lexical_limit or len({_alike(m) for m in head}) >= DISTINCT_ENOUGH:
        return [m.seq for m in head]

    def read(depth: int, skipped: list[tuple[Any, ...]]) -> Awaitable[list[Told]]:
        left = set(skipped)
        chosen = [m for m in best if _alike(m) not in left][:depth]
        return _told(session, tenant_id, conversation_key, chosen)

    def said_at(ways: list[tuple[Any, ...]]) -> Awaitable[list[Told]]:
        wanted = set(ways)
        chosen = [m for m in best if _alike(m) in wanted]
        return _told(session, tenant_id, conversation_key, chosen)

    told = await distinct_nearest(
        read,
        said_at,
        plan.lexical_limit,
        statement,
        DISTINCT_ENOUGH,
        lambda row: (-row.item.score, -row.item.seq),
        lambda row: _alike(row.item),
    )
    return [row.item.seq for row in told]


def _alike(match: LexicalMatch) -> tuple[Any, ...]:
    # How a message matches: one statement's copies all match this way.
    return match.score, tuple(match.terms), tuple(match.tfs)


async def nearest_candidates(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_key: str,
    query: np.ndarray[Any, Any],
    matches: Mapping[int, LexicalMatch],
    plan: SearchPlan,
    time_from: datetime | None,
    time_to: datetime | None,
    with_ids: bool = False,
) -> Candidates:
    """Seeds (the nearest messages and the best of ``matches``) and their neighbourhoods
    (see ``neighbourhoods``)."""
    nearest = await nearest_messages(
        session, tenant_id, conversation_key, query, plan, time_from, time_to
    )
    seeds = nearest + await lexical_seeds(session, tenant_id, conversation_key, matches, plan)
    size = await conversation_size(session, tenant_id, conversation_key)
    return await neighbourhoods(
        session,
        tenant_id,
        conversation_key,
        query,
        seeds,
        matches,
        plan,
        time_from,
        time_to,
        size,
        with_ids,
    )


_COLUMNS = ("seq", "candidate", "sender_id", "sender_name", "sent_at", "similarity")


async def search_candidates(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_key: str,
    query: np.ndarray[Any, Any],
    terms: list[str],
    plan: SearchPlan,
    time_from: datetime | None,
    time_to: datetime | None,
) -> Candidates:
    """Both steps in turn, with the message ids (``search`` reads the lexical side while the
    question is embedded)."""
    matches = await lexical_matches(
        session, tenant_id, conversation_key, terms, plan, time_from, time_to
    )
    return await nearest_candidates(
        session, tenant_id, conversation_key, query, matches, plan, time_from, time_to, True
    )


async def messages_by_seq(
    session: AsyncSession, tenant_id: uuid.UUID, conversation_key: str, seqs: list[int]
) -> dict[int, Any]:
    """Messages of a conversation by seq, with their vectors."""
    params = {"tenant_id": tenant_id, "conversation_key": conversation_key, "seqs": seqs}
    return {row.seq: row for row in await session.execute(_SEARCH_HITS, params)}


_DAY = text(
    """
    SELECT sender_name, text FROM messages
    WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key
      AND sent_at >= :start AND sent_at < :end
      -- Leaving out a person's: the rows their erasure deletes (as its sender, or its user).
      AND (CAST(:without AS text) IS NULL
           OR (sender_id IS DISTINCT FROM :without AND user_id IS DISTINCT FROM :without))
    ORDER BY sent_at
    LIMIT 5000
    """
)


async def said_on_day(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_key: str,
    day: Any,
    zone: Any,
    without: str | None = None,
) -> list[Row[Any]]:
    """A conversation's messages on one local day (but ``without``'s): who sent each, by
    the name the chat shows (``sender_name``), and its ``text``."""
    from datetime import datetime as dt

    start = dt.combine(day, time(0), zone)
    params = {
        "tenant_id": tenant_id,
        "conversation_key": conversation_key,
        "start": start,
        "end": start + timedelta(days=1),
        "without": without,
    }
    return list(await session.execute(_DAY, params))


# A message's local day is counted in the zone of the same IANA name the digests' days are;
# a person's messages are those their erasure deletes in a group (as sender or as user).
_GROUP_DAYS = text(
    """
    SELECT DISTINCT group_id, CAST(timezone(:zone, sent_at) AS date) AS day FROM messages
    WHERE tenant_id = :tenant_id AND (sender_id = :person OR user_id = :person)
      AND group_id IS NOT NULL
    ORDER BY group_id, day
    """
)


async def group_days(
    session: AsyncSession, tenant_id: uuid.UUID, person_id: str, zone: str
) -> list[tuple[str, date]]:
    """The (group, local day) of every day a person's messages are in a group's."""
    params = {"tenant_id": tenant_id, "person": person_id, "zone": zone}
    return [(r.group_id, r.day) for r in await session.execute(_GROUP_DAYS, params)]


async def group_name(
    session: AsyncSession, tenant_id: uuid.UUID, conversation_key: str
) -> str | None:
    """The last group name seen for a conversation."""
    row = (
        await session.execute(
            text(
                "SELECT group_name FROM conversations"
                " WHERE tenant_id = :tenant_id AND conversation_key = :conversation_key"
            ),
            {"tenant_id": tenant_id, "conversation_key": conversation_key},
        )
    ).first()
    return row.group_name if row is not None else None
