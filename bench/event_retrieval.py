"""Event-path retrieval quality on real data, through the public API.

The loop a bot runs: every turn handed over with ``POST /v1/end``, the historian turns it
into an absolute event, and a later question finds it again. Starts the app in process
(worker included, offline historian: rules, no LLM) on a throwaway embedded PostgreSQL, then
hands over every message of the sets of ``bench/retrieval_quality.py`` (the same chats:
LoCoMo conversations and MemDaily pools as group chats, MADial users' memories as private
chats), one ``end`` call per message (its sender, its time, its text as the one
observation). Once the historian has written every event, each question is asked with
``POST /v1/events/search`` (top 10) and with ``POST /v1/context`` (``auto_top_k`` 10):
hit@5, hit@10, rec@5, rec@10 overall and per category, an event counting for the message it
was written from.

The LoCoMo dev split is what ``--conversations`` picks from (all five by default); the
held-out conversations are not in ``../shared/bench``. The ranking's defaults are meant for
every embedder and tenant, not fitted to these questions.

Before events were ranked with their neighbours, on conv-26 and conv-30 (302 questions,
--without-profiles, offline historian): events/search hit@5 0.649, hit@10 0.715, rec@10
0.671; /v1/context the same; MADial (262 test turns) hit@10 0.924. With the neighbours and
lexical_weight 0.5 (all five LoCoMo dev conversations, --without-profiles): LoCoMo hit@5
0.740, hit@10 0.797; MADial 0.821 / 0.939; MemDaily dev 0.711 / 0.815 (at 0.3: 0.692 /
0.783, 0.847 / 0.935, 0.711 / 0.797). With the asker, the named days and a long query's 128
terms (64 before, which cut MADial's dialogues: 0.935): LoCoMo 0.769 / 0.853, MADial 0.847 /
0.950, MemDaily dev asked by its members 0.980 / 0.980 (not: 0.711 / 0.814). A speaker named
in full once a text (not at every "I"): LoCoMo 0.773 / 0.855. With the asker's own nearest
events as candidates in a group: MemDaily asked by its members 1.000 / 1.000 (rec@10 0.781 ->
0.908); a turn's 3 events (--auto-top-k 3) hit 0.851 -> 1.000 (LoCoMo 0.665, MADial 0.786).
The events search's lexical side alone (its BM25 candidates, printed as "lexical side"):
LoCoMo 0.605 / 0.686, MADial 0.844 / 0.912, MemDaily dev 0.745 / 0.829. Groups weighing the
lexical side three times as much as dialogues (as the message search's group weights do):
MemDaily not asked 0.814 -> 0.820, asked 1.000 -> 0.982; not adopted. The query's terms
counted over 4 neighbours each side instead of 10 (``StreamWeights.window``): LoCoMo 0.776 /
0.858, MADial and MemDaily unchanged. A day the question names weighed as the message
search weighs it (``ranking.day_lift``: 0.38 on the relevance scale in a dialogue instead
of 0.12): LoCoMo 0.781 / 0.862 (single-hop 0.876 -> 0.880, adversarial 0.899 -> 0.907),
MADial and MemDaily unchanged. Two members' same words on one day kept as two events, as
the message search keeps them (only one member's repeat is dropped): MemDaily not asked
0.716 / 0.827 (0.711 / 0.814 before; the lexical side alone 0.829), the rest unchanged.

Run: python bench/event_retrieval.py [--data DIR] [--cache /tmp/vectors]
     [--only locomo,madial,memdaily] [--conversations 2] [--without-profiles]
     [--auto-top-k 3]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retrieval_quality import (
    ADMIN,
    DATA,
    HEADER,
    Api,
    Dataset,
    Question,
    Scores,
    load_locomo,
    load_madial,
    locomo_dataset,
    madial_dataset,
    memdaily_dataset,
    new_tenant,
    percentiles,
    use_cache,
)

from service.app import create_app
from service.db.embedded import embedded_url, stop_embedded
from service.historian import service as historian
from service.recall.ranking import EventQuery, lexical_candidates
from service.settings import QuerySettings, Settings

TOP_K = 10


class EventApi(Api):
    """The public API as a bot uses it: ``end`` calls, event search, the turn's context."""

    def __init__(
        self, http: httpx.AsyncClient, key: str, runtime: Any, tenant_id: uuid.UUID
    ) -> None:
        super().__init__(http, key)
        self.context_latencies: list[float] = []
        # The app in process and the tenant: for the lexical side alone.
        self.runtime, self.tenant_id = runtime, tenant_id
        # Which source item (a LoCoMo turn, a MADial memory) each event was written from.
        self.source: dict[str, str] = {}

    async def end(self, body: dict[str, Any], source: str) -> int:
        accepted = await self.post("/v1/end", body)
        for event_id in accepted["event_ids"]:
            self.source[event_id] = source
        return int(accepted["job_id"])

    async def events(self, query: str, context: dict[str, Any]) -> list[str]:
        started = time.perf_counter()
        found = await self.post(
            "/v1/events/search", {"query": query[-4000:], "context": context, "top_k": TOP_K}
        )
        self.latencies.append(time.perf_counter() - started)
        return self.sources(hit["id"] for hit in found["events"])

    async def context(self, messages: list[str], context: dict[str, Any]) -> list[str]:
        started = time.perf_counter()
        found = await self.post("/v1/context", {**context, "messages": messages[-5:]})
        self.context_latencies.append(time.perf_counter() - started)
        return self.sources(item["id"].removeprefix("event:") for item in found["events"])

    def sources(self, event_ids: Any) -> list[str]:
        # Two events of one turn count once, at the better rank.
        return list(dict.fromkeys(self.source.get(e, e) for e in event_ids))

    async def settle(self, jobs: list[int]) -> dict[str, int]:
        """Wait for the jobs; how many ended in each status."""
        headers = {"Authorization": f"Bearer {self.key}"}
        counts: dict[str, int] = defaultdict(int)
        for job_id in jobs:
            while True:
                job = (await self.http.get(f"/v1/jobs/{job_id}", headers=headers)).json()
                if job["status"] in ("done", "failed"):
                    counts[job["status"]] += 1
                    if job["status"] == "failed" and counts["failed"] <= 3:
                        print(f"  job {job_id} failed: {job.get('last_error')}")
                    break
                await asyncio.sleep(0.2)
        return dict(counts)


def told(dataset: Dataset) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Every message of every chat in the order said, with the body of its ``end`` call
    (its sender, its time, its text as the one observation)."""
    for context, messages in dataset.chats:
        where = {k: v for k, v in context.items() if k in ("request_type", "group_id", "user_id")}
        # A request id is the tenant's idempotency key: turn ids repeat across chats
        # (LoCoMo's "D1:3" is in every conversation), so the chat is part of it.
        chat = where.get("group_id") or where.get("user_id")
        said: Counter[str] = Counter()
        for message in messages:
            # The turns of a session share its time; a second apart each, they are told in
            # the order said (else events of one time follow the order the historian wrote
            # them in, which varies from run to run, and so do the neighbours).
            at = datetime.fromisoformat(message["sent_at"])
            at += timedelta(seconds=said[message["sent_at"]])
            said[message["sent_at"]] += 1
            body = {
                **where,
                "sender_id": message["sender_id"],
                "sender_name": message["sender_name"],
                "timestamp": at.isoformat(),
                "timezone": "UTC",
                "request_id": re.sub(
                    r"[^A-Za-z0-9_.-]", ".", f"{dataset.name}.{chat}.{message['message_id']}"
                ),
                "observations": [message["text"]],
            }
            yield message, body


async def hand_over(api: EventApi, dataset: Dataset) -> list[int]:
    """Every message of every chat as one ``end`` call (see ``told``), in the order said."""
    return [await api.end(body, message["message_id"]) for message, body in told(dataset)]


def report(title: str, overall: Scores, by_category: dict[str, Scores] | None = None) -> None:
    print(title)
    print(HEADER)
    print(overall.row("overall"))
    if by_category and len(by_category) > 1:
        for name in sorted(by_category):
            print(by_category[name].row(name))


def context_lines(question: Question) -> list[str]:
    # A chat history as the query (MADial's user turns) is the last lines of a context call.
    return question.query.split("\n")


async def lexical_side(api: EventApi, question: Question) -> list[str]:
    """The events search's lexical side alone: its BM25 candidates, best first (top 10)."""
    runtime, q = api.runtime, QuerySettings()
    search = EventQuery(question.query, [question.key], TOP_K, q.time_decay_half_life_days_tool)
    async with runtime.db.tenant(api.tenant_id) as session:
        rows = await lexical_candidates(session, api.tenant_id, search, q)
    return api.sources(r["id"] for r in rows[:TOP_K])


async def evaluate(
    api: EventApi, dataset: Dataset, auto_top_k: int = TOP_K, askers: bool = True
) -> None:
    """Every question through events/search and through the turn's context, by its asker
    where the set names one (``askers``), and through the lexical side alone."""
    searched, contexts, lexical = Scores(), Scores(), Scores()
    searched_by: dict[str, Scores] = defaultdict(Scores)
    contexts_by: dict[str, Scores] = defaultdict(Scores)
    api.latencies, api.context_latencies = [], []
    for q in dataset.questions:
        if not q.query.strip():
            continue
        kind = "group" if "group_id" in q.scope else "private"
        # The chats were told in UTC (see hand_over): the days a question names are read so.
        where = {"request_type": kind, **q.scope, "timezone": "UTC"}
        if askers and q.asker:  # the member asking, as a group bot's call names them
            where["sender_id"] = q.asker
        found = await api.events(q.query, where)
        searched.add(found, set(q.relevant))
        searched_by[q.category].add(found, set(q.relevant))
        injected = await api.context(context_lines(q), where)
        if askers:
            lexical.add(await lexical_side(api, q), set(q.relevant))
        contexts.add(injected, set(q.relevant))
        contexts_by[q.category].add(injected, set(q.relevant))
    name = dataset.name
    if any(q.asker for q in dataset.questions):
        name += ", asked by their members" if askers else ", the asker not given"
    report(f"{name}, events/search (top_k {TOP_K})", searched, searched_by)
    if askers:
        print(lexical.row("lexical side"))
    print(f"  latency: {percentiles(api.latencies)}")
    # Fewer than 5 events a turn: its hit@5 is the hit at what it takes.
    report(f"{name}, context (auto_top_k {auto_top_k})", contexts, contexts_by)
    print(f"  latency: {percentiles(api.context_latencies)}\n")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=DATA, help="folder of the bench data")
    parser.add_argument("--cache", type=Path, default=None, help="folder of cached vectors")
    parser.add_argument("--only", default="locomo,madial", help="sets, comma separated")
    parser.add_argument("--conversations", type=int, default=0, help="LoCoMo ones (0 = all)")
    parser.add_argument(
        "--turns", type=int, default=0, help="a quick check: the first turns of each (0 = all)"
    )
    parser.add_argument(
        "--auto-top-k",
        type=int,
        default=TOP_K,
        help="the events a turn's context takes (the service's default is 3)",
    )
    parser.add_argument(
        "--without-profiles",
        action="store_true",
        help="the historian writes events and memories but no profiles (the event path alone)",
    )
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the figures, not the request log
    if args.without_profiles:
        # Profiles are the slow and capped part of a job while they grow with every fact;
        # they play no part in event search.
        historian.end_targets = lambda *args, **kwargs: []

    wanted = set(args.only.split(","))
    datasets = []
    if "locomo" in wanted:
        turns, questions = load_locomo(args.data / "locomo_dev.jsonl")
        if args.conversations:
            turns = dict(list(turns.items())[: args.conversations])
            questions = [q for q in questions if q["conv_id"] in turns]
        if args.turns:
            turns = {conv_id: rows[: args.turns] for conv_id, rows in turns.items()}
            kept = {t["turn_id"] for rows in turns.values() for t in rows}
            questions = [q for q in questions if set(q["evidence"]) <= kept]
        datasets.append(locomo_dataset(turns, questions))
    if "madial" in wanted:
        datasets.append(madial_dataset(*load_madial(args.data / "madial-zh")))
    if "memdaily" in wanted:
        datasets.append(memdaily_dataset(args.data / "memdaily-zh/memdaily_events_pools.jsonl"))

    data_dir = Path(tempfile.mkdtemp(prefix="bench-event-retrieval-"))
    settings = Settings(
        database_url=embedded_url(data_dir / "pg"), admin_token=ADMIN, log_level="WARNING"
    )
    app = create_app(settings, migrate=True, run_worker=True)
    for hook in app.on_startup:
        await hook(app)
    use_cache(app, args.cache)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://bench", timeout=60
        ) as http:
            created = await new_tenant(http, "bench")
            api = EventApi(
                http, created["api_key"]["key"], app.state.runtime, uuid.UUID(created["tenant_id"])
            )
            await api.http.patch(
                "/v1/settings",
                json={"query": {"auto_top_k": args.auto_top_k}},
                headers={"Authorization": f"Bearer {api.key}"},
            )
            started = time.perf_counter()
            jobs = []
            for dataset in datasets:
                jobs += await hand_over(api, dataset)
            counts = await api.settle(jobs)
            elapsed = time.perf_counter() - started
            print(
                f"{len(jobs)} end calls, historian done in {elapsed:.0f} s "
                f"({len(jobs) / elapsed:.1f} jobs/s): {counts}\n"
            )
            for dataset in datasets:
                await evaluate(api, dataset, args.auto_top_k)
                if any(q.asker for q in dataset.questions):
                    await evaluate(api, dataset, args.auto_top_k, askers=False)
    finally:
        for hook in app.on_shutdown:
            await hook(app)
        stop_embedded()
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
