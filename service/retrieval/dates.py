"""The calendar days a question names ("on 13 October 2023", "2023年10月13日"): what was
said on a named day is what such a question is about.

Only dates that name their year are read: "on October 13" could be any year's, and a
relative time ("last Saturday") is the historian's to resolve, not a search's.
"""

from __future__ import annotations

import re
from datetime import date, datetime, time, tzinfo

import numpy as np
import numpy.typing as npt

# A question names a few dates at most; a pasted text may hold many, and only the first
# count.
MAX_NAMED = 8

# English names, whatever the process's locale (``calendar.month_name`` follows it).
_NAMES = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]
_MONTHS = {name: n for n, name in enumerate(_NAMES, start=1)}
_MONTHS |= {name[:3]: n for name, n in _MONTHS.items()} | {"sept": 9}
_MONTH = "|".join(sorted(_MONTHS, key=len, reverse=True))
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(\d{4})"
# Every pattern is a fixed sequence of bounded pieces: linear in the text's length.
_THEN = r"(?:,\s*|\s+)"  # ", " or ",", or a space: "1 December, 2023", "December 1,2023"
_DAY_MONTH_YEAR = re.compile(rf"\b{_DAY}\s+(?:of\s+)?({_MONTH})\.?{_THEN}{_YEAR}\b", re.I)
_MONTH_DAY_YEAR = re.compile(rf"\b({_MONTH})\.?\s+{_DAY}{_THEN}{_YEAR}\b", re.I)
_MONTH_YEAR = re.compile(rf"\b({_MONTH})\.?{_THEN}(?:of\s+)?{_YEAR}\b", re.I)
_ISO = re.compile(r"(?<!\d)(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})(?!\d)")
_CN_DAY = re.compile(r"(\d{4})\s*年\s*(\d{1,2})\s*月\s*(\d{1,2})\s*[日号]")
_CN_MONTH = re.compile(r"(\d{4})\s*年\s*(\d{1,2})\s*月(?!\s*\d)")

Span = tuple[date, date]  # [first day, day after the last)
# Years read as dates (a four-digit number outside is not one): within them every day and
# the day after converts to a time in any zone.
_YEARS = range(1000, 9999)


def _day(year: str, month: int | str, day: str) -> Span | None:
    if int(year) not in _YEARS:
        return None
    try:
        first = date(int(year), int(month), int(day))
    except ValueError:  # 31 February, month 13
        return None
    return first, date.fromordinal(first.toordinal() + 1)


def _month(year: str, month: int | str) -> Span | None:
    y, m = int(year), int(month)
    if y not in _YEARS or not 1 <= m <= 12:
        return None
    return date(y, m, 1), date(y + (m == 12), m % 12 + 1, 1)


def days_named(query: str) -> list[Span]:
    """The days (or whole months) the query names with their year, in the order found."""
    spans: list[Span | None] = []
    for m in _DAY_MONTH_YEAR.finditer(query):
        spans.append(_day(m[3], _MONTHS[m[2].lower()], m[1]))
    for m in _MONTH_DAY_YEAR.finditer(query):
        spans.append(_day(m[3], _MONTHS[m[1].lower()], m[2]))
    for m in _ISO.finditer(query):
        spans.append(_day(m[1], m[2], m[3]))
    for m in _CN_DAY.finditer(query):
        spans.append(_day(m[1], m[2], m[3]))
    for m in _CN_MONTH.finditer(query):
        spans.append(_month(m[1], m[2]))
    if not any(spans):  # "in May 2023", unless a day of it is named
        spans.extend(_month(m[2], _MONTHS[m[1].lower()]) for m in _MONTH_YEAR.finditer(query))
    return list(dict.fromkeys(s for s in spans if s is not None))[:MAX_NAMED]


def bounds(span: Span, zone: tzinfo) -> tuple[datetime, datetime]:
    """The span as times: its first day's midnight and the midnight after its last, on the
    clocks of ``zone``."""
    first, after = span
    return datetime.combine(first, time(0), zone), datetime.combine(after, time(0), zone)


def on_days(at: npt.NDArray[np.float64], spans: list[Span], zone: tzinfo) -> npt.NDArray[np.bool_]:
    """Whether each time (seconds since the epoch) falls on one of the days, as the clocks of
    ``zone`` read them."""
    inside = np.zeros(len(at), dtype=bool)
    for span in spans:
        start, end = bounds(span, zone)
        inside |= (at >= start.timestamp()) & (at < end.timestamp())
    return inside


def envelope(
    spans: list[Span], zone: tzinfo, time_from: datetime | None, time_to: datetime | None
) -> tuple[datetime, datetime] | None:
    """From the first named day to the end of the last, within ``[time_from, time_to)``
    where given; None when nothing is named or nothing is left."""
    if not spans:
        return None
    times = [bounds(span, zone) for span in spans]
    start, end = min(a for a, _ in times), max(b for _, b in times)
    if time_from is not None:
        start = max(start, time_from)
    if time_to is not None:
        end = min(end, time_to)
    return (start, end) if start < end else None
