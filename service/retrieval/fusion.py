"""Putting rankings together: reciprocal-rank and weighted fusion, time decay, no repeats.

Pure functions over plain numbers, so every search (messages, events, memories) ranks the
same way and the arithmetic is tested without a database.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from pgvector import Vector

from service.retrieval.terms import Wording, same_statement, wording

K = TypeVar("K", bound=Hashable)
H = TypeVar("H", bound=Hashable)
T = TypeVar("T")

# The constant of Cormack et al.: damps the head of each list so one list cannot dominate.
RRF_K = 60
SECONDS_PER_DAY = 86400.0


def reciprocal_rank_fusion(rankings: Sequence[Sequence[K]], k: int = RRF_K) -> dict[K, float]:
    """Sum of ``1 / (k + rank)`` over the rankings an item appears in (rank from 1)."""
    scores: dict[K, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return scores


def scale_by_max(values: Sequence[float]) -> list[float]:
    """Scores divided by the largest, so that the best is 1 (all zero stays zero)."""
    top = max(values, default=0.0)
    return [v / top if top > 0 else 0.0 for v in values]


def scale_min_max(values: Sequence[float]) -> list[float]:
    """Scores mapped onto [0, 1]: the worst 0, the best 1 (all equal: all 1)."""
    low, high = min(values, default=0.0), max(values, default=0.0)
    if high <= low:
        return [1.0] * len(values)
    return [(v - low) / (high - low) for v in values]


def weighted_fusion(
    features: Mapping[str, Sequence[float]], weights: Mapping[str, float]
) -> list[float]:
    """The weighted average of named features, item by item (weights need not sum to one)."""
    total = sum(weights.get(name, 0.0) for name in features)
    if total <= 0:
        raise ValueError("at least one feature needs a positive weight")
    length = len(next(iter(features.values()), []))
    out = np.zeros(length, dtype=np.float64)
    for name, values in features.items():
        weight = weights.get(name, 0.0)
        if weight:
            out += weight * np.asarray(values, dtype=np.float64)
    result: list[float] = (out / total).tolist()
    return result


def unit_vector(vector: Any) -> npt.NDArray[np.float32] | None:
    """A stored or computed vector at unit length (pgvector's ``Vector`` as the driver returns
    it, or any array); None for no vector or a zero one."""
    if vector is None:
        return None
    if isinstance(vector, Vector):
        vector = vector.to_numpy()
    array = np.asarray(vector, dtype=np.float32).ravel()
    norm = float(np.linalg.norm(array))
    return array / norm if norm > 0 else None


# One value, or an array of them (the functions below work elementwise).
Values = float | npt.NDArray[np.float64]


def decay(age_seconds: Values, half_life_days: float) -> Values:
    """How fresh something is: 1 now, 0.5 one half-life ago (the future counts as now)."""
    fresh: Values = 0.5 ** (np.maximum(age_seconds, 0.0) / (half_life_days * SECONDS_PER_DAY))
    return fresh


def time_decayed(
    score: Values,
    sim: Values,
    age_seconds: Values,
    *,
    half_life_days: float,
    boost: float,
    min_similarity: float,
) -> npt.NDArray[np.float64]:
    """The design's recency boost: ``score * (1 + boost * decay)`` when the match is close
    enough (``sim >= min_similarity``); a weak match is not lifted by being recent. Arrays
    of candidates are boosted at once."""
    lifted = score * (1.0 + boost * decay(age_seconds, half_life_days))
    return np.where(np.less(sim, min_similarity), score, lifted)


def first_distinct(
    texts: Sequence[str],
    vectors: Sequence[npt.NDArray[np.float32] | None],
    k: int,
    threshold: float,
    same_occasion: Callable[[int, int], bool] | None = None,
    copy_of: Callable[[int, int], bool] | None = None,
) -> list[int]:
    """Positions of the first ``k`` items, in the order given, that repeat no item kept
    before them: the same statement (``near_duplicate``: close in meaning, at ``threshold``
    on their unit ``vectors``, AND in wording) on the same occasion (``same_occasion`` of
    the two positions; any, without it), or a copy of it however varied (``copy_of(n, m)``:
    a flood's, ``floods.copy_of``). An item without a vector repeats only identical words.
    Meaning alone would merge the different news of a group that all reads alike."""
    kept: list[int] = []
    wordings: dict[int, Wording] = {}  # each text's, made once: it is compared with many

    def worded(n: int) -> Wording:
        if n not in wordings:
            wordings[n] = wording(texts[n])
        return wordings[n]

    def repeats(n: int, m: int) -> bool:
        if copy_of is not None and copy_of(n, m):
            return True
        if same_occasion is not None and not same_occasion(n, m):
            return False
        vector, other = vectors[n], vectors[m]
        cosine = float(vector @ other) if vector is not None and other is not None else 0.0
        return same_statement(worded(n), worded(m), cosine, threshold)

    for n in range(len(texts)):
        if len(kept) == k:
            break
        if any(repeats(n, m) for m in kept):
            continue
        kept.append(n)
    return kept


# A side's candidates holding too few statements are read this many times deeper once (a
# conversation where every text comes a few times), then, past a flood, skipping what its
# copies share at most FLOOD_ROUNDS times (``distinct_nearest``).
FLOOD_WIDENING = 4
FLOOD_ROUNDS = 2


def first_of_each(items: Sequence[T], key: Callable[[T], Hashable]) -> list[T]:
    """The items in their order, only the first of each ``key``."""
    seen: set[Hashable] = set()
    firsts = []
    for item in items:
        if (which := key(item)) not in seen:
            seen.add(which)
            firsts.append(item)
    return firsts


async def distinct_nearest(
    read: Callable[[int, list[H]], Awaitable[Sequence[T]]],
    said_at: Callable[[list[H]], Awaitable[Sequence[T]]],
    wanted: int,
    key: Callable[[T], Hashable],
    enough: int,
    order: Callable[[T], Any],
    at: Callable[[T], H],
) -> list[T]:
    """The nearest ``wanted`` items in ``order``, only the first of each ``key`` (a
    statement); ``read(depth, skipped)`` gives the nearest ``depth`` not at a distance
    (``at``: or a score, anything a statement's copies share) in ``skipped``,
    ``said_at(distances)`` the items at those, at least the first of each statement.

    Where fewer than ``enough`` statements differ among the nearest, they are read
    ``FLOOD_WIDENING`` times deeper once: in a conversation where every text comes a few
    times (a bot's notices, greetings) that holds enough, for one more scan. A flood's
    copies share one vector (one text, embedded alike), so one distance: where the deeper
    reading still holds too few, the distances of the statements said more than once there
    are skipped in the next reading, and every statement at those distances is read apart. A
    spammer's ad sent thousands of times over weeks costs the same two scans more as one
    sent a few hundred times in a day, at most ``FLOOD_ROUNDS`` times."""
    depth = wanted
    items = await read(depth, [])
    firsts = first_of_each(items, key)
    if len(firsts) < enough and len(items) == depth:
        depth *= FLOOD_WIDENING
        items = await read(depth, [])
        firsts = first_of_each(items, key)
    skipped: list[H] = []
    for _ in range(FLOOD_ROUNDS):
        if len(firsts) >= enough or len(items) < depth:
            break
        copies = Counter(map(key, items))
        repeated = list(dict.fromkeys(at(item) for item in items if copies[key(item)] > 1))
        if not repeated:
            break
        skipped += repeated
        depth = wanted
        items = await read(depth, skipped)
        apart = await said_at(repeated)
        firsts = first_of_each(sorted([*firsts, *apart, *items], key=order), key)
    return firsts[:wanted]


async def first_distinct_read(
    count: int,
    k: int,
    head: int,
    read: Callable[[int], Awaitable[None]],
    distinct: Callable[[int], list[T]],
) -> list[T]:
    """The first ``k`` distinct items of a ranking of ``count``, where telling repeats apart
    needs their rows read whole: ``read(head)`` reads the best ``head``'s, ``distinct(head)``
    keeps the first that repeat none before them among those. While fewer than ``k`` are
    kept and the ranking goes on (a member's line said again and again, ranked high), twice
    as many are read."""
    while True:
        await read(head)
        kept = distinct(head)
        if len(kept) >= k or head >= count:
            return kept
        head *= 2
