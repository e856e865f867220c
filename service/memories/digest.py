"""A group's day digest: the SUMMARY memory of one group's local day, made of the words of
that day's messages (its sources are the group and the day, ``group_id`` and
``summary_day``), worded here when no LLM writes it."""

from __future__ import annotations

import re
from collections import Counter
from datetime import date

from service.retrieval.terms import COMMON_CHINESE_CHARS, ENGLISH_STOPWORDS


def day_summary(day: date, texts: list[str], group_name: str | None) -> str | None:
    """The offline summary of a group's day: its most repeated words (no LLM)."""
    counts: Counter[str] = Counter()
    for text in texts:
        seen: set[str] = set()
        for term in _terms(text):
            if term not in seen:
                counts[term] += 1
                seen.add(term)
    top: list[str] = []
    for term, n in counts.most_common(20):
        if n < 2 or len(top) == 5:
            break
        # "湖划" out of "西湖划船": the seam between two words already chosen is no word.
        seam = (
            len(term) == 2
            and any(t.endswith(term[0]) for t in top)
            and any(t.startswith(term[1]) for t in top)
        )
        if not seam:
            top.append(term)
    where = f"群「{group_name}」" if group_name else "群里"
    if not top:
        return f"{day.isoformat()} {where}有 {len(texts)} 条消息，话题零散"
    return f"{day.isoformat()} {where}主要讨论了：{'、'.join(top)}（{len(texts)} 条消息）"


def _terms(text: str) -> list[str]:
    terms = [
        w.lower()
        for w in re.findall(r"[A-Za-z][A-Za-z'-]{3,}", text)
        if w.lower() not in ENGLISH_STOPWORDS
    ]
    for run in re.findall(r"[\u4e00-\u9fff]+", text):
        terms.extend(
            run[i : i + 2]
            for i in range(len(run) - 1)
            if run[i] not in COMMON_CHINESE_CHARS and run[i + 1] not in COMMON_CHINESE_CHARS
        )
    return terms
