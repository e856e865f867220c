"""Message-archive retrieval quality on real data, through the public API.

Starts the app in process (worker included) on a throwaway embedded PostgreSQL, then:

1. LoCoMo (English): each conversation is one group chat whose two speakers are its
   members; every turn is a message (``message_id`` = turn id, ``sent_at`` = the session's
   time, a shared photo's caption appended to the text). Each question with evidence is
   asked with ``POST /v1/messages/search`` (top 10) of its conversation: hit@5, hit@10,
   rec@5, rec@10 overall and per category (the LoCoMo paper's definitions).
2. MADial-Bench (Chinese): each user's memories are the messages of a private chat (in date
   order); each test turn asks with the dialogue's user turns up to it: hit@k and rec@k of
   the labelled memories.
3. Search latency (p50/p95) of the calls above (query embedding included), and with
   ``--big N`` on one conversation of N messages (the LoCoMo turns and MADial memories over
   and over; their vectors copied from the embedded originals so the run does not spend
   minutes embedding).

``--cv`` also re-fits the ranking weights with 2-fold cross-validation by conversation (the
candidates and features come from the service's own code) and prints the held-out figures,
which is how the defaults in ``service.retrieval.neighbours.StreamWeights`` were chosen.

Data are read from ``../shared/bench`` next to the repository (or ``--data DIR``); nothing
is copied into the repository.

``--recent`` asks LoCoMo again with every conversation moved in time to end yesterday, so
the recency boost (on by default) weighs on all but the last sessions.

Run: python bench/retrieval_quality.py [--data DIR] [--big 50000] [--cv] [--recent]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure import quantile_ms

from service.app import create_app
from service.db.embedded import embedded_url, stop_embedded
from service.messages import repository
from service.messages.search import SEARCH_PLAN, stream_of
from service.retrieval.neighbours import StreamWeights, stream_features
from service.retrieval.terms import query_terms
from service.settings import Settings

DATA = Path(__file__).resolve().parents[2] / "shared/bench"
ADMIN = "bench-admin"
BATCH = 500
KS = (5, 10)


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

    def row(self, name: str) -> str:
        n = len(self.hits[KS[0]])
        cells = [f"{statistics.fmean(self.hits[k]):.3f}" for k in KS]
        cells += [f"{statistics.fmean(self.recalls[k]):.3f}" for k in KS]
        return f"  {name:<14} {n:>5}   " + "   ".join(cells)


HEADER = "  {:<14} {:>5}   hit@5   hit@10  rec@5   rec@10".format("", "n")


def percentiles(samples: list[float]) -> str:
    p50, p95, p99 = (quantile_ms(samples, q) for q in (0.50, 0.95, 0.99))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"p50 {p50:6.1f} ms  p95 {p95:6.1f} ms  p99 {p99:6.1f} ms  (n={len(samples)}; "
        f"load average {load})"
    )


def load_locomo(path: Path) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
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


async def ingest_locomo(
    api: Api, turns: dict[str, list[dict[str, Any]]], recent: bool = False
) -> set[int]:
    """Each conversation as a group chat; ``recent``: moved in time so that its last session
    was yesterday (the recency boost then weighs on every older session)."""
    jobs: set[int] = set()
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
        context = {"request_type": "group", "group_id": conv_id, "timezone": "UTC"}
        jobs |= await api.ingest(context, messages)
    return jobs


async def ingest_madial(
    api: Api, memories: dict[int, list[dict[str, Any]]], names: dict[int, str]
) -> set[int]:
    jobs: set[int] = set()
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
        jobs |= await api.ingest(context, messages)
    return jobs


async def evaluate_locomo(api: Api, questions: list[dict[str, Any]], title: str = "LoCoMo") -> None:
    overall, by_category = Scores(), defaultdict(Scores)
    for q in questions:
        found = await api.search({"query": q["question"], "group_id": q["conv_id"], "top_k": 10})
        evidence = set(q["evidence"])
        overall.add(found, evidence)
        by_category[f"{q['category_id']} {q['category']}"].add(found, evidence)
    print(f"{title} ({len(questions)} questions with evidence, top_k 10)")
    print(HEADER)
    print(overall.row("overall"))
    for name in sorted(by_category):
        print(by_category[name].row(name))


def madial_queries(dialogues: list[dict[str, Any]]) -> list[tuple[int, str, set[str]]]:
    queries = []
    for dialogue in dialogues:
        for turn in dialogue["test-turn"]:
            _, lines = user_turns(dialogue["dialogue"], turn)
            relevant = {str(i) for i in dialogue["relevant-id"]}
            queries.append((int(dialogue["user-id"]), "\n".join(lines), relevant))
    return queries


async def evaluate_madial(api: Api, dialogues: list[dict[str, Any]]) -> None:
    scores = Scores()
    queries = madial_queries(dialogues)
    for user, query, relevant in queries:
        found = await api.search({"query": query[-4000:], "user_id": f"madial-{user}", "top_k": 10})
        scores.add(found, relevant)
    print(f"MADial-Bench zh ({len(queries)} test turns, memories per user as a private chat)")
    print(HEADER)
    print(scores.row("overall"))


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
            api.latencies = []
            for query in queries:
                await api.search({"query": query, "group_id": "big", "top_k": 10})
            print(f"  search latency, {title}, {note}: {percentiles(api.latencies)}")


async def cross_validate(
    runtime: Any, tenant_id: Any, questions: list[dict[str, Any]], folds: list[set[str]]
) -> None:
    """Fit the fusion weights on one fold of conversations, measure on the other."""
    names = list(StreamWeights().feature_weights())
    reaches = StreamWeights()
    data = []
    for q in questions:
        vector = await runtime.embedder.query(q["question"])
        words = query_terms(q["question"])
        async with runtime.db.tenant(tenant_id) as session:
            rows = await repository.search_candidates(
                session, tenant_id, f"g:{q['conv_id']}", vector, words, SEARCH_PLAN, None, None
            )
        passages, idfs = stream_of(rows, q["question"])
        picked, features = stream_features(passages, idfs, reaches)
        ids = [rows[i].message_id for i in picked]
        matrix = np.array([features[n] for n in names]).T
        data.append((q["conv_id"], ids, matrix, set(q["evidence"])))

    def measure(weights: np.ndarray, chosen: list[int]) -> tuple[float, float]:
        hits, recalls = [], []
        for n in chosen:
            _, ids, matrix, evidence = data[n]
            order = np.argsort(-(matrix @ weights), kind="stable")[:10]
            got = {ids[i] for i in order} & evidence
            hits.append(1.0 if got else 0.0)
            recalls.append(len(got) / len(evidence))
        return float(np.mean(hits)), float(np.mean(recalls))

    grids = {
        "neighbour_similarity": [0, 5, 10, 15, 20, 25, 30, 40],
        "speaker": [0, 0.1, 0.25, 0.5, 1],
    }
    default_grid = [0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 2, 2.25, 2.5, 3]

    def fit(chosen: list[int]) -> np.ndarray:
        # Coordinate ascent from dense only; the dense weight is the fixed scale (10).
        weights = np.array([10.0] + [0.0] * (len(names) - 1))
        h, r = measure(weights, chosen)
        best = h + 0.5 * r
        for _ in range(3):
            for j, name in enumerate(names[1:], start=1):
                for value in grids.get(name, default_grid):
                    trial = weights.copy()
                    trial[j] = value
                    h, r = measure(trial, chosen)
                    if h + 0.5 * r > best + 1e-9:
                        best, weights = h + 0.5 * r, trial
        return weights

    print("\nCross-validation by conversation (weights fitted on one fold, measured on the other)")
    held_hits, held_recalls, total = 0.0, 0.0, 0
    for train in folds:
        chosen = [n for n, item in enumerate(data) if item[0] in train]
        rest = [n for n, item in enumerate(data) if item[0] not in train]
        weights = fit(chosen)
        h, r = measure(weights, rest)
        held_hits += h * len(rest)
        held_recalls += r * len(rest)
        total += len(rest)
        shown = ", ".join(f"{n}={w:g}" for n, w in zip(names, weights, strict=True))
        print(f"  fit on {sorted(train)}: {shown}")
        print(f"    held-out ({len(rest)} questions): hit@10 {h:.3f}  rec@10 {r:.3f}")
    print(f"  held-out overall: hit@10 {held_hits / total:.3f}  rec@10 {held_recalls / total:.3f}")
    everything = list(range(len(data)))
    weights = fit(everything)
    shown = ", ".join(f"{n}={w:g}" for n, w in zip(names, weights, strict=True))
    h, r = measure(weights, everything)
    print(f"  fit on all (in-sample hit@10 {h:.3f}): {shown}")
    current = np.array([StreamWeights().feature_weights()[n] for n in names])
    h, r = measure(current, everything)
    print(f"  shipped defaults: hit@10 {h:.3f}  rec@10 {r:.3f}")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=DATA, help="folder of the bench data")
    parser.add_argument("--big", type=int, default=0, help="messages of the latency chat")
    parser.add_argument("--cv", action="store_true", help="2-fold cross-validated weights")
    parser.add_argument("--recent", action="store_true", help="LoCoMo again, dated up to yesterday")
    args = parser.parse_args()
    logging.disable(logging.INFO)  # the figures, not the request log

    turns, questions = load_locomo(args.data / "locomo_dev.jsonl")
    memories, dialogues = load_madial(args.data / "madial-zh")
    names: dict[int, str] = {}
    for dialogue in dialogues:
        name, _ = user_turns(dialogue["dialogue"], len(dialogue["dialogue"]))
        if name:
            names.setdefault(int(dialogue["user-id"]), name)

    data_dir = Path(tempfile.mkdtemp(prefix="bench-retrieval-"))
    settings = Settings(
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
    app = create_app(settings, migrate=True, run_worker=True)
    for hook in app.on_startup:
        await hook(app)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
            created = await http.post(
                "/admin/tenants",
                json={"name": "bench"},
                headers={"Authorization": f"Bearer {ADMIN}"},
            )
            body = created.json()
            api = Api(http, body["api_key"]["key"])
            started = time.perf_counter()
            jobs = await ingest_locomo(api, turns)
            jobs |= await ingest_madial(api, memories, names)
            await api.wait_for_jobs(jobs)
            stored = sum(len(rows) for rows in turns.values())
            stored += sum(len(rows) for rows in memories.values())
            print(
                f"Ingested and embedded {stored} messages in {time.perf_counter() - started:.0f} s\n"
            )

            await evaluate_locomo(api, questions)
            print(f"  search latency: {percentiles(api.latencies)}\n")
            api.latencies = []
            await evaluate_madial(api, dialogues)
            print(f"  search latency: {percentiles(api.latencies)}")
            runtime = app.state.runtime
            if args.recent:
                created = await http.post(
                    "/admin/tenants",
                    json={"name": "bench-recent"},
                    headers={"Authorization": f"Bearer {ADMIN}"},
                )
                recent = Api(http, created.json()["api_key"]["key"])
                await recent.wait_for_jobs(await ingest_locomo(recent, turns, recent=True))
                print()
                await evaluate_locomo(recent, questions, "LoCoMo dated up to yesterday")
            if args.cv:
                folds = [{"conv-26", "conv-42"}, {"conv-30", "conv-41", "conv-43"}]
                await cross_validate(runtime, body["tenant_id"], questions, folds)
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
