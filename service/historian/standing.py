"""Standing facts: where someone works, lives and studies, their pet, birthday and partner.

A sentence is read by its structure: a subject (the speaker, "我"/"I", or nobody in Chinese,
where the speaker is understood), a predicate of one kind (在X工作, 住在, "I work at",
"moving to"…) and its object. A newer fact of a slot replaces the older one of the same slot
for the same person, in the profile and in the memories.

Conservative by design: a question, a negation, a wish or a hypothesis, a joke, or a
sentence about someone else ("我朋友在阿里工作") is not a fact of the speaker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.profiles.consolidate import kind_of

# The profile's line label of each slot (the 概况 section of a profile body).
SLOTS = {
    "work": "工作",
    "home": "居住地",
    "school": "学业",
    "pet": "宠物",
    "birthday": "生日",
    "relationship": "感情",
}


@dataclass(frozen=True)
class Standing:
    """A standing fact found in a sentence: its slot and the clause that states it, in the
    speaker's own words (first person, or no subject in Chinese)."""

    slot: str
    clause: str
    rest: str = ""  # what the sentence goes on to say after it ("，主要写 Go")

    @property
    def kind(self) -> str:
        """The profile's label of the slot."""
        return SLOTS[self.slot]


# ---------------------------------------------------------------- what is not a fact

_CN_NOT_A_FACT = re.compile(
    r"[?？]|吗|呢|么|哪|什么|谁|多少|是不是|有没有|要不要|会不会|能不能|怎么|为什么|啥|"
    r"如果|要是|假如|假设|万一|的话|想|希望|梦想|打算|也许|可能|说不定|或许|"
    r"哈哈|开玩笑|玩笑|逗你|[😂🤣]|听说|据说|他说|她说|说他|说她"
)
_EN_NOT_A_FACT = re.compile(
    r"\?|^\s*(?:do|does|did|are|is|was|were|can|could|would|will|should|have|has|what|where|"
    r"when|who|why|how|which)\b|\b(?:if|unless|would|wish|imagine|suppose|maybe|might|hope|"
    r"hoping|want|wanna|dream(?:ing)?|someday|plan(?:ning)? to|thinking (?:about|of)|could|"
    r"lol|lmao|jk|kidding|joking|haha\w*|said|says|told me|heard|pretend(?:ing)?)\b",
    re.I,
)

# ---------------------------------------------------------------- Chinese

_CN_JOB = (
    r"开发|工程师|程序员|设计|产品|运营|销售|老师|教师|医生|护士|会计|律师|记者|编辑|主管|"
    r"经理|总监|实习|研究员|测试|运维|算法|前端|后端|客服|人事|财务|市场|咨询|顾问|翻译|"
    r"厨师|司机|警察|兼职|全职|店员|主播|UP主|公务员|教授|讲师|助理|架构师|分析师|工人"
)
_CN_PET = r"猫咪|猫|狗狗|狗|仓鼠|兔子|鹦鹉|金毛|柯基|泰迪|哈士奇|布偶|英短|橘猫|乌龟|柴犬|宠物"
_CN_PARTNER = r"男朋友|女朋友|男友|女友|老公|老婆|丈夫|妻子|太太|未婚夫|未婚妻|对象|爱人"
_X = r"[^，,。；;！!？?\s]{1,20}?"
_END = r"(?=[，,。；;！!？?\s]|$)"
# Words that may stand between the subject and the predicate without making it someone
# else's fact or a different kind of sentence.
_CN_BETWEEN = (
    r"(?:现在|目前|如今|眼下|已经|也|还|一直|终于|刚|刚刚|马上|就要|快要|要|准备|正在|"
    r"今年|明年|下个?月|下周|月底|年底|去年|上个?月|前段时间|从去年开始|从小|就|都)*"
)

_CN_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "work",
        re.compile(
            rf"在(?P<o>{_X})(?:工作|上班|任职|实习)|在(?P<o2>{_X})(?:做|当)(?P<r>[^，,。；;！!？?\s]{{0,10}}(?:{_CN_JOB})[^，,。；;！!？?\s]{{0,6}}){_END}"
            rf"|(?:入职|加入|跳槽到|就职于)了?(?P<o3>{_X}){_END}"
            rf"|是(?:一名|一个|一位|个|名)?(?P<r2>[^，,。；;！!？?\s的]{{0,10}}(?:{_CN_JOB})[^，,。；;！!？?\s的]{{0,4}}){_END}"
            rf"|是(?P<o4>{_X})的(?P<r3>[^，,。；;！!？?\s]{{0,10}}(?:{_CN_JOB})[^，,。；;！!？?\s]{{0,4}}){_END}"
            rf"|(?:的)?(?:工作|职业)是(?P<r4>{_X}){_END}"
        ),
    ),
    (
        "school",
        re.compile(
            rf"在(?P<o>{_X})(?:读书|上学|念书|上大学|读(?:大学|研|博|本科|研究生|高中|初中|小学)"
            rf"|读(?:大|研|博|高|初)[一二三四五])"
            rf"|就读于(?P<o2>{_X}){_END}|考上了?(?P<o3>{_X}){_END}"
            rf"|是(?P<o4>{_X})的(?:学生|研究生|博士生|本科生|新生){_END}"
            rf"|(?:读|上|念)(?:大|研|博|高|初)[一二三四五]{_END}"
            rf"|(?:学的|专业)是(?P<o5>{_X}){_END}"
        ),
    ),
    (
        "home",
        re.compile(
            rf"(?:住在|定居在?|搬到了?|搬家到|搬去了?|搬回了?)(?P<o>{_X}){_END}"
            rf"|^家(?:住|在)(?P<o2>{_X}){_END}"
        ),
    ),
    (
        "pet",
        re.compile(
            rf"(?:养了?|有)(?:一|两|三|几)?(?:只|条|个|头)?(?:小)?(?:{_CN_PET})"
            rf"|^(?:家|的)?的?(?:小)?(?:{_CN_PET})(?:叫|名字(?:是|叫))(?P<o>{_X}){_END}"
        ),
    ),
    (
        "birthday",
        re.compile(
            rf"^的?生日(?:是|在|就是)(?P<o>[^，,。；;！!？?]{{1,20}}?){_END}"
            rf"|是?(?P<o2>\d{{4}}年\d{{1,2}}月\d{{1,2}}[日号]|\d{{1,2}}月\d{{1,2}}[日号])(?:出生|生)的?"
        ),
    ),
    (
        "relationship",
        re.compile(
            rf"^的?(?:{_CN_PARTNER})(?:是|叫)(?P<o>{_X}){_END}"
            rf"|(?:和|跟)(?P<o2>[^，,。；;！!？?\s]{{1,10}}?)(?:结婚了|订婚了|在一起了|领证了)"
            rf"|(?:结婚了|离婚了|订婚了|分手了|脱单了|是单身|单身)"
        ),
    ),
)
# "下周三是我生日", "写代码是我的工作": the object comes first.
_CN_OBJECT_FIRST = (
    ("birthday", re.compile(rf"^(?P<o>[^，,。；;！!？?]{{1,16}}?)是我的?生日{_END}")),
    ("work", re.compile(rf"^(?P<o>[^，,。；;！!？?]{{1,16}}?)是我的(?:工作|职业){_END}")),
)
_CN_SUBJECT = re.compile(r"^(?:我|本人)")
# "我下周三生日": a day, then 生日, after the subject.
_CN_DAY_BIRTHDAY = re.compile(
    r"^(?P<o>今天|明天|后天|大后天|(?:下|这|本)?(?:周|星期|礼拜)[一二三四五六日天]"
    r"|下个?月\d{1,2}[日号]|\d{1,2}月\d{1,2}[日号]|\d{1,2}[日号])(?:过)?生日" + _END
)


def _chinese(sentence: str) -> Standing | None:
    seen = 0
    pieces = re.split(r"([，,；;])", sentence)
    for n in range(0, len(pieces), 2):
        after = "".join(pieces[n + 1 :]).rstrip(" 。.!！~～")
        clause = pieces[n].strip(" 。.!！~～")
        clause = re.sub(r"^(?:嗯|哦|噢|对了|其实|顺便说下|顺便说一下|告诉你们)[，,\s]*", "", clause)
        if not clause:
            continue
        for slot, pattern in _CN_OBJECT_FIRST:
            if m := pattern.match(clause):
                said = "我的生日是" if slot == "birthday" else "我的工作是"
                return Standing(slot, said + m.group("o"), after)
        subject = _CN_SUBJECT.match(clause)
        seen += 1
        if subject is None and seen > 1:
            continue  # no subject of its own: it may go on about whoever came before
        rest = clause[subject.end() :] if subject else clause
        between = re.match(_CN_BETWEEN, rest)
        assert between is not None
        predicate = rest[between.end() :]
        if subject and (m := _CN_DAY_BIRTHDAY.match(rest)):
            return Standing("birthday", f"我的生日是{m.group('o')}", after)
        for slot, pattern in _CN_RULES:
            if pattern.match(predicate) is None:
                continue
            if (
                not subject
                and slot in ("pet", "relationship", "birthday")
                and predicate[:1] in "的家"
            ):
                return None  # "的猫叫…" with no one before it is not the speaker's
            kept = re.sub(r"现在|目前|如今|眼下", "", rest[: between.end()])
            return Standing(slot, "我" + kept + predicate, after)
    return None


# ---------------------------------------------------------------- English

_ROLE = (
    r"engineer|developer|programmer|teacher|nurse|doctor|designer|manager|lawyer|accountant|"
    r"consultant|chef|cook|waiter|waitress|barista|cashier|writer|journalist|artist|"
    r"photographer|musician|scientist|researcher|analyst|architect|pilot|driver|firefighter|"
    r"officer|intern|professor|lecturer|tutor|librarian|pharmacist|dentist|therapist|"
    r"counselor|electrician|plumber|mechanic|carpenter|farmer|realtor|editor|producer|"
    r"assistant|coach|trainer|veterinarian|vet|surgeon|clerk|receptionist|secretary|"
    r"paramedic|soldier|dancer|actor|actress|student teacher"
)
_PETS = (
    r"cats?|dogs?|pupp(?:y|ies)|kittens?|pups?|hamsters?|rabbits?|bunn(?:y|ies)|parrots?|"
    r"birds?|turtles?|guinea pigs?"
)
_PARTNERS = r"girlfriend|boyfriend|wife|husband|partner|fianc[ée]e?"
# An object runs to the end of its clause, or to a word that starts another.
_OBJ = (
    r"[^,.;:!?\n]{1,60}?"
    r"(?=\s+(?:and|but|while|since|because|so|though|although|when|with|for)\b|[,.;:!?\n]|$)"
)
_NAME = r"[A-Z][a-z]+\b"
_AM = r"(?:I'm|I am)"
_ADV = r"(?:(?:currently|now|still|also|just|actually|finally|recently|already)\s+)*"
_PET_NAMED = (
    r"(?:'s name is|,?\s+(?:his|her|its) name is|\s+is named|\s+is called|\s+named|\s+called|,)?"
)
_STUDENT = (
    r"freshman|sophomore|junior|senior|student|grad student|graduate student|phd student|"
    r"undergrad|undergraduate"
)
_SCHOOL = r"[Uu]niversity|[Cc]ollege|[Ss]chool|Academy|Institute"


def _any(*alternatives: str) -> re.Pattern[str]:
    return re.compile("|".join(alternatives))


_EN_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "work",
        _any(
            rf"(?:I\s+{_ADV}(?:work|have been working)|I've\s+been\s+working|{_AM}\s+{_ADV}working)"
            rf"\s+(?:at|for|as|in)\s+{_OBJ}",
            rf"{_AM}\s+{_ADV}an?\s+(?:[\w-]+\s+){{0,3}}?(?:{_ROLE})s?\b"
            rf"(?:\s+(?:at|for|in)\s+{_OBJ})?",
            rf"[Mm]y\s+(?:job|occupation|profession)\s+is\s+{_OBJ}",
            rf"(?:I\s+{_ADV}(?:got|have got)|I've\s+got)\s+(?:a|my first|a new)\s+(?:new\s+)?job"
            rf"\s+(?:at|as|with)\s+{_OBJ}",
        ),
    ),
    (
        "school",
        _any(
            rf"(?:I\s+{_ADV}study|{_AM}\s+{_ADV}studying)\s+at\s+{_OBJ}",
            rf"I\s+{_ADV}go\s+to\s+(?:[\w-]+\s+){{0,4}}?(?:{_SCHOOL})\b(?:\s+of\s+[A-Z]\w+)*",
            rf"{_AM}\s+{_ADV}an?\s+(?:{_STUDENT})(?:\s+student)?\s+(?:at|in)\s+{_OBJ}",
            rf"(?:I\s+{_ADV}major|{_AM}\s+{_ADV}majoring)\s+in\s+{_OBJ}",
            rf"[Mm]y\s+major\s+is\s+{_OBJ}",
        ),
    ),
    (
        "home",
        _any(
            rf"(?:I\s+{_ADV}live|{_AM}\s+{_ADV}living)\s+in\s+{_OBJ}",
            rf"(?:I\s+{_ADV}(?:moved|have moved|relocated)|I've\s+{_ADV}moved|{_AM}\s+{_ADV}moving)"
            rf"\s+(?:back\s+)?to\s+{_OBJ}",
            rf"[Mm]y\s+home\s+is\s+in\s+{_OBJ}",
        ),
    ),
    (
        "pet",
        _any(
            rf"[Mm]y\s+(?:[\w-]+\s+)?(?:{_PETS}){_PET_NAMED}\s+{_NAME}",
            rf"(?:I\s+{_ADV}(?:have|have got|adopted|got)|I've\s+{_ADV}got|I've)"
            rf"\s+(?:a|an|two|three|\d+)\s+(?:[\w-]+\s+)?(?:{_PETS})\b"
            rf"(?:\s+(?:named|called)\s+{_NAME})?",
        ),
    ),
    (
        "birthday",
        _any(rf"[Mm]y\s+birthday(?:\s+is|'s)\s+(?:on\s+)?{_OBJ}", rf"I\s+was\s+born\s+on\s+{_OBJ}"),
    ),
    (
        "relationship",
        _any(
            rf"{_AM}\s+{_ADV}(?:married|engaged)\s+to\s+{_OBJ}",
            rf"{_AM}\s+{_ADV}(?:married|engaged|single|divorced)\b",
            rf"I\s+{_ADV}got\s+(?:married|engaged|divorced)\b",
            rf"[Mm]y\s+(?:{_PARTNERS})(?:'s name)?\s+is\s+{_NAME}",
            rf"(?:I\s+{_ADV}have|I've\s+got)\s+an?\s+(?:{_PARTNERS})\b",
        ),
    ),
)
_EN_OBJECT_FIRST = re.compile(
    r"^(?P<o>today|tomorrow|(?:next|this)\s+\w+|[A-Z][a-z]+\s+\d{1,2}(?:st|nd|rd|th)?|"
    r"\d{4}-\d{2}-\d{2})\s+is\s+my\s+birthday\b",
    re.I,
)
# What may come before the subject: a greeting, an interjection, a time word.
_EN_OPENING = re.compile(
    r"^(?:(?:oh|well|yeah|yes|yep|so|and|but|actually|also|btw|by the way|hey|um|hi|anyway|"
    r"currently|now|right now|these days|at the moment|fyi|guess what|fun fact)[,!]?\s+)*",
    re.I,
)


def _english(sentence: str) -> Standing | None:
    # The whole sentence first ("My cat, Fluffy, is …" holds commas), then each clause.
    clauses = re.split(r"(?<=[,;])\s+|\s+(?:but|and|so)\s+(?=I\b|[Mm]y\b)", sentence)
    for clause in dict.fromkeys([sentence, *clauses]):
        clause = _EN_OPENING.sub("", clause.strip())
        if m := _EN_OBJECT_FIRST.match(clause):
            return Standing("birthday", f"my birthday is {m.group('o')}")
        for slot, pattern in _EN_RULES:
            m = pattern.match(clause)
            if m is not None:
                # The clause it is stated in: up to the next comma after what it matched.
                end = re.search(r"[,;]|$", clause[m.end() :])
                assert end is not None
                cut = m.end() + end.start()
                return Standing(slot, clause[:cut].strip(" .!~,;"), clause[cut:].rstrip(" .!~"))
    return None


def sentences(text: str) -> list[str]:
    """A message's sentences (Chinese and English stops, line breaks)."""
    # English sentences end at a stop followed by a space; Chinese at its own marks.
    parts = re.split(r"[\n。！!？?]+|(?<=[a-z0-9)])\.\s+|~+", text)
    return [p.strip() for p in parts if p and p.strip()]


def standing(sentence: str) -> Standing | None:
    """The speaker's standing fact a sentence states, or None: a question, a negation, a
    wish, a hypothesis, a joke, or a fact about someone else is not one."""
    text = sentence.strip()
    if not text:
        return None
    cjk = bool(re.search(r"[\u4e00-\u9fff]", text))
    if cjk:
        if _CN_NOT_A_FACT.search(text) or re.search(r"不|没|别|未", text.split("，")[0][:12]):
            return None
        return _chinese(text)
    if _EN_NOT_A_FACT.search(text) or re.search(r"\b(?:not|never|no longer)\b|n['’]t\b", text):
        return None
    return _english(text.replace("’", "'"))


def standing_facts(text: str, limit: int = 3) -> list[Standing]:
    """The standing facts of the speaker in a message, one per sentence, at most ``limit``
    (one of each slot: a later sentence of the same slot corrects an earlier one)."""
    found: dict[str, Standing] = {}
    for sentence in sentences(text):
        fact = standing(sentence)
        if fact is not None:
            found.pop(fact.slot, None)
            found[fact.slot] = fact
    return list(found.values())[-limit:]


# ---------------------------------------------------------------- stored statements

_LABEL = r"(?:[^\s()（）,，。]{1,32}?\s?[(（][^()（）]{1,64}[)）]|[A-Z][\w.-]*(?:\s[A-Z][\w.-]*)?)"
# The same predicates in the third person: what the rules' rewrite of them reads like.
_EN_THIRD: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "work",
        _any(
            r"\b(?:works|is working|has been working)\s+(?:at|for|as|in)\b",
            rf"\bis an?\s+(?:[\w-]+\s+){{0,3}}?(?:{_ROLE})s?\b",
            r"'s\s+(?:job|occupation|profession)\s+is\b",
            r"\bgot\s+a\s+(?:new\s+)?job\b",
        ),
    ),
    (
        "school",
        _any(
            r"\b(?:studies|is studying)\s+at\b",
            rf"\bgoes\s+to\s+(?:[\w-]+\s+){{0,4}}?(?:{_SCHOOL})\b",
            r"\b(?:majors|is majoring)\s+in\b",
            r"'s\s+major\s+is\b",
        ),
    ),
    (
        "home",
        _any(
            r"\b(?:lives|is living)\s+in\b",
            r"\b(?:moved|has moved|is moving|relocated)\s+(?:back\s+)?to\b",
            r"'s\s+home\s+is\s+in\b",
        ),
    ),
    (
        "pet",
        _any(
            rf"'s\s+(?:[\w-]+\s+)?(?:{_PETS}){_PET_NAMED}\s+{_NAME}",
            rf"\bhas\s+(?:a|an|two|three|\d+)\s+(?:[\w-]+\s+)?(?:{_PETS})\b",
        ),
    ),
    ("birthday", _any(r"'s\s+birthday(?:\s+is|'s)\b", r"\bwas\s+born\s+on\b")),
    (
        "relationship",
        _any(
            r"\bis\s+(?:married|engaged|single|divorced)\b",
            r"\bgot\s+(?:married|engaged|divorced)\b",
            rf"'s\s+(?:{_PARTNERS})(?:'s name)?\s+is\b",
        ),
    ),
)


def slot_of(statement: str) -> str | None:
    """The slot of a stored statement about one person ("张三(10001)在阿里巴巴工作",
    "Alice (10001) works at Google"), or None. Its subject is the person's name."""
    text = statement.strip()
    kind = kind_of(text)
    known = next((slot for slot, label in SLOTS.items() if label == kind), None)
    if re.search(r"[\u4e00-\u9fff]", text):
        m = re.match(_LABEL, text)
        fact = standing("我" + text[m.end() :].lstrip()) if m else None
        return fact.slot if fact else known
    if _EN_NOT_A_FACT.search(text) or re.search(r"\b(?:not|never|no longer)\b|n['’]t\b", text):
        return None
    for slot, pattern in _EN_THIRD:
        if pattern.search(text):
            return slot
    return known
