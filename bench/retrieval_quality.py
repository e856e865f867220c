"""Message-archive retrieval quality on real data, through the public API.

Starts the app in process (worker included) on a throwaway embedded PostgreSQL, then asks
every question with ``POST /v1/messages/search`` (top 10) of its conversation and prints
hit@5, hit@10, rec@5, rec@10 overall and per category (the LoCoMo paper's definitions):

1. LoCoMo (English): each conversation is one group chat whose two speakers are its
   members; every turn is a message (``message_id`` = turn id, ``sent_at`` = the session's
   time, a shared photo's caption appended to the text).
2. MADial-Bench (Chinese): each user's memories are the messages of a private chat (in date
   order); each test turn asks with the dialogue's user turns up to it.
3. MemDaily (Chinese, ``memdaily-zh``): each pool is one group chat of ~100 members, every
   member telling the group about their own events, in the order they were said; each
   question is asked in its group.

Next to the hybrid, two lexical baselines per set: the service's own lexical side alone
(its candidates ranked by their BM25 only) and plain BM25 (k1 1.5, b 0.75) over the
conversation's messages, with character bigrams for Chinese and stop-word-free lowercase
words for English.

``--cv`` re-fits the ranking weights (candidates and features from the service's own code)
leave-one-dataset-out: fitted on two sets, measured on the third, printed next to the
in-sample fit and the shipped defaults. That is how the defaults in
``service.retrieval.neighbours.StreamWeights`` were chosen. Once with one set of weights for
every stream, once gated as the service gates them: a dialogue's weights fitted on the
streams that read as dialogues, a many-sender group's on the others (where the sets left in
hold no stream of a shape, that shape takes the other's weights).
Then the features the sets left in never exercise (never firing, or equal to the
similarity: neighbours never present), and the held-out figure with just those at the
shipped weights: how much of a fall is what the other sets cannot teach.

``--cache DIR`` keeps the vectors of every embedded message (keyed by a hash of model, kind
and text) in DIR, outside the repository, so that a second run does not embed again, and
every question's candidate stream; ``--replay`` then ranks those with the current ranking
code in seconds, without the service (figures without recency and MMR), with ``--cv``.

``--big N`` measures search latency on one conversation of N messages (the LoCoMo turns
and MADial memories over and over, their vectors copied from the embedded originals).
``--recent`` asks LoCoMo again with every conversation moved in time to end yesterday, so
the recency boost (on by default) weighs on all but the last sessions.

Data are read from ``../shared/bench`` next to the repository (or ``--data DIR``); nothing
is copied into the repository.

Run: python bench/retrieval_quality.py [--data DIR] [--cache /tmp/vectors] [--cv]
     [--only locomo,madial,memdaily] [--big 50000] [--recent]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import math
import os
import pickle
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure import quantile_ms

from service.app import create_app
from service.context import scope_of
from service.db.embedded import embedded_url, stop_embedded
from service.messages import repository
from service.messages.search import SEARCH_PLAN, stream_of
from service.retrieval.neighbours import Stream, StreamPassage, StreamWeights, stream_features
from service.retrieval.neighbours import dialogue as reads_as_dialogue
from service.retrieval.terms import ENGLISH_STOPWORDS, MAX_QUERY_TERMS, query_terms
from service.runtime import settle_heap
from service.settings import Settings

DATA = Path(__file__).resolve().parents[2] / "shared/bench"
ADMIN = "bench-admin"
BATCH = 500
KS = (5, 10)
DATASETS = ("locomo", "madial", "memdaily")


@dataclass
class Scores:
    """hit@k and rec@k accumulated over questions."""

    hits: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    recalls: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))

    def add(self, found: list[str], relevant: set[str]) -> None:
        for k in KS:
            got = set(found[:k]) & relevant
            self.hits[k].append(1.0 if got else 0.0)
            self.recalls[k].append(len(got) / len(relevant))

    def hit(self, k: int = 10) -> float:
        return statistics.fmean(self.hits[k]) if self.hits[k] else 0.0

    def row(self, name: str) -> str:
        n = len(self.hits[KS[0]])
        cells = [f"{statistics.fmean(self.hits[k]):.3f}" for k in KS]
        cells += [f"{statistics.fmean(self.recalls[k]):.3f}" for k in KS]
        return f"  {name:<18} {n:>5}   " + "   ".join(cells)


HEADER = "  {:<18} {:>5}   hit@5   hit@10  rec@5   rec@10".format("", "n")


def percentiles(samples: list[float]) -> str:
    p50, p95, p99 = (quantile_ms(samples, q) for q in (0.50, 0.95, 0.99))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"p50 {p50:6.1f} ms  p95 {p95:6.1f} ms  p99 {p99:6.1f} ms  (n={len(samples)}; "
        f"load average {load})"
    )


def load_locomo(path: Path) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Turns by conversation, and the questions with evidence (also reads MemDaily pools,
    which share the format)."""
    turns: dict[str, list[dict[str, Any]]] = defaultdict(list)
    questions = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["kind"] == "turn":
            turns[row["conv_id"]].append(row)
        elif row["evidence"]:
            questions.append(row)
    return turns, questions


def turn_text(turn: dict[str, Any]) -> str:
    caption = turn.get("image_caption")
    return f"{turn['text']}\n{caption}" if caption else str(turn["text"])


def load_madial(folder: Path) -> tuple[dict[int, list[dict[str, Any]]], list[dict[str, Any]]]:
    memories: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for line in (folder / "MADial-Bench-zh-memory.json").read_text().splitlines():
        for memory in json.loads(line).values():
            memories[int(memory["user-id"])].append(memory)
    dialogues = [
        json.loads(line)
        for line in (folder / "MADial-Bench-zh-dialogue.json").read_text().splitlines()
        if line.strip()
    ]
    return memories, dialogues


_SPEAKER = re.compile(r'^<([^>]+)>:\s*"?(.*?)"?\s*$', re.S)


def user_turns(dialogue: list[str], upto: int) -> tuple[str | None, list[str]]:
    """The user's name and lines before the test turn (the assistant's lines left out)."""
    name, lines = None, []
    for line in dialogue[:upto]:
        match = _SPEAKER.match(line.strip())
        if match and match.group(1) != "Assistant":
            name = match.group(1)
            lines.append(match.group(2))
    return name, lines


def madial_names(dialogues: list[dict[str, Any]]) -> dict[int, str]:
    """Each MADial user's name, as their dialogues call them."""
    names: dict[int, str] = {}
    for dialogue in dialogues:
        name, _ = user_turns(dialogue["dialogue"], len(dialogue["dialogue"]))
        if name:
            names.setdefault(int(dialogue["user-id"]), name)
    return names


# --- The sets as chats and questions -------------------------------------------------------


@dataclass(frozen=True)
class Question:
    """One question asked in one conversation, and the message ids that answer it."""

    scope: dict[str, str]  # {"group_id": …} or {"user_id": …}
    query: str
    relevant: frozenset[str]
    category: str = "all"
    asker: str | None = None  # the member asking (a group bot's call names them)

    @property
    def key(self) -> str:
        return scope_of(self.scope.get("group_id"), self.scope.get("user_id"))


@dataclass
class Dataset:
    """A set as the API sees it: chats (context and messages, in the order said), questions."""

    name: str
    chats: list[tuple[dict[str, Any], list[dict[str, Any]]]]
    questions: list[Question]
    chinese: bool


def locomo_dataset(
    turns: dict[str, list[dict[str, Any]]], questions: list[dict[str, Any]], recent: bool = False
) -> Dataset:
    """Each conversation as a group chat; ``recent``: moved in time so that its last session
    was yesterday (the recency boost then weighs on every older session)."""
    chats = []
    for conv_id, rows in turns.items():
        shift = timedelta(0)
        if recent:
            last = max(datetime.fromisoformat(t["session_time"]) for t in rows)
            shift = datetime.now() - timedelta(days=1) - last
        messages = [
            {
                "message_id": t["turn_id"],
                "sender_id": t["speaker"].lower(),
                "sender_name": t["speaker"],
                "text": turn_text(t),
                "sent_at": (datetime.fromisoformat(t["session_time"]) + shift).isoformat(),
            }
            for t in rows
        ]
        chats.append(({"request_type": "group", "group_id": conv_id, "timezone": "UTC"}, messages))
    asked = [
        Question(
            {"group_id": q["conv_id"]},
            q["question"],
            frozenset(q["evidence"]),
            f"{q['category_id']} {q['category']}",
        )
        for q in questions
    ]
    return Dataset("LoCoMo", chats, asked, chinese=False)


def madial_queries(dialogues: list[dict[str, Any]]) -> list[tuple[int, str, set[str]]]:
    queries = []
    for dialogue in dialogues:
        for turn in dialogue["test-turn"]:
            _, lines = user_turns(dialogue["dialogue"], turn)
            relevant = {str(i) for i in dialogue["relevant-id"]}
            queries.append((int(dialogue["user-id"]), "\n".join(lines), relevant))
    return queries


def madial_dataset(
    memories: dict[int, list[dict[str, Any]]], dialogues: list[dict[str, Any]]
) -> Dataset:
    """Each user's memories as the messages of a private chat, in date order."""
    names = madial_names(dialogues)
    chats = []
    for user, rows in memories.items():
        messages = [
            {
                "message_id": str(m["id"]),
                "sender_id": f"madial-{user}",
                "sender_name": names.get(user),
                "text": m["event"],
                "sent_at": f"{m['time']}T12:00:00",
            }
            for m in sorted(rows, key=lambda m: (m["time"], int(m["id"])))
        ]
        context = {"request_type": "private", "user_id": f"madial-{user}", "timezone": "UTC"}
        chats.append((context, messages))
    asked = [
        Question({"user_id": f"madial-{user}"}, query[-4000:], frozenset(relevant))
        for user, query, relevant in madial_queries(dialogues)
    ]
    return Dataset("MADial-Bench zh", chats, asked, chinese=True)


def memdaily_dataset(path: Path) -> Dataset:
    """Each pool as one group chat of its speakers, every message in the order said."""
    turns, questions = load_locomo(path)
    # A MemDaily question is its trajectory's user's own question about their life.
    users = {t["turn_id"].split(":")[0]: t["speaker"] for rows in turns.values() for t in rows}
    chats = []
    for pool, rows in turns.items():
        ordered = sorted(rows, key=lambda t: (t["session_time"], t["turn_id"]))
        messages = [
            {
                "message_id": t["turn_id"],
                "sender_id": t["speaker"],
                "sender_name": t["speaker"],
                "text": t["text"],
                "sent_at": t["session_time"],
            }
            for t in ordered
        ]
        chats.append(({"request_type": "group", "group_id": pool, "timezone": "UTC"}, messages))
    asked = [
        Question(
            {"group_id": q["conv_id"]},
            q["question"],
            frozenset(q["evidence"]),
            q["category"],
            # None where the question's id names no trajectory of the pool.
            users.get(str(q.get("qid", "")).rsplit("-q", 1)[0]),
        )
        for q in questions
    ]
    return Dataset("MemDaily zh", chats, asked, chinese=True)


# --- The API, and a vector cache -----------------------------------------------------------


class CachedEmbedder:
    """An embedder that remembers every passage's vector in a folder (keyed by model, kind
    and text), so that the next run embeds only what it has not seen; questions are embedded
    each run, as in service, unless ``queries`` keeps theirs too."""

    def __init__(self, inner: Any, folder: Path, queries: bool = False) -> None:
        self.inner, self.queries = inner, queries
        self.name, self.dimension = inner.name, inner.dimension
        self.calibration = inner.calibration
        self.path = folder / f"vectors-{re.sub(r'[^A-Za-z0-9_.-]', '_', inner.name)}.npz"
        folder.mkdir(parents=True, exist_ok=True)
        self.vectors: dict[str, np.ndarray[Any, Any]] = {}
        if self.path.exists():
            with np.load(self.path) as stored:
                self.vectors = {k: stored[k] for k in stored.files}
        self.added = 0

    def _key(self, kind: str, text: str) -> str:
        return hashlib.sha1(f"{kind}\0{text}".encode()).hexdigest()

    async def passages(self, texts: Sequence[str]) -> list[Any]:
        keys = [self._key("p", t) for t in texts]
        missing = [n for n, k in enumerate(keys) if k not in self.vectors]
        if missing:
            made = await self.inner.passages([texts[n] for n in missing])
            for n, vector in zip(missing, made, strict=True):
                self.vectors[keys[n]] = np.asarray(vector, dtype=np.float32)
            self.added += len(missing)
        return [self.vectors[k] for k in keys]

    async def query(self, text: str) -> Any:
        # Not kept unless asked: a question's embedding is part of the search latency.
        if not self.queries:
            return await self.inner.query(text)
        key = self._key("q", text)
        if key not in self.vectors:
            self.vectors[key] = np.asarray(await self.inner.query(text), dtype=np.float32)
            self.added += 1
        return self.vectors[key]

    def save(self) -> None:
        if self.added:
            np.savez(self.path, **self.vectors)
            self.added = 0

    async def warm_up(self) -> None:
        pass

    async def close(self) -> None:
        self.save()
        await self.inner.close()


class Api:
    """The app's HTTP API in process, with one tenant's key."""

    def __init__(self, http: httpx.AsyncClient, key: str) -> None:
        self.http, self.key = http, key
        self.latencies: list[float] = []

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self.http.post(
            path, json=body, headers={"Authorization": f"Bearer {self.key}"}
        )
        if response.status_code >= 300:
            raise RuntimeError(f"{path}: {response.status_code} {response.text}")
        return dict(response.json())

    async def search(self, body: dict[str, Any]) -> list[str]:
        started = time.perf_counter()
        found = await self.post("/v1/messages/search", body)
        self.latencies.append(time.perf_counter() - started)
        return [hit["message_id"] for hit in found["messages"]]

    async def ingest(self, context: dict[str, Any], messages: list[dict[str, Any]]) -> set[int]:
        jobs = set()
        for start in range(0, len(messages), BATCH):
            stored = await self.post(
                "/v1/messages", {**context, "messages": messages[start : start + BATCH]}
            )
            if stored.get("embed_job_id"):
                jobs.add(int(stored["embed_job_id"]))
        return jobs

    async def wait_for_jobs(self, jobs: set[int]) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        for job_id in sorted(jobs):
            while True:
                job = (await self.http.get(f"/v1/jobs/{job_id}", headers=headers)).json()
                if job["status"] in ("done", "failed"):
                    if job["status"] == "failed":
                        raise RuntimeError(f"embedding job {job_id} failed: {job}")
                    break
                await asyncio.sleep(0.5)


async def ingest(api: Api, dataset: Dataset) -> set[int]:
    jobs: set[int] = set()
    for context, messages in dataset.chats:
        jobs |= await api.ingest(context, messages)
    return jobs


# --- Lexical baselines ---------------------------------------------------------------------

_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_WORD = re.compile(r"[a-z0-9]+")


def baseline_terms(text: str, chinese: bool) -> list[str]:
    """Character bigrams of the Chinese runs (a lone character as itself), or lowercase
    words without stop words."""
    if chinese:
        out: list[str] = []
        for run in _HAN.findall(text):
            out.extend([run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)])
        return out + [w for w in _WORD.findall(text.lower())]
    return [w for w in _WORD.findall(text.lower()) if w not in ENGLISH_STOPWORDS]


class Bm25:
    """Okapi BM25 (k1 1.5, b 0.75, rank-bm25's idf) over one conversation's messages."""

    def __init__(self, ids: list[str], texts: list[str], chinese: bool) -> None:
        self.ids, self.chinese = ids, chinese
        self.docs = [Counter(baseline_terms(t, chinese)) for t in texts]
        self.lengths = np.array([sum(d.values()) for d in self.docs], dtype=np.float64)
        self.mean = float(self.lengths.mean()) if len(self.docs) else 1.0
        df: Counter[str] = Counter()
        for d in self.docs:
            df.update(d.keys())
        n = len(self.docs)
        self.idf = {t: math.log((n - f + 0.5) / (f + 0.5) + 1.0) for t, f in df.items()}

    def rank(self, query: str, k: int = 10) -> list[str]:
        terms = set(baseline_terms(query, self.chinese))
        scores = np.zeros(len(self.docs))
        norm = 1.5 * (1 - 0.75 + 0.75 * self.lengths / self.mean)
        for n, doc in enumerate(self.docs):
            scores[n] = sum(
                self.idf[t] * doc[t] * 2.5 / (doc[t] + norm[n]) for t in terms if t in doc
            )
        order = np.argsort(-scores, kind="stable")[:k]
        return [self.ids[n] for n in order if scores[n] > 0]


def bm25_baseline(dataset: Dataset) -> tuple[Scores, dict[str, Scores]]:
    """Plain BM25 over each conversation, question by question."""
    indexes = {}
    for context, messages in dataset.chats:
        key = scope_of(context.get("group_id"), context.get("user_id"))
        indexes[key] = Bm25(
            [m["message_id"] for m in messages], [m["text"] for m in messages], dataset.chinese
        )
    overall, by_category = Scores(), defaultdict(Scores)
    for q in dataset.questions:
        found = indexes[q.key].rank(q.query)
        overall.add(found, set(q.relevant))
        by_category[q.category].add(found, set(q.relevant))
    return overall, by_category


# --- Through the API -----------------------------------------------------------------------


async def evaluate(
    api: Api, dataset: Dataset, askers: bool = True
) -> tuple[Scores, dict[str, Scores]]:
    """Every question through ``POST /v1/messages/search`` (top 10), by its asker where the
    set names one (``askers``)."""
    overall, by_category = Scores(), defaultdict(Scores)
    for q in dataset.questions:
        asker = {"asker_id": q.asker} if askers and q.asker else {}
        # The chats were told in UTC (see ingest): the days a question names are read so.
        body = {"query": q.query, **q.scope, **asker, "timezone": "UTC", "top_k": 10}
        found = await api.search(body)
        overall.add(found, set(q.relevant))
        by_category[q.category].add(found, set(q.relevant))
    return overall, by_category


def report(
    title: str, overall: Scores, by_category: dict[str, Scores], baselines: dict[str, Scores]
) -> None:
    print(title)
    print(HEADER)
    print(overall.row("overall"))
    if len(by_category) > 1:
        for name in sorted(by_category):
            print(by_category[name].row(name))
    for name, scores in baselines.items():
        print(scores.row(name))


# --- The ranking's features, offline -------------------------------------------------------


@dataclass
class Asked:
    """One question's candidates as the service ranks them: ids, feature matrix."""

    dataset: str
    category: str
    ids: list[str]
    matrices: dict[str, np.ndarray[Any, Any]]  # by variant of the ranking (VARIANTS)
    relevant: frozenset[str]
    lexical: list[str]  # the candidates by the service's BM25 alone, best first
    dialogues: dict[str, bool]  # by variant: whether the stream reads as a dialogue


# The ranking as shipped, and with one of its choices undone (to see what each one earns).
VARIANTS = {
    "shipped": StreamWeights(),
    "dialogue everywhere": StreamWeights(dialogue_speakers=10**9),
    "no neighbours": StreamWeights(dialogue_speakers=0),
    "asker not given": StreamWeights(),  # the search called without asker_id
    "named days not read": StreamWeights(),
}
# The variants that undo a flag of the stream: the column dropped.
UNFLAGGED = {"asker not given": "by_asker", "named days not read": "on_named_day"}


@dataclass
class Candidates:
    """One question's candidate stream as the service builds it (before ranking)."""

    dataset: str
    category: str
    ids: list[str]  # of every row of the stream
    passages: Stream | list[StreamPassage]  # older kept streams hold passages
    idfs: dict[str, float]
    relevant: frozenset[str]
    lexical: list[str]
    asker: str | None = None


async def candidates_of(runtime: Any, tenant_id: Any, datasets: list[Dataset]) -> list[Candidates]:
    """The service's candidate streams for every question."""
    out = []
    for dataset in datasets:
        for q in dataset.questions:
            vector = await runtime.embedder.query(q.query)
            words = query_terms(q.query, MAX_QUERY_TERMS)
            async with runtime.db.tenant(tenant_id) as session:
                rows = await repository.search_candidates(
                    session, tenant_id, q.key, vector, words, SEARCH_PLAN, None, None
                )
            passages, idfs = stream_of(rows, q.query, q.asker)
            lexical = sorted(
                (r for r in rows if r.candidate and r.bm25 > 0), key=lambda r: -float(r.bm25)
            )
            out.append(
                Candidates(
                    dataset.name,
                    q.category,
                    [r.message_id for r in rows],
                    passages,
                    idfs,
                    q.relevant,
                    [r.message_id for r in lexical[:10]],
                    q.asker,
                )
            )
    return out


def features_of(streams: list[Candidates], names: list[str]) -> list[Asked]:
    """The ranking's features of every question's candidates (no recency, no MMR), under
    each of the VARIANTS."""
    out = []
    for c in streams:
        matrices, dialogues = {}, {}
        picked: list[int] = []
        for variant, weights in VARIANTS.items():
            passages = c.passages
            if variant in UNFLAGGED and isinstance(passages, Stream):
                passages = replace(passages, **{UNFLAGGED[variant]: None})
            dialogues[variant] = reads_as_dialogue(passages, weights.dialogue_speakers)
            picked, features = stream_features(passages, c.idfs, weights)
            matrices[variant] = np.array([features[n] for n in names]).T
        ids = [c.ids[i] for i in picked]
        out.append(Asked(c.dataset, c.category, ids, matrices, c.relevant, c.lexical, dialogues))
    return out


def lexical_side(asked: list[Asked], dataset: str) -> Scores:
    scores = Scores()
    for a in asked:
        if a.dataset == dataset:
            scores.add(a.lexical, set(a.relevant))
    return scores


def lexical_tie_orders(
    asked: list[Asked], dataset: str, names: list[str], orders: int = 40
) -> list[float]:
    """hit@10 of the lexical side with its equal BM25 scores in ``orders`` random orders.

    The lexical side lists equal scores in the stream's order (the earliest first), and in
    a group many messages hold the same query terms: where the hybrid and the lexical side
    differ by a question or two, this says whether the order of ties decides it (on
    MemDaily with the asker not given: .871 earliest first, .861 latest first)."""
    rng = np.random.default_rng(0)
    column = names.index("lexical")
    figures = []
    for _ in range(orders):
        hits = []
        for a in asked:
            if a.dataset != dataset:
                continue
            scores = a.matrices["shipped"][:, column]
            matched = np.flatnonzero(scores > 0)
            ranked = matched[np.lexsort((rng.random(len(matched)), -scores[matched]))][:10]
            hits.append(bool({a.ids[i] for i in ranked} & a.relevant))
        figures.append(float(np.mean(hits)))
    return figures


def shipped_weights(names: list[str], in_dialogue: bool = True) -> np.ndarray[Any, Any]:
    """The default weights (of a dialogue, or of a stream of many senders) as a vector."""
    shipped = StreamWeights().feature_weights(in_dialogue)
    return np.array([shipped[n] for n in names])


def measure(
    asked: list[Asked],
    weights: np.ndarray[Any, Any],
    variant: str = "shipped",
    group: np.ndarray[Any, Any] | None = None,
) -> dict[str, tuple[float, float]]:
    """hit@10 and rec@10 per dataset under ``weights`` (features of ``variant``); with
    ``group``, streams that are not dialogues are ranked by those weights instead."""
    hits: dict[str, list[float]] = defaultdict(list)
    recalls: dict[str, list[float]] = defaultdict(list)
    for a in asked:
        if not a.ids:
            hits[a.dataset].append(0.0)
            recalls[a.dataset].append(0.0)
            continue
        used = weights if group is None or a.dialogues[variant] else group
        order = np.argsort(-(a.matrices[variant] @ used), kind="stable")[:10]
        got = {a.ids[i] for i in order} & a.relevant
        hits[a.dataset].append(1.0 if got else 0.0)
        recalls[a.dataset].append(len(got) / len(a.relevant))
    return {d: (float(np.mean(hits[d])), float(np.mean(recalls[d]))) for d in hits}


def objective(figures: dict[str, tuple[float, float]]) -> float:
    """Macro average over the sets (each set counts the same, whatever its size)."""
    return float(np.mean([h + 0.5 * r for h, r in figures.values()]))


GRIDS = {
    "neighbour_similarity": [0, 5, 10, 15, 20, 25, 30, 40],
    "speaker": [0, 0.1, 0.25, 0.5, 1],
}
DEFAULT_GRID = [0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8]


def fit(asked: list[Asked], names: list[str]) -> np.ndarray[Any, Any]:
    """Coordinate ascent from dense only; the dense weight is the fixed scale (10)."""
    weights = np.array([10.0] + [0.0] * (len(names) - 1))
    best = objective(measure(asked, weights))
    for _ in range(3):
        for j, name in enumerate(names[1:], start=1):
            for value in GRIDS.get(name, DEFAULT_GRID):
                trial = weights.copy()
                trial[j] = value
                score = objective(measure(asked, trial))
                if score > best + 1e-9:
                    best, weights = score, trial
    return weights


def unexercised(asked: list[Asked], names: list[str], in_dialogue: bool) -> list[int] | None:
    """The features (their positions in ``names``) that the streams of one shape never tell
    apart from nothing or from the similarity (the first feature): a fit learns nothing of
    them. None: no stream has the shape (the fit takes the other shape's weights)."""
    rows = [a.matrices["shipped"] for a in asked if a.ids and a.dialogues["shipped"] == in_dialogue]
    if not rows:
        return None
    matrix = np.vstack(rows)
    return [
        j
        for j in range(1, len(names))
        if not matrix[:, j].any() or np.allclose(matrix[:, j], matrix[:, 0])
    ]


def fit_gated(
    asked: list[Asked], names: list[str]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The shipped ranking's two weight sets, as it gates them: a dialogue's fitted on the
    streams that read as dialogues, a group's on the others. A shape the sets lack takes the
    other's weights (what a new shape would meet)."""
    dialogues = [a for a in asked if a.dialogues["shipped"]]
    groups = [a for a in asked if not a.dialogues["shipped"]]
    in_dialogue = fit(dialogues, names) if dialogues else fit(groups, names)
    return in_dialogue, fit(groups, names) if groups else in_dialogue


def cross_validate(asked: list[Asked], names: list[str]) -> None:
    """Leave one dataset out: weights fitted on the others, measured on it."""
    shown = lambda w: ", ".join(f"{n}={v:g}" for n, v in zip(names, w, strict=True))  # noqa: E731
    sets = list(dict.fromkeys(a.dataset for a in asked))
    print("\nLeave-one-dataset-out (fitted on the other sets, measured on the one left out)")
    print(f"  {'':<18} {'held-out':>9} {'in-sample':>10} {'defaults':>9} {'lexical':>8}  (hit@10)")
    everything = fit(asked, names)
    in_sample = measure(asked, everything)
    current = shipped_weights(names)
    group = shipped_weights(names, in_dialogue=False)
    defaults = measure(asked, current, group=group)
    fitted = {}
    for held in sets:
        train = [a for a in asked if a.dataset != held]
        fitted[held] = fit(train, names)
        out = measure([a for a in asked if a.dataset == held], fitted[held])[held]
        lexical = lexical_side(asked, held).hit()
        print(
            f"  {held:<18} {out[0]:>9.3f} {in_sample[held][0]:>10.3f} "
            f"{defaults[held][0]:>9.3f} {lexical:>8.3f}"
        )
    # The shipped ranking weighs a dialogue and a many-sender group apart: fitted so too.
    print("\nThe same, with the weights gated as shipped (a dialogue's, a group's)")
    print(f"  {'':<18} {'held-out':>9} {'in-sample':>10}  (hit@10)")
    whole = fit_gated(asked, names)
    gated_in = measure(asked, whole[0], group=whole[1])
    gated = {}
    for held in sets:
        gated[held] = fit_gated([a for a in asked if a.dataset != held], names)
        left_out = [a for a in asked if a.dataset == held]
        out = measure(left_out, gated[held][0], group=gated[held][1])[held]
        print(f"  {held:<18} {out[0]:>9.3f} {gated_in[held][0]:>10.3f}")
    # What the sets left in cannot teach: a feature that never fires in their streams of a
    # shape, or always equals the similarity (neighbours that are never there), keeps the
    # fit's starting weight. The held-out figure once more with those at the shipped
    # weights shows how much of the fall is such a feature (the rest is weights that do not
    # carry over).
    print("\n  Features the other sets never exercise (dialogue / group), and the held-out")
    print("  hit@10 with those at the shipped weights:")
    for held in sets:
        train = [a for a in asked if a.dataset != held]
        blind = [unexercised(train, names, in_dialogue) for in_dialogue in (True, False)]
        patched = [gated[held][n].copy() for n in (0, 1)]
        for n, in_dialogue in enumerate((True, False)):
            if blind[n]:
                shipped = shipped_weights(names, in_dialogue)
                patched[n][blind[n]] = shipped[blind[n]]
        left_out = [a for a in asked if a.dataset == held]
        out = measure(left_out, patched[0], group=patched[1])[held]
        unseen = " / ".join(
            "no such streams" if b is None else ", ".join(names[j] for j in b) or "none"
            for b in blind
        )
        print(f"  {held:<18} {out[0]:>9.3f}  ({unseen})")
    for held in sets:
        dialogue_weights, group_weights = (shown(w) for w in gated[held])
        print(f"  without {held}, gated: dialogue {dialogue_weights}")
        print(f"  {'':<{len(held) + 16}} group {group_weights}")
    for held in sets:
        print(f"  without {held}: {shown(fitted[held])}")
    print(f"  fitted on all: {shown(everything)}")
    print(f"  shipped:       {shown(current)}")
    print(f"  shipped, not a dialogue: {shown(group)}")
    print("\nThe shipped weights with one choice undone (hit@10)")
    for variant in VARIANTS:
        figures = measure(asked, current, variant, group)
        print(f"  {variant:<22} " + "  ".join(f"{d} {figures[d][0]:.3f}" for d in sets))


async def big_conversation(
    api: Api,
    runtime: Any,
    tenant_id: Any,
    turns: dict[str, list[dict[str, Any]]],
    memories: dict[int, list[dict[str, Any]]],
    questions: list[dict[str, Any]],
    dialogues: list[dict[str, Any]],
    size: int,
) -> None:
    """Search latency on one conversation of ``size`` messages: the LoCoMo turns and the
    MADial memories over and over, a minute apart."""
    from sqlalchemy import text

    source = [(t["speaker"], turn_text(t)) for rows in turns.values() for t in rows]
    source += [(None, m["event"]) for rows in memories.values() for m in rows]
    messages = [
        {
            "message_id": f"big-{n}",
            "sender_id": (source[n % len(source)][0] or "someone").lower(),
            "sender_name": source[n % len(source)][0],
            "text": source[n % len(source)][1],
            "sent_at": datetime.fromtimestamp(1.6e9 + n * 60, UTC).isoformat(),
        }
        for n in range(size)
    ]
    started = time.perf_counter()
    # No worker meanwhile: the vectors are copied from the embedded originals below.
    if runtime.worker is not None:
        await runtime.worker.stop()
    await api.ingest({"request_type": "group", "group_id": "big", "timezone": "UTC"}, messages)
    copy = text(
        """
        UPDATE messages AS m SET embedding = o.embedding
        FROM (SELECT DISTINCT ON (text) text, embedding FROM messages
              WHERE tenant_id = :tenant AND conversation_key <> 'g:big'
              ORDER BY text) AS o
        WHERE m.tenant_id = :tenant AND m.conversation_key = 'g:big' AND m.text = o.text
        """
    )
    async with runtime.db.system() as session:
        await session.execute(copy, {"tenant": tenant_id})
        await session.execute(text("ANALYZE messages"))
    print(f"\nBig conversation: {size} messages stored in {time.perf_counter() - started:.0f} s")
    cases = (
        ("LoCoMo questions", [q["question"] for q in questions[:300]]),
        ("MADial dialogues", [query[-4000:] for _, query, _ in madial_queries(dialogues)[:100]]),
    )
    for title, queries in cases:
        # Each query twice: first embedded, then from the query cache (the rest of the path).
        for note in ("query embedding included", "query embedding cached"):
            if note.endswith("included"):
                forget_queries(runtime)
            # The bench's own data (every question's candidate stream, millions of objects)
            # set aside like the service's: else the full collections the searches trigger
            # walk it, 270 ms a time, a pause no server holds.
            settle_heap()
            api.latencies = []
            for query in queries:
                await api.search({"query": query, "group_id": "big", "top_k": 10})
            print(f"  search latency, {title}, {note}: {percentiles(api.latencies)}")


STREAMS = "candidate-streams.pickle"


def replay(streams: list[Candidates]) -> None:
    """Offline figures of the current ranking code on kept candidate streams, per set and
    category, the variants and the leave-one-dataset-out fit."""
    names = list(StreamWeights().feature_weights())
    asked = features_of(streams, names)
    current = shipped_weights(names)
    group = shipped_weights(names, in_dialogue=False)
    for name in dict.fromkeys(a.dataset for a in asked):
        overall, by_category = Scores(), defaultdict(Scores)
        for a in asked:
            if a.dataset == name:
                used = current if a.dialogues["shipped"] else group
                order = np.argsort(-(a.matrices["shipped"] @ used), kind="stable")[:10]
                found = [a.ids[i] for i in order]
                overall.add(found, set(a.relevant))
                by_category[a.category].add(found, set(a.relevant))
        report(
            f"{name} (offline)", overall, by_category, {"lexical side": lexical_side(asked, name)}
        )
        ties = lexical_tie_orders(asked, name, names)
        print(
            f"  lexical side, equal scores in random order: hit@10 {np.mean(ties):.3f}"
            f" ({min(ties):.3f}-{max(ties):.3f} over {len(ties)} orders)"
        )
    cross_validate(asked, names)


def settings_for(data_dir: Path) -> Settings:
    return Settings(
        database_url=embedded_url(data_dir / "pg"),
        admin_token=ADMIN,
        log_level="WARNING",
        # Only the archive is measured: no extraction jobs competing for the CPU.
        cognitive={
            "extraction": {
                "every_n_messages": 10_000,
                "pause_minutes": 10.0**6,
                "remember_keywords": [],
            },
            "messages": {"batch_max": BATCH},
        },
    )


def forget_queries(runtime: Any) -> None:
    """Empty the embedder's cache of recent questions, so that the next search of each
    question embeds it, as a new question is (its latency then includes the embedding)."""
    embedder = runtime.embedder.inner
    embedder = getattr(embedder, "inner", embedder)  # through the vector cache
    cache = getattr(embedder, "_cache", None)
    if cache is not None:
        cache.clear()


def use_cache(app: Any, folder: Path | None, queries: bool = False) -> CachedEmbedder | None:
    """Embed through a vector cache in ``folder`` (None: no cache); ``queries``: questions'
    vectors kept too."""
    if folder is None:
        return None
    current = app.state.runtime.embedder
    cached = CachedEmbedder(current.inner, folder, queries)
    current.inner = cached
    return cached


async def new_tenant(http: httpx.AsyncClient, name: str) -> dict[str, Any]:
    created = await http.post(
        "/admin/tenants", json={"name": name}, headers={"Authorization": f"Bearer {ADMIN}"}
    )
    return dict(created.json())


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=DATA, help="folder of the bench data")
    parser.add_argument("--cache", type=Path, default=None, help="folder of cached vectors")
    parser.add_argument("--only", default=",".join(DATASETS), help="sets, comma separated")
    parser.add_argument("--big", type=int, default=0, help="messages of the latency chat")
    parser.add_argument("--cv", action="store_true", help="leave-one-dataset-out weights")
    parser.add_argument(
        "--replay",
        action="store_true",
        help="no service: rank the candidates a --cache run kept (offline figures, --cv)",
    )
    parser.add_argument("--recent", action="store_true", help="LoCoMo again, dated up to yesterday")
    args = parser.parse_args()
    logging.disable(logging.INFO)  # the figures, not the request log

    if args.replay:
        if args.cache is None:
            parser.error("--replay reads the candidates that a run with --cache kept")
        replay(pickle.loads((args.cache / STREAMS).read_bytes()))
        return
    wanted = set(args.only.split(","))
    turns, questions = load_locomo(args.data / "locomo_dev.jsonl")
    memories, dialogues = load_madial(args.data / "madial-zh")
    datasets = []
    if "locomo" in wanted:
        datasets.append(locomo_dataset(turns, questions))
    if "madial" in wanted:
        datasets.append(madial_dataset(memories, dialogues))
    if "memdaily" in wanted:
        datasets.append(memdaily_dataset(args.data / "memdaily-zh/memdaily_events_pools.jsonl"))

    data_dir = Path(tempfile.mkdtemp(prefix="bench-retrieval-"))
    app = create_app(settings_for(data_dir), migrate=True, run_worker=True)
    for hook in app.on_startup:
        await hook(app)
    cache = use_cache(app, args.cache)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
            body = await new_tenant(http, "bench")
            api = Api(http, body["api_key"]["key"])
            started = time.perf_counter()
            jobs: set[int] = set()
            for dataset in datasets:
                jobs |= await ingest(api, dataset)
            await api.wait_for_jobs(jobs)
            if cache is not None:
                cache.save()
            stored = sum(len(m) for d in datasets for _, m in d.chats)
            print(
                f"Ingested and embedded {stored} messages in {time.perf_counter() - started:.0f} s\n"
            )
            runtime = app.state.runtime
            names = list(StreamWeights().feature_weights())
            streams = await candidates_of(runtime, body["tenant_id"], datasets)
            if args.cache is not None:
                cache.save()  # type: ignore[union-attr]
                (args.cache / STREAMS).write_bytes(pickle.dumps(streams))
            asked = features_of(streams, names)
            for dataset in datasets:
                forget_queries(runtime)
                settle_heap()  # see big_conversation
                api.latencies = []
                overall, by_category = await evaluate(api, dataset)
                plain, _ = bm25_baseline(dataset)
                asked_by = (
                    " asked by their members" if any(q.asker for q in dataset.questions) else ""
                )
                report(
                    f"{dataset.name} ({len(dataset.questions)} questions{asked_by}, top_k 10)",
                    overall,
                    by_category,
                    {
                        "lexical side": lexical_side(asked, dataset.name),
                        "BM25 " + ("bigrams" if dataset.chinese else "words"): plain,
                    },
                )
                print(
                    f"  search latency (query embedding included): {percentiles(api.latencies)}\n"
                )
                if asked_by:
                    overall, by_category = await evaluate(api, dataset, askers=False)
                    report(f"{dataset.name}, the asker not given", overall, by_category, {})
                    print()
            if cache is not None:
                cache.save()
            if args.recent and "locomo" in wanted:
                created = await new_tenant(http, "bench-recent")
                recent = Api(http, created["api_key"]["key"])
                moved = locomo_dataset(turns, questions, recent=True)
                await recent.wait_for_jobs(await ingest(recent, moved))
                overall, by_category = await evaluate(recent, moved)
                report("LoCoMo dated up to yesterday", overall, by_category, {})
            if args.cv:
                cross_validate(asked, names)
            if args.big:
                await big_conversation(
                    api,
                    runtime,
                    body["tenant_id"],
                    turns,
                    memories,
                    questions,
                    dialogues,
                    args.big,
                )
    finally:
        for hook in app.on_shutdown:
            await hook(app)
        stop_embedded()
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
