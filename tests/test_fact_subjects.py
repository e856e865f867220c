"""Who a fact is about: the bot spoken to is never its subject, English first person agrees
with its verb once it names the speaker, and a group rule is the group's."""

from __future__ import annotations

import json
import re
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from service.historian.absolutize import Person, Situation
from service.historian.profiles import announces_for_group, of_the_member
from service.historian.statements import draft, offline_statements
from service.historian.subjects import _UNCHANGED, in_third_person, unaddressed
from service.profiles.service import Fact
from tests.dev_chats import BENCH

BOT = Person("小助手", "20002")
ALICE = Person("Alice", "10001")
ZHANG = Person("张三", "10001")
MOMENT = datetime(2026, 2, 21, 23, 30, tzinfo=ZoneInfo("Asia/Shanghai"))


def said_by(person: Person) -> Situation:
    return Situation(MOMENT, person, BOT, None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("小助手，李四对花生过敏", "李四对花生过敏"),
        ("@小助手 我下周三生日", "我下周三生日"),
        ("[CQ:at,qq=20002] 我住在上海", "我住在上海"),
        ("嘿 小助手：我在阿里工作", "我在阿里工作"),
        ("我住在上海，小助手", "我住在上海"),
        ('<at qq="20002"/> 我养了一只猫', "我养了一只猫"),
        # Not an address to the bot: kept as it is.
        ("小助手们好", "小助手们好"),
        ("小助手的名字真好听", "小助手的名字真好听"),
        ("[CQ:at,qq=30003] 你好", "[CQ:at,qq=30003] 你好"),
    ],
)
def test_addresses_to_the_bot_are_taken_off(text: str, expected: str) -> None:
    assert unaddressed(text, BOT) == expected


def test_a_fact_told_to_the_bot_is_about_the_person_it_names() -> None:
    [statement] = offline_statements("小助手，记住李四对花生过敏", said_by(ZHANG), BOT)
    assert statement.text == "李四对花生过敏"
    [statement] = offline_statements("@小助手 记住我对花生过敏", said_by(ZHANG), BOT)
    assert statement.text == "张三(10001)对花生过敏"


_BOT_NAMES = st.text(
    alphabet=st.characters(whitelist_categories=("Lo", "Lu", "Ll")), min_size=2, max_size=8
)


@settings(max_examples=150, deadline=None)
@given(
    name=_BOT_NAMES,
    bot_id=st.from_regex(r"[1-9][0-9]{4,9}", fullmatch=True),
    how=st.sampled_from(["{n}，", "{n}, ", "@{n} ", "[CQ:at,qq={i}] ", "嘿 {n}：", "hey {n}, "]),
    fact=st.sampled_from(
        [
            "记住我住在上海",
            "我在阿里巴巴做前端开发",
            "remember that I live in Paris",
            "我家猫叫咪咪",
        ]
    ),
)
def test_no_bot_name_in_front_of_a_fact_reaches_the_stored_fact(
    name: str, bot_id: str, how: str, fact: str
) -> None:
    speaker = Person("Alice", "10001")
    # A name the fact itself or the speaker's label holds would be found for no fault.
    assume(name.casefold() not in f"{fact} alice (10001) is has".casefold())
    assume(bot_id not in "10001" and "10001" not in bot_id)
    bot = Person(name, bot_id)
    message = how.format(n=name, i=bot_id) + fact
    statements = offline_statements(message, Situation(MOMENT, speaker, bot, None), bot)
    assert statements, message
    for statement in statements:
        assert name not in statement.text and bot_id not in statement.text, statement
        assert statement.text.startswith("Alice"), statement


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I prefer to be called Ali", "Alice (10001) prefers to be called Ali"),
        ("I'm moving to Shenzhen", "Alice (10001) is moving to Shenzhen"),
        ("I am a nurse", "Alice (10001) is a nurse"),
        ("I have a cat", "Alice (10001) has a cat"),
        ("I've got two dogs", "Alice (10001) has got two dogs"),
        ("I don't like spicy food", "Alice (10001) doesn't like spicy food"),
        ("I do not eat pork", "Alice (10001) does not eat pork"),
        ("I can swim", "Alice (10001) can swim"),
        ("I will call", "Alice (10001) will call"),
        ("I should rest", "Alice (10001) should rest"),
        ("I go to NYU", "Alice (10001) goes to NYU"),
        ("I do yoga", "Alice (10001) does yoga"),
        ("I try hard", "Alice (10001) tries hard"),
        ("I fix cars", "Alice (10001) fixes cars"),
        ("I need sleep", "Alice (10001) needs sleep"),
        ("I really love my cat Mochi", "Alice (10001) really loves Alice's cat Mochi"),
        ("I went home", "Alice (10001) went home"),
        ("I didn't go", "Alice (10001) didn't go"),
        ("I'll be late", "Alice (10001) will be late"),
        ("My cat Mochi is asleep", "Alice (10001)'s cat Mochi is asleep"),
    ],
)
def test_english_first_person_agrees_with_its_verb(text: str, expected: str) -> None:
    assert in_third_person(text, ALICE) == expected


_VERBS = st.from_regex(r"[a-z]{2,9}", fullmatch=True).filter(
    lambda v: (
        v not in {"can", "could", "will", "would", "shall", "should", "may", "might"}
        and v not in {"must", "ought", "used", "was", "were", "did", "had", "put", "cut", "set"}
        and v not in {"hit", "let", "quit", "read", "cost", "hurt", "shut", "bet", "fit", "spread"}
        and not (v.endswith("ed") and not v.endswith("eed"))
    )
)


@settings(max_examples=300, deadline=None)
@given(verb=_VERBS, rest=st.sampled_from(["", " it", " to the gym", " every day"]))
def test_any_present_verb_after_i_changes_for_a_name(verb: str, rest: str) -> None:
    out = in_third_person(f"I {verb}{rest}", ALICE)
    if verb in {"also", "just", "really", "still", "always", "never", "often", "usually"}:
        return  # an adverb, not the verb
    match = re.fullmatch(r"Alice \(10001\) (\S+)" + re.escape(rest), out)
    assert match, out
    assert match.group(1) != verb or verb in _UNCHANGED, out


@pytest.mark.parametrize(
    "text",
    [
        "群规：不许发广告",
        "本群禁止刷屏",
        "大家注意，周五前交周报",
        "以后群里只聊技术",
        "From now on everyone posts in English",
        "Group rule: no spoilers",
        "No spamming in this group",
    ],
)
def test_a_group_rule_goes_to_the_group_not_the_speaker(text: str) -> None:
    assert announces_for_group(text)
    [statement] = offline_statements(text, said_by(ZHANG), BOT)
    assert statement.for_group
    fact = Fact(draft(text, said_by(ZHANG)), "2026-02-21")
    assert of_the_member([fact]) == []


@pytest.mark.parametrize("text", ["我在群里最活跃", "I like this group a lot", "今天群里好热闹"])
def test_talk_about_the_group_is_no_rule(text: str) -> None:
    assert not announces_for_group(text)


def _bench_turns() -> list[str]:
    texts = []
    for name in ("locomo_dev.jsonl", "realtalk_dev.jsonl"):
        path = BENCH / name
        if not path.exists():
            continue
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                record = json.loads(line)
                if record.get("kind") == "turn" and re.search(r"\bI\b", record["text"]):
                    texts.append(record["text"].replace("’", "'"))
    return texts


# A bare first-person verb right after the speaker's name, where the subject starts.
_BARE = re.compile(
    r"(?:^|[.!?] )Elise \(10001\) (?:(?:really|also|just|still|always) )*"
    r"(?:am|are|have|do|go|like|love|work|live|want|think|feel|need|prefer|enjoy|try|know)\b"
)


def test_dev_chats_first_person_agrees_everywhere() -> None:
    turns = _bench_turns()
    if not turns:
        pytest.skip("the dev chats are not on this machine")
    elise = Person("Elise", "10001")
    checked = 0
    for text in turns:
        out = in_third_person(text, elise)
        assert not re.search(r"\bI\b|\bI'm\b|\bmy\b", out), (text, out)
        assert not _BARE.search(out), (text, out)
        checked += 1
    assert checked > 1000
