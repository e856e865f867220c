"""Who a sentence is about: addresses to the bot taken off, and English first person turned
into the third with its verb agreeing ("I prefer" → "Alice prefers").

The rule rewriter puts a name where "I" was; English then needs the verb to follow the name.
A person's gender is not known, so "my" becomes the name's possessive ("Alice's cat").
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from service.historian.absolutize import Person

# A mention of someone: ``[CQ:at,qq=…]`` or an ``<at … qq|id|user_id=…>`` tag, no '<' crossed.
_AT_CODE = re.compile(
    r"\[CQ:at,qq=(\w+)[^\]]{0,64}\]|<at\b[^<>]{0,200}?\b(?:qq|id|user_id)=\"?(\w+)[^<>]{0,200}>"
)
_CALL = r"[\s,，:：!！~～、]*"


def unaddressed(text: str, bot: Person, others: Iterable[str] = ()) -> str:
    """The text without its addresses to the bot: its @-mentions and CQ at codes, and its
    name said as a vocative at the start or the end ("小助手，李四对花生过敏"). The bot is the
    one spoken to, never the subject of what it is told."""
    ids = {i for i in (bot.id, *others) if i}
    names = sorted({n.strip() for n in (bot.name,) if n and n.strip()}, key=len, reverse=True)

    def code(m: re.Match[str]) -> str:
        return " " if (m.group(1) or m.group(2)) in ids else m.group(0)

    out = _AT_CODE.sub(code, text)
    for name in names:
        quoted = re.escape(name)
        out = re.sub(rf"@{quoted}{_CALL}", " ", out)
        # The name as a vocative: at the start (with or without a greeting) or the end.
        out = re.sub(
            rf"^\s*(?:(?:hey|hi|hello|ok|okay|嘿|喂|哎|嗨)[\s,，]*)?{quoted}(?:同学|酱|君)?"
            rf"(?=[\s,，:：!！~～、])[\s,，:：!！~～、]+",
            "",
            out,
            flags=re.I,
        )
        out = re.sub(rf"[\s,，、]+{quoted}[\s!！~～。.]*$", "", out)
    return re.sub(r"[ \t]{2,}", " ", out).strip()


# ---------------------------------------------------------------- English third person

_NEGATED = {"haven": "hasn", "have": "has", "don": "doesn", "do": "does", "aren": "isn"}
_IRREGULAR = {"be": "is", "have": "has", "do": "does", "go": "goes", "am": "is"}
# Left as they are: modals, past forms, and verbs whose past looks like the present.
_UNCHANGED = frozenset(
    (  # noqa: SIM905 (a word list reads as words)
        "can could will would shall should may might must ought used was were did had went got "
        "made took saw came knew thought felt found gave told became left kept met ran said "
        "brought bought began wrote ate drank drove flew grew heard held lost paid sat sent "
        "slept spent stood taught understood won wore built caught chose fell forgot hid led "
        "lent meant rode rose sang sold shot spoke stole swam threw woke broke put cut set hit "
        "let quit read cost hurt shut spread bet fit also just really still always never often "
        "usually sometimes only even actually definitely totally mostly recently currently now "
        "already kinda sorta probably finally and or but"
    ).split()
)
_ADVERBS = (
    r"(?:(?:also|just|really|still|always|never|often|usually|sometimes|only|even|actually|"
    r"definitely|totally|mostly|currently|now|already|kinda|sorta|probably|finally|"
    r"absolutely|truly|honestly|personally|generally|rarely|seldom|hardly|literally)\s+)*"
)
_FIRST = re.compile(
    r"\bI(?P<c>'m|’m|'ve|’ve|'ll|’ll|'d|’d)(?![\w'’])"
    r"|\bI(?P<neg>\s+(?:don't|don’t|do not))\b"
    rf"|\bI(?P<adv>\s+{_ADVERBS})(?P<verb>[a-z]+)(?P<nt>n?['’]t\b)?(?![\w'’])"
    r"|\bI\b(?!['’]\w)"
    r"|(?i:\b(?P<poss>my|mine)\b)"
    r"|(?i:\b(?P<obj>me|myself)\b)"
)


def conjugated(verb: str) -> str:
    """The third person singular of an English verb in the present: goes, has, tries, likes."""
    if verb in _IRREGULAR:
        return _IRREGULAR[verb]
    if verb in _UNCHANGED or (verb.endswith("ed") and not verb.endswith("eed")):
        return verb
    if re.search(r"(?:s|sh|ch|x|z|o)$", verb):
        return verb + "es"
    if re.search(r"[^aeiou]y$", verb):
        return verb[:-1] + "ies"
    return verb + "s"


def in_third_person(text: str, person: Person) -> str:
    """English first person about ``person`` in the third: the name (with its id the first
    time) and an agreeing verb; "my" becomes the name's possessive. Chinese is left to the
    rule rewriter, which needs no agreement."""
    if not person.known or not re.search(r"\b(?:I|[Mm]y|[Mm]e|[Mm]ine|[Mm]yself)\b", text):
        return text
    mention = person.mentions()

    def replace(m: re.Match[str]) -> str:
        who = mention(m)
        if m.group("c"):
            contraction = m.group("c")[1:]
            return who + {"m": " is", "ve": " has", "ll": " will", "d": " would"}[contraction]
        if m.group("neg"):
            return who + (" does not" if "not" in m.group("neg") else " doesn't")
        if m.group("nt"):
            # "haven't" → "hasn't"; a modal's or a past form's negation stays as it is.
            verb = _NEGATED.get(m.group("verb"), m.group("verb"))
            return f"{who}{m.group('adv')}{verb}{m.group('nt')}"
        if m.group("verb"):
            return f"{who}{m.group('adv')}{conjugated(m.group('verb'))}"
        if m.group("poss"):
            return f"{who}'s"
        return who

    return _FIRST.sub(replace, text)
