"""The rule rewriter and the gate on fixed moments, in Chinese and English."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from service.historian.absolutize import Person, Situation, absolutize, cn_number
from service.historian.gate import gate, id_drift

SHANGHAI = ZoneInfo("Asia/Shanghai")
# Saturday 2026-02-21 23:30 in Shanghai (15:30 UTC).
LATE_SATURDAY = datetime(2026, 2, 21, 23, 30, tzinfo=SHANGHAI)
SPEAKER = Person("张三", "10001")
BOT = Person("小助手", "20002")


def rewrite(text: str, moment: datetime = LATE_SATURDAY, location: str | None = "上海") -> str:
    return absolutize(text, Situation(moment, SPEAKER, BOT, location))


@pytest.mark.parametrize(
    ("text", "expected_parts", "gone"),
    [
        ("我明天去北京", ["张三(10001)", "2026-02-22", "去北京"], ["我", "明天"]),
        ("我昨天加班到很晚", ["张三(10001)", "2026-02-20"], ["昨天"]),
        ("前天下雨了", ["2026-02-19"], ["前天"]),
        ("我后天考试", ["2026-02-23"], ["后天"]),
        ("然后天气就变冷了", ["然后天气就变冷了"], []),
        (
            "你刚才帮我修好了 bug",
            ["小助手(20002)", "2026-02-21 23:30", "张三(10001)"],
            ["你", "刚才"],
        ),
        ("我下周三要交报告", ["2026-02-25"], ["下周三"]),
        ("我上周五见了老板", ["2026-02-13"], ["上周五"]),
        ("我周五去了杭州", ["2026-02-20"], ["周五"]),  # past tense: the last Friday
        ("我周一要开会", ["2026-02-23"], ["周一"]),  # future: the coming Monday
        ("我下周要出差", ["2026-02-23至2026-03-01"], ["下周"]),
        ("我上个月换了工作", ["2026年1月"], ["上个月"]),
        ("我下个月结婚", ["2026年3月"], ["下个月"]),
        ("我去年去过日本", ["2025年"], ["去年"]),
        ("三天后我要考试", ["2026-02-24"], ["三天后"]),
        ("两周前我搬家了", ["2026-02-02至2026-02-08"], ["两周前"]),
        ("我今晚不睡了", ["2026-02-21晚上"], ["今晚"]),
        ("我在这里住了五年", ["上海"], ["这里"]),
        ("我们下周去爬山", ["我们"], ["下周"]),  # 我们 is ambiguous in a group: left alone
        ("I will fly to Tokyo tomorrow", ["张三(10001) will fly to Tokyo on 2026-02-22"], []),
        ("I'm moving here next month", ["张三(10001) is moving in 上海 in March 2026"], []),
        ("I met my sister last Friday", ["张三(10001) met 张三's sister on 2026-02-13"], []),
        ("I went to Paris 3 days ago", ["on 2026-02-18"], ["ago"]),
        ("Can you remind me until tomorrow", ["小助手(20002)", "until 2026-02-22"], [" me "]),
        ("She called this morning", ["She called on the morning of 2026-02-21"], []),
        ("we had dinner yesterday evening", ["on the evening of 2026-02-20"], []),
    ],
)
def test_rule_rewrites(text: str, expected_parts: list[str], gone: list[str]) -> None:
    result = rewrite(text)
    for part in expected_parts:
        assert part in result, (text, result)
    for word in gone:
        assert word not in result, (text, result)


def test_a_speaker_is_named_in_full_once_then_by_name() -> None:
    # A text saying "I" five times carries its speaker's id once: the rest reads as prose.
    said = "I'm sure my cat likes me, I feed her, and you know I love her"
    out = rewrite(said)
    assert out.count("10001") == 1 and out.count("张三") == 5, out
    assert out.startswith("张三(10001) is sure 张三's cat likes 张三"), out
    assert "小助手(20002) know" in out
    cn = rewrite("我说过我喜欢猫，你也说过你喜欢")
    assert cn.count("(10001)") == 1 and cn.count("张三") == 2, cn
    assert cn.count("(20002)") == 1 and cn.count("小助手") == 2, cn
    # An id that is the name in other letters adds nothing: "Caroline (caroline)" is noise.
    same = Situation(LATE_SATURDAY, Person("Caroline", "caroline"), BOT, None)
    assert absolutize("I paint", same) == "Caroline paint"
    # Each text starts afresh: the first mention of the next one is in full again.
    assert rewrite("I paint").startswith("张三(10001)")


def test_names_are_written_as_they_are_never_read_as_patterns() -> None:
    # A chat name chosen to look like a regex replacement template stays literal.
    for name in (r"\g<0>", r"\1", "$&", "a(b"):
        out = absolutize("I told you", Situation(LATE_SATURDAY, Person(name, "7"), BOT, None))
        assert out.startswith(f"{name}") and "(7) told 小助手(20002)" in out, (name, out)


def test_the_date_follows_the_events_own_timezone() -> None:
    # 23:30 in Shanghai is still 15:30 UTC on the same day; in New York it is 10:30.
    new_york = datetime(2026, 2, 21, 10, 30, tzinfo=ZoneInfo("America/New_York"))
    assert "2026-02-22" in rewrite("我明天去北京", LATE_SATURDAY)
    assert "2026-02-22" in rewrite("我明天去北京", new_york)
    just_after_midnight = datetime(2026, 2, 22, 0, 5, tzinfo=SHANGHAI)
    assert "2026-02-23" in rewrite("我明天去北京", just_after_midnight)


def test_unknown_people_and_places_are_left_for_the_llm() -> None:
    anonymous = Situation(LATE_SATURDAY, Person(None, None), Person(None, None), None)
    out = absolutize("我觉得这里的咖啡不错", anonymous)
    assert "我" in out and "这里" in out
    assert {h.kind for h in gate(out)} == {"pronoun", "relative_place"}


def test_cn_numbers() -> None:
    assert [cn_number(t) for t in ["3", "三", "两", "十", "十二", "二十", "二十五", "百"]] == [
        3,
        3,
        2,
        10,
        12,
        20,
        25,
        None,
    ]


@pytest.mark.parametrize(
    ("text", "kinds"),
    [
        ("他明天来", {"pronoun", "relative_time"}),
        ("张三(10001) 2026-02-22 去北京", set()),
        ("其他同事和吉他老师 2026-02-22 到上海", set()),
        ("我们在那边集合", {"pronoun", "relative_place"}),
        ("最近天气不好", {"relative_time"}),
        ("She said it is here", {"pronoun", "relative_place"}),
        ("There is a party on 2026-02-21 in Shanghai", set()),
        ("The US team won on 2026-02-21", set()),
        ("Alice will come back tomorrow", {"relative_time"}),
        ("张三(10001) 2026-02-21至2026-02-22周末 去爬山", set()),
    ],
)
def test_gate(text: str, kinds: set[str]) -> None:
    assert {hit.kind for hit in gate(text)} == kinds


def test_id_drift() -> None:
    original = "QQ 12345678 的用户说他明天去北京"
    assert [h.text for h in id_drift(original, "用户 2026-02-22 去北京")] == ["12345678"]
    assert id_drift(original, "用户12345678 2026-02-22 去北京") == []
    # Dates and times are not ids.
    assert id_drift("2026-02-22 23:30 见面", "见面") == []
