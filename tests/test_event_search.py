"""Nearest events: the exact top-k by cosine distance within the tenant, conversations and time
range asked for, checked against brute force."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from service.db.engine import Database
from service.db.migrate import upgrade_to_head
from service.errors import Invalid
from service.events import repository as events_repository
from service.events.repository import nearest_events, upsert_events
from service.retrieval.terms import query_terms, term_sample, terms
from service.settings import Settings
from service.tenants.service import create_tenant
from tests.conftest import DatabaseFactory

DIM = 384
START = datetime(2026, 1, 1, tzinfo=UTC)


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def event_row(
    tenant_id: uuid.UUID, event_id: str, key: str, at: datetime, vector: Any
) -> dict[str, Any]:
    group = key[2:] if key.startswith("g:") else None
    return {
        "tenant_id": tenant_id,
        "id": event_id,
        "conversation_key": key,
        "request_type": "group" if group else "private",
        "group_id": group,
        "user_id": None if group else key[2:],
        "sender_id": "10001",
        "request_id": event_id,
        "end_seq": 1,
        "kind": "observation",
        "perspective": "group" if group else "sender",
        "text": f"事件 {event_id}",
        "source_text": f"事件 {event_id}",
        "is_absolute": True,
        "warnings": [],
        "occurred_at": at,
        "timezone": "Asia/Shanghai",
        "location_abs": None,
        "message_ids": [],
        "metadata": {},
        "embedding": vector,
        "job_id": None,
    }


class Corpus:
    """Events written through ``upsert_events``, with their vectors kept for brute force."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.rows: list[dict[str, Any]] = []

    async def add(self, tenant_id: uuid.UUID, key: str, vectors: np.ndarray, **at: Any) -> None:
        rows = [
            event_row(
                tenant_id,
                f"{key}-{len(self.rows) + i}",
                key,
                at.get("when") or START + timedelta(minutes=len(self.rows) + i),
                vector,
            )
            for i, vector in enumerate(vectors)
        ]
        async with self.db.tenant(tenant_id) as session:
            for start in range(0, len(rows), 500):
                await upsert_events(session, rows[start : start + 500])
        self.rows += rows

    def brute_force(
        self,
        tenant_id: uuid.UUID,
        keys: list[str],
        query: np.ndarray,
        limit: int,
        time_from: datetime | None = None,
        time_to: datetime | None = None,
    ) -> list[str]:
        chosen = [
            r
            for r in self.rows
            if r["tenant_id"] == tenant_id
            and r["conversation_key"] in keys
            and r["embedding"] is not None
            and (time_from is None or r["occurred_at"] >= time_from)
            and (time_to is None or r["occurred_at"] < time_to)
        ]
        matrix = np.stack([r["embedding"] for r in chosen]).astype(np.float64)
        q = query.astype(np.float64)
        distances = 1.0 - matrix @ q / (np.linalg.norm(matrix, axis=1) * np.linalg.norm(q))
        order = np.argsort(distances, kind="stable")[:limit]
        return [chosen[i]["id"] for i in order]


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    database = Database(db_url, pool_size=4)
    yield database
    await database.dispose()


async def new_tenant_id(db: Database, name: str) -> uuid.UUID:
    async with db.system() as session:
        tenant, _ = await create_tenant(session, name, {}, Settings())
    return tenant.id


async def search(
    db: Database, tenant_id: uuid.UUID, keys: list[str], query: np.ndarray, limit: int, **kw: Any
) -> list[dict[str, Any]]:
    async with db.tenant(tenant_id) as session:
        return await nearest_events(session, tenant_id, keys, query, limit, **kw)


async def test_exact_top_k_over_several_conversations(db: Database) -> None:
    rng = np.random.default_rng(7)
    tenant = await new_tenant_id(db, "acme")
    corpus = Corpus(db)
    for key, size in (("g:busy", 2500), ("g:quiet", 300), ("p:10001", 700), ("g:other", 500)):
        await corpus.add(tenant, key, unit(rng, size))
    for keys in (["g:busy"], ["g:quiet"], ["g:busy", "p:10001"], ["g:quiet", "p:10001"]):
        for limit in (1, 10, 36):
            for query in unit(rng, 4):
                found = await search(db, tenant, keys, query, limit)
                assert [e["id"] for e in found] == corpus.brute_force(tenant, keys, query, limit)
                distances = [e["distance"] for e in found]
                assert distances == sorted(distances)
                assert {e["conversation_key"] for e in found} <= set(keys)


async def test_distance_is_the_cosine_distance_and_rows_carry_the_event(db: Database) -> None:
    rng = np.random.default_rng(3)
    tenant = await new_tenant_id(db, "acme")
    corpus = Corpus(db)
    vectors = unit(rng, 50) * 3.0  # not unit length: cosine ignores the scale
    await corpus.add(tenant, "g:1", vectors)
    query = unit(rng, 1)[0] * 0.5
    found = await search(db, tenant, ["g:1"], query, 5)
    best = next(r for r in corpus.rows if r["id"] == found[0]["id"])
    expected = 1.0 - float(best["embedding"] @ query) / (3.0 * 0.5)
    assert found[0]["distance"] == pytest.approx(expected, abs=1e-5)
    assert found[0]["text"] == best["text"]
    assert found[0]["occurred_at"] == best["occurred_at"]
    # The full-precision vector comes along (the read path compares candidates with it).
    assert np.allclose(found[0]["embedding"].to_numpy(), best["embedding"], atol=1e-6)


async def test_other_conversations_and_tenants_never_appear_even_when_nearer(
    db: Database,
) -> None:
    rng = np.random.default_rng(11)
    tenant, stranger = await new_tenant_id(db, "acme"), await new_tenant_id(db, "other")
    corpus = Corpus(db)
    await corpus.add(tenant, "g:1", unit(rng, 400))
    query = unit(rng, 1)[0]
    # The query itself (distance 0) in a sibling conversation and under another tenant's g:1.
    await corpus.add(tenant, "g:2", query[None, :])
    await corpus.add(stranger, "g:1", np.repeat(query[None, :], 20, axis=0))

    found = await search(db, tenant, ["g:1"], query, 10)
    assert [e["id"] for e in found] == corpus.brute_force(tenant, ["g:1"], query, 10)
    assert all(e["conversation_key"] == "g:1" and e["distance"] > 0.5 for e in found)

    both = await search(db, tenant, ["g:1", "g:2"], query, 10)
    assert both[0]["conversation_key"] == "g:2"
    assert both[0]["distance"] == pytest.approx(0.0, abs=1e-6)
    assert len(await search(db, stranger, ["g:1"], query, 50)) == 20
    assert await search(db, tenant, ["g:none"], query, 10) == []


async def test_time_range_includes_its_start_and_excludes_its_end(db: Database) -> None:
    rng = np.random.default_rng(5)
    tenant = await new_tenant_id(db, "acme")
    corpus = Corpus(db)
    await corpus.add(tenant, "g:1", unit(rng, 1500))  # one a minute from START
    time_from, time_to = START + timedelta(minutes=200), START + timedelta(minutes=900)
    for query in unit(rng, 5):
        found = await search(db, tenant, ["g:1"], query, 10, time_from=time_from, time_to=time_to)
        expected = corpus.brute_force(tenant, ["g:1"], query, 10, time_from, time_to)
        assert [e["id"] for e in found] == expected
        assert all(time_from <= e["occurred_at"] < time_to for e in found)
    # The events exactly at the bounds: the start is in, the end is out.
    at_start = next(r for r in corpus.rows if r["occurred_at"] == time_from)
    at_end = next(r for r in corpus.rows if r["occurred_at"] == time_to)
    window = {"time_from": time_from, "time_to": time_to}
    assert (await search(db, tenant, ["g:1"], at_start["embedding"], 1, **window))[0][
        "id"
    ] == at_start["id"]
    assert at_end["id"] not in {
        e["id"] for e in await search(db, tenant, ["g:1"], at_end["embedding"], 1, **window)
    }
    since = await search(db, tenant, ["g:1"], at_end["embedding"], 1, time_from=time_to)
    assert since[0]["id"] == at_end["id"]
    until = await search(db, tenant, ["g:1"], at_start["embedding"], 1000, time_to=time_from)
    assert len(until) == 200 and at_start["id"] not in {e["id"] for e in until}


async def test_limit_beyond_the_filtered_set_returns_all_of_it_in_order(db: Database) -> None:
    rng = np.random.default_rng(13)
    tenant = await new_tenant_id(db, "acme")
    corpus = Corpus(db)
    await corpus.add(tenant, "g:1", unit(rng, 30))
    await corpus.add(tenant, "g:2", unit(rng, 300))
    query = unit(rng, 1)[0]
    found = await search(db, tenant, ["g:1"], query, 100)
    assert [e["id"] for e in found] == corpus.brute_force(tenant, ["g:1"], query, 100)
    assert len(found) == 30
    assert await search(db, tenant, ["g:1"], query, 0) == []


async def test_dense_near_duplicates_are_still_ranked_exactly(db: Database) -> None:
    """Hundreds of events closer to each other than half precision can tell apart."""
    rng = np.random.default_rng(17)
    tenant = await new_tenant_id(db, "acme")
    corpus = Corpus(db)
    query, side = unit(rng, 2)
    side = side - (side @ query) * query
    side /= np.linalg.norm(side)
    # Distances 1e-5, 2e-5, … 2e-3: far apart for float32, all within half precision's error.
    distances = 1e-5 * rng.permutation(np.arange(1, 201))
    tilt = np.sqrt(1.0 / (1.0 - distances) ** 2 - 1.0)
    near = (query[None, :] + tilt[:, None] * side[None, :]).astype(np.float32)
    await corpus.add(tenant, "g:1", np.concatenate([near, unit(rng, 2000)]))
    for limit in (10, 36):
        found = await search(db, tenant, ["g:1"], query, limit)
        assert [e["id"] for e in found] == corpus.brute_force(tenant, ["g:1"], query, limit)
        assert [e["distance"] for e in found] == pytest.approx(
            [1e-5 * i for i in range(1, limit + 1)], abs=2e-6
        )


async def test_rewritten_and_unembedded_events_follow_their_latest_write(db: Database) -> None:
    rng = np.random.default_rng(19)
    tenant = await new_tenant_id(db, "acme")
    corpus = Corpus(db)
    await corpus.add(tenant, "g:1", unit(rng, 100))
    query = unit(rng, 1)[0]
    first = (await search(db, tenant, ["g:1"], query, 1))[0]["id"]
    row = next(r for r in corpus.rows if r["id"] == first)
    async with db.tenant(tenant) as session:  # a retried job: the same id, no embedding now
        await upsert_events(session, [{**row, "embedding": None}])
    assert first not in {e["id"] for e in await search(db, tenant, ["g:1"], query, 100)}
    async with db.tenant(tenant) as session:  # and again, now exactly the query
        await upsert_events(session, [{**row, "embedding": query}])
    again = await search(db, tenant, ["g:1"], query, 1)
    assert again[0]["id"] == first and again[0]["distance"] == pytest.approx(0.0, abs=1e-6)


async def test_a_write_keeps_another_turns_event_of_the_same_id(db: Database) -> None:
    # Turn ("t", 1) with two observations names its events t:1:1 and t:1:2, and turn
    # ("t:1", 1) with one names its event t:1:1 too: two such ends racing past the end
    # call's check must not give group A's event group B's words.
    rng = np.random.default_rng(23)
    tenant = await new_tenant_id(db, "acme")
    vectors = unit(rng, 2)
    first = {**event_row(tenant, "t:1:1", "g:A", START, vectors[0]), "request_id": "t"}
    other = {
        **event_row(tenant, "t:1:1", "g:B", START, vectors[1]),
        "request_id": "t:1",
        "text": "B 群的秘密",
    }

    async def stored() -> tuple[str, ...]:
        async with db.tenant(tenant) as session:
            row = await session.execute(
                text("SELECT conversation_key, request_id, text FROM events WHERE id = 't:1:1'")
            )
            return tuple(row.one())

    async with db.tenant(tenant) as session:
        await upsert_events(session, [first])
    async with db.tenant(tenant) as session:
        await upsert_events(session, [other])
    assert await stored() == ("g:A", "t", first["text"])
    found = await search(db, tenant, ["g:A"], vectors[0], 1)
    assert found[0]["id"] == "t:1:1" and found[0]["distance"] == pytest.approx(0.0, abs=1e-3)
    assert await search(db, tenant, ["g:B"], vectors[1], 1) == []
    async with db.tenant(tenant) as session:  # its own turn's retry still rewrites it
        await upsert_events(session, [{**first, "text": "A 群, 改写"}])
    assert await stored() == ("g:A", "t", "A 群, 改写")


async def test_a_zero_query_is_refused(db: Database) -> None:
    tenant = await new_tenant_id(db, "acme")
    with pytest.raises(Invalid):
        await search(db, tenant, ["g:1"], np.zeros(DIM, dtype=np.float32), 10)


async def test_vectors_too_wide_for_the_index_are_still_searched_exactly(
    databases: DatabaseFactory,
) -> None:
    """1,536 dimensions (an OpenAI model) do not fit a B-tree entry; the search still works."""
    url = await databases.create_empty()
    wide = Settings(models={"embedding": {"dimensions": 1536}})
    await asyncio.to_thread(upgrade_to_head, url, wide)
    db = Database(url, pool_size=2)
    try:
        rng = np.random.default_rng(23)
        async with db.system() as session:
            tenant = (await create_tenant(session, "wide", {}, wide))[0].id
        corpus = Corpus(db)
        vectors = rng.standard_normal((600, 1536)).astype(np.float32)
        await corpus.add(tenant, "g:1", vectors)
        await corpus.add(tenant, "g:2", vectors[:50])
        for query in rng.standard_normal((3, 1536)).astype(np.float32):
            found = await search(db, tenant, ["g:1"], query, 10)
            assert [e["id"] for e in found] == corpus.brute_force(tenant, ["g:1"], query, 10)
    finally:
        await db.dispose()


async def test_lexical_search_skips_common_terms_only_where_matches_would_be_too_many(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(23)
    tenant, other = await new_tenant_id(db, "acme"), await new_tenant_id(db, "other")
    rows = [
        {**event_row(tenant, f"e{n}", "g:1", START + timedelta(hours=n), v), "text": text}
        for n, (v, text) in enumerate(
            zip(
                unit(rng, 300),
                ["张三的猫阿福打翻了鱼缸"] + [f"大家在西湖边散步，第{n}次" for n in range(299)],
                strict=True,
            )
        )
    ]
    async with db.tenant(tenant) as session:
        await upsert_events(session, rows)
    async with db.tenant(other) as session:
        await upsert_events(session, [{**rows[0], "tenant_id": other}])
    async with db.system() as session:
        await session.execute(text("ANALYZE events"))
    monkeypatch.setattr(events_repository, "_common", (-math.inf, frozenset()))
    async with db.tenant(tenant) as session:
        common = await events_repository.common_terms(session)
        assert {"西湖", "散步"} <= common and "阿福" not in common and "鱼缸" not in common
        # 300 events: every match can be scored, so the common term still counts.
        found = await events_repository.lexical_events(
            session, tenant, ["g:1"], ["阿福", "西湖"], 5, common=common
        )
        monkeypatch.setattr(events_repository, "MAX_LEXICAL_MATCHES", 100)
        busy = await events_repository.lexical_events(
            session, tenant, ["g:1"], ["阿福", "西湖"], 5, common=common
        )
    # "阿福" is inside an unsegmented sentence; the other tenant's copy never shows up.
    assert [r["id"] for r in found][:1] == ["e0"]
    assert len(found) == 5 and found[0]["bm25"] > found[-1]["bm25"] > 0
    assert all(r["conversation_key"] == "g:1" for r in found)
    assert np.allclose(found[0]["embedding"].to_numpy(), rows[0]["embedding"], atol=1e-6)
    # Too many events to score every match: only the informative term is asked for.
    assert [r["id"] for r in busy] == ["e0"]


async def test_a_name_asked_in_a_big_group_is_found_however_many_events_hold_its_other_words(
    db: Database,
) -> None:
    """A badminton group of 3,200 events, 3,000 of them badminton lines, and three where
    王芳 talks about badminton: the oldest, one in the middle, the newest. Asked "王芳 羽毛球",
    the lexical side finds her three first: each asked term is looked up on its own, a
    frequent one's matches sampled, so the matches of "羽毛球" (an ordinary word in a table
    of a million events, not a common one) cannot fill the look-up and leave hers out. (One
    look-up of all the terms took the first 2,000 matches it met, in whatever order its plan
    read them: by time or as stored, one of her three was never among them.)"""
    rng = np.random.default_rng(47)
    tenant = await new_tenant_id(db, "badminton")
    key = "g:羽毛球%:1"
    texts = [f"第{n}次羽毛球，打得{'好累' if n % 2 else '开心'}" for n in range(3000)]
    texts += [f"周末去西湖散步，第{n}次" for n in range(197)]
    hers = {0: "王芳说羽毛球拍坏了", 1600: "王芳问谁有羽毛球", 3199: "王芳下周六约大家打羽毛球"}
    for n, line in sorted(hers.items()):
        texts.insert(n, line)
    rows = [
        {**event_row(tenant, f"{key}#{n}", key, START + timedelta(minutes=n), v), "text": t}
        for n, (v, t) in enumerate(zip(unit(rng, len(texts)), texts, strict=True))
    ]
    async with db.tenant(tenant) as session:
        for start in range(0, len(rows), 500):
            await upsert_events(session, rows[start : start + 500])
    async with db.system() as session:
        await session.execute(text("ANALYZE events"))  # as a big table is, at rest
    asked = query_terms("王芳 羽毛球")
    assert {"王芳", "羽毛", "毛球"} <= set(asked)
    # A model's query of many words: still a look-up a term, and hers first.
    wordy = query_terms("王芳 羽毛球 " + " ".join(f"地点{n}" for n in range(40)))
    assert len(wordy) > 30
    expected = {f"{key}#{n}" for n in hers}
    for words in (asked, wordy):
        async with db.tenant(tenant) as session:
            found = await events_repository.lexical_events(
                session, tenant, [key], words, 10, common=frozenset()
            )
        assert {r["id"] for r in found[:3]} == expected
        assert found[2]["bm25"] > found[3]["bm25"]


def textbook_bm25(
    stored: dict[str, list[str]], asked: list[str], documents: int
) -> dict[str, tuple[float, dict[str, float]]]:
    """BM25 of the events holding an asked term (``stored``: each event's terms), as the
    lexical side defines it: idf over the matches among ``documents`` events, lengths in
    distinct terms normalized by their mean over the (event, term) hits, a term's frequency
    as stored (at most 256 positions)."""
    held = {}
    for event_id, found in stored.items():
        counts = Counter(t for t in found if t in asked)
        if counts:
            held[event_id] = ({t: min(c, 256) for t, c in counts.items()}, len(set(found)))
    if not held:
        return {}
    hits = [length for counts, length in held.values() for _ in counts]
    mean_length = max(sum(hits) / len(hits), 1.0)
    df = Counter(t for counts, _ in held.values() for t in counts)
    idf = {
        t: math.log(1 + (documents - min(n, documents) + 0.5) / (min(n, documents) + 0.5))
        for t, n in df.items()
    }
    return {
        event_id: (
            sum(
                idf[t] * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * length / mean_length))
                for t, tf in counts.items()
            ),
            {t: idf[t] for t in counts},
        )
        for event_id, (counts, length) in held.items()
    }


async def test_lexical_scores_are_textbook_bm25_of_the_stored_terms_through_either_branch(
    db: Database,
) -> None:
    """A group too big for its matches to be read row by row (through the GIN index and the
    tenant-bound look-up) and a small one (row by row) score the same way: BM25 of the terms
    stored with each event, repeats capped as stored (a line of 300 "阿福"), ids and texts of
    colons, percent signs and quotes; another tenant's copy of the group changes nothing."""
    rng = np.random.default_rng(41)
    tenant, other = await new_tenant_id(db, "bm25"), await new_tenant_id(db, "copycat")
    common = ["西湖", "散步", "猫粮", "划船"]
    rare = ["鱼缸", "tesla", "x1:2", "it's", "50%", "a\\b"]

    def line(n: int) -> str:
        if n % 97 == 0:
            return "阿福" * 300 + " 打翻了鱼缸"
        picked = [common[k] for k in rng.choice(4, size=int(rng.integers(1, 4)), replace=False)]
        if rng.random() < 0.06:
            picked += [rare[k] for k in rng.choice(6, size=int(rng.integers(1, 3)), replace=False)]
        return f"第{n}条：" + "，".join(picked) + f"；杂项{'甲乙丙丁戊己庚辛壬癸子丑寅'[n % 13]}"

    groups = {"g:big%:'x": 2400, "g:small": 300}
    texts: dict[str, dict[str, str]] = {}
    for key, size in groups.items():
        rows = [
            {
                **event_row(tenant, f"{key}/{n}", key, START + timedelta(minutes=n), v),
                "text": line(n),
            }
            for n, v in enumerate(unit(rng, size))
        ]
        texts[key] = {r["id"]: r["text"] for r in rows}
        for owner in (tenant, other):
            async with db.tenant(owner) as session:
                for start in range(0, size, 500):
                    chunk = rows[start : start + 500]
                    await upsert_events(session, [{**r, "tenant_id": owner} for r in chunk])
    asked = query_terms("阿福的鱼缸 tesla x1:2 it's 50% a\\b")
    assert {"阿福", "鱼缸", "tesla", "x1", "50"} <= set(asked)
    for key, size in groups.items():
        async with db.tenant(tenant) as session:
            found = await events_repository.lexical_events(session, tenant, [key], asked, 60)
        expected = textbook_bm25({i: terms(t) for i, t in texts[key].items()}, asked, size)
        best = sorted(expected, key=lambda i: (-expected[i][0], i))[:60]
        assert [r["id"] for r in found] == best, key
        for row in found:
            score, idfs = expected[row["id"]]
            assert row["bm25"] == pytest.approx(score, rel=1e-9)
            assert dict(zip(row["terms"], row["idfs"], strict=True)) == pytest.approx(idfs)
        assert 20 < len(expected) < events_repository.MAX_LEXICAL_MATCHES
        # Every match is read: no asked term holds more than its share of the look-up.
        held = Counter(t for i in texts[key] for t in set(terms(texts[key][i])) if t in asked)
        assert max(held.values()) <= term_sample(
            events_repository.MAX_LEXICAL_MATCHES, len(set(asked))
        )


async def test_months_of_lexical_searches_in_a_busy_group_score_as_textbook_bm25(
    db: Database,
) -> None:
    """Four months of a busy group (4,000 events, an id and key of %, :, / and ..), then 1,000
    lexical searches such as a model's tool calls make: words and junk of every kind, repeats,
    words no event holds, with and without a time range (which moves a search between the
    row-by-row reading and the GIN look-up). Each one's scores, order and idfs are BM25 of the
    stored terms over its range; another tenant's copy of the group never counts."""
    rng = np.random.default_rng(43)
    tenant, other = await new_tenant_id(db, "months"), await new_tenant_id(db, "twin")
    key, size = "g:..%2F:x/1", 4000
    frequent = ["今天", "天气", "大家", "吃饭", "上班", "hello", "meeting"]
    rare = [f"{w}{n}" for w in ("地点", "room", "活动", "x:") for n in range(10)]
    rare += ["it's", "50%", "a\\b", "' OR 1=1 --", "%_%", "阿福"]

    def line(n: int) -> str:
        words = [frequent[k] for k in rng.choice(len(frequent), size=3)]
        if rng.random() < 0.25:
            words.append(rare[int(rng.integers(len(rare)))])
        return f"第{n}条 " + " ".join(words)

    minutes = 120 * 24 * 60 / size
    rows = [
        {
            **event_row(tenant, f"{key}#{n}", key, START + timedelta(minutes=n * minutes), v),
            "text": line(n),
        }
        for n, v in enumerate(unit(rng, size))
    ]
    for owner in (tenant, other):
        async with db.tenant(owner) as session:
            for start in range(0, size, 500):
                chunk = rows[start : start + 500]
                await upsert_events(session, [{**r, "tenant_id": owner} for r in chunk])
    stored = {r["id"]: terms(r["text"]) for r in rows}
    common = frozenset(t for w in frequent for t in terms(w))
    junk = ["", "   ", "%", "/", "..", "\\", "'", "🙂", "x" * 300]
    for n in range(1000):
        words = [
            str(rng.choice(rare + frequent + junk + ["没人说过", "nobody"]))
            for _ in range(int(rng.integers(1, 12)))
        ]
        asked = query_terms(" ".join(words))
        time_from = time_to = None
        if n % 2:
            start_day = int(rng.integers(0, 100))
            time_from = START + timedelta(days=start_day)
            time_to = time_from + timedelta(days=int(rng.integers(1, 120 - start_day + 1)))
        async with db.tenant(tenant) as session:
            found = await events_repository.lexical_events(
                session, tenant, [key], asked, 20, time_from, time_to, common=common
            )
        in_range = {
            r["id"]: stored[r["id"]]
            for r in rows
            if (time_from is None or r["occurred_at"] >= time_from)
            and (time_to is None or r["occurred_at"] < time_to)
        }
        documents = min(len(in_range), events_repository.MAX_COUNTED_DOCUMENTS)
        scored = (
            asked
            if len(in_range) < events_repository.MAX_LEXICAL_MATCHES
            else [t for t in asked if t not in common]
        )
        expected = textbook_bm25(in_range, scored, documents)
        assert len(found) == min(20, len(expected)), (words, time_from, time_to)
        best = sorted((score for score, _ in expected.values()), reverse=True)[: len(found)]
        assert [r["bm25"] for r in found] == pytest.approx(best, rel=1e-9)
        for row in found:
            score, idfs = expected[row["id"]]
            assert row["bm25"] == pytest.approx(score, rel=1e-9)
            assert dict(zip(row["terms"], row["idfs"], strict=True)) == pytest.approx(idfs)


def near(query: np.ndarray, cosine: float, rng: np.random.Generator) -> np.ndarray:
    """A unit vector at exactly ``cosine`` from the unit ``query``."""
    other = rng.standard_normal(DIM)
    other -= (other @ query) * query
    other /= np.linalg.norm(other)
    return (cosine * query + math.sqrt(1.0 - cosine**2) * other).astype(np.float32)


async def test_neighbour_events_are_the_ones_told_around_it_in_its_conversation(
    db: Database,
) -> None:
    rng = np.random.default_rng(31)
    tenant = await new_tenant_id(db, "acme")
    corpus = Corpus(db)
    await corpus.add(tenant, "g:1", unit(rng, 10))  # g:1-0 … g:1-9, a minute apart
    await corpus.add(tenant, "g:2", unit(rng, 10))
    # Two events told at the same minute: the order they were written in decides.
    same = START + timedelta(minutes=5)
    await corpus.add(tenant, "g:3", unit(rng, 3), when=same)
    query = unit(rng, 1)[0]
    async with db.tenant(tenant) as session:
        around = await events_repository.neighbour_events(session, tenant, ["g:1-5"], query, 2)
        clipped = await events_repository.neighbour_events(
            session, tenant, ["g:1-5", "g:1-0"], query, 2, time_to=START + timedelta(minutes=6)
        )
        tied = await events_repository.neighbour_events(session, tenant, ["g:3-21"], query, 1)
        many = await events_repository.neighbour_events(
            session, tenant, [f"g:1-{n}" for n in range(10)], query, 3
        )
    assert sorted(r["id"] for r in around) == ["g:1-3", "g:1-4", "g:1-6", "g:1-7"]
    expected = {r["id"]: 1.0 - float(r["embedding"] @ query) for r in corpus.rows}
    for row in around:
        assert 1.0 - row["similarity"] == pytest.approx(expected[row["id"]], abs=1e-5)
    # The time range holds for neighbours too; each event comes once.
    assert sorted(r["id"] for r in clipped) == ["g:1-1", "g:1-2", "g:1-3", "g:1-4"]
    assert sorted(r["id"] for r in tied) == ["g:3-20", "g:3-22"]
    assert len(many) == len({r["id"] for r in many}) == 10


async def test_neighbours_carry_the_asked_terms_they_hold_as_the_ranking_would_count_them(
    db: Database,
) -> None:
    """The window's term counts come from the stored terms of each neighbour, not from
    segmenting a thousand texts again per query: the same counts, repeats included."""
    rng = np.random.default_rng(32)
    tenant = await new_tenant_id(db, "terms")
    texts = [
        "张三(10001) 在杭州西湖划船，西湖很美",
        "Caroline painted a sunset; painting calms her",
        "李四买了猫粮",
        "nothing asked here",
        "西湖边的 painting class",
    ]
    rows = [
        {**event_row(tenant, f"t-{n}", "g:t", START + timedelta(minutes=n), v), "text": t}
        for n, (t, v) in enumerate(zip(texts, unit(rng, len(texts)), strict=True))
    ]
    async with db.tenant(tenant) as session:
        await upsert_events(session, rows)
    asked = query_terms("西湖 painting 猫粮")
    async with db.tenant(tenant) as session:
        around = await events_repository.neighbour_events(
            session, tenant, ["t-2"], unit(rng, 1)[0], 2, terms=asked
        )
    assert sorted(r["id"] for r in around) == ["t-0", "t-1", "t-3", "t-4"]
    for row in around:
        counted = dict(zip(row["hit_terms"] or [], row["hit_counts"] or [], strict=True))
        expected = Counter(t for t in terms(row["text"]) if t in asked)
        assert counted == expected, row["text"]
    assert dict(zip(around[0]["hit_terms"], around[0]["hit_counts"], strict=True))["西湖"] == 2


def chat_rows(
    tenant: uuid.UUID,
    lines: list[tuple[str, str, float]],
    query: np.ndarray,
    rng: np.random.Generator,
) -> list[dict[str, Any]]:
    """Events of a chat in group g:1, a minute apart: (sender, text, cosine to ``query``)."""
    return [
        {
            **event_row(tenant, f"e{n}", "g:1", START + timedelta(minutes=n), near(query, c, rng)),
            "sender_id": sender,
            "text": text,
        }
        for n, (sender, text, c) in enumerate(lines)
    ]


async def boat_trip_ranked(
    db: Database, tenant: uuid.UUID, rows: list[dict[str, Any]], query: np.ndarray
) -> list[Any]:
    """The events stored, then what the event search shows for "西湖划船" (top 10, no decay)."""
    from service.recall.ranking import EventQuery, lexical_candidates, rank_events
    from service.settings import QuerySettings

    async with db.tenant(tenant) as session:
        await upsert_events(session, rows)
        q = QuerySettings(time_decay_enabled=False)
        search = EventQuery("西湖划船", ["g:1"], 10, 60.0)
        lexical = await lexical_candidates(session, tenant, search, q)
        return await rank_events(session, tenant, search, query, lexical, q, START)


async def test_an_answer_event_is_found_through_the_turn_it_answers(db: Database) -> None:
    """Events of a two-person chat: the short answer right after the turn that names the
    topic ranks above an unrelated event as close in meaning, through its neighbour."""
    rng = np.random.default_rng(37)
    tenant = await new_tenant_id(db, "acme")
    query = unit(rng, 1)[0]
    lines = [
        ("alice", "今天上班好累", 0.80),
        ("bob", "早点休息吧", 0.80),
        ("alice", "我们下周去杭州西湖划船吧", 0.90),
        ("bob", "好呀，我来订船", 0.84),  # the answer: no query word of its own
        ("alice", "那就说定了", 0.80),
        ("bob", "晚饭吃什么", 0.80),
        ("alice", "随便吃点面条", 0.80),
        ("bob", "楼下新开了一家店", 0.84),  # as close in meaning, about something else
        ("alice", "明天再说", 0.80),
        ("bob", "好的", 0.80),
    ]
    ranked = await boat_trip_ranked(db, tenant, chat_rows(tenant, lines, query, rng), query)
    order = [e.row["id"] for e in ranked]
    assert order[0] == "e2"
    assert order.index("e3") < order.index("e7")
    assert len(order) == len(set(order)) == 10


async def test_a_reply_neither_side_finds_is_ranked_through_the_turn_it_answers(
    db: Database,
) -> None:
    """A two-person chat in one sitting: the reply right after the turn that names the topic
    holds no query word and is farther in meaning than forty other events, so neither the
    dense nor the lexical side brings it, yet it is shown, whole, above all forty: the events
    next to a candidate are ranked too. Events of another sitting are not."""
    rng = np.random.default_rng(41)
    tenant = await new_tenant_id(db, "acme")
    query = unit(rng, 1)[0]
    lines = [(f"今天吃什么好呢，第{n}顿", 0.5) for n in range(150)]
    for n in range(0, 120, 3):
        lines[n] = (f"周末一起去看第{n}部电影吗", 0.78)  # closer in meaning than the reply
    lines[130] = ("我们下周去杭州西湖划船吧", 0.9)
    lines[131] = ("好呀，我来安排", 0.75)  # the answer: no query word of its own
    rows = chat_rows(
        tenant,
        [(("alice", "bob")[n % 2], text, c) for n, (text, c) in enumerate(lines)],
        query,
        rng,
    )
    # The same reply a day later, after an unrelated turn: another sitting.
    later = START + timedelta(days=1)
    rows += [
        {
            **event_row(tenant, "late-turn", "g:1", later, near(query, 0.5, rng)),
            "text": "今天吃什么好呢",
        },
        {
            **event_row(
                tenant, "late-reply", "g:1", later + timedelta(hours=2), near(query, 0.75, rng)
            ),
            "text": "好呀，我来安排",
        },
    ]
    ranked = await boat_trip_ranked(db, tenant, rows, query)
    order = [e.row["id"] for e in ranked]
    assert order[0] == "e130"
    assert "e131" in order
    assert order.index("e131") < min(
        order.index(f"e{n}") for n in range(0, 120, 3) if f"e{n}" in order
    )
    assert "late-reply" not in order
    reply = ranked[order.index("e131")].row
    assert reply.keys() == ranked[0].row.keys() and reply["text"] == "好呀，我来安排"


async def test_a_senders_nearest_events_are_theirs_alone_exact_among_their_latest(
    db: Database,
) -> None:
    """``nearest_told_by``: one sender's events nearest to the query, exactly, in their group
    only: never a look-alike id's (``u_1`` against ``u%``), another group's or another
    tenant's, however near; among their ``recent`` latest; under the time bounds."""
    rng = np.random.default_rng(43)
    tenant, other = await new_tenant_id(db, "acme"), await new_tenant_id(db, "rival")
    key, asker = "g:a%:/b", "u%"
    query = unit(rng, 1)[0]
    rows = []
    for n in range(900):
        sender = (asker, "u_1", "u:1/..%2F")[n % 3]
        at = START + timedelta(hours=n)
        cosine = 0.95 if sender != asker else float(rng.uniform(0.1, 0.8))
        rows.append(
            {**event_row(tenant, f"e{n}", key, at, near(query, cosine, rng)), "sender_id": sender}
        )
    # The asker in another group, and another tenant's group of the same id: nearer still.
    for n, (owner, where) in enumerate(((tenant, "g:a%:/c"), (other, key))):
        rows.append(
            {**event_row(owner, f"x{n}", where, START, near(query, 0.99, rng)), "sender_id": asker}
        )
    for owner in (tenant, other):
        async with db.tenant(owner) as session:
            await upsert_events(session, [r for r in rows if r["tenant_id"] == owner])

    def expected(chosen: list[dict[str, Any]], limit: int) -> list[str]:
        distances = [1.0 - float(r["embedding"] @ query) for r in chosen]
        order = sorted(range(len(chosen)), key=lambda i: (distances[i], chosen[i]["id"]))
        return [chosen[i]["id"] for i in order[:limit]]

    mine = [r for r in rows if r["tenant_id"] == tenant and r["conversation_key"] == key]
    mine = [r for r in mine if r["sender_id"] == asker]

    async def told(**kw: Any) -> list[dict[str, Any]]:
        async with db.tenant(tenant) as session:
            return await events_repository.nearest_told_by(
                session, tenant, [key], asker, query, kw.pop("limit", 5), **kw
            )

    found = await told()
    assert [r["id"] for r in found] == expected(mine, 5)
    assert all(r["sender_id"] == asker and r["conversation_key"] == key for r in found)
    for row in found:  # the distance as the dense side gives it, with the whole row
        truth = next(r for r in mine if r["id"] == row["id"])
        assert row["distance"] == pytest.approx(1.0 - float(truth["embedding"] @ query), abs=1e-5)
        assert row["text"] == truth["text"] and row["embedding"] is not None
    latest = sorted(mine, key=lambda r: r["occurred_at"])[-100:]
    assert [r["id"] for r in await told(recent=100)] == expected(latest, 5)
    since = START + timedelta(days=20)
    bounded = [r for r in mine if r["occurred_at"] >= since]
    assert [r["id"] for r in await told(time_from=since, limit=50)] == expected(bounded, 50)
    async with db.tenant(tenant) as session:
        for nobody in ("u", "%", "u_", "U%"):
            assert (
                await events_repository.nearest_told_by(session, tenant, [key], nobody, query, 5)
                == []
            )


async def test_in_a_group_of_a_hundred_members_the_askers_own_news_is_in_their_turn(
    db: Database,
) -> None:
    """A hundred members each told the group alike news (nearer the question than the
    asker's own) with none of the question's words: a turn's 3 events come from the nearest
    9, all others'. The asker's own news is a candidate too, and shown, when they ask;
    another member asking gets the group's nearest, not the asker's."""
    from service.recall.ranking import EventQuery, lexical_candidates, rank_events
    from service.settings import QuerySettings

    rng = np.random.default_rng(47)
    tenant = await new_tenant_id(db, "acme")
    query = unit(rng, 1)[0]
    rows = []
    for n in range(300):
        member = f"m{n % 100}"
        cosine = 0.7 if member == "m42" else float(rng.uniform(0.72, 0.85))
        rows.append(
            {
                **event_row(
                    tenant, f"e{n}", "g:1", START + timedelta(hours=n), near(query, cosine, rng)
                ),
                "sender_id": member,
                "text": f"{member} 报名了第{n}场",
            }
        )
    async with db.tenant(tenant) as session:
        await upsert_events(session, rows)

    async def turn(asker: str | None) -> list[str]:
        q = QuerySettings(time_decay_enabled=False)
        search = EventQuery("周末去哪玩", ["g:1"], 3, 60.0, asker=asker)
        async with db.tenant(tenant) as session:
            lexical = await lexical_candidates(session, tenant, search, q)
            ranked = await rank_events(session, tenant, search, query, lexical, q, START)
        return [e.row["sender_id"] for e in ranked]

    assert "m42" in await turn("m42")
    assert (await turn("m42"))[0] == "m42"
    assert "m42" not in await turn(None)
    assert "m42" not in await turn("m7")


async def test_a_chatty_members_months_are_read_only_as_far_as_their_latest(
    db: Database,
) -> None:
    """Four months of a busy group, one member telling 1,500 of its 9,000 events: their
    nearest are chosen among their latest ``SENDER_RECENT``, found through the sender's
    index (the others' 7,500 events are not read) and only those scored, and equal brute
    force over them."""
    rng = np.random.default_rng(53)
    tenant = await new_tenant_id(db, "acme")
    query = unit(rng, 1)[0]
    vectors = unit(rng, 9000)
    rows = [
        {
            **event_row(tenant, f"e{n}", "g:1", START + timedelta(minutes=20 * n), vectors[n]),
            "sender_id": "chatty" if n % 6 == 0 else f"m{n % 97}",
        }
        for n in range(9000)
    ]
    async with db.tenant(tenant) as session:
        for start in range(0, len(rows), 1000):
            await upsert_events(session, rows[start : start + 1000])
    async with db.system() as session:
        await session.execute(text("ANALYZE events"))
    recent = events_repository.SENDER_RECENT
    latest = [r for r in rows if r["sender_id"] == "chatty"][-recent:]
    distances = np.array([1.0 - float(r["embedding"] @ query) for r in latest])
    expected = [latest[i]["id"] for i in np.argsort(distances, kind="stable")[:9]]
    params = {
        "tenant_id": tenant,
        "conversation_keys": ["g:1"],
        "sender": "chatty",
        "query": query,
        "limit": 9,
        "recent": recent,
    }
    statement = events_repository._told_by(False, False)
    async with db.tenant(tenant) as session:
        found = await events_repository.nearest_told_by(
            session, tenant, ["g:1"], "chatty", query, 9
        )
        plan = (
            await session.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + statement.text), params)
        ).scalar_one()
    assert [r["id"] for r in found] == expected

    def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node] + [n for child in node.get("Plans", []) for n in nodes(child)]

    every = nodes(plan[0]["Plan"])
    # Found through the sender's index alone (an index scan newest first, or a bitmap of
    # theirs), never by reading the group.
    assert {n["Index Name"] for n in every if "Index Name" in n} == {
        "ix_events_sender_time",
        "pk_events",
    }, every
    assert not [n for n in every if n["Node Type"] == "Seq Scan"], every
    read = [n for n in every if n.get("Relation Name") == "events"]
    assert sum(n["Actual Rows"] * n.get("Actual Loops", 1) for n in read) <= 1500 + 9, read
    # Only the latest are scored: the distances are computed over at most SENDER_RECENT.
    limits = [n for n in every if n["Node Type"] == "Limit"]
    assert max(n["Actual Rows"] for n in limits) == recent, limits


async def test_an_events_vector_is_read_from_its_row_and_a_long_text_still_whole(
    db: Database,
) -> None:
    """An event's vector stays in its row (a 2.7 kB row is over PostgreSQL's 2 kB bar, at
    which pgvector's vectors went to the TOAST table): reading a neighbour's similarity is
    then one row read, not a TOAST look-up as well. Only a text too long for a page is moved
    out, and reads back whole. Rows rewritten later (a re-embedding) stay whole too."""
    rng = np.random.default_rng(59)
    tenant = await new_tenant_id(db, "acme")
    vectors = unit(rng, 600)
    rows = [
        {
            **event_row(tenant, f"e{n}", "g:1", START + timedelta(minutes=n), vectors[n]),
            # An ordinary event's text and terms: the row is about 2.5 kB with its vector.
            "text": f"张三{n}说周末要去西湖边划船，顺便去看看断桥和雷峰塔，晚上吃杭帮菜" * 3,
        }
        for n in range(600)
    ]
    # A text that cannot fit a page, nor compress to fit one (random characters).
    long_text = "".join(chr(0x4E00 + int(c)) for c in rng.integers(0, 20000, 30_000))
    rows[300]["text"] = long_text
    async with db.tenant(tenant) as session:
        await upsert_events(session, rows)
        await upsert_events(session, [{**r, "embedding": -r["embedding"]} for r in rows[:100]])
    async with db.system() as session:
        toast = (
            await session.execute(
                text(
                    "SELECT reltoastrelid::regclass::text FROM pg_class"
                    " WHERE oid = 'events'::regclass"
                )
            )
        ).scalar_one()
        moved = (
            await session.execute(text(f"SELECT count(DISTINCT chunk_id) FROM {toast}"))
        ).scalar_one()
    assert moved == 2  # the long text and its terms, alone

    query = unit(rng, 1)[0]
    ids = [f"e{n}" for n in range(0, 600, 20)]
    params = {
        "tenant_id": tenant,
        "ids": ids,
        "query": query,
        "reach": 6,
        "terms": [],
        "tsquery": "",
    }
    statement = events_repository._neighbours(False, False, False)
    async with db.tenant(tenant) as session:
        found = await events_repository.neighbour_events(session, tenant, ids, query, 6)
        plan = (
            await session.execute(
                text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement.text), params
            )
        ).scalar_one()
        whole = await events_repository.events_by_ids(session, tenant, ["e300", "e0"])
    assert whole["e300"]["text"] == long_text
    assert np.allclose(whole["e0"]["embedding"].to_numpy(), -vectors[0], atol=1e-6)
    expected = {f"e{n}": float(v @ query) for n, v in enumerate(vectors)}
    expected.update({f"e{n}": -expected[f"e{n}"] for n in range(100)})
    assert len(found) == 30 * 12 - 6  # the first candidate has none before it
    for row in found:
        assert row["similarity"] == pytest.approx(expected[row["id"]], abs=1e-5)
    # About two buffers a neighbour (its index entry's page, its row's page); through TOAST
    # it was five or more (the TOAST index's levels and its chunk's page as well).
    top = plan[0]["Plan"]
    touched = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
    assert touched <= 3 * len(found), touched


async def test_a_floods_copies_leave_the_scan_on_upgrade_and_stay_out_of_a_rebuild(
    databases: DatabaseFactory,
) -> None:
    """A database of revision 0020 kept every copy of a flood in the nearest events' scan.
    The upgrade takes out the copies (words unindexed although they have some); an event
    without words ("👍") stays searched by meaning, as every indexed one. A rebuild of the
    scan (after a re-embedding) leaves the copies out again; the downgrade puts them back."""
    from alembic import command

    from service.db.migrate import alembic_config
    from service.events import vectors

    url = await databases.create_empty()
    settings = Settings()
    config = alembic_config(url, settings)
    await asyncio.to_thread(command.upgrade, config, "0020_event_term_rows")
    db = Database(url, pool_size=2)
    try:
        rng = np.random.default_rng(7)
        async with db.system() as session:
            tenant = (await create_tenant(session, "old", {}, settings))[0].id
        said = {"kept": "王芳明天去杭州出差", "copy:1/%": "王芳 买车找我", "thumb": "👍"}
        rows = [
            {**event_row(tenant, key, "g:1", START, vector), "text": body}
            for (key, body), vector in zip(said.items(), unit(rng, 3), strict=True)
        ]
        rows[1]["lexical"] = ""  # as the old flood rule left a copy: in the scan still
        async with db.tenant(tenant) as session:
            await upsert_events(session, rows)

        scanned = text("SELECT event_id FROM event_vectors ORDER BY event_id")

        async def in_scan() -> list[str]:
            async with db.system() as session:
                return list((await session.execute(scanned)).scalars())

        assert await in_scan() == ["copy:1/%", "kept", "thumb"]
        await asyncio.to_thread(command.upgrade, config, "head")
        # The upgrade widens event_vectors.event_id: statements prepared before are stale.
        await db.engine.dispose()
        assert await in_scan() == ["kept", "thumb"]
        async with db.system() as session:
            await vectors.rebuild(session, DIM)
        assert await in_scan() == ["kept", "thumb"]
        async with db.system() as session:
            kept = text("SELECT count(embedding) FROM events")
            assert (await session.execute(kept)).scalar_one() == 3
        await asyncio.to_thread(command.downgrade, config, "0020_event_term_rows")
        await db.engine.dispose()
        assert await in_scan() == ["copy:1/%", "kept", "thumb"]
    finally:
        await db.dispose()
