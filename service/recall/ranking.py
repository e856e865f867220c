"""Ranking events for a turn or a tool call: hybrid candidates, time decay, rerank, no twins.

1. Candidates from both sides, under the same hard filters: the exact nearest events by
   meaning (``nearest_events``) and the best lexical matches by BM25 over the application's
   Chinese/English terms (``lexical_events``), each ``top_k × rerank_candidate_multiplier``.
   In conversations too big for every match to be scored, terms common to many events (by
   PostgreSQL's statistics) are left out of the lexical side: they match too much and tell
   too little. In smaller ones every term counts, weighed by BM25's idf. A question naming
   a day brings that day's nearest events too; a group member's, their own nearest among
   their latest (``nearest_told_by``): in a group of a hundred members telling alike news,
   the asker's own is often not among the group's nearest few.
2. Fusion on the similarity scale, so that the seeds' thresholds keep their meaning: an
   event's similarity is its cosine on the embedder's calibrated scale (0 for what the model
   scores an unrelated pair, 1 for a clearly related one: ``Calibration``), its relevance
   that similarity with lexical evidence closing a share (``lexical_weight``) of the gap to
   1, in proportion to its BM25 against the best match's. Without a lexical match the
   relevance is exactly the similarity; a memo event (the bot's own note) weighs
   ``MEMO_WEIGHT`` of it. On raw cosines of a model such as e5, where every
   pair scores 0.8 to 0.9, the ×1.2 recency boost would outweigh any difference in meaning
   and no event would fall under ``time_decay_min_similarity``.
   Then, with lexical search on (``lexical_weight`` > 0), the candidates are read with
   the message search's features and weights (``service.retrieval.neighbours``): each with
   the events told just before and after it in its conversation (a short answer after the
   turn naming its topic), the query's terms over its window, in the same fusion on the
   similarity scale (see ``with_neighbours``). The events within ``SPREAD`` of a candidate
   in its sitting are ranked as candidates too, as the message search ranks a seed's
   neighbours: the answer to a question is often the short reply after the turn naming its
   topic, which neither side finds on its own. The decay's threshold reads the event's own
   similarity.
3. The seeds' time decay, ``final = relevance × (1 + boost × 0.5^(age / half_life))`` for
   events with ``sim ≥ time_decay_min_similarity``.
4. With a reranker configured (and ``enable_rerank``), its relevance replaces the fused one
   for the candidates, decayed the same way; if it fails or is slow, step 3's order stands.
5. Near-duplicates (the same statement recorded twice on one day, told by the same sender)
   are dropped, the better one kept: two members telling the same words is two pieces of
   news, as in the message search.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from itertools import takewhile
from typing import Any

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import is_group
from service.embedding.base import Calibration
from service.events import service as events
from service.llm.base import LLMError
from service.llm.rerank import Reranker
from service.retrieval import floods
from service.retrieval.dates import Span, days_named, envelope
from service.retrieval.fusion import (
    distinct_nearest,
    first_distinct,
    first_distinct_read,
    scale_by_max,
    time_decayed,
    unit_vector,
)
from service.retrieval.neighbours import Stream, StreamWeights, asked_flags, stream_features
from service.retrieval.terms import MAX_QUERY_TERMS, query_terms, terms
from service.settings import QuerySettings

log = logging.getLogger(__name__)

# Two events this close in meaning AND wording are one statement (see near_duplicate).
DUPLICATE_COSINE = 0.97
# A memo event is the bot's note of what it did ("查了北京的天气"), kept for short-term
# continuity (the memo log is injected every turn anyway); what people said is what a long-
# term search is for. A memo ranks as if this much as relevant as its text would make it, so
# a statement about the same thing comes first.
MEMO_WEIGHT = 0.85
# The events this close to a candidate in its sitting are ranked too, as the message search
# ranks a seed's neighbours.
SPREAD = 2
# What an event told by the sender asking gains on the relevance scale per unit of weight
# the message search gives it (5 in a group). Through events/search, hit@10 at 0 / 0.01 /
# 0.02 / 0.04 / 0.06 / 0.08 a unit on MemDaily's pools, asked by the member: .815 / .948 /
# .963 / .980 / .980 / .980; with the worst asker for it (the member of the best wrong
# event) .807 / .805 / .805 at 0.01 / 0.02 / 0.04. Not more: at 0.159 (what a unit of weight
# buys in a group by the rule of ``day_lift``) the worst asker's .763 falls to .664 (2026-11,
# 1.000 asked by the member either way).
ASKER_LIFT_PER_WEIGHT = 0.06


@dataclass
class RankedEvent:
    """An event row with how it ranked."""

    row: dict[str, Any]
    similarity: float
    lexical: float
    relevance: float
    score: float = 0.0


@dataclass(frozen=True)
class EventQuery:
    """One ranked event search: the text, the filters, how many, which decay."""

    text: str
    conversation_keys: list[str]
    top_k: int
    half_life_days: float
    time_from: datetime | None = None
    time_to: datetime | None = None
    asker: str | None = None  # the sender asking (see StreamWeights.group_asker)
    zone: tzinfo = UTC  # whose clocks tell the days the text names

    def pool(self, q: QuerySettings) -> int:
        """Candidates taken from each side."""
        return self.top_k * max(q.rerank_candidate_multiplier, 1)


def fuse(
    dense: list[dict[str, Any]],
    lexical: list[dict[str, Any]],
    lexical_weight: float,
    calibration: Calibration = Calibration(),  # noqa: B008 (frozen, shared safely)
) -> list[RankedEvent]:
    """One candidate per event: similarity from the exact distance on the embedder's scale,
    lexical evidence from BM25 relative to the best lexical match, relevance
    ``sim + w × lex × (1 - sim)``."""
    by_id: dict[str, RankedEvent] = {}
    for row in dense + lexical:
        if row["id"] not in by_id:
            distance = row.get("distance")
            sim = calibration.similarity(1.0 - float(distance)) if distance is not None else 0.0
            by_id[row["id"]] = RankedEvent(row=row, similarity=sim, lexical=0.0, relevance=sim)
    for row, lex in zip(lexical, scale_by_max([float(r["bm25"]) for r in lexical]), strict=True):
        event = by_id[row["id"]]
        event.lexical = lex
        event.relevance = event.similarity + lexical_weight * lex * (1.0 - event.similarity)
    for event in by_id.values():
        if event.row.get("kind") == "memo":
            event.relevance *= MEMO_WEIGHT
    return list(by_id.values())


def day_lift(weight: dict[str, float], calibration: Calibration) -> float:
    """What an event on a day the query names gains on the relevance scale: as much as the
    message search's ``weight`` for it buys there. In that fusion the named day's weight
    equals a rise of ``named_day / (similarity + neighbour_similarity)`` in the cosine of an
    event and its neighbours, which ``calibration`` puts on the relevance scale. With the
    local model's calibration, 0.38 in a dialogue (the weights' 2 / 25 of a cosine over its
    span of 0.21), 0.32 in a group.

    Through events/search on LoCoMo (103 of its 997 questions name a day or month), hit@10
    .858 at 0.12 (0.06 a unit of weight, the rule before), .859 / .860 / .861 / .862 / .859
    at 0.18 / 0.24 / 0.30 / 0.36 / 0.48, .862 at 0.38 (this rule); the message search, .843
    without the named days and .864 with them. No other set's questions name a day."""
    dense = weight["similarity"] + weight["neighbour_similarity"]
    return weight["named_day"] / (dense * calibration.span) if dense > 0 else 0.0


def with_neighbours(
    candidates: list[RankedEvent],
    lexical: list[dict[str, Any]],
    around: list[dict[str, Any]],
    lexical_weight: float,
    calibration: Calibration = Calibration(),  # noqa: B008 (frozen, shared safely)
    spread: int = 0,
    asker: str | None = None,
    days: list[Span] | None = None,
    zone: tzinfo = UTC,
) -> list[RankedEvent]:
    """Rank the candidates with the message search's features and weights (a dialogue's, or a
    many-sender group's, by the senders present): each event with
    the events told just before and after it (``around``) in its conversation, BM25 from the
    ``lexical`` candidates (see ``service.retrieval.neighbours``).

    On the similarity scale, as ``fuse``: the dense side is the weighted mean of the
    event's own cosine and its neighbours' (calibrated), the lexical evidence the weighted
    mean of its own BM25, its window's and its neighbours' (each relative to the best
    candidate's), and the relevance ``sim + w × lex × (1 - sim)``. An event with neither
    neighbours nor query words keeps its own similarity as its relevance; a memo weighs
    ``MEMO_WEIGHT`` of it.

    The events within ``spread`` of a candidate in its sitting (``stream_features``) are
    ranked too: the reply that answers the turn naming the topic. They are returned, new
    candidates whose rows hold only the neighbours' columns.

    An event told by ``asker`` (the sender asking) gains ``ASKER_LIFT_PER_WEIGHT`` of the
    relevance a unit of the message search's weight for it. One on a day the query names (on
    the clocks of ``zone``) gains what the message search's weight for that buys there: the
    calibrated similarity that the same weight on the dense features would (``day_lift``)."""
    rows: dict[str, dict[str, Any]] = {r["id"]: r for r in around}
    for event in candidates:
        rows[event.row["id"]] = event.row
    ranked = {event.row["id"]: event for event in candidates}
    bm25 = {r["id"]: float(r["bm25"]) for r in lexical}
    idfs: dict[str, float] = {}
    for row in lexical:
        for term, weight in zip(row.get("terms") or [], row.get("idfs") or [], strict=True):
            idfs[term] = float(weight)
    stream = sorted(
        rows.values(),
        key=lambda r: (r["conversation_key"], r["occurred_at"], r["created_at"], r["id"]),
    )
    held: list[list[str] | None] = []
    counts: list[list[int] | None] = []
    similarity, own_bm25, candidate = [], [], []
    for row in stream:
        found = ranked.get(row["id"])
        if idfs and "hit_terms" in row:  # a neighbour: counted by the database
            held.append(row["hit_terms"])
            counts.append(row["hit_counts"])
        elif idfs:
            counted = Counter(t for t in terms(row["text"]) if t in idfs)
            held.append(list(counted))
            counts.append(list(counted.values()))
        else:
            held.append(None)
            counts.append(None)
        candidate.append(found is not None)
        if found is not None:
            distance = row.get("distance")
            similarity.append(1.0 - float(distance) if distance is not None else 0.0)
            own_bm25.append(bm25.get(row["id"], 0.0))
        else:
            similarity.append(float(row["similarity"]))
            own_bm25.append(0.0)
    occurred = np.array([row["occurred_at"].timestamp() for row in stream], dtype=np.float64)
    senders = [row.get("sender_id") for row in stream]
    by_asker, on_named_day = asked_flags(senders, occurred, asker, days or [], zone)
    passages = Stream(
        similarity=np.array(similarity, dtype=np.float64),
        bm25=np.array(own_bm25, dtype=np.float64),
        at=occurred,
        candidate=np.array(candidate, dtype=bool),
        speaker_named=np.zeros(len(stream), dtype=bool),
        senders=senders,
        terms=held,
        counts=counts,
        streams=[row["conversation_key"] for row in stream],
        by_asker=by_asker,
        on_named_day=on_named_day,
    )
    w = StreamWeights()
    picked, features = stream_features(passages, idfs, w, spread)
    added = []
    for at in picked:
        if stream[at]["id"] not in ranked:  # within the spread of a candidate
            sim = calibration.similarity(float(passages.similarity[at]))
            event = RankedEvent(row=stream[at], similarity=sim, lexical=0.0, relevance=sim)
            ranked[stream[at]["id"]] = event
            added.append(event)
    # A dialogue's weights, or a many-sender group's, as the message search weighs them.
    weight = w.for_stream(passages)
    dense = ("similarity", "neighbour_similarity")
    lexical_side = ("lexical", "window_lexical", "neighbour_lexical")
    dense_weight = sum(weight[name] for name in dense)
    lexical_weights = sum(weight[name] for name in lexical_side)
    day = day_lift(weight, calibration)
    for n, at in enumerate(picked):
        event = ranked[stream[at]["id"]]
        cosine = sum(weight[name] * features[name][n] for name in dense) / dense_weight
        sim = calibration.similarity(cosine)
        lex = sum(weight[name] * features[name][n] for name in lexical_side) / lexical_weights
        event.relevance = sim + lexical_weight * lex * (1.0 - sim)
        event.relevance += ASKER_LIFT_PER_WEIGHT * weight["asker"] * features["asker"][n]
        event.relevance += day * features["named_day"][n]
        if event.row.get("kind") == "memo":
            event.relevance *= MEMO_WEIGHT
    return added


def decay_scores(
    candidates: list[RankedEvent], now: datetime, half_life_days: float, q: QuerySettings
) -> None:
    """Set each candidate's final score: its relevance with the seeds' time decay."""
    relevance = [event.relevance for event in candidates]
    if q.time_decay_enabled and candidates:
        relevance = time_decayed(
            np.array(relevance, dtype=np.float64),
            np.array([event.similarity for event in candidates], dtype=np.float64),
            np.array([(now - e.row["occurred_at"]).total_seconds() for e in candidates]),
            half_life_days=half_life_days,
            boost=q.time_decay_boost,
            min_similarity=q.time_decay_min_similarity,
        ).tolist()
    for event, score in zip(candidates, relevance, strict=True):
        event.score = score


def without_duplicates(ranked: list[RankedEvent], k: int) -> list[RankedEvent]:
    """The first ``k`` events, skipping any that repeats one already kept on its day and told
    by the same sender."""
    keep = first_distinct(
        [event.row["text"] for event in ranked],
        [unit_vector(event.row.get("embedding")) for event in ranked],
        k,
        DUPLICATE_COSINE,
        lambda a, b: _same_occasion(ranked[a].row, ranked[b].row),
        floods.copy_of(
            [
                (
                    e.row["text"],
                    e.row.get("sender_id"),
                    e.row.get("occurred_at"),
                    e.row.get("indexed", True),
                )
                for e in ranked
            ]
        ),
    )
    return [ranked[n] for n in keep]


async def lexical_candidates(
    session: AsyncSession, tenant_id: Any, search: EventQuery, q: QuerySettings
) -> list[dict[str, Any]]:
    """The lexical side's candidates, one of each statement (``distinct_nearest``: a
    flood's copies score alike). They need no query vector, so the read path reads them
    while the query is being embedded."""
    if search.top_k <= 0 or q.lexical_weight <= 0:
        return []
    words = query_terms(search.text, MAX_QUERY_TERMS)
    keys, pool = search.conversation_keys, search.pool(q)
    bounds = search.time_from, search.time_to

    def best(depth: int, skipped: list[float]) -> Awaitable[list[dict[str, Any]]]:
        return events.lexical(session, tenant_id, keys, words, depth, *bounds, skipped=skipped)

    def said_at(scores: list[float]) -> Awaitable[list[dict[str, Any]]]:
        return events.lexical(session, tenant_id, keys, words, pool, *bounds, said_at=scores)

    return await distinct_nearest(
        best,
        said_at,
        pool,
        _statement,
        search.top_k,
        lambda row: (-row["bm25"], row["id"]),
        lambda row: row["bm25"],
    )


async def rank_events(
    session: AsyncSession,
    tenant_id: Any,
    search: EventQuery,
    vector: np.ndarray[Any, Any],
    lexical: list[dict[str, Any]] | Callable[[], Awaitable[list[dict[str, Any]]]],
    q: QuerySettings,
    now: datetime,
    reranker: Reranker | None = None,
    warnings: list[str] | None = None,
    calibration: Calibration = Calibration(),  # noqa: B008 (frozen, shared safely)
) -> list[RankedEvent]:
    """The ``top_k`` best events for the query under the hard filters, best first, from the
    dense side (searched here) and the ``lexical`` candidates (``lexical_candidates``, or
    what reads them once the dense side is searched: they may be on their way beside)."""
    if search.top_k <= 0:
        return []
    pool = search.pool(q)
    dense = await _nearest_statements(
        session, tenant_id, search, vector, pool, search.time_from, search.time_to
    )
    days = days_named(search.text)
    named = envelope(days, search.zone, search.time_from, search.time_to)
    if named is not None:
        # A question naming a day: that day's nearest events are candidates too, however
        # many of the rest of the conversation's are nearer.
        dense += await _nearest_statements(session, tenant_id, search, vector, pool, *named)
    if search.asker is not None and any(map(is_group, search.conversation_keys)):
        # In a group, whoever asks is often asking about their own news among the members'
        # alike ones: their nearest top_k events are candidates too (see nearest_told_by).
        # (As many as the dense side's, top_k × rerank_candidate_multiplier, found no more on
        # MemDaily's pools, and each candidate costs its neighbours' read.)
        dense += await events.nearest_told_by(
            session,
            tenant_id,
            search.conversation_keys,
            search.asker,
            vector,
            search.top_k,
            search.time_from,
            search.time_to,
        )
    if callable(lexical):
        lexical = await lexical()
    query = unit_vector(vector)
    for row in lexical:
        # The exact cosine distance, as the dense side computes it.
        unit = unit_vector(row.get("embedding"))
        row["distance"] = (
            1.0 - float(query @ unit) if query is not None and unit is not None else None
        )
    candidates = fuse(dense, lexical, q.lexical_weight, calibration)
    if q.lexical_weight > 0 and candidates:
        around = await events.neighbours(
            session,
            tenant_id,
            [e.row["id"] for e in candidates],
            vector,
            StreamWeights().context + SPREAD,
            search.time_from,
            search.time_to,
            terms=sorted({t for row in lexical for t in row.get("terms") or []}),
        )
        candidates += with_neighbours(
            candidates,
            lexical,
            around,
            q.lexical_weight,
            calibration,
            SPREAD,
            search.asker,
            days,
            search.zone,
        )
    decay_scores(candidates, now, search.half_life_days, q)
    candidates.sort(key=lambda e: (-e.score, e.row["id"]))
    head = search.pool(q)
    candidates = await _whole_rows(session, tenant_id, candidates, head)
    if reranker is not None and q.enable_rerank and candidates:
        await _rerank(reranker, search, candidates, now, q, warnings)

    # The best head are whole already (read before the reranker): another read only where so
    # many repeats were skipped (a line a group says again and again) that it goes further.
    return await shown(session, tenant_id, candidates, head, search.top_k)


async def shown(
    session: AsyncSession, tenant_id: Any, ranked: list[RankedEvent], head: int, k: int
) -> list[RankedEvent]:
    """The first ``k`` of the ranked candidates that repeat none before them
    (``without_duplicates``), each read whole (``_whole_rows``), ``head`` of them at first,
    further while repeats leave too few (``first_distinct_read``)."""

    async def read(head: int) -> None:
        nonlocal ranked
        ranked = await _whole_rows(session, tenant_id, ranked, head)

    def distinct(head: int) -> list[RankedEvent]:
        # Up to the first row not whole: one deleted meanwhile moves a neighbour's partial
        # row into the head, and a result is never one.
        whole = list(takewhile(lambda e: "embedding" in e.row, ranked[:head]))
        return without_duplicates(whole, k)

    return await first_distinct_read(len(ranked), k, head, read, distinct)


def _statement(row: dict[str, Any]) -> tuple[Any, ...]:
    """What one member said on one day, word for word (see ``_same_occasion``)."""
    at = row.get("occurred_at")
    return row.get("sender_id"), at.date() if at is not None else None, row["text"]


async def _nearest_statements(
    session: AsyncSession,
    tenant_id: Any,
    search: EventQuery,
    vector: np.ndarray[Any, Any],
    pool: int,
    time_from: datetime | None,
    time_to: datetime | None,
) -> list[dict[str, Any]]:
    """The ``pool`` nearest events, one of each statement (``distinct_nearest``)."""
    keys = search.conversation_keys

    def nearest(depth: int, skipped: list[float]) -> Awaitable[list[dict[str, Any]]]:
        return events.nearest(session, tenant_id, keys, vector, depth, time_from, time_to, skipped)

    def said_at(approx: list[float]) -> Awaitable[list[dict[str, Any]]]:
        return events.said_at(session, tenant_id, keys, vector, approx, pool, time_from, time_to)

    rows = await distinct_nearest(
        nearest,
        said_at,
        pool,
        _statement,
        search.top_k,
        lambda row: (row["distance"], row["id"]),
        lambda row: row["approx"],
    )
    for row in rows:  # a row as any other event's (a neighbour fetched by id)
        del row["approx"]
    return rows


async def _whole_rows(
    session: AsyncSession, tenant_id: Any, ranked: list[RankedEvent], head: int
) -> list[RankedEvent]:
    """The ranked candidates, the first ``head`` with whole rows: neighbours ranked among
    them came with the columns the ranking reads, and the ones that may be shown get their
    row and vector (for the duplicate check). One deleted meanwhile is dropped."""
    partial = [e for e in ranked[:head] if "embedding" not in e.row]
    if not partial:
        return ranked
    found = await events.by_ids(session, tenant_id, [e.row["id"] for e in partial])
    gone = set()
    for event in partial:
        row = found.get(event.row["id"])
        if row is None:
            gone.add(event.row["id"])
        else:
            # As the dense side gives it: the exact cosine distance.
            event.row = {**row, "distance": 1.0 - float(event.row["similarity"])}
    return [e for e in ranked if e.row["id"] not in gone]


async def _rerank(
    reranker: Reranker,
    search: EventQuery,
    candidates: list[RankedEvent],
    now: datetime,
    q: QuerySettings,
    warnings: list[str] | None,
) -> None:
    # The reranker sees the best top_k × rerank_candidate_multiplier of the fused union (both
    # sides together give up to twice that), as documented: it is the costly step.
    head = candidates[: search.pool(q)]
    try:
        relevance = await reranker.rerank(search.text, [e.row["text"] for e in head])
    except LLMError as exc:
        log.warning("reranking skipped: %s", exc)
        if warnings is not None:
            warnings.append("the reranker did not answer; results are in fused order")
        return
    for event, value in zip(candidates, relevance, strict=False):
        event.relevance = value
    # Candidates beyond what the reranker took (max_documents) rank after its picks.
    for event in candidates[len(relevance) :]:
        event.relevance = 0.0
    decay_scores(candidates, now, search.half_life_days, q)
    candidates.sort(key=lambda e: (-e.score, e.row["id"]))


def _same_occasion(a: dict[str, Any], b: dict[str, Any]) -> bool:
    # The same words on two days are two happenings (a weekly meeting), not one repeated;
    # from two members of a group, two members' news ("the duration of the dinner is nine
    # days", each of their own dinner): in a group of a hundred alike announcements, the one
    # asked about was dropped as the repeat of another's. MemDaily's pools without the
    # asker: hit@10 .814 -> .827 (its lexical side alone .829); with the worst asker .763 ->
    # .779; LoCoMo and MADial unchanged.
    at, other = a.get("occurred_at"), b.get("occurred_at")
    same_day = at is None or other is None or at.date() == other.date()
    return same_day and a.get("sender_id") == b.get("sender_id")
