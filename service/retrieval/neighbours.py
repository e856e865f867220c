"""Ranking passages of a stream (a chat, an event log) with the help of their neighbours.

A chat message rarely stands alone: the answer to "what did she say about the trip?" is
often a short "Sure, next week!" right after the message that names the trip. So besides a
message's own dense similarity and BM25 score, its score uses

- the mean dense similarity of the messages just before and after it,
- the BM25 score of its immediate neighbours,
- a window score: the query terms counted over the surrounding window (a small "session"
  document, BM25-saturated, no length normalization),
- whether the query names the message's sender,
- whether whoever asks said it (in a group: "where is the event I signed up for?" is about
  the asker's own message among the members' alike ones),
- whether it was said on a day the query names ("what did she show on 13 October 2023?").

Neighbours count only within one sitting: consecutive passages less than
``episode_gap`` apart. Passages that are not a conversation (notes written days apart) thus
fall back to their own similarity and terms.

The caller gives the passages in stream order, contiguous around every candidate (each
candidate's whole window present); rows that are only there as context are not scored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import tzinfo

import numpy as np
import numpy.typing as npt

from service.retrieval.dates import Span, on_days
from service.retrieval.fusion import scale_by_max, weighted_fusion

BM25_K1 = 1.2
BM25_B = 0.75


@dataclass(slots=True)
class StreamPassage:
    """One passage of the stream as a query sees it."""

    similarity: float  # dense cosine with the query
    bm25: float  # the passage's own BM25 score
    term_counts: Mapping[str, int] = field(default_factory=dict)  # query terms it contains
    speaker_named: bool = False  # the query names its sender
    candidate: bool = True  # ranked; False: present only as a neighbour of candidates
    at: float = 0.0  # when it was said (seconds); a long pause separates neighbours
    stream: str = ""  # which conversation: passages of two are never neighbours
    sender: str | None = None  # who said it (see StreamWeights.dialogue_speakers)
    by_asker: bool = False  # said by whoever asks the query
    on_named_day: bool = False  # said on a day the query names


@dataclass(frozen=True)
class Stream:
    """The passages of a stream column by column, in stream order: what the ranking reads.

    A big group's search ranks thousands of rows; read into arrays at once, they are not
    made into a passage object each (``of`` turns passages into a stream).
    """

    similarity: npt.NDArray[np.float64]
    bm25: npt.NDArray[np.float64]
    at: npt.NDArray[np.float64]
    candidate: npt.NDArray[np.bool_]
    speaker_named: npt.NDArray[np.bool_]
    senders: Sequence[str | None]
    # The query terms each passage holds and how often (None: none).
    terms: Sequence[Sequence[str] | None]
    counts: Sequence[Sequence[int] | None]
    streams: Sequence[str] | None = None  # None: all of one stream
    # Whether whoever asks said each passage (None: the asker is not known).
    by_asker: npt.NDArray[np.bool_] | None = None
    # Whether each was said on a day the query names (None: it names none).
    on_named_day: npt.NDArray[np.bool_] | None = None

    def __len__(self) -> int:
        return len(self.similarity)

    @classmethod
    def of(cls, passages: Sequence[StreamPassage]) -> Stream:
        return cls(
            similarity=np.array([p.similarity for p in passages], dtype=np.float64),
            bm25=np.array([p.bm25 for p in passages], dtype=np.float64),
            at=np.array([p.at for p in passages], dtype=np.float64),
            candidate=np.array([p.candidate for p in passages], dtype=bool),
            speaker_named=np.array([p.speaker_named for p in passages], dtype=bool),
            senders=[p.sender for p in passages],
            terms=[list(p.term_counts) for p in passages],
            counts=[list(p.term_counts.values()) for p in passages],
            streams=[p.stream for p in passages],
            by_asker=np.array([p.by_asker for p in passages], dtype=bool),
            on_named_day=np.array([p.on_named_day for p in passages], dtype=bool),
        )


def asked_flags(
    senders: Sequence[str | None],
    at: npt.NDArray[np.float64],
    asker: str | None,
    days: list[Span],
    zone: tzinfo,
) -> tuple[npt.NDArray[np.bool_] | None, npt.NDArray[np.bool_] | None]:
    """A stream's ``by_asker`` and ``on_named_day`` columns: who of the ``senders`` is the
    ``asker`` (None: not known), and which times ``at`` fall on the ``days`` the query names
    on the clocks of ``zone`` (None: it names none)."""
    by_asker = None if asker is None else np.array([s == asker for s in senders], dtype=bool)
    return by_asker, on_days(at, days, zone) if days else None


Passages = Stream | Sequence[StreamPassage]


def _stream(passages: Passages) -> Stream:
    return passages if isinstance(passages, Stream) else Stream.of(passages)


@dataclass(frozen=True)
class StreamWeights:
    """Weights of the features, and how far the neighbourhood reaches (in passages).

    Chosen by cross-validation on held-out conversations (see bench/retrieval_quality.py).
    """

    similarity: float = 10.0
    neighbour_similarity: float = 15.0
    lexical: float = 1.0
    window_lexical: float = 1.5
    neighbour_lexical: float = 0.5
    speaker: float = 0.25
    similarity_reach: int = 2
    lexical_reach: int = 1
    # The query's terms are counted over this many passages on each side. Every one more
    # is two more neighbours read per candidate; on the dev sets hit@10 (LoCoMo) at 2 / 3 /
    # 4 / 5 / 6 / 8 / 10: .859 / .862 / .864 / .866 / .865 / .864 / .861 (MADial .947 at 2,
    # .939 above; MemDaily's the same at all): 4 is the cheapest of the plateau.
    window: int = 4
    episode_gap: float = 3600.0
    # A conversation is a dialogue while the stream holds at most this many senders: there a
    # message's neighbours are the turns it answers and that answer it. In a bigger group
    # consecutive messages are mostly different people's unrelated news, so a neighbour
    # counts only in a run of one sender's messages.
    dialogue_speakers: int = 4
    # Outside a dialogue the sought message is one person's, holding the asked detail, among
    # many others' news close to it in meaning: there the message's own terms weigh more, its
    # sender-run neighbours' terms not at all. (Chosen on MemDaily's group pools, leaving one
    # kind of question out at a time; dialogues never use these.)
    group_lexical: float = 10.0
    group_neighbour_similarity: float = 20.0
    group_neighbour_lexical: float = 0.0
    # A passage said by whoever asks, unless the query names a sender: in a group, "the event
    # in Shanghai, what is it?" is about the asker's own among several members' events in
    # Shanghai. Worth about a stray matched character of the lexical side, less than a
    # matched word. On MemDaily's pools: hit@10 .871 without it, 1.000 with it; with the worst
    # asker for it (the member of the best wrong match), .844, and no question that names its
    # detail lost (at 1.5, .977 and .861; at 3, .992 and .852). In a dialogue the question is
    # as often about the other's words ("what did you recommend?"): none there.
    asker: float = 0.0
    group_asker: float = 5.0
    # A passage said on a day the query names. On LoCoMo (103 of its 997 questions name a
    # day or month) hit@10 .840 without it; at 1 / 2 / 3 / 5, .858 / .861 / .860 / .859
    # (the dated questions: .738 without, .942 at 2). No other set's questions name a date.
    named_day: float = 2.0

    def feature_weights(self, in_dialogue: bool = True) -> dict[str, float]:
        """The weights by feature name, for a dialogue or (``in_dialogue=False``) for a
        stream of many senders."""
        return {
            "similarity": self.similarity,
            "neighbour_similarity": (
                self.neighbour_similarity if in_dialogue else self.group_neighbour_similarity
            ),
            "lexical": self.lexical if in_dialogue else self.group_lexical,
            "window_lexical": self.window_lexical,
            "neighbour_lexical": (
                self.neighbour_lexical if in_dialogue else self.group_neighbour_lexical
            ),
            "speaker": self.speaker,
            "asker": self.asker if in_dialogue else self.group_asker,
            "named_day": self.named_day,
        }

    def for_stream(self, passages: Passages) -> dict[str, float]:
        """The weights by feature name for these passages, by the stream's shape."""
        return self.feature_weights(dialogue(passages, self.dialogue_speakers))

    @property
    def context(self) -> int:
        """How many passages on each side a candidate needs present around it."""
        return max(self.similarity_reach, self.lexical_reach, self.window)


def idf(documents: int, document_frequency: int) -> float:
    """BM25's inverse document frequency (the non-negative Lucene form)."""
    df = min(document_frequency, documents)
    return math.log(1.0 + (documents - df + 0.5) / (df + 0.5))


def _window_sums(
    values: npt.NDArray[np.float64],
    reach: int,
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
) -> npt.NDArray[np.float64]:
    """Sum of each item's window ``[i - reach, i + reach]``, clipped to its episode
    ``[starts[i], ends[i])``, from running sums: exact for counts (whole numbers); for
    scores, see ``_neighbour_sums``."""
    n = len(values)
    prefix = np.concatenate(([0.0], np.cumsum(values)))
    index = np.arange(n)
    return prefix[np.minimum(ends, index + reach + 1)] - prefix[np.maximum(starts, index - reach)]


def _neighbour_sums(
    values: npt.NDArray[np.float64],
    reach: int,
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
) -> npt.NDArray[np.float64]:
    """Sum of each item's neighbours within ``reach`` (itself left out), clipped to its
    episode ``[starts[i], ends[i])``. Added up directly, not as a difference of running sums:
    over a long stream those carry rounding of the size of everything before, and where every
    neighbour is 0 the difference came out as ±1e-12, which scaling by the largest then blew
    up to ±1."""
    n = len(values)
    index = np.arange(n)
    out = np.zeros(n)
    for offset in (*range(-reach, 0), *range(1, reach + 1)):
        other = index + offset
        inside = (other >= starts) & (other < ends)
        out[inside] += values[other[inside]]
    return out


def dialogue(passages: Passages, speakers: int) -> bool:
    """Whether the passages read as a dialogue: at most ``speakers`` senders (passages of
    unknown sender count as one)."""
    senders = passages.senders if isinstance(passages, Stream) else [p.sender for p in passages]
    return len(set(senders)) <= speakers


def _changes(values: Sequence[str | None]) -> npt.NDArray[np.bool_]:
    """Whether each value differs from the one before it (one flag fewer than values)."""
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return np.asarray(column[1:] != column[:-1], dtype=bool)


def _episodes(
    stream: Stream, gap: float, by_sender: bool = False
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Each passage's episode as [start, end) positions: runs of one stream without a pause
    over ``gap`` (``by_sender``: and of one sender)."""
    n = len(stream)
    other = np.abs(np.diff(stream.at)) > gap
    if stream.streams is not None:
        other |= _changes(stream.streams)
    if by_sender:
        other |= _changes(stream.senders)
    breaks = np.flatnonzero(other) + 1
    bounds = np.concatenate(([0], breaks, [n])).astype(np.int64)
    episode = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    return bounds[episode], bounds[episode + 1]


def _picked(
    stream: Stream,
    spread: int,
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
) -> list[int]:
    """Positions of the candidates and, with ``spread``, of the passages within that many of
    one in its episode."""
    candidates = np.flatnonzero(stream.candidate).tolist()
    if spread <= 0:
        return candidates
    picked = set(candidates)
    for n in candidates:
        picked.update(range(max(int(starts[n]), n - spread), min(int(ends[n]), n + spread + 1)))
    return sorted(picked)


def _scale_by_max(values: npt.NDArray[np.float64]) -> list[float]:
    return scale_by_max(values.tolist())


def stream_features(
    passages: Passages,
    idfs: Mapping[str, float],
    weights: StreamWeights,
    spread: int = 0,
) -> tuple[list[int], dict[str, list[float]]]:
    """The candidates' positions and their features, each scaled for fusion. With
    ``spread``, the passages within that many of a candidate in its episode are ranked too:
    the reply after the turn that names the topic."""
    w = weights
    stream = _stream(passages)
    n = len(stream)
    sims, bm25 = stream.similarity, stream.bm25
    starts, ends = _episodes(
        stream, w.episode_gap, by_sender=not dialogue(stream, w.dialogue_speakers)
    )

    # Neighbours' mean similarity, excluding the passage itself (alone: its own).
    sim_sums = _neighbour_sums(sims, w.similarity_reach, starts, ends)
    counts = _neighbour_sums(np.ones(n), w.similarity_reach, starts, ends)
    neighbour_sim = np.where(counts > 0, sim_sums / np.maximum(counts, 1.0), sims)
    neighbour_lex = _neighbour_sums(bm25, w.lexical_reach, starts, ends)

    # The window as one small document: query terms counted over it, saturated, by idf.
    window = np.zeros(n)
    column = {term: k for k, term in enumerate(idfs)}
    if column:
        counts_t = np.zeros((n, len(column)))
        for i, (held, tallies) in enumerate(zip(stream.terms, stream.counts, strict=True)):
            for term, count in zip(held or (), tallies or (), strict=True):
                slot = column.get(term)
                if slot is not None:
                    counts_t[i, slot] = count
        weight = np.array(list(idfs.values()))
        for k in np.flatnonzero(counts_t.any(axis=0)):
            total = _window_sums(counts_t[:, k], w.window, starts, ends)
            window += weight[k] * total * (BM25_K1 + 1.0) / (total + BM25_K1)

    # Whoever asks counts only while the query names no sender: the named one is meant.
    by_asker = stream.by_asker
    if by_asker is None or stream.speaker_named.any():
        by_asker = np.zeros(n, dtype=bool)

    picked = _picked(stream, spread, starts, ends)
    at = np.array(picked, dtype=np.int64)
    features = {
        "similarity": sims[at].tolist(),
        "neighbour_similarity": neighbour_sim[at].tolist(),
        "lexical": _scale_by_max(bm25[at]),
        "window_lexical": _scale_by_max(window[at]),
        "neighbour_lexical": _scale_by_max(neighbour_lex[at]),
        "speaker": stream.speaker_named[at].astype(np.float64).tolist(),
        "asker": by_asker[at].astype(np.float64).tolist(),
        "named_day": (np.zeros(len(at)) if stream.on_named_day is None else stream.on_named_day[at])
        .astype(np.float64)
        .tolist(),
    }
    return picked, features


def score_stream(
    passages: Passages,
    idfs: Mapping[str, float],
    weights: StreamWeights | None = None,
) -> list[float | None]:
    """Fused scores of the candidate passages (``None`` for context-only rows)."""
    w = weights or StreamWeights()
    stream = _stream(passages)
    out: list[float | None] = [None] * len(stream)
    picked, features = stream_features(stream, idfs, w)
    if not picked:
        return out
    fused = weighted_fusion(features, w.for_stream(stream))
    for i, score in zip(picked, fused, strict=True):
        out[i] = score
    return out
