"""A group's day digest: the SUMMARY memory of one group's local day, made of the words of
that day's messages (its sources are the group and the day, ``group_id`` and
``summary_day``), worded here when no LLM writes it.

A digest says what was talked about and by whom: the day's topic words, those at least two
messages share, grouped by the messages they meet in, each group with the people who said
them. A day of greetings and reactions has no such words and gets no digest; a message
holding sensitive data (health, ids, contact data) lends it none of its words.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from service import pii
from service.retrieval.terms import TopicWord, topic_words

# A digest is one line of a context turn: its few largest topics, each in a few words.
MAX_TOPICS = 4
MAX_WORDS = 4
MAX_NAMES = 3
# A quoted word longer than this is a repeated sentence, not a word: its first bigram stands.
MAX_WORD_CHARS = 8
# A word joins a topic when at least this share of its messages are the topic's.
JOIN_SHARE = 0.5


@dataclass(frozen=True)
class Said:
    """One message of the day: who said it (``name``, as the chat shows them) and what."""

    name: str | None
    text: str


def said_in(rows: Iterable[Any]) -> list[Said]:
    """The day's messages as the digest reads them (rows of ``sender_name`` and ``text``)."""
    return [Said(r.sender_name, r.text) for r in rows]


@dataclass
class _Topic:
    keys: list[str] = field(default_factory=list)
    lines: set[int] = field(default_factory=set)


def day_summary(day: date, said: Sequence[Said], group_name: str | None) -> str | None:
    """The offline digest of a group's day, or None when nothing was talked about."""
    lines = [s for s in said if s.text and not pii.sensitive(s.text)]
    # The people in the chat are who talked, not what about.
    names = {w.key for s in lines if s.name for w in topic_words(s.name)}
    words = [[w for w in topic_words(s.text) if w.key not in names] for s in lines]
    topics = _topics(words)
    if not topics:
        return None
    chinese = _chinese(lines)
    shared = {k for t in topics for k in t.keys}
    # Topics of the same people are said once for them: "张三、李四聊了 羽毛球，周末 聚餐".
    by_people: dict[tuple[str, str], list[str]] = defaultdict(list)
    for topic in topics:
        who, verb = _people(topic, lines, chinese)
        by_people[who, verb].append(" ".join(_quoted(topic, lines, shared)))
    glue = "，" if chinese else ", "
    parts = [f"{who}{verb} {glue.join(said)}" for (who, verb), said in by_people.items()]
    if chinese:
        where = f"群「{group_name}」" if group_name else "群里"
        return f"{day.isoformat()} {where}：{'；'.join(parts)}"
    where = f"in the group “{group_name}”" if group_name else "in the group"
    return f"{day.isoformat()} {where}: {'; '.join(parts)}"


def _topics(words: list[list[TopicWord]]) -> list[_Topic]:
    """The day's topics: the words two or more messages share, each joined to the topic
    whose messages hold most of its own (else a topic of its own), largest first."""
    where: dict[str, set[int]] = defaultdict(set)
    for n, found in enumerate(words):
        for word in found:
            where[word.key].add(n)
    shared = sorted((k for k in where if len(where[k]) >= 2), key=lambda k: -len(where[k]))
    topics: list[_Topic] = []
    for key in shared:
        lines = where[key]
        best = max(topics, key=lambda t: len(t.lines & lines), default=None)
        if best is not None and len(best.lines & lines) >= JOIN_SHARE * len(lines):
            best.keys.append(key)
            best.lines |= lines
        else:
            topics.append(_Topic([key], set(lines)))
    topics.sort(key=lambda t: -len(t.lines))
    return topics[:MAX_TOPICS]


def _chinese(lines: Sequence[Said]) -> bool:
    """Whether the day was mostly written in Chinese (or Japanese): a digest reads in the
    conversation's language."""
    cjk = sum(1 for s in lines if any("\u3040" <= c <= "\u9fff" for c in s.text))
    return 2 * cjk >= len(lines)


def _quoted(topic: _Topic, lines: Sequence[Said], shared: set[str]) -> list[str]:
    """A topic's words as the messages wrote them, most often said first; a word inside
    another chosen one ("羽毛" of "羽毛球") is not said again."""
    keys = set(topic.keys)
    counts: Counter[str] = Counter()
    written: dict[str, Counter[str]] = defaultdict(Counter)
    for n in sorted(topic.lines):
        # Words are quoted whole, of the words of every topic ("电影" and "影盛" of two
        # topics are "电影盛宴"), where they hold one of this topic's.
        found = {
            _same(w): _shown(w)
            for w in topic_words(lines[n].text, shared)
            if any(k in keys for k in _keys(w))
        }
        for same, surface in found.items():
            written[same][surface] += 1
        counts.update(found.keys())
    chosen: list[str] = []
    for same, _ in counts.most_common():
        [(surface, _)] = written[same].most_common(1)
        low = surface.lower()
        if any(low in c.lower() for c in chosen):
            continue
        chosen = [c for c in chosen if c.lower() not in low]
        chosen.append(surface)
        if len(chosen) == MAX_WORDS:
            break
    return chosen


def _keys(word: TopicWord) -> list[str]:
    """The keys a quoted word is made of: an English word's one, a Chinese word's bigrams."""
    if word.surface.isascii():
        return [word.key]
    return [word.surface[i : i + 2] for i in range(len(word.surface) - 1)]


def _shown(word: TopicWord) -> str:
    long = len(word.surface) > MAX_WORD_CHARS and not word.surface.isascii()
    return word.key if long else word.surface


def _same(word: TopicWord) -> str:
    """What tells a topic's words apart: a Chinese word as written, an English one by its
    stem ("booked" is "book")."""
    return word.key if word.surface.isascii() else word.surface


def _people(topic: _Topic, lines: Sequence[Said], chinese: bool) -> tuple[str, str]:
    """Who talked of a topic (their names, most often first), and how ("聊了", "问了")."""
    said = [lines[n] for n in sorted(topic.lines)]
    # Names as the chat shows them; an id alone is no name to say ("有人", "someone").
    by: Counter[str] = Counter(s.name for s in said if s.name)
    names = [n for n, _ in by.most_common()]
    more = len(names) > MAX_NAMES
    # In the order they first spoke that day, the same for every topic of the same people.
    first = {s.name: i for i, s in reversed(list(enumerate(lines))) if s.name}
    names = sorted(names[:MAX_NAMES], key=lambda n: first[n])
    # One person's questions: they asked; several people's messages: they talked.
    questions = sum(s.text.rstrip().endswith(("?", "？")) for s in said)
    asked = len(names) == 1 and 2 * questions > len(said)
    if chinese:
        who = "、".join(names) + ("等" if more else "") if names else "有人"
        return who, "问了" if asked else ("聊了" if len(names) > 1 else "说起")
    if not names:
        who = "someone"
    elif len(names) == 1:
        who = names[0]
    elif more:
        who = ", ".join(names) + " and others"
    else:
        who = ", ".join(names[:-1]) + " and " + names[-1]
    return who, " asked about" if asked else (" talked about" if len(names) > 1 else " mentioned")
