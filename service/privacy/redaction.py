"""Redacting an erased person's names from other people's statements.

What belongs to a person is found by their ids; this module handles the other half: a text
written by someone else that names them. The text stays (it is another person's statement);
the name is replaced by a marker. A name is only replaced where it is known to be theirs:

- it is a display name they used themselves (their messages, their profiles);
- nobody else goes by it in the conversation the text is in (a genuine namesake there may
  be the one meant); someone in a conversation of which the person was never part names
  no one the text could mean, so a name used there shields nothing;
- it can be told apart from ordinary words: it has at least two letters (Han or kana: two
  characters), is not an English function word ("is", "the"), not a number (ids are never
  matched as text: "2" is in "Alice has 2 cats"), and it is matched as a whole word where its
  edges are Latin letters or digits ("Ann" is not in "Anna");
- the text is in a conversation they took part in (the callers restrict the rows).

Their id goes too where the service wrote it beside a name of theirs, as its label of a
person (``张三(10001)``, ``Alice (10001)``): the id says for certain who is meant, so the
label goes whole even when its name is too short or too common to be redacted alone.

Profile documents are redacted in their body (and tags) only, and rebuilt through the
renderer, so a name that looks like a YAML key or value can never break the front matter.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from service.errors import Invalid
from service.profiles.document import Profile, parse, render, split
from service.retrieval.terms import CHINESE_STOP_CHARS, ENGLISH_STOPWORDS

ERASED = "[已删除用户]"

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff"
# A word character of a script written with spaces: a name's edge made of one needs a
# boundary there; Han and kana are written without spaces and have none.
_SPACED_WORD = re.compile(rf"[^\W{_CJK}]")
_HAS_CJK = re.compile(rf"[{_CJK}]")


def is_distinct_name(name: str) -> bool:
    """Whether a display name can be told apart from ordinary text (see the module)."""
    name = name.strip()
    letters = [ch for ch in name if ch.isalpha()]
    if _HAS_CJK.search(name):
        return len(name) >= 2 and name not in CHINESE_STOP_CHARS
    return len(letters) >= 2 and name.lower() not in ENGLISH_STOPWORDS


def _pattern(name: str, edge: str = "both") -> str:
    before = r"(?<![^\W" + _CJK + "])" if _SPACED_WORD.match(name[0]) else ""
    after = r"(?![^\W" + _CJK + "])" if _SPACED_WORD.match(name[-1]) else ""
    return before + re.escape(name) + (after if edge == "both" else "")


class Redactor:
    """Finds and replaces a set of names known to be one person's."""

    def __init__(
        self, names: Iterable[str], person_id: str | None = None, own: Iterable[str] = ()
    ) -> None:
        """``names``: the names known to be theirs alone; ``person_id`` and ``own`` (every
        name they went by): their labels (see the module)."""
        self.names = sorted({n.strip() for n in names if is_distinct_name(n)}, key=len)[::-1]
        patterns = [_pattern(n) for n in self.names]
        self.labels: list[str] = []
        if person_id:
            self.labels = [f"({person_id})", f"（{person_id}）"]
            # Also a label whose name an earlier redaction already replaced by the marker.
            prefixes = sorted({n.strip() for n in own if n.strip()} | {ERASED}, key=len)[::-1]
            label = "|".join(_pattern(n, edge="before") for n in prefixes)
            ident = re.escape(person_id)
            patterns.insert(0, rf"(?:{label})[ \t]?(?:\({ident}\)|（{ident}）)")
        self._regex = re.compile("|".join(patterns)) if patterns else None

    def __bool__(self) -> bool:
        return self._regex is not None

    def mentions(self, text: str | None) -> bool:
        """Whether the text names the person."""
        return bool(text) and self._regex is not None and self._regex.search(text or "") is not None

    def text(self, value: str) -> str:
        """The text with every mention replaced by the marker."""
        if self._regex is None:
            return value
        return self._regex.sub(ERASED, value)

    def json(self, value: Any, owned: Callable[[dict[str, Any]], bool] | None = None) -> Any:
        """A JSON value with every string redacted; list items that ``owned`` says are the
        person's own (a message of theirs quoted in a job's payload) are left out."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [
                self.json(item, owned)
                for item in value
                if not (owned is not None and isinstance(item, dict) and owned(item))
            ]
        if isinstance(value, dict):
            return {key: self.json(item, owned) for key, item in value.items()}
        return value

    def document(self, document: str) -> str:
        """A profile document (current or a kept revision) without the name in its body or
        tags; the front matter is kept byte for byte unless a tag named the person, and is
        otherwise rebuilt by the renderer (never by editing YAML text)."""
        try:
            head, body = split(document)
        except Invalid:
            return self.text(document)
        start = len(document) - len(body)
        if self.mentions(head):
            try:
                return render(self.profile(parse(document, stored=True)))
            except Invalid:
                pass  # kept as it was written: the body still loses the name
        return document[:start] + self.text(body)

    def profile(self, profile: Profile) -> Profile:
        """A parsed profile with the name gone from its body and tags."""
        profile.body = self.text(profile.body)
        profile.tags = [self.text(tag) for tag in profile.tags]
        return profile
