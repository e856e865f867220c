"""The rule rewriter: relative times, pronouns and places made absolute, in Chinese and English.

It always runs first (and is the whole historian when no LLM is configured). It only replaces
what it can resolve without guessing: a day word against the event's local date, a
first-person pronoun against the known speaker, "here" against a known place. Anything it
cannot resolve (他, "she", "there") is left for the LLM and the gate.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta

_CN_DIGITS = {
    "零": 0,
    "一": 1,
    "二": 2,
    "两": 2,
    "三": 3,
    "四": 4,
    "五": 5,
    "六": 6,
    "七": 7,
    "八": 8,
    "九": 9,
    "十": 10,
}
_CN_WEEKDAY = {"一": 0, "二": 1, "三": 2, "四": 3, "五": 4, "六": 5, "日": 6, "天": 6}
_EN_WEEKDAY = {
    name: i
    for i, name in enumerate(
        ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
    )
}
_CJK = re.compile(r"[\u3400-\u9fff]")


@dataclass(frozen=True)
class Person:
    """Someone a pronoun can stand for."""

    name: str | None
    id: str | None

    @property
    def known(self) -> bool:
        return bool(self.name or self.id)

    def label(self) -> str:
        """``张三(10001)`` / ``Alice (10001)`` / the one part that is known."""
        if self.name and self.id and self.name.casefold() != self.id.casefold():
            sep = "" if _CJK.search(self.name) else " "
            return f"{self.name}{sep}({self.id})"
        return str(self.name or self.id)

    def mentions(self) -> Callable[[re.Match[str]], str]:
        """A replacement naming the person in full the first time, by name after: a text
        saying "I" five times names its speaker's id once."""
        said = False

        def mention(_: re.Match[str]) -> str:
            nonlocal said
            full, said = not said, True
            return self.label() if full else str(self.name or self.id)

        return mention


@dataclass(frozen=True)
class Situation:
    """What the rewriter knows about the moment of the event."""

    moment: datetime  # aware, local time of the event
    first_person: Person  # who "我"/"I" is (the speaker; for a memo, the bot)
    second_person: Person  # who "你"/"you" is (the bot; for a memo, the user)
    location: str | None = None


def absolutize(text: str, situation: Situation) -> str:
    """Rewrite what the rules can resolve; leave everything else as it is."""
    out, habits = _shield(text)
    out = _relative_times_cn(out, situation)
    out = _relative_times_en(out, situation)
    out = _pronouns_cn(out, situation)
    out = _pronouns_en(out, situation)
    out = _places(out, situation)
    return _tidy(_unshield(out, habits))


# ---------------------------------------------------------------- recurrences

# A day word governed by a quantifier names every such day, not one date: 每周五, 每个星期天,
# 隔周三, 逢周末, every (other) Friday, each Monday morning, weekly on Fridays. So does one
# said with an adverb of habit (我一般周五打球, 周末都去爬山, usually on Friday) or in the
# plural (on Sundays, Friday nights). Such a span is a recurrence: it is already as absolute as
# it gets, and no day rule may turn it into the date of one occurrence. The words a quantifier
# governs run on through a list (每周二和周四, 每周一、三、五, every Tuesday and Thursday).
_CN_NUMBER = r"[0-9一二两三四五六七八九十几]"
_CN_DAY_WORD = r"(?:(?:周|星期|礼拜)[一二三四五六日天末]|周末|双休日|工作日)"
_CN_DAYPART = r"(?:早上|早晨|上午|中午|下午|傍晚|晚上|夜里|夜间|凌晨)"
# 每/逢/隔 and what they count (每两周的, 每个月第一个, 隔周的), then the day words they govern.
_CN_QUANTIFIED = (
    rf"(?:每逢|每隔|每|逢|隔){_CN_NUMBER}*个?(?:(?:周|星期|礼拜|月|年)的?)?"
    rf"(?:第{_CN_NUMBER}+个)?{_CN_DAY_WORD}"
)
_CN_LIST = rf"(?:(?:和|与|跟|及|或|、|到|至|-|~){_CN_DAY_WORD})*"
_CN_HABIT_BEFORE = r"(?:一般|通常|平时|平常|经常|常常|往往|向来|一向|总是|照例|习惯)(?:在|于|是)?"
_CN_HABIT_AFTER = rf"(?={_CN_DAYPART}?(?:都|总|一般|通常|经常|常|照例|照常))"
_CN_HABIT = re.compile(
    rf"(?:{_CN_QUANTIFIED}){_CN_LIST}"
    rf"|{_CN_HABIT_BEFORE}{_CN_DAY_WORD}{_CN_LIST}"
    rf"|(?<![上下这本个每隔逢]){_CN_DAY_WORD}{_CN_LIST}{_CN_HABIT_AFTER}"
)
_EN_DAY = r"(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_EN_DAY_LIST = rf"(?:\s*(?:,|and|or|&|/)\s*(?:on\s+)?{_EN_DAY}s?\b)*"
_EN_HABIT = re.compile(
    # every / each (other, second, 2nd, few) + what it counts, and the days it governs
    rf"(?<![A-Za-z0-9_'])(?:every|each)\s+(?:other\s+|second\s+|third\s+|\d+(?:st|nd|rd|th)?\s+)?"
    rf"(?:{_EN_DAY}|week(?:end)?|month|year|day)\b"
    rf"(?:\s+(?:on\s+)?{_EN_DAY}s?\b)?{_EN_DAY_LIST}"
    rf"|\b(?:weekly|biweekly|fortnightly)\s+(?:on\s+)?{_EN_DAY}s?\b{_EN_DAY_LIST}"
    # the plural: on Sundays, Friday nights
    rf"|\b{_EN_DAY}s\b{_EN_DAY_LIST}"
    rf"|\b{_EN_DAY}\s+(?:mornings|afternoons|evenings|nights)\b"
    # said as a habit: usually on Friday, always Fridays
    rf"|\b(?:usually|always|normally|typically|generally|often)\s+"
    rf"(?:(?!next\b|last\b|this\b|coming\b)\w+\s+){{0,2}}(?:on\s+)?{_EN_DAY}\b"
    rf"{_EN_DAY_LIST}",
    re.I,
)
# A shielded span waits out the rules as one private-use character each (U+E000 on), which
# no rule's pattern matches.
_SHIELD_BASE = 0xE000
_SHIELD_ROOM = 0x1800
_PRIVATE_USE = re.compile(f"[{chr(_SHIELD_BASE)}-{chr(_SHIELD_BASE + _SHIELD_ROOM - 1)}]")


def recurrences(text: str) -> list[tuple[int, int]]:
    """Where ``text`` names a recurring day (每周五, every Friday, on Sundays): the spans."""
    spans = [m.span() for pattern in (_CN_HABIT, _EN_HABIT) for m in pattern.finditer(text)]
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _shield(text: str) -> tuple[str, list[str]]:
    spans = recurrences(text)[:_SHIELD_ROOM]
    if not spans or _PRIVATE_USE.search(text):
        # A text holding such characters already is rewritten unshielded: its own would be
        # read back as spans.
        return text, []
    parts: list[str] = []
    habits: list[str] = []
    last = 0
    for start, end in spans:
        parts += [text[last:start], chr(_SHIELD_BASE + len(habits))]
        habits.append(text[start:end])
        last = end
    parts.append(text[last:])
    return "".join(parts), habits


def _unshield(text: str, habits: list[str]) -> str:
    if not habits:
        return text
    return re.sub(
        f"[{chr(_SHIELD_BASE)}-{chr(_SHIELD_BASE + len(habits) - 1)}]",
        lambda m: habits[ord(m.group(0)) - _SHIELD_BASE],
        text,
    )


# ---------------------------------------------------------------- dates


def iso(day: date) -> str:
    return day.isoformat()


def week_start(day: date) -> date:
    """Weeks start on Monday (ISO 8601), as in China."""
    return day - timedelta(days=day.weekday())


def week_span(day: date) -> tuple[date, date]:
    start = week_start(day)
    return start, start + timedelta(days=6)


def month_shift(day: date, months: int) -> tuple[int, int]:
    index = day.year * 12 + (day.month - 1) + months
    return index // 12, index % 12 + 1


def on_the_calendar(replace: Callable[[re.Match[str]], str]) -> Callable[[re.Match[str]], str]:
    """A rule's rewrite, or the words left as they are where the day it names is off the
    calendar (years 1 to 9999): "99999999天后", or "tomorrow" said on 9999-12-30. The gate
    then flags them, and the turn's other items are stored as always."""

    def rewrite(m: re.Match[str]) -> str:
        try:
            return replace(m)
        except (OverflowError, ValueError):
            return m.group(0)

    return rewrite


# A word ending in "ed" is tried from its first character only: from every character of a
# long word (a run of Chinese is one \w run) the search was quadratic in the word's length.
_PAST = re.compile(
    r"了|过|已经|刚|\b(?:was|were|did|went|met|had|ago|yesterday|last)\b|\b\w+ed\b", re.I
)


def looks_past(text: str) -> bool:
    """A rough tense guess for a bare weekday: past if the sentence says so."""
    return bool(_PAST.search(text))


def bare_weekday(today: date, weekday: int, past: bool) -> date:
    """The nearest such weekday: the coming one, or the last one for past events."""
    delta = weekday - today.weekday()
    if past:
        return today + timedelta(days=delta if delta <= 0 else delta - 7)
    return today + timedelta(days=delta if delta >= 0 else delta + 7)


def cn_number(token: str) -> int | None:
    """Arabic digits or small Chinese numerals (一 … 九十九)."""
    if token.isdigit():
        return int(token)
    if not token or any(ch not in _CN_DIGITS for ch in token):
        return None
    if token == "十":  # noqa: S105 (a numeral, not a password)
        return 10
    if "十" in token:
        tens, _, ones = token.partition("十")
        return (_CN_DIGITS[tens] if tens else 1) * 10 + (_CN_DIGITS[ones] if ones else 0)
    return _CN_DIGITS[token] if len(token) == 1 else None


# ---------------------------------------------------------------- Chinese times

# A count is tried from its first digit or numeral only, as in the gate: from every digit of
# a long run it was quadratic in the run's length.
_CN_COUNT = r"((?<![0-9])[0-9]+|(?<![一二两三四五六七八九十])[一二两三四五六七八九十]+)"


def _relative_times_cn(text: str, s: Situation) -> str:
    today = s.moment.date()
    clock = s.moment.strftime("%H:%M")
    past = looks_past(text)

    def day(offset: int) -> str:
        return f" {iso(today + timedelta(days=offset))} "

    def span(start: date, end: date, suffix: str = "那一周") -> str:
        return f" {iso(start)}至{iso(end)}{suffix} "

    rules: list[tuple[str, Callable[[re.Match[str]], str]]] = [
        (r"(大前天)", lambda m: day(-3)),
        (r"(大后天)", lambda m: day(3)),
        (r"(前天)", lambda m: day(-2)),
        (r"(?<!然)(?<!之)(?<!以)(后天)(?!气|性|天)", lambda m: day(2)),
        (r"(今早|今晨)", lambda m: day(0).rstrip() + "早上 "),
        (r"(今晚|今夜)", lambda m: day(0).rstrip() + "晚上 "),
        (r"(昨晚|昨夜)", lambda m: day(-1).rstrip() + "晚上 "),
        (r"(明早)", lambda m: day(1).rstrip() + "早上 "),
        (r"(明晚)", lambda m: day(1).rstrip() + "晚上 "),
        (r"(今天|今日|今儿)", lambda m: day(0)),
        (r"(昨天|昨日|昨儿)", lambda m: day(-1)),
        (r"(明天|明日|明儿)", lambda m: day(1)),
        (r"(刚才|刚刚)", lambda m: f" {iso(today)} {clock} "),
        (r"(稍后|待会儿?|等会儿?|一会儿)", lambda m: f" {iso(today)} {clock}之后 "),
        (r"(现在|目前|眼下)", lambda m: f" {iso(today)} {clock} "),
        (r"(最近|近期|这几天|近来)", lambda m: f" 截至{iso(today)} "),
        (r"(前几天)", lambda m: f" {iso(today)}之前几天 "),
        (
            _CN_COUNT + r"(天|日)(前|后|之前|之后|以前|以后)",
            lambda m: _cn_days(m, today),
        ),
        (
            _CN_COUNT + r"个?(周|星期|礼拜)(前|后|之前|之后|以前|以后)",
            lambda m: _cn_weeks(m, today),
        ),
        (
            r"(下下|上上|上|下|这|本)?个?(周|星期|礼拜)([一二三四五六日天末])",
            lambda m: _cn_weekday(m, today, past),
        ),
        (
            r"(上上|下下)(周|星期|礼拜)",
            lambda m: span(*week_span(today + timedelta(weeks=-2 if m.group(1) == "上上" else 2))),
        ),
        (r"(上个?(?:周|星期|礼拜))", lambda m: span(*week_span(today - timedelta(weeks=1)))),
        (r"(下个?(?:周|星期|礼拜))", lambda m: span(*week_span(today + timedelta(weeks=1)))),
        (
            r"((?:这|本)个?(?:周|星期|礼拜))(?![一二三四五六日天末])",
            lambda m: span(*week_span(today)),
        ),
        (r"(上个?月)", lambda m: " {}年{}月 ".format(*month_shift(today, -1))),
        (r"(下个?月)", lambda m: " {}年{}月 ".format(*month_shift(today, 1))),
        (r"(这个月|本月)", lambda m: f" {today.year}年{today.month}月 "),
        (r"(前年)", lambda m: f" {today.year - 2}年 "),
        (r"(去年)", lambda m: f" {today.year - 1}年 "),
        (r"(今年)", lambda m: f" {today.year}年 "),
        (r"(明年)", lambda m: f" {today.year + 1}年 "),
        (r"(?<!之)(?<!以)(?<!然)(后年)", lambda m: f" {today.year + 2}年 "),
    ]
    for pattern, replace in rules:
        text = re.sub(pattern, on_the_calendar(replace), text)
    return text


def _cn_days(m: re.Match[str], today: date) -> str:
    n = cn_number(m.group(1))
    if n is None:
        return m.group(0)
    sign = -1 if m.group(3) in ("前", "之前", "以前") else 1
    return f" {iso(today + timedelta(days=sign * n))} "


def _cn_weeks(m: re.Match[str], today: date) -> str:
    n = cn_number(m.group(1))
    if n is None:
        return m.group(0)
    sign = -1 if m.group(3) in ("前", "之前", "以前") else 1
    start, end = week_span(today + timedelta(weeks=sign * n))
    return f" {iso(start)}至{iso(end)}那一周 "


def _cn_weekday(m: re.Match[str], today: date, past: bool) -> str:
    prefix, _, name = m.group(1), m.group(2), m.group(3)
    weeks = {"上上": -2, "上": -1, "下": 1, "下下": 2, "这": 0, "本": 0}.get(prefix or "")
    if name == "末":
        base = week_start(today + timedelta(weeks=weeks or 0))
        return f" {iso(base + timedelta(days=5))}至{iso(base + timedelta(days=6))}周末 "
    weekday = _CN_WEEKDAY[name]
    if weeks is None:
        return f" {iso(bare_weekday(today, weekday, past))} "
    return f" {iso(week_start(today + timedelta(weeks=weeks)) + timedelta(days=weekday))} "


# ---------------------------------------------------------------- English times

_PREPOSITION = re.compile(
    r"\b(?:until|till|by|since|from|before|after|to|through|on|in|of)\s+$", re.I
)
# How far before a time word its preposition is looked for: the word and its spaces.
_PREPOSITION_REACH = 32


def _relative_times_en(text: str, s: Situation) -> str:
    today = s.moment.date()
    clock = s.moment.strftime("%H:%M")
    past = looks_past(text)

    def lead(m: re.Match[str], word: str) -> str:
        # "on 2026-02-22", but "until 2026-02-22": no second preposition after one. Looked
        # for just before the word: searched over all the text before each time word, a text
        # of many took time quadratic in its length.
        start = max(0, m.start() - _PREPOSITION_REACH)
        return "" if _PREPOSITION.search(text, start, m.start()) else word + " "

    def on(offset: int, part: str = "") -> Callable[[re.Match[str]], str]:
        def replace(m: re.Match[str]) -> str:
            day = today + timedelta(days=offset)
            if part:
                return f"{lead(m, 'on')}the {part} of {iso(day)}"
            return f"{lead(m, 'on')}{iso(day)}"

        return replace

    def week(offset: int) -> Callable[[re.Match[str]], str]:
        def replace(m: re.Match[str]) -> str:
            start = week_start(today + timedelta(weeks=offset))
            return f"{lead(m, 'in')}the week of {iso(start)}"

        return replace

    def month(offset: int) -> Callable[[re.Match[str]], str]:
        def replace(m: re.Match[str]) -> str:
            year, number = month_shift(today, offset)
            return f"{lead(m, 'in')}{datetime(year, number, 1):%B} {year}"

        return replace

    def ago(sign: int) -> Callable[[re.Match[str]], str]:
        return lambda m: (
            lead(m, "on" if m.group(2).lower() == "day" else "in") + _en_ago(m, today, sign)
        )

    rules: list[tuple[str, Callable[[re.Match[str]], str]]] = [
        (r"\bthe day before yesterday\b", on(-2)),
        (r"\bthe day after tomorrow\b", on(2)),
        (r"\b(?:last night|yesterday (?:evening|night))\b", on(-1, "evening")),
        (r"\byesterday (morning|afternoon)\b", lambda m: on(-1, m.group(1).lower())(m)),
        (
            r"\btomorrow (morning|afternoon|evening|night)\b",
            lambda m: on(1, m.group(1).lower())(m),
        ),
        (r"\bthis (morning|afternoon|evening)\b", lambda m: on(0, m.group(1).lower())(m)),
        (r"\btonight\b", on(0, "evening")),
        (r"\b(?:earlier|later) today\b", on(0)),
        (r"\btoday\b", on(0)),
        (r"\byesterday\b", on(-1)),
        (r"\btomorrow\b", on(1)),
        (r"\b(?:just now|a moment ago|right now)\b", lambda m: f"at {iso(today)} {clock}"),
        (r"\b(\d+) (day|week|month|year)s? ago\b", ago(-1)),
        (r"\bin (\d+) (day|week|month|year)s?\b", ago(1)),
        (
            r"\b(next|last|this) (monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b",
            lambda m: _en_weekday(m, today),
        ),
        (
            r"\b(?:on )?(monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b",
            lambda m: "on " + iso(bare_weekday(today, _EN_WEEKDAY[m.group(1).lower()], past)),
        ),
        (r"\blast week\b", week(-1)),
        (r"\bnext week\b", week(1)),
        (r"\bthis week\b", week(0)),
        (r"\blast month\b", month(-1)),
        (r"\bnext month\b", month(1)),
        (r"\bthis month\b", month(0)),
        (r"\blast year\b", lambda m: f"{lead(m, 'in')}{today.year - 1}"),
        (r"\bnext year\b", lambda m: f"{lead(m, 'in')}{today.year + 1}"),
        (r"\bthis year\b", lambda m: f"{lead(m, 'in')}{today.year}"),
        (r"\b(?:recently|lately|these days)\b", lambda m: f"in the days before {iso(today)}"),
    ]
    for pattern, replace in rules:
        text = re.sub(pattern, on_the_calendar(replace), text, flags=re.I)
    # "now" last: "right now"/"just now" are handled above.
    return re.sub(r"\bnow\b", f"as of {iso(today)}", text, flags=re.I)


def _en_ago(m: re.Match[str], today: date, sign: int) -> str:
    n, unit = int(m.group(1)), m.group(2).lower()
    if unit == "day":
        return iso(today + timedelta(days=sign * n))
    if unit == "week":
        return f"the week of {iso(week_start(today + timedelta(weeks=sign * n)))}"
    if unit == "month":
        year, month = month_shift(today, sign * n)
        return f"{datetime(year, month, 1):%B} {year}"
    return str(today.year + sign * n)


def _en_weekday(m: re.Match[str], today: date) -> str:
    weeks = {"next": 1, "last": -1, "this": 0}[m.group(1).lower()]
    weekday = _EN_WEEKDAY[m.group(2).lower()]
    return "on " + iso(week_start(today + timedelta(weeks=weeks)) + timedelta(days=weekday))


# ---------------------------------------------------------------- pronouns


def _pronouns_cn(text: str, s: Situation) -> str:
    # 我/咱/俺 alone (not 我们/咱们): the first person. 你/您 alone: the second person.
    if s.first_person.known:
        text = re.sub(r"(?:我|咱|俺)(?!们|国|方|司|校|院|军|党)", s.first_person.mentions(), text)
    if s.second_person.known:
        text = re.sub(r"(?:你|您)(?!们|好)", s.second_person.mentions(), text)
    return text


# Longest first; "I" only in capitals (a stray "i" is rarely the speaker).
_EN_FIRST = [
    (r"\bI'm\b|\bI am\b", "{p} is"),
    (r"\bI've\b|\bI have\b", "{p} has"),
    (r"\bI'll\b", "{p} will"),
    (r"\bI'd\b", "{p} would"),
    (r"\bI was\b", "{p} was"),
    (r"\bI\b", "{p}"),
    (r"(?i:\bmyself\b)", "{p}"),
    (r"(?i:\b(?:my|mine)\b)", "{p}'s"),
    (r"(?i:\bme\b)", "{p}"),
]
_EN_SECOND = [
    (r"\byou're\b|\byou are\b", "{p} is"),
    (r"\byou've\b|\byou have\b", "{p} has"),
    (r"\byou'll\b", "{p} will"),
    (r"\byou were\b", "{p} was"),
    (r"\byourself\b", "{p}"),
    (r"\byour(?:s)?\b", "{p}'s"),
    (r"\byou\b", "{p}"),
]


def _one_pass(table: list[tuple[str, str]], flags: int = 0) -> tuple[re.Pattern[str], list[str]]:
    # One pattern of the table's alternatives, each a group, tried in the table's order.
    pattern = "|".join(f"({p})" for p, _ in table)
    return re.compile(pattern, flags), [template for _, template in table]


_EN_PRONOUNS = (_one_pass(_EN_FIRST), _one_pass(_EN_SECOND, re.I))


def _pronouns_en(text: str, s: Situation) -> str:
    for person, (pattern, templates) in zip(
        (s.first_person, s.second_person), _EN_PRONOUNS, strict=True
    ):
        if person.known:
            text = pattern.sub(_templated(person.mentions(), templates), text)
    return text


def _templated(
    mention: Callable[[re.Match[str]], str], templates: list[str]
) -> Callable[[re.Match[str]], str]:
    # The matched alternative's template, around the person's mention.
    def replace(m: re.Match[str]) -> str:
        return templates[(m.lastindex or 1) - 1].format(p=mention(m))

    return replace


# ---------------------------------------------------------------- places


def _places(text: str, s: Situation) -> str:
    if not s.location:
        return text
    place = s.location
    text = re.sub(r"(这里|这儿|这边|本地|当地|此地|此处)", lambda m: f" {place} ", text)
    return re.sub(r"\b(?:right )?here\b", lambda m: f"in {place}", text, flags=re.I)


def _tidy(text: str) -> str:
    """Undo the padding spaces the replacements added where Chinese needs none."""
    text = re.sub(r"[ \t]{2,}", " ", text)
    text = re.sub(r" ([，。！？；：、）」』”,.!?;:)])", r"\1", text)
    text = re.sub(r"([（「『“(]) ", r"\1", text)
    return text.strip()
