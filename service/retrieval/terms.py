"""Lexical terms of Chinese and English text, segmented by the application.

PostgreSQL's own parsers know neither Chinese word boundaries nor our stemming, and we add
no extension for them: the application turns text into terms and stores them as a
``tsvector`` literal (``'term':pos,…``), which PostgreSQL takes as given.

- Chinese (and Japanese kana/kanji) runs: every character bigram plus the unigrams that are
  not function words. A query word inside an unsegmented sentence shares its bigrams with
  it ("西湖" in "我想去杭州西湖划船"), with no dictionary to miss new names.
- Latin script: lowercased, stopwords removed, a light suffix stripper so that
  "painting", "painted" and "paints" meet at "paint".
- Digits stay as they are ("2023", "5k").
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections import Counter
from collections.abc import Container, Iterable
from typing import NamedTuple

# Han (with extension A and compatibility ideographs), kana: scripts written without spaces.
_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff"
_TOKEN = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+(?:'[^\W_{_CJK}]+)*")
_IS_CJK = re.compile(rf"[{_CJK}]")
# A run of letters of an alphabet: a word of English however close Chinese is written to
# it ("跟Melanie说"; to ``\b``, Chinese characters are letters of the same word).
_LETTERS = re.compile(rf"[^\W\d_{_CJK}]+")

# Function characters: frequent and meaningless alone (they still count inside bigrams).
# Search drops them as unigrams; everything else that skips common words starts from here.
CHINESE_STOP_CHARS = frozenset("的了着过吗呢吧啊呀哦嘛么哈是在和与及或也都就还又很太把被给让对")

# The function characters plus pronouns, words of asking and the commonest verbs and
# measure words: too common to name a topic (the day summary skips the bigrams holding
# them). Search keeps these as unigrams: alone they still tell messages apart ("不去" from
# "去"), and dropping them cost the Chinese dialogue set 3 of 262 questions at hit@10.
COMMON_CHINESE_CHARS = CHINESE_STOP_CHARS | frozenset(
    "嗯我你他她它们这那有不没个一上下人到说要会去来好什哪"
)

_ENGLISH_STOPWORDS = """
a about above after again against all am an and any are aren as at be because been before
being below between both but by can cannot could couldn did didn do does doesn doing don
down during each few for from further had hadn has hasn have haven having he her here hers
herself him himself his how i if in into is isn it its itself just let ll me more most
mustn my myself no nor not now of off on once only or other ought our ours ourselves out
over own re s same shan she should shouldn so some such t than that the their theirs them
themselves then there these they this those through to too under until up ve very was wasn
we were weren what when where which while who whom why will with won would wouldn you your
yours yourself yourselves d m o y also ok oh yeah hey hi wow really
"""
ENGLISH_STOPWORDS = frozenset(_ENGLISH_STOPWORDS.split())

# Tokens longer than this are not words (ids, base64, URLs squashed together).
_MAX_TOKEN = 40
# PostgreSQL keeps at most 256 positions per lexeme and positions up to 16383.
_MAX_POSITIONS = 256
_MAX_POSITION = 16383

_NUMBER = re.compile(r"\d+")
_VOWEL = re.compile(r"[aeiouy]")
_DOUBLE = re.compile(r"([bfgmnprt])\1$")


def compact(text: str) -> str:
    """Text reduced to lowercase letters and digits: two statements that differ only in
    spacing and punctuation compact to the same string."""
    return re.sub(r"[\s\W_]+", "", text.lower())


def stem(word: str) -> str:
    """A light English suffix stripper: plural, possessive, -ing, -ed, -ly, final e.

    Not a full Porter stemmer: it only joins the inflections a chat question and a chat
    message most often disagree on, and leaves short words alone.
    """
    if not word.isascii() or len(word) <= 3:
        return word
    if word.endswith("'s"):
        word = word[:-2]
    word = word.replace("'", "")
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith("sses"):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) > 3:
        word = word[:-1]
    for suffix in ("ingly", "edly", "ing", "ed", "ly"):
        if word.endswith(suffix):
            base = word[: -len(suffix)]
            if len(base) >= (4 if suffix == "ly" else 3) and _VOWEL.search(base):
                word = base[:-1] if _DOUBLE.search(base) else base
            break
    if word.endswith("e") and len(word) > 3 and not word.endswith("ee"):
        word = word[:-1]
    if word.endswith("y") and len(word) > 4 and word[-2] not in "aeiou":
        word = word[:-1] + "i"
    return word


def _chinese_terms(run: str) -> list[str]:
    terms = [ch for ch in run if ch not in CHINESE_STOP_CHARS]
    terms += [run[i : i + 2] for i in range(len(run) - 1)]
    return terms


def terms(text: str) -> list[str]:
    """The lexical terms of ``text`` in reading order (repeats kept: they are frequencies)."""
    out: list[str] = []
    normalized = unicodedata.normalize("NFKC", text).lower().replace("\u2019", "'")
    for token in _TOKEN.findall(normalized):
        if _IS_CJK.match(token):
            out.extend(_chinese_terms(token))
        elif len(token) <= _MAX_TOKEN:
            # Contractions and possessives: "caroline's" is "caroline", "don't" is "don".
            word = token.split("'")[0]
            if word not in ENGLISH_STOPWORDS:
                out.append(stem(word))
    return [t for t in out if t]


# Words of greeting, reaction and filler, and asking the bot to remember: a day made only of
# these ("早", "晚安", "记住", "lol", "good night") names no topic. Topic words only;
# search keeps them.
_CHAT_WORDS = """
晚安 早安 谢谢 感谢 多谢 哈哈 嘿嘿 呵呵 嘻嘻 大家 可以 知道 什么 为什 怎么 怎样 今天 明天
昨天 现在 时候 觉得 应该 可能 已经 然后 但是 所以 因为 如果 还是 就是 真的 一下 东西 事情
感觉 其实 而且 不过 这样 那样 哪里 这里 那里 比较 还有 非常 一点 自己 喜欢 需要 时间 刚刚
最近 今晚 晚上 早上 中午 马上 等等 收到 回来 起来 出来 厉害 牛逼 真是 确实 不错 还行
记住 记得 remember
lol lmao haha hahaha hehe omg btw thx thanks thank please pls good great nice cool fine
sure yes yep yup nope okay night morning evening afternoon bye see later soon today
tonight tomorrow yesterday time day week thing things stuff lot lots one two get got
getting going gonna wanna want know think thought like love feel felt make made need
say said tell told come came look looks looking let way well still even back much many
guy guys man people right sounds sound definitely maybe actually pretty kind sorry glad
happy awesome amazing fun hope welcome keep take took taking hear heard quite ready share
ever new old mean means meant guess help bit cause crazy dont didnt cant wont isnt someone
something anything everything nothing happen happened happens tough plan plans stay talk
talking chat always never sometimes often usually wait excited interesting true bad best
better worse big little long short whole real totally absolutely especially probably
already almost enough though also anyway else first last next other another every same
ask asked try tried trying use used work working start started give gave find found put
hard easy different able sure lately recently place places times days years year month
friend friends hello hey hiya appreciate appreciated
"""
TOPIC_STOPWORDS = frozenset(_CHAT_WORDS.split())
# Set phrases of leave-taking, thanks and encouragement, whose words alone would name
# something ("take care", "no problem", "保重", "辛苦了"): taken out before the topic words
# are read. The rest of the message still counts ("Good luck with the exam" names the exam).
_CHAT_PHRASES = re.compile(
    r"\b(?:take\s+care|no\s+problems?|no\s+worries|sweet\s+dreams|long\s+time\s+no\s+see"
    r"|my\s+pleasure|you'?re\s+welcome|good\s+luck|congrats|congratulations)\b"
    r"|保重|早点休息|早点睡|没问题|不客气|别客气|回头聊|回头见|下次再聊|改天再?聊|再聊|好梦|辛苦了|辛苦啦|好久不见|加油",
    re.I,
)


class TopicWord(NamedTuple):
    """A topic word of a text: ``key`` (a Chinese bigram, an English stem) and the words as
    written (``surface``)."""

    key: str
    surface: str


def _topic_bigrams(run: str) -> list[tuple[str, bool] | None]:
    """A Chinese run's bigrams, each with whether it is filler ("时间"); None where one
    holds a common character."""
    return [
        None
        if run[i] in COMMON_CHINESE_CHARS or run[i + 1] in COMMON_CHINESE_CHARS
        else (run[i : i + 2], run[i : i + 2] in TOPIC_STOPWORDS)
        for i in range(len(run) - 1)
    ]


def _topic_word(token: str) -> TopicWord | None:
    word = token.split("'")[0]
    lowered = word.lower()
    if (
        len(word) < 3
        or len(word) > _MAX_TOKEN
        or not any(c.isalpha() for c in word)
        or lowered in ENGLISH_STOPWORDS
        or lowered in TOPIC_STOPWORDS
    ):
        return None
    key = stem(lowered)
    return None if key in TOPIC_STOPWORDS else TopicWord(key, word)


def topic_words(text: str, keep: Container[str] | None = None) -> list[TopicWord]:
    """The words of ``text`` that may name a topic: Chinese bigrams of uncommon characters
    and English words that are neither function words nor chit-chat.

    With ``keep``, the words as a reader would quote them: a run of adjacent bigrams that are
    all kept is one word ("羽毛球" of "羽毛" and "毛球"), its key the first bigram's, and
    English words whose stem is kept.
    """
    out: list[TopicWord] = []
    normalized = unicodedata.normalize("NFKC", text).replace("\u2019", "'")
    normalized = _CHAT_PHRASES.sub(" ", normalized)
    for token in _TOKEN.findall(normalized):
        if not _IS_CJK.match(token):
            word = _topic_word(token)
            if word is not None and (keep is None or word.key in keep):
                out.append(word)
            continue
        bigrams = _topic_bigrams(token)
        if keep is None:
            out.extend(TopicWord(b[0], b[0]) for b in bigrams if b is not None and not b[1])
            continue
        # A word begins at a kept bigram and goes on through kept ones and filler:
        # "持续时间" is one word, though "时间" alone names nothing.
        start = None
        for i, bigram in enumerate([*bigrams, None]):
            kept = bigram is not None and not bigram[1] and bigram[0] in keep
            if kept and start is None:
                start = i
            elif not kept and not (bigram is not None and bigram[1] and start is not None):
                if start is not None:
                    out.append(TopicWord(token[start : start + 2], token[start : i + 1]))
                start = None
    return out


# The characters of the chit-chat words: a lone one ("早", "谢") names nothing either.
_CHAT_CHARS = frozenset("".join(w for w in TOPIC_STOPWORDS if _IS_CJK.match(w)))


def names_something(text: str, people: Iterable[str] = ()) -> bool:
    """Whether ``text`` names anything: a topic word, or a Chinese character that is neither
    common nor chit-chat ("狗", "猫" said alone or after "我的"). Greetings, reactions and
    filler ("哈哈", "在吗", "Hey! How have you been?") name nothing, nor does greeting one of
    ``people`` (the conversation's names) by name or by the start of it ("Hey Mel!" to
    Melanie, "王芳早" in her group)."""
    return _names_something(without_people(text, people))


def named_words(text: str, people: Iterable[str] = ()) -> set[str]:
    """The keys of the topic words ``text`` names, the ``people``'s names aside: what two
    texts must share to be about the same thing. The words every question has ("什么",
    "哪里", "what") and a name of the conversation (every item is about its people) are
    not among them."""
    return {w.key for w in topic_words(without_people(text, people))}


def without_people(text: str, people: Iterable[str]) -> str:
    """``text`` without the ``people``'s names: a Chinese name where it occurs, an English
    word where it is a name's word or the start of one (three letters at least)."""
    normalized = unicodedata.normalize("NFKC", text)
    starts: set[str] = set()
    for name in {unicodedata.normalize("NFKC", p).strip() for p in people}:
        if _IS_CJK.search(name) and len(name) >= 2:
            normalized = normalized.replace(name, " ")
        starts.update(w.casefold() for w in _LETTERS.findall(name) if len(w) >= 3)
    if not starts:
        return normalized

    def named(word: re.Match[str]) -> str:
        w = word.group().casefold()
        return " " if len(w) >= 3 and any(s.startswith(w) for s in starts) else word.group()

    return _LETTERS.sub(named, normalized)


# A date names a day ("on 10.01.2024", "5月3日", "2023年"), though its digits are no topic word.
_DATE = re.compile(r"\d{1,4}[./-]\d{1,2}(?:[./-]\d{1,4})?|\d{1,2}\s*[月日号]|\d{4}\s*年")


def _names_something(text: str) -> bool:
    normalized = _CHAT_PHRASES.sub(" ", unicodedata.normalize("NFKC", text))
    if topic_words(normalized) or _DATE.search(normalized):
        return True
    return any(
        _IS_CJK.match(c) and c not in COMMON_CHINESE_CHARS and c not in _CHAT_CHARS
        for c in normalized
    )


# Long queries (a chat history, a pasted paragraph) keep this many of their most telling
# terms (``query_terms``): enough to match, at a bounded cost. The archive and the events
# search alike; at 64 the events search found MADial's memory for .935 of its dialogues
# (hit@10), at 128 for .950, the other sets unchanged.
MAX_QUERY_TERMS = 128


def query_terms(text: str, limit: int | None = None) -> list[str]:
    """The distinct terms of a query, first occurrence first.

    Past ``limit`` (a pasted paragraph, a chat history as the query), single Chinese
    characters go first, then the earliest terms: the end of a chat is its most recent part.
    """
    found = list(dict.fromkeys(terms(text)))
    if limit is None or len(found) <= limit:
        return found
    words = [t for t in found if not (len(t) == 1 and _IS_CJK.match(t))]
    if len(words) >= limit:
        return words[-limit:]
    keep = set(words) | set([t for t in found if t not in set(words)][-(limit - len(words)) :])
    return [t for t in found if t in keep]


def to_tsvector_literal(found: Iterable[str]) -> str:
    """A ``tsvector`` literal of terms with their positions (so term frequency survives)."""
    positions: dict[str, list[int]] = {}
    for n, term in enumerate(found, start=1):
        slot = positions.setdefault(term, [])
        if len(slot) < _MAX_POSITIONS:
            slot.append(min(n, _MAX_POSITION))
    return " ".join(f"'{_quote(t)}':{','.join(map(str, p))}" for t, p in positions.items())


def to_tsquery_literal(found: Iterable[str]) -> str:
    """A ``tsquery`` literal matching any of the terms."""
    return " | ".join(f"'{_quote(t)}'" for t in dict.fromkeys(found))


# Each term of a lexical look-up reads at least this many of its matches: a pasted
# paragraph's 128 terms read 2,048 in all.
MIN_TERM_SAMPLE = 16


def term_sample(budget: int, terms: int) -> int:
    """How many of its matches each of ``terms`` query terms reads, a look-up reading about
    ``budget`` in all: a rare term's matches are all read, a frequent one's are a sample
    (they barely tell matches apart, and each match read is scored on every asked term), and
    no term's matches can crowd out another's."""
    return max(MIN_TERM_SAMPLE, budget // max(terms, 1))


def held_terms_sql(vector: str, terms: str) -> str:
    """SQL for the lexemes of the ``tsvector`` expression ``vector`` that are among the
    ``text[]`` expression ``terms``, as a ``tsvector`` (unnested: each with its positions).

    Marked and kept by weight inside PostgreSQL's own tsvector code: unnesting a whole vector
    and joining it with the terms makes a row of every stored term (12,000 rows for 400
    matched events), for the few that are asked. (Stored vectors always carry positions,
    which carry the weights: see ``to_tsvector_literal``.)"""
    return f"ts_filter(setweight(setweight({vector}, 'D'), 'A', {terms}), '{{a}}')"


def frequencies(found: Iterable[str]) -> Counter[str]:
    """Term frequencies."""
    return Counter(found)


def _quote(term: str) -> str:
    # Terms are word characters only, but stay safe if that ever changes.
    return term.replace("\\", "\\\\").replace("'", "\\'")


def names_in(query: str, name: str | None) -> bool:
    """Whether ``query`` names the person called ``name``.

    Latin names match by any word of three or more letters ("Caroline" names "Caroline
    Smith"); names in Chinese script by the whole name, or its last two characters for names
    of three or more ("小明" names "王小明").
    """
    if not name:
        return False
    folded = unicodedata.normalize("NFKC", name).lower().strip()
    text = unicodedata.normalize("NFKC", query).lower().replace("\u2019", "'")
    if not folded:
        return False
    if _IS_CJK.search(folded):
        han = "".join(_IS_CJK.findall(folded))
        return han in text or (len(han) >= 3 and han[-2:] in text)
    words = {w.split("'")[0] for w in _TOKEN.findall(text)}
    return any(
        len(part) >= 3 and part not in ENGLISH_STOPWORDS and part in words
        for part in (w.split("'")[0] for w in _TOKEN.findall(folded))
    )


# Wording is compared over the first this many characters: the comparison grows with the
# square of the length in bad cases (two 20,000-character messages: 30 ms a pair), and a
# search compares up to 30 candidates with each result it keeps.
WORDING_CHARS = 600


class Wording(NamedTuple):
    """What ``near_duplicate`` compares of a text: its ``compact`` form and its numbers."""

    words: str
    numbers: list[str]


def wording(text: str) -> Wording:
    """A text's ``Wording``, made once where it is compared with many (a search's results:
    compacting both 20,000-character texts of every pair took seconds)."""
    words = compact(text)
    return Wording(words, _NUMBER.findall(words))


def near_duplicate(a: str, b: str, cosine: float, threshold: float) -> bool:
    """The same statement: equal once spacing and punctuation go, or very close in meaning
    AND in wording with the same numbers. Meaning alone is not enough: small embedding models
    put "likes cats" and "likes dogs" (or two cities) within a few hundredths of each other,
    and one digit apart ("2026-03-01" and "2026-03-05") is another fact in the same words."""
    return same_statement(wording(a), wording(b), cosine, threshold)


def same_statement(a: Wording, b: Wording, cosine: float, threshold: float) -> bool:
    """``near_duplicate`` of two texts' ``wording``."""
    left, right = a.words, b.words
    if left == right:
        return True
    return (
        cosine >= threshold
        # Wording this close needs lengths this close (the ratio's own upper bound).
        and 2 * min(len(left), len(right)) >= 0.9 * (len(left) + len(right))
        and a.numbers == b.numbers
        and difflib.SequenceMatcher(None, left[:WORDING_CHARS], right[:WORDING_CHARS]).ratio()
        >= 0.9
    )
