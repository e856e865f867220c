"""The retrieval building blocks: terms, fusion, time decay, repeats, neighbour scoring."""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import replace
from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import numpy as np
import pytest

from service.embedding.base import Calibration
from service.retrieval import floods
from service.retrieval import terms as terms_module
from service.retrieval.dates import MAX_NAMED, days_named, envelope, on_days
from service.retrieval.fusion import (
    decay,
    distinct_nearest,
    first_distinct,
    first_distinct_read,
    first_of_each,
    reciprocal_rank_fusion,
    scale_by_max,
    scale_min_max,
    time_decayed,
    weighted_fusion,
)
from service.retrieval.neighbours import (
    Stream,
    StreamPassage,
    StreamWeights,
    idf,
    score_stream,
    stream_features,
)
from service.retrieval.terms import (
    names_in,
    query_terms,
    stem,
    terms,
    to_tsquery_literal,
    to_tsvector_literal,
)

DAY = 86400.0


def test_a_chinese_word_is_found_inside_an_unsegmented_sentence() -> None:
    sentence = set(terms("我想去杭州西湖划船"))
    assert set(query_terms("西湖")) <= sentence
    assert "西湖" in sentence and "杭州" in sentence
    # Function characters are not terms alone, but stay inside bigrams.
    assert "的" not in terms("我的猫") and "我的" in terms("我的猫")


def test_english_is_lowercased_stemmed_and_stopwords_dropped() -> None:
    assert terms("She was PAINTING the sunsets") == ["paint", "sunset"]
    for a, b in [
        ("painted", "paints"),
        ("hiking", "hike"),
        ("studies", "studying"),
        ("running", "runs"),
        ("Caroline's", "caroline"),
    ]:
        assert stem(terms(a)[0]) == stem(terms(b)[0]), (a, b)
    assert terms("what is it that you did?") == []


def test_mixed_text_numbers_and_curly_apostrophes() -> None:
    found = terms("Melanie’s 2023 trip 去了 Tokyo")
    assert {"melani", "2023", "trip", "tokyo", "去了"} <= set(found)


def test_literals_keep_term_frequency_and_quote_safely() -> None:
    assert to_tsvector_literal(["paint", "lake", "paint"]) == "'paint':1,3 'lake':2"
    assert to_tsquery_literal(["西湖", "西湖", "o'k"]) == "'西湖' | 'o\\'k'"


def test_names_in_query() -> None:
    assert names_in("What did Caroline paint?", "Caroline")
    assert names_in("what did caroline's sister say", "Caroline Smith")
    assert not names_in("what about Carol?", "Caroline")
    assert names_in("小明昨天说了什么", "王小明")
    assert not names_in("三点开会", "张三")
    assert not names_in("anything", None)


def test_reciprocal_rank_fusion() -> None:
    scores = reciprocal_rank_fusion([["a", "b", "c"], ["b", "d"]], k=60)
    assert scores["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert scores["a"] == pytest.approx(1 / 61)
    assert max(scores, key=lambda item: scores[item]) == "b"


def test_weighted_fusion_and_scaling() -> None:
    assert scale_by_max([2.0, 1.0, 0.0]) == [1.0, 0.5, 0.0]
    assert scale_by_max([0.0, 0.0]) == [0.0, 0.0]
    assert scale_min_max([3.0, 1.0, 2.0]) == [1.0, 0.0, 0.5]
    assert scale_min_max([2.0, 2.0]) == [1.0, 1.0]
    fused = weighted_fusion(
        {"dense": [0.8, 0.4], "lexical": [0.0, 1.0]}, {"dense": 3, "lexical": 1}
    )
    assert fused == pytest.approx([0.6, 0.55])
    with pytest.raises(ValueError, match="positive weight"):
        weighted_fusion({"dense": [1.0]}, {"dense": 0})


def test_time_decay_worked_numbers() -> None:
    settings = {"half_life_days": 14.0, "boost": 0.2, "min_similarity": 0.35}
    # One half-life old: decay 0.5, so 0.8 * (1 + 0.2 * 0.5) = 0.88.
    assert decay(14 * DAY, 14.0) == pytest.approx(0.5)
    assert time_decayed(0.8, 0.8, 14 * DAY, **settings) == pytest.approx(0.88)
    # Just now: the full boost.
    assert time_decayed(0.8, 0.8, 0.0, **settings) == pytest.approx(0.96)
    # Below the similarity threshold: unchanged, however fresh.
    assert time_decayed(0.3, 0.3, 0.0, **settings) == 0.3
    # Very old: no boost left; the future counts as now.
    assert time_decayed(0.8, 0.8, 3650 * DAY, **settings) == pytest.approx(0.8)
    assert decay(-DAY, 14.0) == 1.0
    # A search's candidates at once: each as alone.
    scores, sims = np.array([0.8, 0.8, 0.3, 0.8]), np.array([0.8, 0.8, 0.3, 0.35])
    ages = np.array([14 * DAY, 0.0, 0.0, -DAY])
    assert time_decayed(scores, sims, ages, **settings).tolist() == pytest.approx(
        [0.88, 0.96, 0.3, 0.96]
    )


def test_similarity_is_read_on_the_models_scale() -> None:
    raw = Calibration()
    assert raw.similarity(0.8) == pytest.approx(0.8) and raw.similarity(1.3) == 1.0
    e5 = Calibration(floor=0.77, ceiling=0.98)
    assert e5.similarity(0.98) == pytest.approx(1.0) and e5.similarity(0.99) == 1.0
    assert e5.similarity(0.77) == pytest.approx(0.0)
    # Below the floor the order is kept: a weak match still beats none.
    assert e5.similarity(0.70) > e5.similarity(0.60)
    # Unrelated (median 0.77) and related (0.87) pairs fall either side of min_similarity.
    assert e5.similarity(0.80) < 0.35 < e5.similarity(0.87)


def test_only_the_same_statement_is_dropped_not_news_that_reads_alike() -> None:
    a = np.array([1.0, 0.0, 0.0], dtype=np.float32)
    almost_a = np.array([0.999, 0.0447, 0.0], dtype=np.float32)
    almost_a /= np.linalg.norm(almost_a)
    b = np.array([0.0, 1.0, 0.0], dtype=np.float32)
    texts = [
        "我在超市买了一台新电视",
        "我在超市买了一台新冰箱",
        "我在超市买了一台新电视。",
        "周末去爬山",
    ]
    vectors = [a, almost_a, almost_a, b]
    # The fridge is as close in meaning as the repeat, but other news: kept.
    assert first_distinct(texts, vectors, 4, 0.97) == [0, 1, 3]
    assert first_distinct(texts, vectors, 2, 0.97) == [0, 1]
    # On another occasion the same words are another happening.
    assert first_distinct(texts, vectors, 4, 0.97, lambda n, m: False) == [0, 1, 2, 3]
    # Without vectors only the same words (spacing and punctuation aside) repeat.
    assert first_distinct(texts, [None] * 4, 4, 0.97) == [0, 1, 3]
    assert first_distinct([], [], 3, 0.97) == []


def test_each_text_is_compacted_once_however_many_it_is_compared_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An archive search keeps up to 200 results of 600 read, each compared with every one
    kept: compacting both texts for every pair made a private chat's search of 300 long
    messages (20,000 characters each, one sender) take 17 s of the event loop."""
    compacted: list[str] = []
    compact = terms_module.compact

    def counted(text: str) -> str:
        compacted.append(text)
        return compact(text)

    monkeypatch.setattr(terms_module, "compact", counted)
    filler = " and then we talked about the weather" * 50
    texts = [f"report {n}: {filler}" for n in range(300)]
    same = np.array([1.0, 0.0, 0.0], dtype=np.float32)
    # Alike in meaning and length, told apart by their numbers: none repeats another.
    assert first_distinct(texts, [same] * 300, 200, 0.97) == list(range(200))
    assert len(compacted) == len(set(compacted)) <= 300


def test_copies_varied_to_pass_for_new_text_are_one_statement_and_other_words_are_not() -> None:
    """A spammer varies each copy so that it is not the same text: a counter, emoji,
    punctuation, spacing, case, full-width and zero-width characters. Each is the same
    statement (one digest); past ten copies a day, all but the latest are left unindexed.
    Other words stay other statements, so do a bot's notices told apart by a number within
    their words, and a text of no letters is told by its digits."""
    ad = "王芳 买车找我 Call NOW"
    copies = [
        ad,
        "王芳买车找我call now【1372】",
        "王芳\u3000买车找我\u3000ＣＡＬＬ ＮＯＷ！！！",
        "😀 王芳 买车找我 Call NOW 😀😀 12:30",
        "王\u200b芳 买车\u200d找我 Call-NOW",
        "王芳，买车：找我；Call_NOW ~~~ #88",
    ]
    assert len({floods.digest(copy) for copy in copies}) == 1
    others = ["王芳 买房找我 Call NOW", "王芳 买车找他 Call NOW", "666", "888", "？？", "!!"]
    others += ["PR #1234 merged", "PR #1235 merged", "订单 12345 已发货", "订单 12346 已发货"]
    assert len({floods.digest(text) for text in [ad, *others]}) == len(others) + 1
    assert floods.digest("６６ 6") == floods.digest("666")

    # Words past the first SHAPE_CHARS characters are not read, however long the text.
    long = "王芳买车找我" * 200_000
    assert floods.digest(long) == floods.digest(long[: floods.SHAPE_CHARS] + "另一段话")

    at = datetime(2026, 3, 1, 8, tzinfo=UTC)

    def rows(n: int) -> list[dict[str, object]]:
        return [
            {"conversation_key": "g:1", "sender_id": "ads", "text": copies[i % 6], "at": at}
            for i in range(n)
        ]

    assert floods.unindexed(floods.new_copies(rows(10), "at")) == []
    eleven = rows(11)
    floods.unindexed(floods.new_copies(eleven, "at"))
    assert ["lexical" in row for row in eleven] == [True] * 10 + [False]


def test_a_flood_of_long_near_copies_is_told_apart_quickly() -> None:
    """Thirty 20,000-character messages, each one character off the others and all close in
    meaning: the repeat check over a search's pool stays fast, and they are one result."""
    rng = random.Random(3)
    base = [chr(0x4E00 + rng.randrange(3000)) for _ in range(20_000)]
    texts = []
    for _ in range(30):
        copy = list(base)
        copy[rng.randrange(20_000)] = "变"
        texts.append("".join(copy))
    vector = np.ones(4, dtype=np.float32) / 2
    started = time.process_time()
    kept = first_distinct(texts, [vector] * 30, 10, 0.97)
    assert time.process_time() - started < 0.5
    assert kept == [0]
    # Lengths far apart are never the same wording.
    assert first_distinct([texts[0], texts[0][:15_000]], [vector] * 2, 2, 0.97) == [0, 1]


def test_idf_is_positive_and_falls_with_frequency() -> None:
    assert idf(1000, 1) > idf(1000, 100) > idf(1000, 1000) > 0
    assert idf(10, 50) == pytest.approx(idf(10, 10))


def test_a_reply_is_found_through_the_message_it_answers() -> None:
    """The short answer after a message naming the topic outranks an unrelated message with
    the same similarity of its own."""
    weights = StreamWeights(window=2, similarity_reach=1, lexical_reach=1)
    stream = [
        StreamPassage(0.70, 0.0, candidate=False),
        StreamPassage(0.80, 2.0, {"trip": 1}),  # "how was the trip?"
        StreamPassage(0.75, 0.0),  # "amazing, we saw the lake"
        StreamPassage(0.70, 0.0),
        StreamPassage(0.70, 0.0),
        StreamPassage(0.75, 0.0),  # unrelated, equally similar
        StreamPassage(0.70, 0.0, candidate=False),
    ]
    scores = score_stream(stream, {"trip": math.log(2.0)}, weights)
    assert scores[0] is None and scores[-1] is None
    assert scores[2] is not None and scores[5] is not None
    assert scores[1] == max(s for s in scores if s is not None)
    assert scores[2] > scores[5]


def test_the_speaker_named_in_the_query_counts() -> None:
    stream = [StreamPassage(0.8, 0.0, speaker_named=True), StreamPassage(0.8, 0.0)]
    first, second = score_stream(stream, {})
    assert first is not None and second is not None and first > second


def _group(
    senders: list[str], sims: list[float], matches: dict[int, tuple[str, float]]
) -> list[StreamPassage]:
    """A stream of one passage per sender, a minute apart; ``matches``: the query term and
    BM25 of the passages that hold one, by position."""
    return [
        StreamPassage(
            sim,
            matches[n][1] if n in matches else 0.0,
            {matches[n][0]: 1} if n in matches else {},
            at=60.0 * n,
            sender=sender,
        )
        for n, (sender, sim) in enumerate(zip(senders, sims, strict=True))
    ]


def test_in_a_many_speaker_group_the_exact_detail_beats_similar_news_of_others() -> None:
    """Many people's news in a row: the message holding the asked detail wins over one a
    little closer in meaning that holds only a common word and sits among messages closer
    still, because other people's messages are not its context."""
    senders = [f"user-{n:03d}" for n in range(12)]
    sims = [0.80, 0.80, 0.84, 0.80, 0.80, 0.80, 0.88, 0.89, 0.86, 0.89, 0.88, 0.80]
    stream = _group(senders, sims, {2: ("detail", 4.0), 8: ("common", 1.0)})
    idfs = {"detail": 3.0, "common": 0.3}
    scores = score_stream(stream, idfs)
    assert scores[2] is not None and scores[8] is not None
    assert scores[2] == max(s for s in scores if s is not None)
    # Read as a dialogue, the similar neighbourhood would have carried the other one (its
    # similarity alone: the terms over the window left out on both readings).
    alone = StreamWeights(window_lexical=0)
    as_group = score_stream(stream, idfs, alone)
    assert as_group[2] is not None and as_group[8] is not None and as_group[2] > as_group[8]
    as_dialogue = score_stream(stream, idfs, replace(alone, dialogue_speakers=len(senders)))
    assert as_dialogue[8] is not None and as_dialogue[2] is not None
    assert as_dialogue[8] > as_dialogue[2]


def test_in_a_two_person_dialogue_the_reply_still_gains_from_its_neighbours() -> None:
    """Between two people, the answer right after the turn naming the topic is lifted by it
    above an equally similar turn elsewhere; were turns read alone, the two would tie."""
    senders = ["alice", "bob"] * 15
    sims = [0.80] * 30
    sims[6] = 0.88
    stream = _group(senders, sims, {6: ("detail", 3.0)})  # 6 names the topic, 7 answers
    together = score_stream(stream, {"detail": 2.0})
    alone = score_stream(stream, {"detail": 2.0}, StreamWeights(dialogue_speakers=1))
    assert together[7] is not None and together[25] is not None
    assert alone[7] is not None and alone[25] is not None
    assert together[7] > together[25]
    assert alone[7] == pytest.approx(alone[25])


def test_a_long_streams_lone_notes_get_no_neighbour_evidence_from_rounding() -> None:
    """Months of a dialogue, its first 5,000 turns full of matches (BM25 up to 30), then
    notes written hours apart, each holding a query term: a note has no neighbours, so the
    neighbours' lexical evidence is 0 for each and their order is their own features'.
    (Running sums over the stream left ±1e-11 there, the rounding of everything before,
    which scaling by the largest blew up to ±1 and shuffled the notes.)"""
    rng = np.random.default_rng(5)
    early = [
        StreamPassage(
            0.80,
            float(rng.uniform(0, 30)),
            {"lake": 1},
            candidate=False,
            at=60.0 * n,
            sender=("a", "b")[n % 2],
        )
        for n in range(5000)
    ]
    notes = [
        StreamPassage(0.80 + 0.001 * n, 5.3, {"lake": 1}, at=10**7 + 7200.0 * n, sender="a")
        for n in range(40)
    ]
    picked, features = stream_features(Stream.of(early + notes), {"lake": 1.0}, StreamWeights())
    assert picked == list(range(5000, 5040))
    assert features["neighbour_lexical"] == [0.0] * 40
    scores = score_stream(early + notes, {"lake": 1.0})[5000:]
    assert scores == sorted(scores), "alike but for their similarity, the notes follow it"


# The dialogue weights applied to every stream, as the ranking was before groups had their own.
_DIALOGUE_WEIGHTS_EVERYWHERE = StreamWeights(
    group_lexical=StreamWeights().lexical,
    group_neighbour_similarity=StreamWeights().neighbour_similarity,
    group_neighbour_lexical=StreamWeights().neighbour_lexical,
)


def test_in_a_group_the_rare_exact_terms_beat_another_speakers_closer_meaning() -> None:
    """Among a dozen people, the message holding the question's rare terms outranks another
    person's message much closer in meaning; a dialogue of the same messages ranks exactly as
    before, where closeness in meaning wins."""
    sims = [0.80] * 12
    # Close in meaning, none of the asked terms; within the window of the passage holding
    # them, so that the terms over the window do not tell the two apart in a dialogue.
    sims[5] = 0.92
    matches = {2: ("tesla", 4.0)}  # the asked rare term
    idfs = {"tesla": 3.0}

    group = _group([f"user-{n:03d}" for n in range(12)], sims, matches)
    scores = score_stream(group, idfs)
    assert scores[2] is not None and scores[5] is not None
    assert scores[2] == max(s for s in scores if s is not None)
    before = score_stream(group, idfs, _DIALOGUE_WEIGHTS_EVERYWHERE)
    assert before[2] is not None and before[5] is not None
    assert before[5] > before[2]  # what the group weights change

    pair = _group(["alice", "bob"] * 6, sims, matches)
    in_dialogue = score_stream(pair, idfs)
    assert in_dialogue == pytest.approx(score_stream(pair, idfs, _DIALOGUE_WEIGHTS_EVERYWHERE))
    assert in_dialogue[2] is not None and in_dialogue[5] is not None
    assert in_dialogue[5] > in_dialogue[2]


def test_the_group_weights_follow_the_number_of_senders() -> None:
    """Four senders are still a dialogue, five are a group; unknown senders count as one."""
    weights = StreamWeights()
    four = _group(["a", "b", "c", "d"] * 3, [0.8] * 12, {})
    five = _group(["a", "b", "c", "d", "e"] * 3, [0.8] * 15, {})
    unknown = [StreamPassage(0.8, 0.0, at=60.0 * n) for n in range(50)]
    assert weights.for_stream(four) == weights.feature_weights()
    assert weights.for_stream(unknown) == weights.feature_weights()
    assert weights.for_stream(five) == weights.feature_weights(in_dialogue=False)
    assert weights.for_stream(five)["lexical"] > weights.for_stream(four)["lexical"]


def test_a_run_of_one_senders_messages_stays_together_in_a_big_group() -> None:
    """In a big group, one person's consecutive messages are still each other's context."""
    senders = [f"u{n}" for n in range(10)]
    senders[5] = senders[4]  # u4 says two things in a row
    sims = [0.80] * 10
    sims[4] = 0.9
    stream = _group(senders, sims, {})
    scores = score_stream(stream, {})
    assert scores[5] is not None and scores[6] is not None and scores[3] is not None
    assert scores[5] > scores[3] and scores[5] > scores[6]


def test_two_conversations_in_one_stream_are_never_neighbours() -> None:
    first = [StreamPassage(0.95, 0.0, at=0.0, stream="a")]
    second = [
        StreamPassage(0.80, 0.0, at=1.0, stream="b"),
        StreamPassage(0.8, 0.0, at=2.0, stream="b"),
    ]
    scores = score_stream(first + second, {})
    assert scores[1] == pytest.approx(scores[2])


def test_the_days_a_question_names_with_their_year() -> None:
    def named(query: str) -> list[tuple[str, str]]:
        return [(a.isoformat(), b.isoformat()) for a, b in days_named(query)]

    day = [("2023-10-13", "2023-10-14")]
    assert named("What painting did Melanie show on October 13, 2023?") == day
    assert named("what happened on 13th Oct. 2023") == day
    assert named("the 13 of October 2023 meeting") == day
    assert named("我2023年10月13日去了哪里") == day
    assert named("2023 年 10 月 13 号") == day
    assert named("on 2023-10-13 or 2023/10/13") == day
    assert named("the picture shared on October 13,2023") == day
    assert named("Where did Maria hike in July 2023?") == [("2023-07-01", "2023-08-01")]
    assert named("2023年12月的活动") == [("2023-12-01", "2024-01-01")]
    # A named day of a month counts, not the whole month besides.
    assert named("in May 2023, on 3 May 2023") == [("2023-05-03", "2023-05-04")]
    # No year, no date; impossible days and years outside the calendar's reach are none.
    for none in ("on October 13", "上个月13号", "2023-02-30", "0000-01-01", "10000-01-01", "9"):
        assert named(none) == [], none
    assert named("31 February 2023") == [("2023-02-01", "2023-03-01")]
    assert named("9998-12-31") == [("9998-12-31", "9999-01-01")]


def test_a_text_full_of_dates_or_near_dates_is_read_quickly_and_capped() -> None:
    """A pasted log of a thousand dates names the first eight; 100,000 characters of
    digits, month names and 年月 that never complete a date are read in linear time."""
    log = " ".join(f"2023-{1 + n % 12:02d}-{1 + n % 28:02d}" for n in range(1000))
    assert len(days_named(log)) == MAX_NAMED
    for hostile in (
        "2023年" * 20_000,
        "1" * 100_000,
        "May " * 25_000,
        "13 October " * 10_000,
        "2023-10-" * 12_000,
    ):
        started = time.process_time()
        assert days_named(hostile[:100_000]) == []
        assert time.process_time() - started < 1.0


def test_on_days_reads_the_days_on_the_clocks_of_the_zone() -> None:
    # 2026-03-09 01:00 in Shanghai is still the 8th in UTC.
    at = np.array([datetime(2026, 3, 8, 17, 0, tzinfo=UTC).timestamp()])
    ninth = [(date(2026, 3, 9), date(2026, 3, 10))]
    assert on_days(at, ninth, ZoneInfo("Asia/Shanghai")).tolist() == [True]
    assert on_days(at, ninth, UTC).tolist() == [False]


def test_the_envelope_of_the_named_days_stays_within_the_range_asked_for() -> None:
    shanghai = ZoneInfo("Asia/Shanghai")
    spans = [(date(2026, 3, 9), date(2026, 3, 10)), (date(2026, 3, 1), date(2026, 3, 2))]
    start, end = envelope(spans, shanghai, None, None) or (None, None)
    assert start == datetime(2026, 3, 1, tzinfo=shanghai)
    assert end == datetime(2026, 3, 10, tzinfo=shanghai)
    cut = datetime(2026, 3, 5, tzinfo=UTC)
    assert envelope(spans, shanghai, cut, None) == (cut, end)
    assert envelope(spans, shanghai, None, cut) == (start, cut)
    assert envelope(spans, shanghai, datetime(2026, 4, 1, tzinfo=UTC), None) is None
    assert envelope([], shanghai, None, None) is None


def test_a_ranking_is_read_further_only_while_repeats_leave_too_few_to_show() -> None:
    """``first_distinct_read``, as both searches use it: rows are read whole for the best
    ``head`` of the ranking, twice as many each time the repeats among them leave fewer than
    top_k different. A member's line said 1,000 times at the top of a ranking of 100,000 is
    read past in a few doublings, not row by row nor the whole ranking; a ranking with fewer
    different statements than asked is read to its end once and shows what it has."""

    def run(ranking: list[str], k: int, head: int) -> tuple[list[str], list[int]]:
        reads: list[int] = []
        read_rows: set[int] = set()

        async def read(head: int) -> None:
            reads.append(head)
            read_rows.update(range(min(head, len(ranking))))

        def distinct(head: int) -> list[str]:
            assert set(range(min(head, len(ranking)))) <= read_rows  # only rows read whole
            return first_of_each(ranking[:head], lambda text: text)[:k]

        return asyncio.run(first_distinct_read(len(ranking), k, head, read, distinct)), reads

    flood = ["买车找我"] * 1_000 + [f"line {n}" for n in range(99_000)]
    shown, reads = run(flood, 12, 36)
    assert shown == ["买车找我", *(f"line {n}" for n in range(11))]
    assert reads == [36, 72, 144, 288, 576, 1_152]
    # Enough different among the first read: one read.
    assert run([f"line {n}" for n in range(500)], 12, 36)[1] == [36]
    # Fewer different than asked in the whole ranking: it is read to its end, and all shown.
    shown, reads = run(["a", "b"] * 300, 12, 36)
    assert shown == ["a", "b"] and reads[-1] >= 600 and len(reads) == 6
    assert run([], 12, 36) == ([], [36])


def test_the_nearest_skip_a_flood_of_any_size_and_miss_no_statement() -> None:
    """Items (distance, id, statement). Too few statements among the nearest: read four times
    deeper once (texts said a few times each end there); a flood's copies share a distance,
    and the readings past it skip the distances of the statements repeated and read those
    distances' statements apart: the result is the first of each statement of the whole
    ranking, and a flood of 100,000 copies costs the readings one of 100 costs."""

    def search(stream: list[tuple[float, int, str]]) -> tuple[list[str], list[str]]:
        ranked = sorted(stream)
        calls: list[str] = []

        async def read(depth: int, skipped: list[float]) -> list[tuple[float, int, str]]:
            calls.append("read")
            return [item for item in ranked if item[0] not in skipped][:depth]

        async def said_at(distances: list[float]) -> list[tuple[float, int, str]]:
            calls.append("said at")
            firsts: dict[str, tuple[float, int, str]] = {}
            for item in ranked:
                if item[0] in distances:
                    firsts.setdefault(item[2], item)
            return list(firsts.values())

        found = asyncio.run(
            distinct_nearest(read, said_at, 10, lambda i: i[2], 5, lambda i: i[:2], lambda i: i[0])
        )
        return [statement for _, _, statement in found], calls

    news = [(0.3 + n / 100, n, f"news {n}") for n in range(40)]
    # One member's copies at one distance, and the same words from four others at it too.
    chain = [(0.2, 90 + n, f"chain by m{n}") for n in range(4)]
    for size in (100, 100_000):
        ad = [(0.1, 1000 + n, "ad") for n in range(size)]
        found, calls = search([*ad, *chain, *news])
        assert found == [
            "ad",
            *(f"chain by m{n}" for n in range(4)),
            *(f"news {n}" for n in range(5)),
        ]
        assert calls == ["read", "read", "read", "said at"]
    # Every text four times: the deeper reading holds enough, and nothing is skipped.
    fours = [(0.1 + n // 4 / 100, n, f"text {n // 4}") for n in range(80)]
    found, calls = search(fours)
    assert found == [f"text {n}" for n in range(10)] and calls == ["read", "read"]
    # A second flood under the first: one more round, and no more than two.
    ad = [(0.1, 1000 + n, "ad") for n in range(300)]
    spam = [(0.15, 5000 + n, "spam") for n in range(300)]
    found, calls = search([*ad, *spam, *news])
    assert found[:3] == ["ad", "spam", "news 0"] and len(found) == 10
    assert calls == ["read", "read", "read", "said at", "read", "said at"]
    # Enough different statements at first, or no more to read: one reading.
    assert search(news)[1] == ["read"]
    assert search([(0.1, n, "ad") for n in range(7)])[1] == ["read"]
