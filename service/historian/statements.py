"""What the rules make of one message without an LLM: absolute statements about the right
person, each with the standing-fact slot its sentence states, if any."""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.historian.absolutize import Person, Situation, absolutize
from service.historian.gate import gate
from service.historian.profiles import announces_for_group
from service.historian.standing import SLOTS, sentences, standing, standing_facts
from service.historian.subjects import in_third_person, unaddressed

# Leading white space is matched (and removed) from its first character only: tried from
# every character of a long run of spaces, the search was quadratic in the run. The English
# words are whole words: "notebook", "remembered" and "keynote" ask nothing.
REMEMBER = re.compile(
    r"(?<!\s)\s*(?:请|帮我|麻烦)?(?:记住|记得|别忘了|不要忘了|记一下)了?[：:，,\s]*"
    r"|(?<!\s)\s*\b(?:please\s+)?(?:remember|don't forget|do not forget|note|keep in mind)\b"
    r"\s*(?:that\s+)?[:,]?\s*",
    re.I,
)
_STRIP = " ，,。.!！"
_FROM_NOW_ON = re.compile(r"\b(from)\s+now\s+on\b", re.I)


@dataclass(frozen=True)
class Statement:
    """One thing a message says, rewritten by the rules."""

    text: str  # the rules' rewrite: third person, absolute where the rules could
    original: str  # the words it was made from
    slot: str | None = None  # work, home, school, pet, birthday, relationship
    for_group: bool = False  # a rule or an announcement for the whole group

    @property
    def kind(self) -> str | None:
        """The profile's label of its slot."""
        return SLOTS[self.slot] if self.slot else None


def draft(text: str, situation: Situation) -> str:
    """The rules' rewrite: English first person turned into the third (its verbs agreeing),
    then times, pronouns and places made absolute."""
    # "From now on" starts a rule on the day it is said; read word by word, "now" would
    # become "as of <day>" inside it.
    day = situation.moment.date().isoformat()
    text = _FROM_NOW_ON.sub(lambda m: f"{m.group(1)} {day} on", text)
    return absolutize(in_third_person(text, situation.first_person), situation)


def observed(text: str, situation: Situation, bot: Person) -> Statement:
    """An observation the bot handed over, rewritten by the rules, its addresses to the bot
    taken off. Where it is one sentence stating a standing fact, the fact is what is kept,
    with its slot and its subject ("现在在阿里巴巴做前端开发" → "张三(10001)在阿里巴巴…")."""
    said = unaddressed(text, bot) or text
    found = standing_facts(said)
    if len(found) == 1 and len(sentences(said)) == 1:
        fact = found[0]
        return Statement(draft(fact.clause + fact.rest, situation), fact.clause, fact.slot)
    return Statement(draft(said, situation), said)


def offline_statements(text: str, situation: Situation, bot: Person) -> list[Statement]:
    """What a message says that the rules keep: everything it asks to be remembered, and
    otherwise its group rules and the speaker's standing facts (only those that are
    absolute once rewritten)."""
    said = unaddressed(text, bot)
    if REMEMBER.search(said):
        stripped = unaddressed(REMEMBER.sub("", said, count=1).strip(_STRIP), bot)
        found = standing(stripped)
        return [
            Statement(
                draft(stripped, situation),
                stripped,
                found.slot if found else None,
                announces_for_group(stripped),
            )
        ]
    if announces_for_group(said):
        statement = Statement(draft(said.strip(_STRIP), situation), said, None, True)
        return [] if gate(statement.text) else [statement]
    statements = []
    for fact in standing_facts(said):
        rewritten = draft(fact.clause, situation)
        if not gate(rewritten):
            statements.append(Statement(rewritten, fact.clause, fact.slot))
    return statements
