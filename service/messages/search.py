"""Searching the raw message archive: hybrid (dense and lexical) retrieval within one
conversation, ranked with each message's neighbours."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import on_clocks, scope_of
from service.db.engine import Beside, Database, settled
from service.embedding import Embedder, start_embedding
from service.embedding.base import Calibration
from service.messages import repository
from service.messages.schemas import MessageHit, MessageSearch, MessageSearchResult
from service.retrieval import floods
from service.retrieval.dates import days_named
from service.retrieval.fusion import (
    first_distinct,
    first_distinct_read,
    scale_min_max,
    time_decayed,
    unit_vector,
)
from service.retrieval.neighbours import (
    BM25_B,
    BM25_K1,
    Stream,
    StreamWeights,
    asked_flags,
    score_stream,
)
from service.retrieval.terms import MAX_QUERY_TERMS, names_in, query_terms
from service.settings import QuerySettings
from service.tenants.service import TenantContext

# Candidates: the nearest messages and the best lexical matches, each with its close
# neighbours (a short reply after the message naming the topic is often the answer).
SEARCH_PLAN = repository.SearchPlan(
    dense_limit=100,
    lexical_limit=100,
    spread=2,
    context=StreamWeights().context,
    similarity_reach=StreamWeights().similarity_reach,
    k1=BM25_K1,
    b=BM25_B,
)
# Candidates kept for the near-duplicate pass, per result asked for.
DUPLICATE_POOL = 3
# Two messages this close in meaning (cosine of their vectors) AND in wording are one result
# (see near_duplicate): in a group where everyone's news reads alike, e5 puts different
# messages above 0.97, and meaning alone dropped the one asked about.
DUPLICATE_COSINE = 0.97


async def search(
    session: AsyncSession,
    tenant: TenantContext,
    request: MessageSearch,
    embedder: Embedder,
    side: Database | None = None,
) -> MessageSearchResult:
    """The conversation's archived messages best matching the query: dense and lexical
    candidates, ranked with their neighbours, recency-boosted, repeats dropped. ``side``,
    the database of ``session``, lends a big conversation's search a second transaction."""
    key = scope_of(request.group_id, request.user_id)
    warnings = []
    zone = ZoneInfo(request.timezone or tenant.timezone)
    time_from, time_to = on_clocks(request.time_from, zone), on_clocks(request.time_to, zone)
    if time_from and time_to and time_from > time_to:
        time_from, time_to = time_to, time_from
        warnings.append("time_from was after time_to; the two were swapped")
    candidates = await find_candidates(
        session, tenant.tenant_id, key, request.query, embedder, time_from, time_to, side
    )
    ranked = rank_candidates(
        candidates,
        request.query,
        tenant.query,
        datetime.now(UTC),
        embedder.calibration,
        request.asker_id,
        zone,
    )
    found: dict[int, Any] = {}

    async def read(head: int) -> None:
        missing = [seq for seq, _, _ in ranked[:head] if seq not in found]
        found.update(await repository.messages_by_seq(session, tenant.tenant_id, key, missing))

    def distinct(head: int) -> list[tuple[int, float]]:
        pool = [(seq, score) for seq, score, _ in ranked[:head] if seq in found]  # none deleted
        return [pool[n] for n in _distinct([found[seq] for seq, _ in pool], request.top_k)]

    kept = await first_distinct_read(
        len(ranked), request.top_k, request.top_k * DUPLICATE_POOL, read, distinct
    )
    hits = [
        MessageHit(
            message_id=found[seq].message_id,
            text=found[seq].text,
            sender_id=found[seq].sender_id,
            sender_name=found[seq].sender_name,
            sent_at=found[seq].sent_at,
            score=round(score, 6),
        )
        for seq, score in kept
    ]
    return MessageSearchResult(messages=hits, warnings=warnings)


def _distinct(shown: list[Any], k: int) -> list[int]:
    """Positions of the first ``k`` messages that repeat none kept before them."""
    return first_distinct(
        [row.text for row in shown],
        [unit_vector(row.embedding) for row in shown],
        k,
        DUPLICATE_COSINE,
        # The same words from two people are two messages (the one asked about is one).
        lambda a, b: shown[a].sender_id == shown[b].sender_id,
        floods.copy_of([(row.text, row.sender_id, row.sent_at, row.indexed) for row in shown]),
    )


async def find_candidates(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    key: str,
    query: str,
    embedder: Embedder,
    time_from: datetime | None,
    time_to: datetime | None,
    side: Database | None,
) -> repository.Candidates:
    """The search's seeds (the nearest messages, the best lexical matches) and their
    neighbourhoods.

    The lexical side needs no vector: it is read (after the conversation's size) while the
    question is embedded. A conversation read through the GIN index (from ``direct_below``
    messages) takes tens of milliseconds for it, longer than the embedding; there it is read
    on a second transaction of ``side`` (when one is free), beside the embedding and the
    dense pass.
    """
    words = query_terms(query, MAX_QUERY_TERMS)

    def lexical(on: AsyncSession) -> Awaitable[dict[int, repository.LexicalMatch]]:
        return repository.lexical_matches(
            on, tenant_id, key, words, SEARCH_PLAN, time_from, time_to
        )

    embedding = start_embedding(embedder, query)
    beside: Beside[dict[int, repository.LexicalMatch]] | None = None
    try:
        matches: dict[int, repository.LexicalMatch] | None = None
        size = await repository.conversation_size(session, tenant_id, key)
        if side is not None and words and size >= SEARCH_PLAN.direct_below:
            beside = side.read_beside(tenant_id, lexical)
        else:
            matches = await lexical(session)
        vector = await embedding.vector
        nearest = await repository.nearest_messages(
            session, tenant_id, key, vector, SEARCH_PLAN, time_from, time_to
        )
        if beside is not None:
            matches = await beside
        if matches is None:  # no second transaction was free
            matches = await lexical(session)
    finally:
        embedding.discard()
        # Its transaction ends before the search does, however the search ends.
        await settled(beside)
    seeds = nearest + await repository.lexical_seeds(session, tenant_id, key, matches, SEARCH_PLAN)
    return await repository.neighbourhoods(
        session, tenant_id, key, vector, seeds, matches, SEARCH_PLAN, time_from, time_to, size
    )


def stream_of(
    candidates: repository.Candidates,
    query: str,
    asker: str | None = None,
    zone: tzinfo = UTC,
) -> tuple[Stream, dict[str, float]]:
    """The candidates as a stream, and the idf of the query terms seen; ``asker``, the
    sender asking (None: not known); ``zone``, whose clocks tell the days the query names."""
    matched = [candidates.matches.get(seq) for seq in candidates.seq]
    idfs: dict[str, float] = {}
    for found in matched:
        if found is not None:
            idfs.update(zip(found.terms, map(float, found.idfs), strict=True))
    names = candidates.sender_name
    named = {name: names_in(query, name) for name in set(names)}
    at = np.array(candidates.sent_at, dtype=np.float64)
    by_asker, on_named_day = asked_flags(candidates.sender_id, at, asker, days_named(query), zone)
    stream = Stream(
        similarity=np.array(candidates.similarity, dtype=np.float64),
        bm25=np.array([m.score if m else 0.0 for m in matched], dtype=np.float64),
        at=at,
        candidate=np.array(candidates.candidate, dtype=bool),
        speaker_named=np.array([named[name] for name in names], dtype=bool),
        senders=candidates.sender_id,
        terms=[m.terms if m else None for m in matched],
        counts=[m.tfs if m else None for m in matched],
        by_asker=by_asker,
        on_named_day=on_named_day,
    )
    return stream, idfs


def rank_candidates(
    candidates: repository.Candidates,
    query: str,
    settings: QuerySettings,
    now: datetime,
    calibration: Calibration = Calibration(),  # noqa: B008 (frozen, shared safely)
    asker: str | None = None,
    zone: tzinfo = UTC,
) -> list[tuple[int, float, float]]:
    """(seq, score, similarity) of the candidates, best first (``asker``: the sender asking,
    see ``StreamWeights.group_asker``; ``zone``: whose clocks tell the days the query
    names).

    The score is the fused relevance scaled onto the candidates (best 1, worst 0), times the
    design's recency boost. Scaled, because fused scores sit close together (e5 cosines of
    related and unrelated chat lines differ by a few hundredths): a 20% boost on the raw
    score would bury every older answer under anything recent, while on the scaled one it
    reorders only matches within a fifth of the best. The tool half-life applies: an
    archive search is an explicit look-up. Only a match whose similarity, on the embedder's
    scale (``calibration``), reaches ``time_decay_min_similarity`` is lifted.
    """
    stream, idfs = stream_of(candidates, query, asker, zone)
    scored = [(n, score) for n, score in enumerate(score_stream(stream, idfs)) if score is not None]
    kept = [n for n, _ in scored]
    relevance = np.array(scale_min_max([score for _, score in scored]), dtype=np.float64)
    similarity = stream.similarity[kept]
    if settings.time_decay_enabled:
        relevance = time_decayed(
            relevance,
            calibration.similarity(similarity),
            now.timestamp() - stream.at[kept],
            half_life_days=settings.time_decay_half_life_days_tool,
            boost=settings.time_decay_boost,
            min_similarity=settings.time_decay_min_similarity,
        )
    ranked = [
        (candidates.seq[n], score, sim)
        for n, score, sim in zip(kept, relevance.tolist(), similarity.tolist(), strict=True)
    ]
    # Equal scores: the newer message first.
    ranked.sort(key=lambda item: (-item[1], -item[0]))
    return ranked
