"""Reminder requests read by the rules: 提醒我周二下午三点交周报, remind me to call Mom tomorrow.

Without an LLM a todo is made only from a sentence that asks to be reminded, in the speaker's
own words and at the sentence's start (after a greeting, 请, a time), of something to do at a
time it names. Whatever else mentions a reminder ("他说要提醒我们", "these photos remind me
to slow down", "remind me what you said"), asks a question, or repeats (每天提醒我吃药: a todo
fires once) is no request; a request naming no time is left to the model, which can ask.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from service.context import in_range
from service.historian.absolutize import Person, Situation, absolutize, cn_number, recurrences

# A number is tried from its first digit or numeral only: from every digit of a long run the
# search was quadratic in the run's length, and a run of time words exponential.
_NUM = r"(?:(?<![0-9])[0-9]+|(?<![零一二两三四五六七八九十])[零一二两三四五六七八九十]+)"
_WEEKDAY_CN = r"(?:下下|下|这|本)?个?(?:周|星期|礼拜)[一二三四五六日天]"
_DAY_CN = (
    rf"大后天|后天|明天|明日|明儿|今天|今日|今儿|{_WEEKDAY_CN}|{_NUM}天(?:之?后|以后)"
    rf"|{_NUM}月{_NUM}[日号]|{_NUM}[日号](?![子本])"
)
_EVENING_DAY_CN = r"今晚|明晚|今早|明早"
_DAYPART_CN = r"早上|早晨|清早|上午|中午|下午|傍晚|晚上|夜里|凌晨"
_CLOCK_CN = rf"{_NUM}[点時时](?:半|一刻|三刻|{_NUM}分?)?|[0-9]{{1,2}}[:：][0-9]{{2}}"
_LATER_CN = rf"(?:{_NUM}个?半?|半个?)(?:小时|钟头|分钟)(?:之?后|以后)"
_ISO = r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:\s*[0-9]{1,2}:[0-9]{2})?"
_TIME_CN = re.compile(
    rf"(?P<iso>{_ISO})|(?P<later>{_LATER_CN})|(?P<eveday>{_EVENING_DAY_CN})|(?P<day>{_DAY_CN})"
    rf"|(?P<part>{_DAYPART_CN})|(?P<clock>{_CLOCK_CN})"
)

_DAY_EN = r"monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_MONTH_EN = (
    r"january|february|march|april|may|june|july|august|september|october|november|december"
    r"|jan|feb|mar|apr|jun|jul|aug|sept?|oct|nov|dec"
)
_TIME_EN = re.compile(
    rf"(?P<iso>(?:on\s+)?{_ISO})"
    r"|(?P<later>in\s+(?:[0-9]+|an?|one|two|three)\s+(?:minutes?|mins?|hours?|hrs?|days?))"
    r"|(?P<eveday>tonight)"
    rf"|(?P<day>the\s+day\s+after\s+tomorrow|tomorrow|today"
    rf"|(?:on\s+)?(?:next\s+|this\s+|coming\s+)?(?:{_DAY_EN})"
    rf"|(?:on\s+)?(?:{_MONTH_EN})\.?\s+[0-9]{{1,2}}(?:st|nd|rd|th)?)"
    r"|(?P<part>(?:in\s+the\s+|this\s+)?(?:morning|afternoon|evening)|at\s+night|at\s+noon|noon)"
    r"|(?P<clock>(?:at|by|around)\s+[0-9]{1,2}(?::[0-9]{2})?(?:\s*(?:am|pm|a\.m\.|p\.m\.))?"
    r"|[0-9]{1,2}(?::[0-9]{2})?\s*(?:am|pm|a\.m\.|p\.m\.)|[0-9]{1,2}:[0-9]{2})",
    re.I,
)


def _bare(pattern: re.Pattern[str]) -> str:
    """The pattern without its group names, to be part of another."""
    return re.sub(r"\(\?P<\w+>", "(?:", pattern.pattern)


def _run(time_words: str) -> str:
    """A run of time words (明天下午三点, tomorrow at 5pm), spaces and 的 between them."""
    return rf"(?:(?:{time_words})|[\s的,，])*+"


_TIME_CN_RUN = _run(_bare(_TIME_CN))
_TIME_EN_RUN = _run(_bare(_TIME_EN))

# What may come before the request in its sentence: a greeting or filler, politeness, the bot
# addressed by name, a time. Anything else ("他说要", "谢谢你", "不用") makes the words no
# request of the speaker's.
_LEAD_CN = (
    r"(?:[\s，,、：:~～]|@[^\s@]+|请|麻烦|你|您|帮忙|那|就|好的?|嗯|"
    r"对了|哦|噢|另外|还有|然后|再|到时候?|到点|" + _bare(_TIME_CN) + ")*+"
)
_VOCATIVE_CN = r"(?:(?:(?![说讲让要会告问叫])[\u3400-\u9fffA-Za-z0-9_]){1,10}[，,：:]\s*)?"
_WHOM_CN = r"(?P<whom>我们|咱们|大家|所有人|各位|全体成员|全员|我)?"
_ASK_CN = re.compile(
    rf"^{_VOCATIVE_CN}{_LEAD_CN}"
    rf"(?:(?:帮我)?(?P<mind>记得|别忘了|不要忘了|千万别忘了|别忘记)?(?:再|要)?(?:帮我)?提醒(?:一下)?"
    rf"{_WHOM_CN}"
    rf"|(?P<call>(?:到时候?)?叫(?:一下)?(?P<callee>我))"
    rf"|(?P<note>(?:帮|给|替)我记(?:一下|下|着|住)?)[：:，,\s]*+(?=(?:{_TIME_CN_RUN})(?:要|得|需要|该)))"
    r"(?![过了])(?P<rest>.+)$"
)
_LEAD_EN = (
    r"(?:[\s,:;~]|@[^\s@]+|(?:hey|hi|ok|okay|oh|and|also|so|then|just|please|pls|plz)\b|"
    + _bare(_TIME_EN)
    + ")*+"
)
_VOCATIVE_EN = r"(?:[A-Za-z0-9_]{1,20},\s*)?"
_ASK_EN = re.compile(
    rf"^{_VOCATIVE_EN}{_LEAD_EN}"
    r"(?:remind\s+(?P<whom>me|us|everyone|everybody|all\s+of\s+us|the\s+team|the\s+group)"
    r"|(?:don't|do\s+not)\s+let\s+(?P<forget>me|us)\s+forget)"
    rf"\s+(?=(?:{_TIME_EN_RUN})?(?:to|about|that)\b)(?P<rest>.+)$",
    re.I,
)
_SENTENCE = re.compile(r"[^。！？!?；;\n]+[。！？!?；;]*")
_QUESTION = re.compile(r"(?:[?？]|[吗么嘛呢][\s。.!！~～]*)$")
_REPEATS = re.compile(r"每|\b(?:every|each|daily|weekly|monthly|nightly)\b", re.I)
_LEAD_WORDS = re.compile(r"^(?:[\s，,：:]+|一下|要|该|得|记得|to\b|about\b)+", re.I)

_PARTICLES = re.compile(r"(?<![吧啊呀哦哈呗])(?:吧|啊|呀|哦|哈|呗|一下)+$")
_BARE_WEEKDAY = re.compile(rf"(?:on\s+)?(?:{_DAY_EN})|(?:周|星期|礼拜).", re.I)
_COUNT = re.compile(r"([0-9]+|[零一二两三四五六七八九十]+|an?|one|two|three)\s*个?(半)?\s*(\S+)")
_PART_HOUR = {
    "早上": 8, "早晨": 8, "清早": 7, "上午": 9, "中午": 12, "下午": 15, "傍晚": 18,
    "晚上": 20, "夜里": 22, "凌晨": 6, "今晚": 20, "明晚": 20, "今早": 8, "明早": 8,
    "morning": 8, "afternoon": 15, "evening": 20, "night": 20, "noon": 12, "tonight": 20,
}  # fmt: skip
_AFTERNOON = {"下午", "傍晚", "晚上", "夜里", "今晚", "明晚", "afternoon", "evening", "night"}
_EN_COUNT = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3}
_EN_MONTHS = {m[:3]: n for n, m in enumerate(_MONTH_EN.split("|")[:12], start=1)}


@dataclass(frozen=True)
class Reminder:
    """A request to be reminded: of what, whom, and the time words it names."""

    task: str  # what to do, as said, without its time words
    whom: str | None  # who is to be reminded where it is not the speaker (大家, everyone)
    english: bool
    times: tuple[tuple[str, str], ...]  # (kind, words) of each time word, in order; none
    # where the request names no time (提醒我交周报): no todo is made of it by the rules

    def description(self, task: str) -> str:
        """The todo's text: the (rewritten) task, and for whom where it is not the speaker."""
        if self.whom is None:
            return task
        return f"remind {self.whom} to {task}" if self.english else f"提醒{self.whom}{task}"


def request(text: str) -> Reminder | None:
    """The reminder a text asks for, or none: a request at a sentence's start."""
    for sentence in _SENTENCE.findall(text):
        said = sentence.strip()
        if not said or _QUESTION.search(said) or _REPEATS.search(said) or recurrences(said):
            continue
        found = _read(said, _ASK_CN, _TIME_CN, english=False) or _read(
            said, _ASK_EN, _TIME_EN, english=True
        )
        if found is not None:
            return found
    return None


def _read(
    said: str, ask: re.Pattern[str], words: re.Pattern[str], english: bool
) -> Reminder | None:
    m = ask.match(said)
    if m is None:
        return None
    lead, rest = said[: m.start("rest")], m.group("rest")
    times = tuple(_times(words, lead) + _times(words, rest))
    groups = m.groupdict()
    # "明天叫我小王" names the speaker; 明早七点叫我 and 到时候叫我 ask to be woken.
    woken = "到时" in lead or "到点" in lead or any(k in ("clock", "later") for k, _ in times)
    if (groups.get("call") and not woken) or (groups.get("note") and not times):
        return None
    task = words.sub(lambda t: t.group(0) if t.group("iso") else " ", rest)
    task = _LEAD_WORDS.sub("", re.sub(r"\s+", " ", task)).strip(" ，,。.!！~～;；")
    task = re.sub(r"\s+([，,。.])", r"\1", task)
    task = _PARTICLES.sub("", task).strip(" ，,")
    if not task:
        return None
    whom = None
    if english:
        who = (groups.get("whom") or groups.get("forget") or "").lower()
        whom = None if who == "me" else re.sub(r"\s+", " ", who)
    else:
        who = groups.get("whom") or ""
        whom = who if who and who != "我" else None
    return Reminder(task, whom, english, times)


def _times(words: re.Pattern[str], text: str) -> list[tuple[str, str]]:
    return [(t.lastgroup or "", t.group(0)) for t in words.finditer(text) if t.lastgroup]


def trigger(reminder: Reminder, moment: datetime, default_hour: int) -> datetime | None:
    """When the reminder is due, on the moment's clocks; none where it names no time, or
    a day that is no real one."""
    if not reminder.times:
        return None
    day: date | None = None
    clock: time | None = None
    part: str | None = None
    weekly = False  # the day is a bare weekday: 周二 said on a Tuesday evening is next week's
    for kind, words in reminder.times:
        key = re.sub(r"^(?:in\s+the\s+|this\s+|at\s+)", "", words.strip().lower())
        if kind == "iso":
            return _storable(_iso(words, moment, default_hour))
        if kind == "later":
            return _storable(_later(words, moment))
        if kind == "eveday":
            day = day or _day("明天" if words.startswith("明") else "今天", moment)
            part = part or key
        elif kind == "day":
            if day is None:
                day = _day(words, moment)
                weekly = bool(_BARE_WEEKDAY.fullmatch(words))
            if day is None:
                return None
        elif kind == "part":
            part = part or key
        elif kind == "clock":
            clock = clock or _clock(words)
    if clock is not None:
        clock = _afternoon(clock, part, reminder)
    elif part is not None:
        clock = time(_PART_HOUR.get(part, default_hour))
    when_day = day or moment.date()
    try:
        when = datetime.combine(when_day, clock or time(default_hour), moment.tzinfo)
    except (OverflowError, ValueError):
        return None
    if when <= moment and (day is None or weekly):
        # 下午三点 said at five is tomorrow's; 周二三点 said on a Tuesday at five, next week's.
        when += timedelta(days=1 if day is None else 7)
    return _storable(when)


def _storable(when: datetime | None) -> datetime | None:
    """A time the clocks can hold in UTC too, or none (9999-12-31 23:30 in UTC+8 is not)."""
    try:
        return in_range(when) if when is not None else None
    except (OverflowError, ValueError):
        return None


def _day(words: str, moment: datetime) -> date | None:
    today = moment.date()
    m = re.fullmatch(rf"(?:on\s+)?({_MONTH_EN})\.?\s+([0-9]{{1,2}})(?:st|nd|rd|th)?", words, re.I)
    if m:
        return _next_date(today, _EN_MONTHS[m.group(1)[:3].lower()], int(m.group(2)))
    m = re.fullmatch(rf"(?:({_NUM})月)?({_NUM})[日号]", words)
    if m:
        month = cn_number(m.group(1)) if m.group(1) else None
        number = cn_number(m.group(2))
        if number is None or (m.group(1) and month is None):
            return None
        if month is not None:
            return _next_date(today, month, number)
        for ahead in range(3):  # 15号: this month's, or the next one that has it
            year, month_ = divmod(today.month - 1 + ahead, 12)
            try:
                found = date(today.year + year, month_ + 1, number)
            except ValueError:
                continue
            if found >= today:
                return found
        return None
    nobody = Person(None, None)
    out = absolutize(words, Situation(moment, nobody, nobody))
    iso = re.search(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", out)
    return date.fromisoformat(iso.group(0)) if iso else None


def _next_date(today: date, month: int, number: int) -> date | None:
    for year in (today.year, today.year + 1):
        try:
            found = date(year, month, number)
        except ValueError:
            return None
        if found >= today:
            return found
    return None


def _clock(words: str) -> time | None:
    text = words.lower()
    m = re.search(r"([0-9]{1,2})[:：]([0-9]{2})", text) or re.search(r"([0-9]{1,2})", text)
    if m is not None and not re.search(r"[点時时]", text):
        hour = int(m.group(1))
        minute = int(m.group(2)) if m.lastindex and m.lastindex > 1 else 0
        if re.search(r"p\.?m", text) and hour < 12:
            hour += 12
        elif re.search(r"a\.?m", text) and hour == 12:
            hour = 0
        return time(hour, minute) if hour < 24 and minute < 60 else None
    m = re.fullmatch(rf"({_NUM})[点時时](半|一刻|三刻|({_NUM})分?)?", words)
    if m is None:
        return None
    said_hour = cn_number(m.group(1))
    said_minute = {"半": 30, "一刻": 15, "三刻": 45}.get(m.group(2) or "")
    if said_minute is None:
        said_minute = cn_number(m.group(3)) if m.group(3) else 0
    if said_hour is None or said_minute is None or said_hour > 24 or said_minute > 59:
        return None
    return time(said_hour % 24, said_minute)


def _afternoon(clock: time, part: str | None, reminder: Reminder) -> time:
    """三点 said with 下午 (or alone, when one rarely asks to be reminded) is 15:00."""
    said = " ".join(words.lower() for _, words in reminder.times)
    if re.search(r"a\.?m\b|凌晨|早|上午", said) or clock.hour >= 12:
        return clock
    if part in _AFTERNOON or re.search(r"p\.?m\b", said) or 1 <= clock.hour <= 5:
        return clock.replace(hour=clock.hour + 12)
    return clock


def _iso(words: str, moment: datetime, default_hour: int) -> datetime | None:
    m = re.search(r"([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})(?:\s*([0-9]{1,2}):([0-9]{2}))?", words)
    if m is None:
        return None
    try:
        day = date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
        clock = time(int(m.group(4)), int(m.group(5))) if m.group(4) else time(default_hour)
        return datetime.combine(day, clock, moment.tzinfo)
    except (OverflowError, ValueError):
        return None


def _later(words: str, moment: datetime) -> datetime | None:
    if re.match(r"半个?(?:小时|钟头)", words):
        return moment + timedelta(minutes=30)
    m = _COUNT.search(words)
    if m is None:
        return None
    count = _EN_COUNT.get(m.group(1).lower()) or cn_number(m.group(1))
    if count is None:
        return None
    unit = m.group(3).lower()
    if unit.startswith(("min", "分")):
        delta = timedelta(minutes=count)
    elif unit.startswith(("h", "小", "钟")):
        delta = timedelta(hours=count + (0.5 if m.group(2) else 0))
    else:
        delta = timedelta(days=count)
    try:
        return moment + delta
    except OverflowError:
        return None
