"""Stop words defined once (service.retrieval.terms) for search terms and for the offline day
summary: each side skips every word it skipped before the two lists were joined."""

from __future__ import annotations

import re
from datetime import date

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.historian.memories import day_summary
from service.memories.digest import Said
from service.retrieval.terms import (
    CHINESE_STOP_CHARS,
    COMMON_CHINESE_CHARS,
    ENGLISH_STOPWORDS,
    named_words,
    terms,
)

# The lists each side kept before they were merged.
SEARCH_CHARS = "的了着过吗呢吧啊呀哦嘛么哈是在和与及或也都就还又很太把被给让对"
SUMMARY_CHARS = (
    "的了是我你他她它在有和就不都也很这那吗呢吧啊哦嗯呀么个一上下人们到说要会去来还没么好把被给让"
)
SUMMARY_WORDS = [
    "the",
    "and",
    "for",
    "that",
    "this",
    "with",
    "have",
    "just",
    "what",
    "your",
    "you",
    "are",
    "was",
    "but",
    "not",
    "all",
    "can",
    "will",
    "they",
    "about",
    "from",
    "there",
    "been",
    "would",
]


def test_the_lists_hold_what_each_side_skipped() -> None:
    assert set(SEARCH_CHARS) == CHINESE_STOP_CHARS
    assert set(SEARCH_CHARS) | set(SUMMARY_CHARS) <= COMMON_CHINESE_CHARS
    assert set(SUMMARY_WORDS) <= ENGLISH_STOPWORDS


@pytest.mark.parametrize(
    ("question", "topic"),
    [
        ("年会的地点是什么？", {"地点"}),
        ("你送什么礼物？", {"礼物"}),
        ("哪天去爬山？", {"爬山"}),
        ("张三，马拉松在哪里？", {"马拉", "拉松"}),
        ("What is the venue, Mel?", {"venu"}),
    ],
)
def test_what_a_question_names_leaves_out_its_words_of_asking_and_people(
    question: str, topic: set[str]
) -> None:
    # Two texts sharing "什么" or "哪" or a name of the chat are not about one thing.
    assert named_words(question, ["张三", "Melanie"]) == topic


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "什么",
                "哪里",
                "哪天",
                "是",
                "的",
                "张三",
                "Melanie",
                "Mel",
                "年会",
                "爬山",
                "？",
                " ",
            ]
        ),
        max_size=12,
    )
)
def test_no_word_of_asking_nor_name_is_ever_a_named_word(pieces: list[str]) -> None:
    # Whatever a chat line is made of, what it names holds no word of asking and no part
    # of its people's names: two lines never relate through those alone. Chinese is written
    # right beside an English name ("跟Melanie说"); two English words have a space between.
    line = ""
    for piece in pieces:
        line += (
            f" {piece}"
            if line[-1:].isascii() and line[-1:].isalpha() and piece.isascii()
            else piece
        )
    named = named_words(line, ["张三", "Melanie"])
    assert not any(set(key) & set("什哪张三") for key in named), named
    assert not any(key.startswith("mel") for key in named), named


@pytest.mark.parametrize("char", sorted(set(SEARCH_CHARS)))
def test_a_function_character_is_no_search_term_alone_but_stays_in_bigrams(char: str) -> None:
    found = terms(f"西湖{char}划船")
    assert char not in found
    assert f"湖{char}" in found and f"{char}划" in found


@pytest.mark.parametrize("char", sorted(set(SUMMARY_CHARS) - set(SEARCH_CHARS)))
def test_a_common_word_stays_a_search_term(char: str) -> None:
    # "不去" and "去" must not read alike to search.
    assert char in terms(f"西湖{char}划船")


def test_the_day_summary_skips_function_words_of_both_former_lists() -> None:
    # Each function character between two words, twice: under a list without it, "湖着" and
    # "着划" would be topics of the day.
    chars = sorted(set(SEARCH_CHARS) | set(SUMMARY_CHARS))
    texts = [f"西湖{c}划船" for c in chars] * 2
    texts += ["they would have been there with your team about the Kotlin migration"] * 3
    said = [Said(None, t) for t in texts]
    summary = day_summary(date(2026, 2, 21), said, "Python 群")
    assert summary is not None
    # "…：0、1、2聊了 西湖 划船，Kotlin migration": the words after who talked.
    parts = summary.split("：", 1)[1].split("；")
    topics = [w for part in parts for w in re.split(r"[ ，]", part.split(" ", 1)[1])]
    assert "西湖" in topics and "划船" in topics and "Kotlin" in topics
    for topic in topics:
        assert not (set(topic) & COMMON_CHINESE_CHARS), topic
        assert topic not in ENGLISH_STOPWORDS, topic


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("哈哈哈", False),
        ("早", False),
        ("在吗", False),
        ("好的收到", False),
        ("晚安", False),
        ("lol", False),
        ("Thanks, you too!", False),
        ("狗", True),
        ("我的猫", True),
        ("周五聚餐", True),
        ("How are the kids?", True),
        # Set phrases of leave-taking and thanks, though their words name things elsewhere.
        ("Thanks! Take care!", False),
        ("No problem. Talk to you soon!", False),
        ("No worries, I'm here for you.", False),
        ("辛苦了，早点休息", False),
        ("好久不见！", False),
        ("没问题，回头聊", False),
        ("Take care of the dog while I'm away", True),
        ("Good luck with the exam!", True),
        ("考试加油", True),
        ("I care about the climate", True),
        ("Hello, how are you?", False),
        ("Thank you, I really appreciate it!", False),
        # A date names a day, though its digits are no topic word.
        ("What is she planning to do on 10.01.2024?", True),
        ("5月3日那天呢？", True),
    ],
)
def test_a_message_names_something_unless_it_is_chit_chat(text: str, names: bool) -> None:
    """What a turn is handed rests on it: a message that names nothing gets no memories."""
    from service.retrieval.terms import names_something

    assert names_something(text) is names


@pytest.mark.parametrize(
    ("text", "people", "names"),
    [
        ("Hey Mel! Good to see you!", ["Melanie", "Caroline"], False),
        ("Hi Caroline!", ["Caroline"], False),
        ("Hey Mel, how was the pottery class?", ["Melanie"], True),
        ("Hey Mel!", [], True),
        ("Melbourne next week?", ["Melanie"], True),
        ("王芳早", ["王芳"], False),
        ("王芳明天去西湖吗", ["王芳"], True),
        ("Morning John Smith", ["John Smith"], False),
        ("Hey Anna!", ["Joanna"], True),  # the start of a name, not any part of it
    ],
)
def test_greeting_someone_of_the_conversation_names_nothing(
    text: str, people: list[str], names: bool
) -> None:
    from service.retrieval.terms import names_something

    assert names_something(text, people) is names
