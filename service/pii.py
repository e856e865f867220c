"""Personal data in text (seed 003 §7.4, seed 004 §14): find it, mask it, or drop the item.

Phone numbers, e-mail addresses, Chinese ID numbers, bank card numbers (Luhn-checked) and
exact street addresses. The tenant's policy decides: ``store`` (as is), ``mask`` (the middle
hidden: ``138****5678``), ``drop`` (the item is not stored). The historian applies it before
anything is embedded, so a vector never encodes what the policy removed.

Every check reads the text as ``normalise`` gives it, not as typed: ``１３８００１３８０００``,
``alice＠example.com`` and digits with zero-width characters between them are the same data
to whoever reads them, so they are the same data to the checks. Findings are reported, and
masked, at the characters of the original text.
"""

from __future__ import annotations

import bisect
import functools
import re
import unicodedata
from dataclasses import dataclass

POLICIES = ("store", "mask", "drop")

# Characters a reader does not see: the format characters (zero-width space and joiners,
# word joiner, byte-order mark, soft hyphen, bidirectional controls, tags) and the other
# default-ignorable ones (variation selectors, fillers). Between two digits they hide a
# number from a pattern and not from a person, so the checks read the text without them.
_IGNORED_RANGES = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x0600, 0x0605), (0x061C, 0x061C),
    (0x06DD, 0x06DD), (0x070F, 0x070F), (0x0890, 0x0891), (0x08E2, 0x08E2),
    (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x200B, 0x200F),
    (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD),
    (0x110CD, 0x110CD), (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)  # fmt: skip
_IGNORED = frozenset(chr(c) for low, high in _IGNORED_RANGES for c in range(low, high + 1))
# Dashes NFKC leaves as they are: a number typed with any of them is the number with "-".
_DASHES = frozenset("\u2010\u2011\u2012\u2013\u2014\u2015\u2212\u2043\ufe58\u30fc")
# A text with none of these (and already NFKC) reads as it is typed: no per-character pass.
_UNUSUAL = re.compile(
    "["
    + "".join(f"\\U{low:08x}-\\U{high:08x}" for low, high in _IGNORED_RANGES)
    + "".join(f"\\U{ord(d):08x}" for d in sorted(_DASHES))
    + "]|(?![0-9])\\d"
)


@dataclass(frozen=True)
class Normalised:
    """A text as the checks read it, and the index in the original of each of its
    characters (``origin``; None where it is the original)."""

    text: str
    origin: list[int] | None

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The original characters ``[start, end)`` of the normalised text came from."""
        if self.origin is None or start == end:
            return start, end
        return self.origin[start], self.origin[end - 1] + 1


def normalise(text: str) -> Normalised:
    """NFKC (full-width forms), every script's digits as 0-9, dashes as "-", and no
    invisible characters: the text as a reader takes it in."""
    if text.isascii() or (
        unicodedata.is_normalized("NFKC", text) and _UNUSUAL.search(text) is None
    ):
        return Normalised(text, None)
    out: list[str] = []
    origin: list[int] = []
    for run in _RUNS.finditer(text):
        start = run.start()
        if run.group(1) is not None:  # ASCII stays as it is, a run at a time
            out.append(run.group(1))
            origin.extend(range(start, run.end()))
            continue
        for index, char in enumerate(run.group(2), start):
            piece = _PIECES.get(char)
            if piece is None:
                piece = _piece(char)
                if len(_PIECES) < 65_536:
                    _PIECES[char] = piece
            if len(piece) == 1:
                out.append(piece)
                origin.append(index)
            elif piece:
                out.append(piece)
                origin.extend([index] * len(piece))
    return Normalised("".join(out), origin)


_RUNS = re.compile(r"([\x00-\x7f]+)|([^\x00-\x7f]+)")
_PIECES: dict[str, str] = {}  # a character → what it reads as (a bounded cache)


def _piece(char: str) -> str:
    if char in _IGNORED:
        return ""
    if char in _DASHES:
        return "-"
    if char.isdecimal():
        return str(unicodedata.decimal(char))
    return unicodedata.normalize("NFKC", char)


# The patterns run over normalised text, where a digit is 0-9 and a dash is "-". Between
# the groups of a number a space, a dot or a dash may stand ("138 0013 8000",
# "138.0013.8000"); the groups keep the number's own shape, so a date (2026.11.30) or a
# version (3.11.7) has none. Runs of the same class are entered at their first character
# only (the lookbehinds): from every character of a long run, each search would be
# quadratic in the run's length. The matches are the same, since a match from inside a run
# is part of one from its start.
_EMAIL = re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")
_CN_ID = re.compile(
    r"(?<!\d)[1-9]\d{5}[ -]?(?:19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])[ -]?"
    r"\d{3}[\dXx](?!\d)"
)
_CARD = re.compile(r"(?<!\d)(?:\d[ -]?){15,18}\d(?!\d)")
_CN_MOBILE = re.compile(
    r"(?<!\d)(?:(?:\+|00)?86[ .-]?|\(\+?86\)[ .-]?)?1[3-9]\d[ .-]?\d{4}[ .-]?\d{4}(?!\d)"
)
_PHONE = re.compile(
    # International, with its "+": +1 415 555 0132, +44-20-7946-0958.
    r"(?<![A-Za-z0-9+])\+\d{1,3}[ .-]?\d{2,4}[ .-]?\d{3,4}[ .-]?\d{3,4}(?!\d)"
    # A Chinese landline with its area code: 010-12345678, 0755 12345678, (0755)12345678;
    # not the decimals of a number (3.0125 12345678).
    r"|(?<![\d(.])0\d{2,3}[ .-]\d{7,8}(?!\d)|(?<!\d)\(0\d{2,3}\)[ -]?\d{7,8}(?!\d)"
    # North American: (415) 555-0134, +1 (415) 555 0134, 415-555-0134, 415.555.0134.
    r"|(?<![\d+])(?:\+?1[ .-]?)?\([2-9]\d{2}\)[ .-]?[2-9]\d{2}[ .-]?\d{4}(?!\d)"
    r"|(?<![\d.-])[2-9]\d{2}([.-])[2-9]\d{2}\1\d{4}(?!\d|[.-]\d)"
)
_CN_ADDRESS = re.compile(
    r"(?<![\u4e00-\u9fff])[\u4e00-\u9fff]{2,}(?:路|街|道|巷|弄|大道)\s*\d+\s*(?:号|弄)"
    r"(?:\s*\d+\s*(?:栋|幢|号楼|单元|室|层|楼)){0,4}"
)
_EN_ADDRESS = re.compile(
    r"\b\d{1,5}\s+(?:[A-Z][a-z]+\s){1,3}(?:Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Lane|Ln|Drive|Dr)\b\.?",
)
# In this order: an id number is also 18 digits a card pattern takes, a card's digits hold
# an 11-digit run a phone pattern takes; the first kind to claim characters keeps them.
_FINDERS = (
    ("email", _EMAIL),
    ("id_number", _CN_ID),
    ("bank_card", _CARD),
    ("phone", _CN_MOBILE),
    ("phone", _PHONE),
    ("address", _CN_ADDRESS),
    ("address", _EN_ADDRESS),
)


@dataclass(frozen=True)
class Finding:
    """One piece of personal data in a text: ``text[start:end]`` of the original text,
    and ``value``, how the checks read it (full-width forms and invisible characters
    undone)."""

    kind: str
    start: int
    end: int
    text: str
    value: str


_DOUBLED = (0, 2, 4, 6, 8, 1, 3, 5, 7, 9)  # a digit doubled, its digits summed


def _luhn(digits: str) -> bool:
    values = [ord(ch) - 48 for ch in reversed(digits)]
    return (sum(values[0::2]) + sum(_DOUBLED[d] for d in values[1::2])) % 10 == 0


def _find(text: str, normal: Normalised) -> list[Finding]:
    found: list[Finding] = []
    # The spans taken so far, disjoint and sorted: a match overlaps one only if it overlaps
    # the last to start before it ends, so a text of thousands of numbers is no quadratic
    # search of every earlier finding.
    starts: list[int] = []
    ends: list[int] = []
    for kind, pattern in _FINDERS:
        for match in pattern.finditer(normal.text):
            at = bisect.bisect_left(starts, match.end())
            if at and ends[at - 1] > match.start():
                continue  # (before the checksum: a card number is mostly an id found first)
            value = match.group(0)
            if kind == "bank_card" and not _luhn(re.sub(r"\D", "", value)):
                continue
            starts.insert(at, match.start())
            ends.insert(at, match.end())
            start, end = normal.span(*match.span())
            found.append(Finding(kind, start, end, text[start:end], value))
    return sorted(found, key=lambda f: f.start)


# The last few texts read: a text is checked, then masked or classified, in a row (the
# historian's screen, a profile's check), and each reading is linear but not cheap.
@functools.lru_cache(maxsize=4)
def _read(text: str) -> tuple[Normalised, tuple[Finding, ...]]:
    normal = normalise(text)
    return normal, tuple(_find(text, normal))


def find(text: str) -> list[Finding]:
    """Every piece of personal data found, left to right, without overlaps."""
    return list(_read(text)[1])


def mask_one(value: str) -> str:
    """Keep the edges, hide the middle: 13812345678 → 138****5678, a@b.com → a***@b.com."""
    if "@" in value:
        name, _, domain = value.partition("@")
        return f"{name[:1]}***@{domain}"
    if sum(ch.isdigit() for ch in value) >= 7:
        digits = re.sub(r"\D", "", value)
        return f"{digits[:3]}{'*' * max(len(digits) - 7, 4)}{digits[-4:]}"
    keep = max(len(value) // 4, 1)
    return value[:keep] + "*" * (len(value) - 2 * keep) + value[-keep:]


def _masked(text: str, findings: list[Finding]) -> str:
    # Each finding's original characters (full-width digits, the zero-width ones between
    # them) give way to the mask of what they read as.
    out, last = [], 0
    for finding in findings:
        out.append(text[last : finding.start])
        out.append(mask_one(finding.value))
        last = finding.end
    out.append(text[last:])
    return "".join(out)


def mask(text: str) -> str:
    """The text with every finding masked."""
    return _masked(text, find(text))


def apply(text: str, policy: str) -> tuple[str | None, list[str]]:
    """(the text to keep, or None to drop it; the kinds found)."""
    findings = find(text)
    kinds = sorted({f.kind for f in findings})
    if not findings or policy == "store":
        return text, kinds
    if policy == "drop":
        return None, kinds
    return _masked(text, findings), kinds


# Health: conditions, diagnoses, treatment. Not personal data by form (like a phone number)
# but by meaning, so words; a sensitive category all the same (seed 004 §14). Only words
# that name a condition or its treatment: "药" or "医院" alone is everyday talk, and "透析"
# is also "analyse thoroughly" (透析一下这个问题). English words are bounded by letters, not
# by \b: Chinese characters are word characters, and "确诊为HIV阳性" has no \b around HIV.
_HEALTH = re.compile(
    r"诊断|确诊|患有|患上|得了[^，。,.]{0,6}(?:病|癌|症)|艾滋|癌症|肿瘤|糖尿病|抑郁|焦虑症|"
    r"精神(?:病|分裂|疾病|科)|双相|怀孕|流产|过敏|服药|吃药|住院|手术|残疾|"
    r"心脏病|冠心病|心梗|脑梗|高血压|胰岛素|哮喘|癫痫|[乙丙]肝|肝炎|白血病|结核病|"
    r"化疗|放疗|透析(?!一下|一番|了一下|这|那|其|出|问题|本质|原因|现象)|"
    r"心理(?:咨询|治疗|医生)|帕金森|阿尔茨海默|老年痴呆|自闭症|孤独症|多动症|强迫症|厌食症|"
    r"梅毒|性病|"
    r"(?<![A-Za-z])(?:HIV|AIDS|diagnos\w*|cancer|tumou?rs?|diabet\w*|depress\w*|"
    r"antidepressants?|anxiety disorder|bipolar|schizophren\w*|pregnan\w*|miscarriage|"
    r"allerg\w*|medication|hospitali[sz]ed|surgery|disabilit\w*|therap(?:y|ist)|"
    r"heart (?:disease|attack|failure)|insulin|chemo(?:therapy)?|radiotherapy|dialysis|"
    r"epilep\w*|asthma\w*|hypertension|hepatitis|leuka?emia|tuberculosis|psychiatr\w*|"
    r"psychotherap\w*|alzheimer'?s|parkinson'?s|autis(?:m|tic)|ADHD)(?![A-Za-z])",
    re.I,
)


def sensitive(text: str) -> list[str]:
    """The sensitive categories of a text, sorted: ``health`` and the kinds of personal data
    ``find`` sees (phone, email, id_number, bank_card, address). What holds any of them is
    never shared beyond the conversation it was said in."""
    normal, findings = _read(text)
    kinds = {f.kind for f in findings}
    if _HEALTH.search(normal.text):
        kinds.add("health")
    return sorted(kinds)
