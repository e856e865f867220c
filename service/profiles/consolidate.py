"""Profiles that stay bounded: new facts consolidate into a profile instead of piling up.

The offline merge keeps a profile body in this shape:

    # 成员侧写

    ## 概况
    - 居住地：张三搬到了上海。（2026-03-01）
    - 工作：张三在字节跳动做后端工程师。（2026-02-10）

    ## 记录
    - 2026-03-05: 张三去北京出差。

    ## 早先
    - 2026-01（12 条）：去杭州看西湖；养了一只猫叫咪咪；…
    - 2025（40 条）：…

- **概况** holds one line per kind of standing fact (where someone lives, their work, their
  pet's name …): a newer fact of the same kind replaces the older one.
- **记录** is the dated log of everything else, newest last, within a line and character
  budget; past it, the oldest lines fold into …
- **早先**: one short line per month, months past a year's worth folding into one line per year.

Whatever else a document holds (free text, sections a model or a person wrote) is kept as it
is, within the body's budget: past it, those parts are shortened too. However long the chat
runs, a body stays under ``BODY_BUDGET`` characters, far below the document cap.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

SUMMARY = "## 概况"
RECORDS = "## 记录"
EARLIER = "## 早先"
_MANAGED = (SUMMARY, RECORDS, EARLIER)

BODY_BUDGET = 8_000
SUMMARY_LINES = 12
SUMMARY_LINE_CHARS = 240
RECORD_MAX_LINES = 40
RECORD_MAX_CHARS = 4_000
RECORD_LINE_CHARS = 400  # the event keeps the whole statement; the profile, its gist
RECORD_KEEP_LINES = 24  # after a fold: folding runs every ~16 new records, not every one
MONTH_LINES = 6
YEAR_LINES = 5
FOLD_LINE_CHARS = 200
CLIP_CHARS = 24
FOLD_CLIPS = 12  # a line shows the first ones that fit; once full, it stops changing
# The embedded text: the profile's standing part, then the record window in steps of
# EMBED_STEP lines, so the vector changes every few facts rather than with each one.
DIGEST_CHARS = 600
EMBED_STEP = 4

# Kinds of standing facts: a newer fact of a kind replaces the older one. Each pattern asks
# for the wording of a state ("lives in", "works as"), not a topic word, so a one-off event
# ("今天工作很累") stays a record.
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "居住地",
        re.compile(
            r"住在|搬到|搬家到|定居|\b(?:lives?|living|resides?|settled) in\b|\bmoved to\b",
            re.I,
        ),
    ),
    ("家乡", re.compile(r"老家|家乡|出生在|\bhometown\b|\bgrew up in\b|\bwas born in\b", re.I)),
    (
        "工作",
        re.compile(
            r"在\S{1,20}(?:工作|上班|任职)|职业是|工作是|入职|跳槽到|就职于|当上了|"
            r"\bworks? (?:as|at|for)\b|\b(?:job|occupation|profession) is\b|\bgot a job\b",
            re.I,
        ),
    ),
    (
        "学业",
        re.compile(
            r"在\S{1,20}(?:读书|上学|读大学|读研|读博)|就读于|专业是|"
            r"\bstud(?:y|ies|ying) (?:at|in)\b|\bmajors? in\b|\bgoes to school\b",
            re.I,
        ),
    ),
    (
        "宠物",
        re.compile(
            r"(?:猫|狗|宠物|仓鼠|兔子|鹦鹉)\S{0,6}(?:叫|名字是)|"
            r"\b(?:cat|dog|pet|puppy|kitten)(?:'s name is| is (?:called|named)| named| called)\b",
            re.I,
        ),
    ),
    (
        "感情",
        re.compile(
            r"结婚了|离婚了|订婚|分手了|单身|(?:女|男)朋友是|\b(?:got )?(?:married|divorced|"
            r"engaged)\b|\b(?:is|am) single\b|\b(?:girlfriend|boyfriend|wife|husband) is\b",
            re.I,
        ),
    ),
    ("生日", re.compile(r"生日是|生日在|\bbirthday is\b|\bwas born on\b", re.I)),
    ("年龄", re.compile(r"\d{1,3}\s*岁了|今年\d{1,3}岁|\bis \d{1,3} years old\b", re.I)),
)

_RECORD = re.compile(r"^- (\d{4}-\d{2}-\d{2}): (.*)$")
_KIND_LINE = re.compile(r"^- ([^：:]{1,20})[：:]\s*(.*)$")
_LEADING_ID = re.compile(r"^\s*[(（][^()（）]{1,64}[)）]")
_FOLD_LINE = re.compile(r"^- (\d{4}(?:-\d{2})?|更早)（(\d+) 条）：(.*)$")


def kind_of(text: str) -> str | None:
    """The kind of standing fact a statement is (居住地, 工作 …), or None for a record."""
    for kind, pattern in KINDS:
        if pattern.search(text):
            return kind
    return None


@dataclass
class Record:
    """A dated line of the log (day None: a line someone wrote by hand without a date)."""

    day: str | None
    text: str

    def line(self) -> str:
        """The line as the document shows it."""
        return f"- {self.day}: {self.text}" if self.day else self.text


@dataclass
class Fold:
    """A summary line of a month, a year, or the undated rest."""

    period: str  # YYYY-MM, YYYY or 更早
    count: int
    clips: list[str]

    def line(self) -> str:
        """The line as the document shows it, within its budget."""
        head = f"- {self.period}（{self.count} 条）："
        shown: list[str] = []
        for clip in self.clips:
            if len(head) + len("；".join([*shown, clip])) + 2 > FOLD_LINE_CHARS:
                break
            shown.append(clip)
        more = "；…" if len(shown) < len(self.clips) else ""
        return head + "；".join(shown) + more

    def absorb(self, clips: Iterable[str], count: int) -> None:
        """Take in more folded lines (their clips, at the end; repeats once)."""
        self.count += count
        for clip in clips:
            if clip not in self.clips and len(self.clips) < FOLD_CLIPS:
                self.clips.append(clip)


@dataclass
class Body:
    """A profile body taken apart into its managed sections and everything else."""

    head: list[str] = field(default_factory=list)  # the title and free text before sections
    others: list[list[str]] = field(default_factory=list)  # sections we do not manage
    kinds: dict[str, str] = field(default_factory=dict)
    loose: list[str] = field(default_factory=list)  # other lines of 概况, kept
    loose_earlier: list[str] = field(default_factory=list)  # other lines of 早先, kept
    records: list[Record] = field(default_factory=list)
    folds: list[Fold] = field(default_factory=list)  # oldest first

    @classmethod
    def read(cls, text: str) -> Body:
        """Take a body apart; unknown lines of managed sections are kept as records."""
        body = cls()
        section: str | None = None
        block: list[str] | None = None
        for raw in text.splitlines():
            line = raw.rstrip()
            if line.startswith("## "):
                section = line if line in _MANAGED else None
                block = None
                if section is None:
                    block = [line]
                    body.others.append(block)
                continue
            if section is None:
                (block if block is not None else body.head).append(line)
            elif not line.strip():
                continue
            elif section == SUMMARY:
                if m := _KIND_LINE.match(line):
                    body.kinds[m.group(1).strip()] = m.group(2).strip()
                else:
                    body.loose.append(line)
            elif section == EARLIER:
                if m := _FOLD_LINE.match(line):
                    clips = [c for c in m.group(3).split("；") if c and c != "…"]
                    body.folds.append(Fold(m.group(1), int(m.group(2)), clips))
                else:
                    body.loose_earlier.append(line)
            elif m := _RECORD.match(line):
                body.records.append(Record(m.group(1), m.group(2)))
            else:
                body.records.append(Record(None, line))
        return body

    def known_lines(self) -> list[str]:
        """Every statement the body holds, for the duplicate check."""
        lines = [line for line in self.head if line.strip()]
        lines += [line for block in self.others for line in block[1:] if line.strip()]
        lines += list(self.kinds.values()) + self.loose + self.loose_earlier
        lines += [r.text for r in self.records]
        return lines

    def add(self, day: str, text: str, kind: str | None = None) -> None:
        """A new fact: a standing fact (of ``kind``, or of the kind its wording shows)
        replaces its kind's line, anything else is logged."""
        text = " ".join(text.split())  # one line: a statement cannot open a section
        kind = kind or kind_of(text)
        if kind is not None:
            self.kinds.pop(kind, None)  # re-inserted last: the newest kind reads last
            self.kinds[kind] = f"{text}（{day}）"
        else:
            self.records.append(Record(day, _clip(text, RECORD_LINE_CHARS)))

    def render(self) -> str:
        """The body as Markdown."""
        parts = ["\n".join(self.head).strip()]
        parts += ["\n".join(block).strip() for block in self.others]
        if self.kinds or self.loose:
            parts.append(SUMMARY + "\n" + "\n".join([*self.loose, *self._kind_lines()]))
        if self.records:
            parts.append(RECORDS + "\n" + "\n".join(r.line() for r in self.records))
        if self.folds or self.loose_earlier:
            folds = [f.line() for f in self.folds]
            parts.append(EARLIER + "\n" + "\n".join([*self.loose_earlier, *folds]))
        return "\n\n".join(p for p in parts if p) + "\n"

    def _kind_lines(self) -> list[str]:
        return [f"- {kind}：{_clip(text, SUMMARY_LINE_CHARS)}" for kind, text in self.kinds.items()]

    def digest(self) -> str:
        """The text a profile's vector is made of: short, and stable between most facts."""
        window = self.records[: len(self.records) - len(self.records) % EMBED_STEP]
        parts = ["\n".join(self.head).strip()]
        parts += ["\n".join(block).strip() for block in self.others]
        parts += [*self.loose, *self._kind_lines()]
        parts += [r.text for r in window]
        parts += [f.line()[2:] for f in self.folds]
        return _clip("\n".join(p for p in parts if p), DIGEST_CHARS)

    # ------------------------------------------------------------ keeping it bounded

    def compact(self, subject: str | None) -> None:
        """Fold, trim and shorten until every section and the whole body are in budget."""
        while len(self.kinds) > SUMMARY_LINES:
            self.kinds.pop(next(iter(self.kinds)))  # the kind least recently restated
        if (
            len(self.records) > RECORD_MAX_LINES
            or sum(len(r.line()) + 1 for r in self.records) > RECORD_MAX_CHARS
        ):
            self._fold_records(subject)
        self._fold_months()
        while len(self.render()) > BODY_BUDGET and self._shed():
            pass

    def _fold_records(self, subject: str | None) -> None:
        keep, chars = 0, 0
        for record in reversed(self.records):
            chars += len(record.line()) + 1
            if keep >= RECORD_KEEP_LINES or chars > RECORD_MAX_CHARS * 0.6:
                break
            keep += 1
        old, self.records = self.records[: len(self.records) - keep], self.records[-keep:]
        for record in old:
            period = record.day[:7] if record.day else "更早"
            fold = next((f for f in self.folds if f.period == period), None)
            if fold is None:
                fold = Fold(period, 0, [])
                self.folds.append(fold)
            fold.absorb([_summary_clip(record.text, subject)], 1)
        self.folds.sort(key=lambda f: (f.period != "更早", f.period))

    def _fold_months(self) -> None:
        months = [f for f in self.folds if len(f.period) == 7]
        for month in months[: max(len(months) - MONTH_LINES, 0)]:
            year = next((f for f in self.folds if f.period == month.period[:4]), None)
            if year is None:
                year = Fold(month.period[:4], 0, [])
                self.folds.append(year)
            year.absorb(month.clips, month.count)
            self.folds.remove(month)
        years = [f for f in self.folds if len(f.period) == 4]
        for old in years[: max(len(years) - YEAR_LINES, 0)]:
            self.folds.remove(old)  # more than five years of folded chat: the oldest go
        self.folds.sort(key=lambda f: (f.period != "更早", f.period[:4], len(f.period)))

    def _shed(self) -> bool:
        """Make the body one step shorter; False when nothing is left to shorten."""
        if self.folds:
            self.folds.pop(0)
            return True
        if len(self.records) > 1:
            self.records.pop(0)
            return True
        blocks = [
            b
            for b in [self.head, self.loose, self.loose_earlier, *self.others]
            if sum(map(len, b)) > 200
        ]
        if not blocks:
            if self.kinds:
                self.kinds.pop(next(iter(self.kinds)))
                return True
            return False
        longest = max(blocks, key=lambda b: sum(map(len, b)))
        if len(longest) > 2:
            # The last line before the "…" mark goes (the mark is added once).
            if longest[-1] == "…":
                del longest[-2]
            else:
                longest[-1] = "…"
        else:
            longest[-1] = _clip(longest[-1], max(len(longest[-1]) // 2, 100))
        return True


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _summary_clip(text: str, subject: str | None) -> str:
    """A few words of a folded record: its subject's name and the final stop dropped."""
    if subject and text.startswith(subject):
        text = _LEADING_ID.sub("", text[len(subject) :])
    return _clip(text.strip(" ，,。."), CLIP_CHARS).replace("；", "，")


def within_budget(body: str, subject: str | None) -> str:
    """A body someone wrote (a model, a person), compacted only if it is over budget."""
    if len(body) <= BODY_BUDGET:
        return body
    parsed = Body.read(body)
    parsed.compact(subject)
    return parsed.render()


def digest(body: str) -> str:
    """The text a profile body is embedded as."""
    return Body.read(body).digest()
