"""The absolutization gate: plain regular expressions that catch what a rewrite left relative.

Lists start from seed 000 §3.4 (代词 / 相对时间 / 相对地点) and add their English
counterparts. The id-drift check catches explicit numeric ids of the input that a rewrite lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.historian.absolutize import recurrences

_CN_PRONOUNS = (
    r"他们|她们|它们|我们|你们|咱们|这位|那位|"
    r"(?<![其吉])他|她|(?<![其])它|我(?!国)|你(?!好)|您|咱|俺"
)
_CN_TIMES = (
    r"今天|今日|今晚|今早|今晨|昨天|昨日|昨晚|前天|明天|明日|明早|明晚|(?<![然之以])后天(?!气|性)|"
    r"刚才|刚刚|稍后|待会|等会|一会儿|上周|下周|这周|本周|上个?月|下个?月|这个月|本月|"
    r"今年|去年|明年|最近|近期|现在|目前|前几天|这几天|"
    r"(?<![\d）)])(?:上|下|这|本)?(?:周|星期|礼拜)[一二三四五六日天末]|"
    # A number is tried from its first digit only: from every digit of a long run it was
    # quadratic in the run's length.
    r"(?:(?<![0-9])[0-9]+|(?<![一二两三四五六七八九十])[一二两三四五六七八九十]+)"
    r"(?:天|日|个?星期|个?月|年)(?:前|后|之前|之后)"
)
_CN_PLACES = r"这里|那里|这儿|那儿|这边|那边|本地|当地|此地|此处"

_EN_PRONOUNS = (
    r"\bI\b|\b(?:me|my|mine|myself|you|your|yours|yourself|he|him|his|himself|she|her|hers|"
    r"herself|they|them|their|theirs|we|our|ours)\b|\bus\b"
)
_EN_TIMES = (
    r"\b(?:today|tonight|yesterday|tomorrow|now|recently|lately|soon|later|"
    r"(?:last|next|this) (?:week|month|year|night|morning|afternoon|evening|"
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday)|"
    r"\d+ (?:days?|weeks?|months?|years?) ago|in \d+ (?:days?|weeks?|months?))\b"
)
_EN_PLACES = r"\bhere\b|\bthere\b(?! (?:is|are|was|were|will|has|have|had|'s)\b)|\blocal(?:ly)?\b"

_CHECKS: list[tuple[str, re.Pattern[str]]] = [
    ("pronoun", re.compile(_CN_PRONOUNS)),
    ("pronoun", re.compile(_EN_PRONOUNS, re.I)),
    ("relative_time", re.compile(_CN_TIMES)),
    ("relative_time", re.compile(_EN_TIMES, re.I)),
    ("relative_place", re.compile(_CN_PLACES)),
    ("relative_place", re.compile(_EN_PLACES, re.I)),
]
_ID = re.compile(r"(?<![\d.:-])\d{5,}(?![\d.:-])")


@dataclass(frozen=True)
class GateHit:
    """One relative expression that is still there."""

    kind: str  # pronoun | relative_time | relative_place | id_drift
    text: str

    def feedback(self) -> str:
        """What to tell the model about this hit."""
        if self.kind == "id_drift":
            return (
                f"实体 ID {self.text} 在改写中丢失了，请保留它 (id {self.text} was lost; keep it)"
            )
        what = {"pronoun": "代词", "relative_time": "相对时间", "relative_place": "相对地点"}[
            self.kind
        ]
        return f"你在输出中使用了{what}“{self.text}”，请替换为具体的人名/日期/地点"


def gate(text: str) -> list[GateHit]:
    """Every relative expression in ``text`` (empty when it is absolute)."""
    hits: list[GateHit] = []
    seen: set[tuple[str, str]] = set()
    habits = recurrences(text)
    for kind, pattern in _CHECKS:
        for match in pattern.finditer(text):
            token = match.group(0)
            if kind == "relative_time" and _within(match.span(), habits):
                continue  # 每周五, every Friday: a recurrence names no one day to resolve
            if kind == "pronoun" and token == "US":  # noqa: S105
                continue  # the country, not "us"
            key = (kind, token.lower())
            if key not in seen:
                seen.add(key)
                hits.append(GateHit(kind, token))
    return hits


def _within(span: tuple[int, int], spans: list[tuple[int, int]]) -> bool:
    return any(start <= span[0] and span[1] <= end for start, end in spans)


def explicit_ids(text: str) -> set[str]:
    """Numeric ids (QQ numbers and the like: five digits or more) named in a text."""
    return set(_ID.findall(text))


def id_drift(original: str, rewrite: str) -> list[GateHit]:
    """Ids the original named that the rewrite dropped."""
    return [GateHit("id_drift", i) for i in sorted(explicit_ids(original) - explicit_ids(rewrite))]
