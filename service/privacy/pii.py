"""Personal data in text (seed 003 §7.4, seed 004 §14): find it, mask it, or drop the item.

Phone numbers, e-mail addresses, Chinese ID numbers, bank card numbers (Luhn-checked) and
exact street addresses. The tenant's policy decides: ``store`` (as is), ``mask`` (the middle
hidden: ``138****5678``), ``drop`` (the item is not stored). The historian applies it before
anything is embedded, so a vector never encodes what the policy removed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

POLICIES = ("store", "mask", "drop")

# Runs of the same class are entered at their first character only (the lookbehinds): from
# every character of a long run, each search would be quadratic in the run's length. The
# matches are the same, since a match from inside a run is part of one from its start.
_EMAIL = re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")
_CN_ID = re.compile(
    r"(?<!\d)[1-9]\d{5}(?:19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])\d{3}[\dXx](?!\d)"
)
_CARD = re.compile(r"(?<!\d)(?:\d[ -]?){15,18}\d(?!\d)")
_CN_MOBILE = re.compile(r"(?<!\d)(?:\+?86[ -]?)?1[3-9]\d[ -]?\d{4}[ -]?\d{4}(?!\d)")
_PHONE = re.compile(
    r"(?<![\w+])\+\d{1,3}[ -]?\d{2,4}[ -]?\d{3,4}[ -]?\d{3,4}(?!\d)|(?<!\d)0\d{2,3}-\d{7,8}(?!\d)"
)
_CN_ADDRESS = re.compile(
    r"(?<![\u4e00-\u9fff])[\u4e00-\u9fff]{2,}(?:路|街|道|巷|弄|大道)\s*\d+\s*(?:号|弄)"
    r"(?:\s*\d+\s*(?:栋|幢|号楼|单元|室|层|楼)){0,4}"
)
_EN_ADDRESS = re.compile(
    r"\b\d{1,5}\s+(?:[A-Z][a-z]+\s){1,3}(?:Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Lane|Ln|Drive|Dr)\b\.?",
)


@dataclass(frozen=True)
class Finding:
    """One piece of personal data in a text."""

    kind: str
    start: int
    end: int
    text: str


def _luhn(digits: str) -> bool:
    total = 0
    for n, ch in enumerate(reversed(digits)):
        d = int(ch)
        if n % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def find(text: str) -> list[Finding]:
    """Every piece of personal data found, left to right, without overlaps."""
    found: list[Finding] = []
    for kind, pattern in (
        ("email", _EMAIL),
        ("id_number", _CN_ID),
        ("bank_card", _CARD),
        ("phone", _CN_MOBILE),
        ("phone", _PHONE),
        ("address", _CN_ADDRESS),
        ("address", _EN_ADDRESS),
    ):
        for match in pattern.finditer(text):
            if kind == "bank_card" and not _luhn(re.sub(r"\D", "", match.group(0))):
                continue
            if any(f.start < match.end() and match.start() < f.end for f in found):
                continue
            found.append(Finding(kind, match.start(), match.end(), match.group(0)))
    return sorted(found, key=lambda f: f.start)


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


def mask(text: str) -> str:
    """The text with every finding masked."""
    out, last = [], 0
    for finding in find(text):
        out.append(text[last : finding.start])
        out.append(mask_one(finding.text))
        last = finding.end
    out.append(text[last:])
    return "".join(out)


def apply(text: str, policy: str) -> tuple[str | None, list[str]]:
    """(the text to keep, or None to drop it; the kinds found)."""
    findings = find(text)
    kinds = sorted({f.kind for f in findings})
    if not findings or policy == "store":
        return text, kinds
    if policy == "drop":
        return None, kinds
    return mask(text), kinds


# Health: conditions, diagnoses, treatment. Not personal data by form (like a phone number)
# but by meaning, so words; a sensitive category all the same (seed 004 §14).
_HEALTH = re.compile(
    r"诊断|确诊|患有|患上|得了[^，。,.]{0,6}(?:病|癌|症)|艾滋|癌症|肿瘤|糖尿病|抑郁|焦虑症|"
    r"精神(?:病|分裂|疾病)|双相|怀孕|流产|过敏|服药|吃药|住院|手术|残疾|"
    r"\b(?:HIV|AIDS|diagnos\w*|cancer|tumou?rs?|diabet\w*|depress\w*|anxiety disorder|"
    r"bipolar|schizophren\w*|pregnan\w*|miscarriage|allerg\w*|medication|hospitali[sz]ed|"
    r"surgery|disabilit\w*|therap(?:y|ist))\b",
    re.I,
)


def sensitive(text: str) -> list[str]:
    """The sensitive categories of a text, sorted: ``health`` and the kinds of personal data
    ``find`` sees (phone, email, id_number, bank_card, address). What holds any of them is
    never shared beyond the conversation it was said in."""
    kinds = {f.kind for f in find(text)}
    if _HEALTH.search(text):
        kinds.add("health")
    return sorted(kinds)
