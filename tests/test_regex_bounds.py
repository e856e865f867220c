"""Every regular expression of the service runs in time linear in its input.

Request text reaches these patterns (messages up to 100 KB, observations, profile documents);
a pattern that backtracks quadratically stalls the event loop for everyone (a 32 KB message of
repeated ``<at `` once took 3 s). Each pattern is run over 100 KB inputs built to make such
patterns backtrack: long runs of one character class, and repetitions of the pattern's own
literal pieces. The bound is generous (a linear pattern needs milliseconds); a quadratic one
needs seconds to minutes.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

import service
from service import pii
from service.historian.absolutize import Person, Situation, absolutize
from service.recall.schemas import ContextRequest
from service.recall.service import build_query
from service.text import message_content

SIZE = 100_000
BOUND_SECONDS = 0.5

_UNITS = [
    "a", "1", " ", "\n", "中", "（", "(", "-", ".", "@", "<", "a.", "a-", "1-", "1 ", "a@",
    "a@a", "<at ", "<content>", "[CQ:at,qq=", "---\n", "- 2024-01-01: ", "路1", "a'", "- a:",
    "12345 ", "1 A ", "今天", "十", "记住 ", "remember ",
]  # fmt: skip
_LITERAL = re.compile(r"[^\\\[\](){}.*+?|^$]{1,12}")


def _patterns() -> Iterator[tuple[str, re.Pattern[str]]]:
    """(where, pattern) of every compiled pattern held by a module of the service, alone or
    in a list or tuple (the gate's checks, the profile kinds)."""
    for info in pkgutil.walk_packages(service.__path__, "service."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            values = list(value) if isinstance(value, list | tuple) else [value]
            for n, item in enumerate(values):
                found = item if isinstance(item, re.Pattern) else None
                if isinstance(item, tuple):
                    found = next((x for x in item if isinstance(x, re.Pattern)), None)
                if found is not None and isinstance(found.pattern, str):
                    yield f"{info.name}.{name}[{n}]", found


PATTERNS = dict(_patterns())


def _inputs(pattern: re.Pattern[str]) -> Iterator[str]:
    units = list(_UNITS)
    for literal in _LITERAL.findall(pattern.pattern)[:4]:
        units += [literal + " ", literal + "1"]
    for unit in units:
        yield (unit * (SIZE // len(unit) + 1))[:SIZE]


def _seconds(work: object) -> float:
    # CPU time of this thread: other work on a shared machine does not count against it.
    start = time.thread_time()
    for _ in work:  # type: ignore[attr-defined]
        pass
    return time.thread_time() - start


def test_the_service_patterns_are_found() -> None:
    """The collection itself works: the patterns known to run on request text are in it."""
    sources = {p.pattern for p in PATTERNS.values()}
    assert any("CQ:at" in s for s in sources)
    assert any("@" in s and "A-Za-z" in s for s in sources)  # the e-mail finder
    assert len(PATTERNS) >= 30


@pytest.mark.parametrize("where", sorted(PATTERNS))
def test_pattern_is_linear_on_adversarial_input(where: str) -> None:
    """No pattern takes more than half a second on any 100 KB adversarial input."""
    pattern = PATTERNS[where]
    for text in _inputs(pattern):
        took = _seconds(pattern.finditer(text))
        assert took < BOUND_SECONDS, f"{where} took {took:.2f}s on {text[:30]!r}…"


@pytest.mark.parametrize(
    "unit", ["<at ", "<at qq=", "[CQ:at,qq=", "<content>", " ", "1", "中", "a."]
)
def test_context_query_of_a_hostile_message_is_quick(unit: str) -> None:
    """``/v1/context``'s query building over a 100 KB message of repeated pieces (the
    mention search, the ``<content>`` frame) stays within the bound."""
    text = (unit * (SIZE // len(unit) + 1))[:SIZE]
    request = ContextRequest.model_validate(
        {"request_type": "group", "group_id": "g1", "bot_id": "42", "message": text}
    )
    start = time.thread_time()
    build_query(request)
    message_content(text)
    assert time.thread_time() - start < BOUND_SECONDS


@pytest.mark.parametrize("unit", ["a", "中", "1", "十", " ", "today ", "on tomorrow ", "met 周三 "])
def test_absolutizing_a_hostile_text_is_quick(unit: str) -> None:
    """The rule rewriter's own patterns (the tense guess, the preposition before each time
    word) over a message of the default maximum length (20,000 characters), which the
    extraction rewrites without an LLM, stay within the bound."""
    text = (unit * (20_000 // len(unit) + 1))[:20_000]
    moment = datetime(2026, 2, 21, 23, 30, tzinfo=UTC)
    situation = Situation(moment, Person("张三", "10001"), Person("小助手", "20002"), "上海")
    start = time.thread_time()
    absolutize(text, situation)
    assert time.thread_time() - start < BOUND_SECONDS


@pytest.mark.parametrize(
    "unit",
    [
        "13800138000 ",
        "１３８００１３８０００，",
        "1\u200b",
        "a@b.co ",
        "alice＠example.com ",
        "(415) 555-0134 ",
        "110101199003074514 ",
        "上海路1号",
        "心脏病",
    ],
)
def test_personal_data_in_a_hostile_text_is_found_quickly(unit: str) -> None:
    """Finding, masking and classifying a 100 KB text made of one piece of personal data
    repeated (thousands of findings, full-width or invisible characters in each) stays within
    the bound: each finding is checked against those before it without a scan of them all."""
    text = (unit * (SIZE // len(unit) + 1))[:SIZE]
    start = time.thread_time()
    pii.sensitive(text)
    pii.apply(text, "mask")
    assert time.thread_time() - start < BOUND_SECONDS


def test_mentions_and_frames_are_still_read() -> None:
    """The linear forms find what the old ones found."""
    for mention in ('<at user_id="42">', "<at qq=42/>", "[CQ:at,qq=42]", '<at a id="42">'):
        request = ContextRequest.model_validate(
            {"request_type": "group", "group_id": "g1", "bot_id": "42", "message": f"{mention}hi"}
        )
        assert "@机器人" in build_query(request), mention
    assert message_content("x <content> hello </content> <content>b</content>") == "hello"
    assert message_content("<content> open") == "<content> open"
