"""The read path's faster query shapes find exactly what the plain ones found: the lexical
matches of a small conversation, the archive's nearest messages, the context's reads."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from sqlalchemy import event, text

from service.db import statistics, vector_index
from service.db.engine import Database, settled
from service.embedding.base import Calibration
from service.events import repository as events_repository
from service.messages import repository as messages_repository
from service.messages import search as archive
from service.messages.repository import SAMPLED_MATCHES
from service.messages.schemas import MessageSearch
from service.messages.search import SEARCH_PLAN
from service.retrieval.floods import shape
from service.retrieval.terms import (
    MAX_QUERY_TERMS,
    query_terms,
    term_sample,
    terms,
    to_tsvector_literal,
)
from service.settings import Settings
from service.tenants.service import create_tenant, tenant_context
from tests.test_event_search import event_row, unit

START = datetime(2026, 1, 1, tzinfo=UTC)
PLACES = ("西湖边", "电影院", "体育馆", "图书馆", "火锅店", "公园里")
DOINGS = ("划船", "看电影", "打羽毛球", "看书", "吃火锅", "散步")
QUERIES = ("上次在西湖边划船怎么样", "谁想去打羽毛球", "我们去吃火锅吧", "看书", "阿福")


def line(rng: np.random.Generator, n: int) -> str:
    place, doing = PLACES[rng.integers(len(PLACES))], DOINGS[rng.integers(len(DOINGS))]
    return f"我们在{place}{doing}，第{n % 13}次了" if n % 50 else "张三的猫阿福打翻了鱼缸"


def varied(text: str, n: int) -> str:
    """The ``n``-th copy of a spammer's ``text``, varied as spammers vary copies to pass for
    new text: digits, emoji, punctuation, spacing, zero-width and full-width characters."""
    return (
        text,
        f"{text}【{n}】",
        text.replace(" ", "\u3000") + "！" * (n % 3 + 1),
        f"{text} 😀{n}",
        f"{text[:1]}\u200b{text[1:]}",
        f"{n:,} {text}!!",
        f"{text}（{str(n).translate(str.maketrans('0123456789', '０１２３４５６７８９'))}）",
    )[n % 7]


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    database = Database(db_url, pool_size=4)
    yield database
    await database.dispose()


class FixedModel:
    """A model that answers every question with one vector (after ``delay`` seconds)."""

    calibration = Calibration()

    def __init__(self, vector: np.ndarray, delay: float = 0.0) -> None:
        self.vector, self.delay = vector, delay

    async def query(self, question: str) -> np.ndarray:
        if self.delay:
            await asyncio.sleep(self.delay)
        return self.vector


async def new_tenant_id(db: Database, name: str) -> uuid.UUID:
    async with db.system() as session:
        tenant, _ = await create_tenant(session, name, {}, Settings())
    return tenant.id


async def test_a_small_conversation_matches_the_same_events_without_the_gin_index(
    db: Database,
) -> None:
    rng = np.random.default_rng(3)
    tenant = await new_tenant_id(db, "lexical-events")
    rows = []
    for key, size in (("g:small", 400), ("g:big", 3000)):
        vectors = unit(rng, size)
        rows += [
            {
                **event_row(tenant, f"{key}-{n}", key, START + timedelta(minutes=n), vectors[n]),
                "text": line(rng, n),
            }
            for n in range(size)
        ]
    async with db.tenant(tenant) as session:
        for start in range(0, len(rows), 500):
            await events_repository.upsert_events(session, rows[start : start + 500])
    async with db.system() as session:
        await session.execute(text("ANALYZE events"))
    for query in QUERIES:
        words = query_terms(query)
        for keys, bounds in (
            (["g:small"], {}),
            (["g:small"], {"time_from": START + timedelta(minutes=100)}),
            (["g:small", "g:big"], {}),
        ):
            async with db.tenant(tenant) as session:
                direct = await events_repository.lexical_events(
                    session, tenant, keys, words, 24, **bounds
                )
                indexed = await events_repository.lexical_events(
                    session, tenant, keys, words, 24, direct_below=0, **bounds
                )
                # A word said twice in the question is one term, each way.
                repeated = await events_repository.lexical_events(
                    session, tenant, keys, words + words, 24, **bounds
                )
            assert direct, query
            scored = [(r["id"], r["bm25"]) for r in direct]
            assert scored == [(r["id"], r["bm25"]) for r in indexed]
            assert scored == [(r["id"], r["bm25"]) for r in repeated]


async def store_messages(
    db: Database,
    tenant: uuid.UUID,
    key: str,
    texts: list[str],
    vectors: np.ndarray,
    every: timedelta = timedelta(minutes=1),
    senders: list[str] | None = None,
    times: list[datetime] | None = None,
) -> None:
    """Messages of one conversation, ``every`` apart (or at ``times``), embedded, as ingest
    and the embedding job leave them; message n from sender n % 5 unless ``senders`` says."""
    who = senders or [str(n % 5) for n in range(len(texts))]
    rows = [
        {
            "conversation_key": key,
            "message_id": f"m{n}",
            "request_type": "group",
            "group_id": key[2:],
            "user_id": None,
            "sender_id": who[n],
            "sender_name": f"成员{who[n]}",
            "text": body,
            "sent_at": times[n] if times else START + every * n,
            "lexical": to_tsvector_literal(terms(body)),
        }
        for n, body in enumerate(texts)
    ]
    async with db.tenant(tenant) as session:
        inserted = await messages_repository.insert_messages(session, tenant, rows)
        await messages_repository.touch_conversation(
            session,
            {
                "tenant_id": tenant,
                "conversation_key": key,
                "request_type": "group",
                "group_id": key[2:],
                "user_id": None,
                "group_name": None,
                "count": len(inserted),
                "term_count": sum(r.term_count for r in inserted),
                "last_at": rows[-1]["sent_at"],
                "last_seq": max(r.seq for r in inserted),
            },
        )
        await messages_repository.set_embeddings(
            session,
            tenant,
            [SimpleNamespace(conversation_key=key, message_id=r["message_id"]) for r in rows],
            list(vectors),
        )


def rows_of(found: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (r.seq, r.candidate, r.message_id, round(r.similarity, 6), round(r.bm25, 6), r.terms)
        for r in found
    ]


async def test_the_archive_search_finds_the_same_candidates_either_way(db: Database) -> None:
    rng = np.random.default_rng(5)
    tenant = await new_tenant_id(db, "lexical-messages")
    for key, size in (("g:small", 600), ("g:big", 2500)):
        await store_messages(db, tenant, key, [line(rng, n) for n in range(size)], unit(rng, size))
    async with db.system() as session:
        await session.execute(text("ANALYZE messages"))
    # Through the GIN index, with room for every match of every term.
    indexed_plan = dataclasses.replace(SEARCH_PLAN, direct_below=0, sampled_matches=10**6)
    for query in QUERIES:
        vector = unit(rng, 1)[0]
        words = query_terms(query)
        for bounds in ((None, None), (START + timedelta(minutes=200), None)):
            async with db.tenant(tenant) as session:
                direct = await messages_repository.search_candidates(
                    session, tenant, "g:small", vector, words, SEARCH_PLAN, *bounds
                )
                indexed = await messages_repository.search_candidates(
                    session, tenant, "g:small", vector, words, indexed_plan, *bounds
                )
            assert direct and rows_of(direct) == rows_of(indexed)


async def test_a_big_conversation_reads_a_bounded_sample_of_common_words_and_every_rare_one(
    db: Database,
) -> None:
    # Every message says the common words; three late ones also name a rare place.
    rng = np.random.default_rng(9)
    tenant = await new_tenant_id(db, "sampled-messages")
    size = 1200
    texts = [f"今天天气不错，我们去{PLACES[n % 6]}吧" for n in range(size)]
    rare = (size - 300, size - 20, size - 1)
    for n in rare:
        texts[n] = f"今天天气不错，我们去冰岛看极光吧 ({n})"
    await store_messages(db, tenant, "g:busy", texts, unit(rng, size))
    async with db.system() as session:
        await session.execute(text("ANALYZE messages"))
    words = query_terms("今天天气怎么样，冰岛")
    # As a conversation past the direct bound is read: a sample of 60 messages a term.
    plan = dataclasses.replace(
        SEARCH_PLAN, direct_below=0, sampled_matches=60 * len(set(words)), dense_limit=1
    )
    assert term_sample(plan.sampled_matches, len(set(words))) == 60
    # A pasted paragraph's terms read about as many messages in all as a question's.
    longest = MAX_QUERY_TERMS * term_sample(SAMPLED_MATCHES, MAX_QUERY_TERMS)
    assert longest <= 1.05 * SAMPLED_MATCHES
    for bounds, read_from in (((None, None), 0), ((START + timedelta(minutes=1000), None), 1000)):
        async with db.tenant(tenant) as session:
            found = await messages_repository.search_candidates(
                session, tenant, "g:busy", unit(rng, 1)[0], words, plan, *bounds
            )
        scored = sorted((r for r in found if r.bm25 > 0), key=lambda r: -r.bm25)
        # Every message naming the place in the range is found and ranks first lexically.
        named = {f"m{n}" for n in rare if n >= read_from}
        assert {r.message_id for r in scored[: len(named)]} == named
        # The common words were looked up in a bounded sample, within the time range.
        common = {r.seq for r in found if r.bm25 > 0 and r.terms and "冰岛" not in r.terms}
        assert 0 < len(common) <= 60 * (len(set(words)) - 1)
        assert all(r.seq > read_from for r in found if r.bm25 > 0)


async def test_the_archive_finds_the_exact_nearest_messages_from_the_half_precision_copies(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(11)
    tenant = await new_tenant_id(db, "dense-messages")
    size = 3000
    vectors = unit(rng, size)
    # Near-twins of the queries' neighbourhoods make the half-precision order differ from
    # the exact one at the margin.
    queries = unit(rng, 4)
    for n in range(0, 400, 4):
        twin = queries[n % 4] + rng.standard_normal(384).astype(np.float32) * 0.05
        vectors[n] = twin / np.linalg.norm(twin)
    await store_messages(db, tenant, "g:dense", [line(rng, n) for n in range(size)], vectors)
    async with db.system() as session:
        await session.execute(text("ANALYZE messages"))
    plan = dataclasses.replace(SEARCH_PLAN, lexical_limit=0)
    for query in queries:
        exact = np.argsort(-(vectors.astype(np.float64) @ query.astype(np.float64)))
        for bounds in ((None, None), (START + timedelta(minutes=1000), None)):
            async with db.tenant(tenant) as session:
                found = await messages_repository.search_candidates(
                    session, tenant, "g:dense", query, [], plan, *bounds
                )
            seeds = {r.message_id for r in found if r.candidate}
            allowed = [
                n
                for n in exact
                if bounds[0] is None or START + timedelta(minutes=int(n)) >= bounds[0]
            ]
            assert {f"m{n}" for n in allowed[: plan.dense_limit]} <= seeds
            # The same rows as the whole conversation scored exactly (the proof forced to fail).
            with monkeypatch.context() as patch:
                patch.setattr(vector_index, "half_precision_error", lambda n: 10.0)
                async with db.tenant(tenant) as session:
                    scanned = await messages_repository.search_candidates(
                        session, tenant, "g:dense", query, [], plan, *bounds
                    )
            assert rows_of(found) == rows_of(scanned)


async def test_neighbourhoods_read_by_seeds_or_whole_are_the_same(db: Database) -> None:
    # A small conversation is read whole, a big one around each seed: the same rows either
    # way, at the conversation's ends, across seeds close together, within a time range.
    rng = np.random.default_rng(37)
    tenant = await new_tenant_id(db, "neighbourhoods")
    size = 700
    await store_messages(db, tenant, "g:n", [line(rng, n) for n in range(size)], unit(rng, size))
    async with db.system() as session:
        seqs = (
            (
                await session.execute(
                    text("SELECT seq FROM messages WHERE conversation_key = 'g:n' ORDER BY seq")
                )
            )
            .scalars()
            .all()
        )
    query = unit(rng, 1)[0]
    picked = [0, 1, 5, 6, 40, 41, 42, 350, 690, 698, 699]
    picked += [int(n) for n in rng.choice(size, 60, replace=False)]
    for bounds in ((None, None), (START + timedelta(minutes=300), START + timedelta(minutes=500))):
        # Seeds are found within the range.
        inside = [n for n in picked if bounds[0] is None or 300 <= n <= 500]
        seeds = [seqs[n] for n in inside]
        read = {}
        for whole in (True, False):
            async with db.tenant(tenant) as session:
                read[whole] = await messages_repository.neighbourhoods(
                    session,
                    tenant,
                    "g:n",
                    query,
                    seeds,
                    {},
                    SEARCH_PLAN,
                    *bounds,
                    size=0 if whole else 10**6,
                )
        assert dataclasses.asdict(read[True]) == dataclasses.asdict(read[False])
        rows = list(read[True])
        assert sum(r.candidate for r in rows) >= len(inside) > 0
        # Every row within reach of a seed, in order; only those near one read in full.
        assert [r.seq for r in rows] == sorted(r.seq for r in rows)
        near = SEARCH_PLAN.spread + SEARCH_PLAN.similarity_reach
        position = {seq: n for n, seq in enumerate(seqs)}
        for r in rows:
            away = min(abs(position[r.seq] - n) for n in inside)
            assert away <= SEARCH_PLAN.spread + SEARCH_PLAN.context
            assert (r.similarity != 0) == (r.sender_name is not None) == (away <= near)


async def test_the_archive_reads_its_lexical_side_while_the_question_is_embedded(
    db: Database,
) -> None:
    rng = np.random.default_rng(19)
    tenant = await new_tenant_id(db, "overlap")
    vectors = unit(rng, 300)
    await store_messages(db, tenant, "g:o", [line(rng, n) for n in range(300)], vectors)
    lexical_read = asyncio.Event()

    def seen(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if "FROM bm25" in statement:
            lexical_read.set()

    class TakingItsTime:
        """A model that answers once the lexical side has been read (or never)."""

        calibration = Calibration()

        async def query(self, text: str) -> np.ndarray:
            await asyncio.wait_for(lexical_read.wait(), timeout=5)
            return vectors[7]

    async with db.system() as session:
        context = await tenant_context(session, tenant, Settings())
    event.listen(db.engine.sync_engine, "before_cursor_execute", seen)
    try:
        async with db.tenant(tenant) as session:
            found = await archive.search(
                session,
                context,
                MessageSearch(query="西湖边划船", group_id="o", top_k=5),
                TakingItsTime(),  # type: ignore[arg-type]
            )
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", seen)
    # The model answered only because the lexical side was read while it worked.
    assert any("西湖边" in hit.text and "划船" in hit.text for hit in found.messages)


class Failing(FixedModel):
    """A model that goes away while the lexical side is being read."""

    async def query(self, question: str) -> np.ndarray:
        await asyncio.sleep(0.01)
        raise RuntimeError("the model went away")


async def reads_beside_safely(
    db: Database,
    ask: Callable[[Database | None, str], Awaitable[list[str]]],
    marks: dict[str, str],
    failing: Callable[[], Awaitable[Any]],
) -> list[str]:
    """What a search reading its lexical side beside (``ask(side, question)``, on a pool of
    two connections) must show: the answer it gives on its own transaction, the lexical
    statement (``marks``) on a connection of its own; twelve at once, none waiting forever;
    nothing left open by a search that fails midway (``failing``) or whose client hangs up.
    Its answer to the first question, alone."""
    on: dict[str, set[int]] = {kind: set() for kind in marks}

    def seen(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        for kind, mark in marks.items():
            if mark in statement:
                on[kind].add(id(conn.connection.dbapi_connection))

    questions = ["西湖边划船", "张三的猫", "第7次了", "%:/ 西湖"]
    alone = await ask(None, questions[0])
    event.listen(db.engine.sync_engine, "before_cursor_execute", seen)
    try:
        beside = await ask(db, questions[0])
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", seen)
    assert beside == alone
    assert len(on["lexical"]) == len(on["dense"]) == 1 and on["lexical"] != on["dense"]

    # Twelve at once through the two connections: those that find no second transaction
    # free read on their own, none waits forever, and every one answers alike.
    expected = [await ask(None, q) for q in questions * 3]
    together = await asyncio.wait_for(asyncio.gather(*(ask(db, q) for q in questions * 3)), 60)
    assert together == expected

    with pytest.raises(RuntimeError):
        await failing()
    assert db.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    # A client that hangs up mid-search, 50 times over: the search is cancelled while its
    # lexical side is being read, and nothing stays open or lent.
    for _ in range(50):
        running = asyncio.ensure_future(ask(db, questions[0]))
        await asyncio.sleep(0.005)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert db.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert await ask(db, questions[0]) == alone
    return alone


async def test_a_read_beside_hands_its_rows_over_before_its_transaction_ends(
    db_url: str,
) -> None:
    """The rows read on a second transaction reach the request as soon as they are read: its
    COMMIT goes on meanwhile, and ``settled`` waits for it. A read that fails, one cancelled
    while it reads and one cancelled before it starts each end cleanly, with nothing lent."""
    db = Database(db_url, pool_size=2, max_overflow=0)
    tenant = await new_tenant_id(db, "handed-over")

    async def read(session: Any) -> list[str]:
        rows = await session.execute(text("SELECT name FROM tenants"))
        return [r[0] for r in rows]

    for _ in range(20):
        beside = db.read_beside(tenant, read)
        assert await beside == ["handed-over"]  # row-level security: its own tenant only
        # Its transaction still ending (the COMMIT on its way), its connection still lent.
        assert not beside.ended.done()
        assert db.engine.pool.checkedout() == 1  # type: ignore[attr-defined]
        await settled(beside)
        assert beside.ended.done() and beside.ended.exception() is None
        assert db.engine.pool.checkedout() == 0  # type: ignore[attr-defined]

    # A request cancelled while it waits for that COMMIT (a client hung up, on a server that
    # cancels the request then) still waits for it: the COMMIT is not broken off, and the
    # connection is back in the pool before the request ends, still open (a COMMIT broken off
    # cost the pool a new connection each time).
    opened: list[object] = []
    event.listen(db.engine.sync_engine.pool, "connect", lambda *args: opened.append(args))
    for _ in range(20):
        beside = db.read_beside(tenant, read)
        await beside
        request = asyncio.ensure_future(settled(beside))
        await asyncio.sleep(0)
        assert not beside.ended.done()
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)
        assert request.cancelled()
        assert beside.ended.done() and beside.ended.exception() is None
        assert db.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert opened == []

    async def fails(session: Any) -> None:
        await session.execute(text("SELECT 1 / 0"))

    failed = db.read_beside(tenant, fails)
    with pytest.raises(Exception, match="division by zero"):
        await failed
    await settled(failed)

    async def slow(session: Any) -> None:
        await session.execute(text("SELECT pg_sleep(5)"))

    for cancelled_while in (0.05, None):
        hung = db.read_beside(tenant, slow)
        if cancelled_while is not None:
            await asyncio.sleep(cancelled_while)
        started = asyncio.get_running_loop().time()
        await settled(hung)  # cancelled, not waited for
        assert asyncio.get_running_loop().time() - started < 2
        assert hung.found.cancelled()
    assert db.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    await db.dispose()


async def test_a_big_groups_lexical_side_is_read_beside_and_never_waits_for_a_connection(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pool of two connections: one may serve as a second transaction at a time.
    db = Database(db_url, pool_size=2, max_overflow=0)
    rng = np.random.default_rng(29)
    tenant, other = await new_tenant_id(db, "beside"), await new_tenant_id(db, "beside-other")
    texts = [line(rng, n) for n in range(600)]
    vectors = unit(rng, 600)
    await store_messages(db, tenant, "g:big", texts, vectors)
    # Another tenant's group of the same id says the same things, marked.
    await store_messages(db, other, "g:big", [f"别人的：{t}" for t in texts], vectors)
    # From 100 messages a conversation counts as big (read through the GIN index).
    monkeypatch.setattr(archive, "SEARCH_PLAN", dataclasses.replace(SEARCH_PLAN, direct_below=100))
    async with db.system() as session:
        await session.execute(text("ANALYZE messages"))
        context = await tenant_context(session, tenant, Settings())

    async def search(side: Database | None, question: str = "西湖边划船") -> list[str]:
        async with db.tenant(tenant, read_only=True) as session:
            found = await archive.search(
                session,
                context,
                MessageSearch(query=question, group_id="big", top_k=10),
                # The lexical side starts first.
                FixedModel(vectors[123], delay=0.01),  # type: ignore[arg-type]
                side,
            )
        assert not any(hit.text.startswith("别人的") for hit in found.messages)
        return [hit.message_id for hit in found.messages]

    async def failing() -> None:
        async with db.tenant(tenant, read_only=True) as session:
            await archive.search(
                session,
                context,
                MessageSearch(query="西湖边划船", group_id="big", top_k=10),
                Failing(vectors[123]),  # type: ignore[arg-type]
                db,
            )

    marks = {"lexical": "FROM bm25", "dense": "WITH pool AS MATERIALIZED"}
    alone = await reads_beside_safely(db, search, marks, failing)
    assert len(alone) == 10
    async with db.second_tenant(tenant, read_only=True) as second:
        assert second is not None
        async with db.second_tenant(tenant, read_only=True) as third:
            assert third is None  # one at a time in a pool of two
    await db.dispose()


async def test_hostile_questions_to_a_months_long_group_stay_in_it_and_stay_bounded(
    db: Database,
) -> None:
    # Four months of two busy groups (past the size where the lexical side samples), one
    # with an id full of separators; the other says the same things.
    rng = np.random.default_rng(23)
    tenant = await new_tenant_id(db, "hostile-archive")
    size, every = 6000, timedelta(minutes=30)
    texts = [line(rng, n) for n in range(size)]
    vectors = unit(rng, size)
    await store_messages(db, tenant, "g:a:%2F:b", texts, vectors, every)
    await store_messages(db, tenant, "g:a", [f"另一组：{t}" for t in texts], vectors, every)
    async with db.system() as session:
        await session.execute(text("ANALYZE messages"))
        context = await tenant_context(session, tenant, Settings())

    paragraph = (
        " ".join(f"{PLACES[n % 6]}{DOINGS[n % 5]}成员{n % 7}" for n in range(300))
        + " a & b | !c :* 'x' \\ % ( ) '; DROP TABLE messages; -- 阿福"
    )
    questions = (
        paragraph,  # far more terms than a question has, and tsquery syntax
        "%%% ::: /// && || !! '' --",  # no term at all: meaning alone
        "成员3",  # a sender's name
    )
    month = START + every * 4000
    for question in questions:
        for time_from in (None, month):
            answers = []
            # On the session alone, and with the lexical side on a second transaction.
            for side in (None, db):
                async with db.tenant(tenant) as session:
                    found = await archive.search(
                        session,
                        context,
                        MessageSearch(
                            query=question, group_id="a:%2F:b", top_k=10, time_from=time_from
                        ),
                        FixedModel(vectors[4321]),  # type: ignore[arg-type]
                        side,
                    )
                hits = found.messages
                assert len(hits) == 10, question
                assert not any(hit.text.startswith("另一组") for hit in hits)
                assert all(time_from is None or hit.sent_at >= time_from for hit in hits)
                answers.append([hit.message_id for hit in hits])
            assert answers[0] == answers[1]
    # The pasted paragraph's lexical side read a bounded sample, not the group.
    async with db.tenant(tenant) as session:
        matches = await messages_repository.lexical_matches(
            session,
            tenant,
            "g:a:%2F:b",
            query_terms(paragraph, MAX_QUERY_TERMS),
            SEARCH_PLAN,
            None,
            None,
        )
    assert 0 < len(matches) <= 1.05 * SAMPLED_MATCHES


async def test_a_rewritten_or_cleared_vector_moves_its_copy_along(db: Database) -> None:
    rng = np.random.default_rng(13)
    tenant = await new_tenant_id(db, "dense-rewrite")
    vectors = unit(rng, 300)
    await store_messages(db, tenant, "g:w", [line(rng, n) for n in range(300)], vectors)
    query = vectors[7]
    plan = dataclasses.replace(SEARCH_PLAN, lexical_limit=0, dense_limit=1, spread=0, context=0)
    async with db.tenant(tenant) as session:
        found = await messages_repository.search_candidates(
            session, tenant, "g:w", query, [], plan, None, None
        )
        assert [r.message_id for r in found] == ["m7"]
        # Erasure and redaction clear a vector; the half-precision copy goes with it.
        await session.execute(
            text(
                "UPDATE messages SET embedding = NULL"
                " WHERE tenant_id = :t AND conversation_key = 'g:w' AND message_id = 'm7'"
            ),
            {"t": tenant},
        )
        found = await messages_repository.search_candidates(
            session, tenant, "g:w", query, [], plan, None, None
        )
        assert [r.message_id for r in found] != ["m7"] and len(found) == 1


def profile_document(kind: str, entity: str, group: str | None, fact: str) -> str:
    bound = f'group_id: "{group}"\n' if group else ""
    return (
        f'---\nentity_type: {kind}\nentity_id: "{entity}"\n{bound}name: "{entity}"\n'
        f"tags: [t]\nupdated_at: 2026-01-01T00:00:00+08:00\n---\n\n# {entity}\n\n- {fact}\n"
    )


async def test_the_context_reads_each_kind_of_profile_that_exists(db_url: str) -> None:
    from service.app import create_app
    from tests.conftest import make_settings, new_tenant, serve_app

    app = create_app(make_settings(db_url), migrate=False, run_worker=False)
    async with serve_app(app) as client:
        tenant = await new_tenant(client, "profiles-in-context")
        for path, document in (
            ("/v1/profiles/user/u1", profile_document("user", "u1", None, "住在杭州")),
            ("/v1/profiles/group/g1", profile_document("group", "g1", None, "周末爬山")),
            (
                "/v1/profiles/member/g1/u1",
                profile_document("member", "u1", "g1", "群里的摄影师"),
            ),
            ("/v1/profiles/group/g2", profile_document("group", "g2", None, "只聊工作")),
        ):
            response = await client.put(path, json={"document": document}, headers=tenant.headers)
            assert response.status_code in (200, 201), response.text

        async def context(**where: str) -> dict[str, Any]:
            response = await client.post(
                "/v1/context", json={**where, "message": "最近怎么样"}, headers=tenant.headers
            )
            assert response.status_code == 200, response.text
            return dict(response.json())

        everyone = await context(request_type="group", group_id="g1", sender_id="u1")
        assert "住在杭州" in everyone["user_profile"]["text"]
        assert "周末爬山" in everyone["group_profile"]["text"]
        assert "群里的摄影师" in everyone["member_profile"]["text"]
        assert everyone["member_profile"]["id"] == "profile:member:g1:u1"
        assert everyone["user_profile"]["meta"]["version"] == 1
        # Another group: its own profile; the person's user profile follows them; no member
        # profile of theirs there.
        elsewhere = await context(request_type="group", group_id="g2", sender_id="u1")
        assert "只聊工作" in elsewhere["group_profile"]["text"]
        assert "住在杭州" in elsewhere["user_profile"]["text"]
        assert elsewhere["member_profile"] is None
        stranger = await context(request_type="group", group_id="g3", sender_id="u9")
        assert stranger["user_profile"] is stranger["group_profile"] is None
        assert stranger["member_profile"] is None
        private = await context(request_type="private", user_id="u1")
        assert "住在杭州" in private["user_profile"]["text"]
        assert private["group_profile"] is None and private["member_profile"] is None


async def test_where_every_text_comes_seven_times_a_search_still_shows_top_k_of_them(
    db: Database,
) -> None:
    # Each member's lines said seven times over (a bot's notices, a chatty member's "收到"):
    # the best ranked are copies of a few statements, and the search reads further down its
    # ranking until it has top_k different ones to show.
    rng = np.random.default_rng(43)
    tenant = await new_tenant_id(db, "seven-times")
    said = [f"{line(rng, n)}（{n}）" for n in range(120)]
    query = unit(rng, 1)[0]
    near = query + rng.standard_normal((120, 384)).astype(np.float32) * 0.6
    near /= np.linalg.norm(near, axis=1, keepdims=True)
    # store_messages gives message n the sender n % 5: a text's seven copies sit where their
    # sender is the same (text t at every fifth message from t % 5 on).
    order = np.array([p % 5 + 5 * ((p // 5) // 7) for p in range(840)])
    assert all(len({p % 5 for p in np.flatnonzero(order == t)}) == 1 for t in range(120))
    texts = [said[t] for t in order]
    rows = near[order]
    await store_messages(db, tenant, "g:seven", texts, rows)
    async with db.system() as session:
        context = await tenant_context(session, tenant, Settings())
    async with db.tenant(tenant) as session:
        found = await archive.search(
            session,
            context,
            MessageSearch(query="西湖边划船", group_id="seven", top_k=12),
            FixedModel(query),  # type: ignore[arg-type]
        )
    shown = [(hit.sender_id, hit.text) for hit in found.messages]
    assert len(shown) == 12 and len(set(shown)) == 12


async def test_many_equal_vectors_still_give_the_exact_nearest_distances(db: Database) -> None:
    rng = np.random.default_rng(17)
    tenant = await new_tenant_id(db, "dense-ties")
    query = unit(rng, 1)[0]
    close = query + rng.standard_normal(384).astype(np.float32) * 0.3
    vectors = unit(rng, 2000)
    vectors[:300] = close / np.linalg.norm(close)  # 300 copies of one nearby message
    for n in range(300, 340):  # and a few that are nearer still
        nearer = query + rng.standard_normal(384).astype(np.float32) * 0.1
        vectors[n] = nearer / np.linalg.norm(nearer)
    await store_messages(db, tenant, "g:ties", [line(rng, n) for n in range(2000)], vectors)
    plan = dataclasses.replace(SEARCH_PLAN, lexical_limit=0, spread=0, context=0)
    async with db.tenant(tenant) as session:
        found = await messages_repository.search_candidates(
            session, tenant, "g:ties", query, [], plan, None, None
        )
    exact = np.sort(vectors.astype(np.float64) @ query.astype(np.float64))[::-1]
    got = np.sort([r.similarity for r in found])[::-1]
    assert len(got) == plan.dense_limit
    assert np.allclose(got, exact[: plan.dense_limit], atol=1e-5)
    assert {f"m{n}" for n in range(300, 340)} <= {r.message_id for r in found}


async def test_texts_said_again_and_again_are_ranked_exactly_in_one_pass(db: Database) -> None:
    # A group where every text comes eight times (a bot's notices, the same greetings):
    # equal vectors side by side at the top of the dense pool, and the texts close in
    # meaning (cosines to the question 0.0004 apart, as an embedding model's crowd).
    rng = np.random.default_rng(31)
    tenant = await new_tenant_id(db, "dense-repeats")
    texts = [line(rng, n) for n in range(150)]
    query = unit(rng, 1)[0].astype(np.float64)
    away = rng.standard_normal((150, 384))
    away -= np.outer(away @ query, query)
    away /= np.linalg.norm(away, axis=1, keepdims=True)
    cosine = 0.9 - 0.0004 * np.arange(150)
    vectors = (np.outer(cosine, query) + np.sqrt(1 - cosine**2)[:, None] * away).astype(np.float32)
    order = rng.permutation(np.repeat(np.arange(150), 8))
    await store_messages(db, tenant, "g:again", [texts[n] for n in order], vectors[order])
    plan = dataclasses.replace(SEARCH_PLAN, lexical_limit=0, spread=0, context=0)
    passes: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if "embedding_half <#>" in statement:
            passes.append(statement)

    event.listen(db.engine.sync_engine, "before_cursor_execute", seen)
    try:
        for asked in (query, *unit(rng, 4)):
            async with db.tenant(tenant) as session:
                found = await messages_repository.search_candidates(
                    session, tenant, "g:again", asked, [], plan, None, None
                )
            exact = np.sort(vectors[order].astype(np.float64) @ asked.astype(np.float64))[::-1]
            got = np.sort([r.similarity for r in found])[::-1]
            assert np.allclose(got, exact[: plan.dense_limit], atol=1e-5)
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", seen)
    # One scan of the conversation a question: the pool reached past the copies.
    assert len(passes) == 5


async def test_searches_are_planned_for_their_own_parameters_however_often_they_run(
    db: Database,
) -> None:
    # asyncpg prepares every statement; PostgreSQL's default may then settle on one generic
    # plan for all parameters, which made a many-sender group's archive search four times
    # slower. Every session of the service plans each run for its parameters.
    rng = np.random.default_rng(9)
    tenant = await new_tenant_id(db, "custom-plans")
    await store_messages(db, tenant, "g:plans", [line(rng, n) for n in range(300)], unit(rng, 300))
    async with db.tenant(tenant) as session:
        for query in QUERIES * 3:
            await messages_repository.search_candidates(
                session,
                tenant,
                "g:plans",
                unit(rng, 1)[0],
                query_terms(query),
                SEARCH_PLAN,
                None,
                None,
            )
        plans = (
            await session.execute(
                text(
                    "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                    " WHERE statement LIKE '%WITH pool AS MATERIALIZED%'"
                    " AND statement NOT LIKE '%pg_prepared_statements%'"
                )
            )
        ).all()
    assert plans and all(generic == 0 and custom >= 15 for generic, custom in plans), plans
    # Nor is any compiled (see SERVER_SETTINGS): a busy group's search is estimated near the
    # cost that makes a server with JIT compile it, at tens of milliseconds each run.
    for opened in (db.system(), db.tenant(tenant)):
        async with opened as session:
            mode = (await session.execute(text("SHOW plan_cache_mode"))).scalar_one()
            jit = (await session.execute(text("SHOW jit"))).scalar_one()
        assert (mode, jit) == ("force_custom_plan", "off")


async def test_a_turns_lexical_side_is_read_beside_and_never_waits_for_a_connection(
    db_url: str,
) -> None:
    from service.recall.schemas import ContextRequest, EventSearch
    from service.recall.service import Reader

    # A pool of two connections: one may serve as a second transaction at a time.
    db = Database(db_url, pool_size=2, max_overflow=0)
    rng = np.random.default_rng(31)
    tenant, other = await new_tenant_id(db, "turn-beside"), await new_tenant_id(db, "turn-other")
    group = "b:%ig"
    vectors = unit(rng, 600)
    texts = [line(rng, n) for n in range(600)]
    for owner, mark in ((tenant, ""), (other, "别人的：")):
        rows = [
            {
                **event_row(
                    owner, f"{mark}e{n}", f"g:{group}", START + timedelta(minutes=n), vectors[n]
                ),
                "text": mark + texts[n],
            }
            for n in range(600)
        ]
        async with db.tenant(owner) as session:
            for start in range(0, len(rows), 300):
                await events_repository.upsert_events(session, rows[start : start + 300])
    async with db.system() as session:
        await session.execute(text("ANALYZE events"))
        context = await tenant_context(session, tenant, Settings())

    async def turn(side: Database | None, message: str = "西湖边划船") -> list[str]:
        reader = Reader(FixedModel(vectors[123], delay=0.01), None, side)  # type: ignore[arg-type]
        async with db.tenant(tenant, read_only=True) as session:
            found = await reader.context(
                session,
                context,
                ContextRequest(
                    request_type="group", group_id=group, sender_id="10001", message=message
                ),
            )
            searched = await reader.search_events(
                session, context, EventSearch(query=message, group_id=group, top_k=10)
            )
        said = [e.text for e in found.events] + [e.text for e in searched.events]
        assert said and not any(t.startswith("别人的") for t in said)
        return [e.id for e in found.events] + ["|"] + [e.id for e in searched.events]

    async def failing() -> None:
        asked = ContextRequest(request_type="group", group_id=group, message="西湖边划船")
        async with db.tenant(tenant, read_only=True) as session:
            await Reader(Failing(vectors[0]), None, db).context(  # type: ignore[arg-type]
                session, context, asked
            )

    marks = {"lexical": "WITH counted AS MATERIALIZED", "dense": "WITH candidates AS MATERIALIZED"}
    alone = await reads_beside_safely(db, turn, marks, failing)
    assert "event:e123" in alone  # the nearest in meaning, in the turn
    await db.dispose()


async def test_a_line_said_a_hundred_times_in_a_day_is_shown_once_among_the_rest(
    db: Database,
) -> None:
    from service.recall.schemas import ContextRequest, EventSearch
    from service.recall.service import Reader

    # Every third event of the day is the same line: ranked first, its repeats are skipped
    # until the kept reach past the candidates read whole (a 500 once).
    rng = np.random.default_rng(37)
    tenant = await new_tenant_id(db, "said-again")
    vectors = unit(rng, 300)
    repeated = vectors[0]
    rows = []
    for n in range(300):
        again = n % 3 == 0
        rows.append(
            {
                **event_row(
                    tenant,
                    f"e{n}",
                    "g:spam",
                    START + timedelta(minutes=n),
                    repeated if again else vectors[n],
                ),
                "text": "张三的猫阿福打翻了鱼缸" if again else line(rng, n + 1),
            }
        )
    async with db.tenant(tenant) as session:
        await events_repository.upsert_events(session, rows)
    # The rest are random lines, under any relevance floor: with none, what is shown beside
    # the repeated line is what the flood left room for.
    unfloored = Settings(cognitive={"query": {"context_min_relevance": 0}})
    async with db.system() as session:
        context = await tenant_context(session, tenant, unfloored)
    reader = Reader(FixedModel(repeated), None, db)  # type: ignore[arg-type]
    async with db.tenant(tenant, read_only=True) as session:
        turn = await reader.context(
            session,
            context,
            ContextRequest(request_type="group", group_id="spam", message="张三的猫阿福怎么了"),
        )
        searched = await reader.search_events(
            session, context, EventSearch(query="张三的猫阿福", group_id="spam", top_k=10)
        )
    for shown in ([e.text for e in turn.events], [e.text for e in searched.events]):
        assert shown[0] == "张三的猫阿福打翻了鱼缸"
        assert shown.count("张三的猫阿福打翻了鱼缸") == 1
        assert len(shown) == len(set(shown)) > 1
    assert len(searched.events) == 10


async def test_a_members_flood_is_one_result_and_a_chorus_too_but_a_few_alike_are_each_own(
    db: Database,
) -> None:
    from service.events import service as event_service
    from service.recall.schemas import EventSearch
    from service.recall.service import Reader

    # One day of a busy group, as the historian writes it: 300 members repost a chain line
    # word for word (a chorus), seven members say they will go too, one member sends an ad
    # 100 times, and the rest is talk. Asked about the ad, it comes once (one member's
    # repeats are one statement); asked about the chain, it comes once or twice, not once a
    # member, and each of the seven is shown (alike words from a few people stay each
    # their own).
    rng = np.random.default_rng(41)
    tenant = await new_tenant_id(db, "flood")
    vectors = unit(rng, 600)
    chain, ad = vectors[0], vectors[1]
    rows = []
    for n in range(600):
        row = event_row(tenant, f"e{n}", "g:flood", START + timedelta(seconds=40 * n), vectors[n])
        if n % 2 == 0:
            row.update(text="接龙：周六下午三点西湖边集合", sender_id=f"m{n:03d}", embedding=chain)
        elif n % 3 == 0:
            row.update(text="买车找我，优惠多多", sender_id="ads", embedding=ad)
        elif n < 20:
            row.update(text="周六我也去西湖边集合", sender_id=f"j{n:02d}", embedding=chain)
        else:
            row.update(text=line(rng, n), sender_id=f"m{n % 40:03d}")
        rows.append(row)
    for start in range(0, len(rows), 50):
        async with db.tenant(tenant) as session:
            await event_service.store(session, rows[start : start + 50])
    async with db.system() as session:
        context = await tenant_context(session, tenant, Settings())
    for vector, asked in ((ad, "买车优惠"), (chain, "周六西湖边集合")):
        reader = Reader(FixedModel(vector), None, db)  # type: ignore[arg-type]
        async with db.tenant(tenant, read_only=True) as session:
            searched = await reader.search_events(
                session, context, EventSearch(query=asked, group_id="flood", top_k=10)
            )
        shown = [(e.text, e.sender_id) for e in searched.events]
        assert len(shown) == 10
        if vector is ad:
            assert shown[0] == ("买车找我，优惠多多", "ads")
            assert [who for _, who in shown].count("ads") == 1
        else:
            assert 1 <= [said for said, _ in shown].count("接龙：周六下午三点西湖边集合") <= 2
            too = {who for said, who in shown if said == "周六我也去西湖边集合"}
            assert too == {f"j{n:02d}" for n in range(20) if n % 2 and n % 3}, shown


async def test_a_chat_history_as_the_query_still_finds_what_its_first_line_named(
    db: Database,
) -> None:
    import itertools

    from service.recall.schemas import EventSearch
    from service.recall.service import Reader

    # A bot asks with the last forty lines of a chat; the first names the parlour, the
    # others a hundred words of small talk. Meaning says nothing here (an unrelated query
    # vector): the parlour's words must survive the cut of a long query's terms.
    rng = np.random.default_rng(41)
    tenant = await new_tenant_id(db, "long-history")
    places = ["bakery", "museum", "harbour", "stadium", "library", "cinema", "garden", "zoo"]
    texts = [f"went to the {places[n % 8]} with friends, visit {n}" for n in range(40)]
    texts[17] = "ate mango ice cream at the parlour on Elm street"
    vectors = unit(rng, 41)
    rows = [
        {**event_row(tenant, f"m{n}", "p:ann", START + timedelta(days=n), vectors[n]), "text": t}
        for n, t in enumerate(texts)
    ]
    async with db.tenant(tenant) as session:
        await events_repository.upsert_events(session, rows)
    syllables = ["ka", "lo", "mi", "tu", "re", "sa", "no", "vi", "de", "zu"]
    chatter = ["".join(p) for p in itertools.product(syllables, repeat=3)][:100]
    history = ["remember the ice cream parlour on Elm street?"]
    history += [" ".join(chatter[n : n + 3]) for n in range(0, 99, 3)]
    assert 64 < len(query_terms("\n".join(history))) <= 128
    async with db.system() as session:
        context = await tenant_context(session, tenant, Settings())
    reader = Reader(FixedModel(vectors[40]), None, db)  # type: ignore[arg-type]
    async with db.tenant(tenant, read_only=True) as session:
        found = await reader.search_events(
            session, context, EventSearch(query="\n".join(history), user_id="ann", top_k=3)
        )
    assert found.events[0].text == texts[17]


async def test_months_of_turns_with_hostile_words_and_ids_stay_in_their_group_and_bounded(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.recall.schemas import ContextRequest, EventSearch
    from service.recall.service import Reader

    # Four months of a busy group's events, every half hour, under an id full of separators;
    # another tenant's group of the same id says the same things, marked. Five hundred turns
    # and searches, a dozen at a time through a pool of four (two may serve beside), with
    # hostile questions, odd asker ids and clients that hang up.
    db = Database(db_url, pool_size=4, max_overflow=0)
    rng = np.random.default_rng(43)
    tenant, other = await new_tenant_id(db, "months-of-turns"), await new_tenant_id(db, "nosy")
    group, size = "o:%1", 4 * 30 * 48
    vectors = unit(rng, size)
    texts = [line(rng, n) for n in range(size)]
    for owner, mark in ((tenant, ""), (other, "别人的：")):
        rows = [
            {
                **event_row(
                    owner, f"{mark}e{n}", f"g:{group}", START + timedelta(minutes=30 * n), v
                ),
                "text": mark + texts[n],
                "sender_id": f"u:{n % 40}%2F",
            }
            for n, v in enumerate(vectors)
        ]
        async with db.tenant(owner) as session:
            for start in range(0, size, 500):
                await events_repository.upsert_events(session, rows[start : start + 500])
    async with db.system() as session:
        await session.execute(text("ANALYZE events"))
        context = await tenant_context(session, tenant, Settings())

    asked_terms: list[int] = []
    lexical_events = events_repository.lexical_events

    async def counted(
        session: Any, tenant_id: Any, keys: Any, words: list[str], *a: Any, **k: Any
    ) -> Any:
        asked_terms.append(len(words))
        return await lexical_events(session, tenant_id, keys, words, *a, **k)

    monkeypatch.setattr(events_repository, "lexical_events", counted)
    told: list[tuple[str, list[str]]] = []
    told_by = events_repository.nearest_told_by

    async def own(session: Any, tenant_id: Any, keys: Any, sender: str, *a: Any, **k: Any) -> Any:
        found = await told_by(session, tenant_id, keys, sender, *a, **k)
        told.append((sender, [r["sender_id"] for r in found]))
        return found

    monkeypatch.setattr(events_repository, "nearest_told_by", own)

    class Model(FixedModel):
        async def query(self, question: str) -> np.ndarray:
            return vectors[sum(map(ord, question)) % size]

    paragraph = " ".join(f"zq{n}x" for n in range(700))[:3900]  # 4,000 characters of words
    questions = [
        "上次在西湖边划船怎么样",
        "阿福 阿福 阿福 张三的猫",
        "%:/ 西湖' OR 1=1 --",
        "(((a+)+)+)$ \\d*\\d*\\d*!",
        paragraph,
        "别人的：我们在西湖边划船",
    ]
    askers = ["u:3%2F", "..%2Fetc", "u:%00", None]  # a '/' is refused before any read

    async def turn(n: int) -> None:
        question, asker = questions[n % len(questions)], askers[n // 2 % len(askers)]
        reader = Reader(Model(vectors[0]), None, db)  # type: ignore[arg-type]
        async with db.tenant(tenant, read_only=True) as session:
            if n % 2:
                found = await reader.context(
                    session,
                    context,
                    ContextRequest(
                        request_type="group", group_id=group, sender_id=asker, message=question
                    ),
                )
                shown = [e.text for e in found.events]
                assert len(shown) <= context.query.auto_top_k
            else:
                searched = await reader.search_events(
                    session, context, EventSearch(query=question, group_id=group, top_k=8)
                )
                assert all(e.group_id == group for e in searched.events)
                shown = [e.text for e in searched.events]
                assert len(shown) == 8
        assert not any(t.startswith("别人的") for t in shown), (question, shown)

    for round_ in range(42):
        batch = [asyncio.ensure_future(turn(12 * round_ + n)) for n in range(12)]
        await asyncio.sleep(0.002)
        batch[round_ % 12].cancel()  # a client that hangs up
        done = await asyncio.wait_for(asyncio.gather(*batch, return_exceptions=True), 120)
        failures = [d for d in done if isinstance(d, BaseException)]
        assert all(isinstance(f, asyncio.CancelledError) for f in failures), failures
    # The paragraph's 700 words were cut to the most telling ones; nothing leaked.
    assert len(asked_terms) > 400 and max(asked_terms) <= MAX_QUERY_TERMS
    # The asker's own nearest, for each asker known, theirs alone (a '%' is no wildcard).
    assert {sender for sender, _ in told} == {"u:3%2F", "..%2Fetc", "u:%00"}
    assert all(set(senders) <= {sender} for sender, senders in told)
    assert any(senders for sender, senders in told if sender == "u:3%2F")
    assert db.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    async with (
        db.second_tenant(tenant, read_only=True) as first,
        db.second_tenant(tenant, read_only=True) as second,
        db.second_tenant(tenant, read_only=True) as third,
    ):
        # Every transaction lent beside came back: two of a pool of four, again.
        assert first is not None and second is not None and third is None
    await db.dispose()


def reads_to_fill(
    cosines: np.ndarray, said: list[tuple[Any, ...]], vector_of: np.ndarray, pool: int, enough: int
) -> int | None:
    """How many readings of the nearest it takes until ``enough`` statements differ among
    them, as the search should read them: the ``pool`` nearest; with too few (and no fewer
    than asked), 4 times as many; with still too few, the ``pool`` nearest skipping the
    vectors repeated in the last reading, twice at most. None where equal cosines of
    different statements meet at a reading's edge (which come first is then the database's
    choice)."""
    order = np.argsort(-cosines, kind="stable")
    skipped: set[int] = set()
    firsts: set[tuple[Any, ...]] = set()
    for reading, depth in enumerate((pool, 4 * pool, pool, pool), start=1):
        if reading == 2:
            firsts = set()
        left = [n for n in order if vector_of[n] not in skipped]
        edge = left[depth - 1 : depth + 1]
        tied = len(edge) == 2 and abs(cosines[edge[0]] - cosines[edge[1]]) < 2e-3
        if tied and said[edge[0]] != said[edge[1]]:
            return None
        items = left[:depth]
        firsts |= {said[n] for n in items} | {said[n] for n in order if vector_of[n] in skipped}
        if len(firsts) >= enough or len(items) < depth or reading == 4:
            return reading
        if reading >= 2:
            counts = Counter(vector_of[n] for n in items)
            repeated = {v for v, copies in counts.items() if copies > 1}
            if not repeated:
                return reading
            skipped |= repeated
    return 4


AD = "买车找我，优惠多多，加微信"


def four_months(rng: np.random.Generator) -> tuple[list[dict[str, Any]], np.ndarray]:
    """Four months of a busy group as a real one runs, in time order: a bot's notice every
    morning (the same words and vector each day), two members' tics said a few times a day,
    a spammer flooding an ad 40-400 times on one day in nine (about 3,000 copies in all), and
    a score of members' own lines a day. Also the ad's vector."""
    notice, ad, laugh, ack = unit(rng, 4)
    said: list[dict[str, Any]] = []

    def say(sender: str, body: str, at: datetime, vector: np.ndarray) -> None:
        said.append({"sender_id": sender, "text": body, "at": at, "vector": vector})

    for day in range(120):
        morning = START + timedelta(days=day, hours=1)
        say("bot", "每日打卡提醒：今天也要记得喝水运动", morning, notice)
        for k in range(20):
            at = morning + timedelta(minutes=5 + int(rng.integers(0, 780)))
            body = f"{line(rng, k)}，第{day}天{k}号"
            say(f"m{int(rng.integers(30)):02d}", body, at, unit(rng, 1)[0])
        for who, body, vector in (("m07", "哈哈哈哈", laugh), ("m12", "收到收到", ack)):
            for _ in range(int(rng.integers(2, 6))):
                say(who, body, morning + timedelta(minutes=int(rng.integers(5, 780))), vector)
        if day % 9 == 3:
            for _ in range(int(rng.integers(40, 401))):
                at = morning + timedelta(minutes=int(rng.integers(5, 780)))
                say("ads", AD, at, ad)
    said.sort(key=lambda s: s["at"])
    return said, ad


async def test_four_months_of_a_group_fill_every_search_with_distinct_statements(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four months of a busy group (``four_months``). A thousand event searches (a model's
    tool calls: any vector, words and junk, a day named or a range of days) each show top_k
    different statements, or all the range holds, and read each side no more than three
    times; a search with enough different nearest reads once, one flooded twice or three
    times, however many copies the flood holds."""
    from service.events import service as event_service
    from service.recall.schemas import EventSearch
    from service.recall.service import Reader

    rng = np.random.default_rng(44)
    tenant = await new_tenant_id(db, "four-months")
    group = "月%:x..100"
    key = f"g:{group}"
    said, ad = four_months(rng)
    notice = said[0]["vector"]
    laugh = next(s["vector"] for s in said if s["text"] == "哈哈哈哈")
    ack = next(s["vector"] for s in said if s["text"] == "收到收到")
    flood_days = {day for day in range(120) if day % 9 == 3}
    vectors = np.stack([s["vector"] for s in said])
    rows = [
        {
            **event_row(tenant, f"{key}#{n}", key, s["at"], s["vector"]),
            "text": s["text"],
            "sender_id": s["sender_id"],
        }
        for n, s in enumerate(said)
    ]
    async with db.tenant(tenant) as session:
        for start in range(0, len(rows), 500):
            await events_repository.upsert_events(session, rows[start : start + 500])
    statement = [(s["sender_id"], s["at"].date(), s["text"]) for s in said]
    vector_of = np.unique(vectors, axis=0, return_inverse=True)[1].ravel()
    days = np.array([(s["at"] - START).days for s in said])

    readings: list[str] = []
    sides = {"nearest": event_service.nearest, "lexical": event_service.lexical}
    for name, read in sides.items():

        def counted(*args: Any, _read: Any = read, _name: str = name, **kwargs: Any) -> Any:
            # The statements at skipped scores are read apart, not a reading of the side.
            readings.append(f"{_name} apart" if kwargs.get("said_at") else _name)
            return _read(*args, **kwargs)

        monkeypatch.setattr(event_service, name, counted)
    async with db.system() as session:
        context = await tenant_context(session, tenant, Settings())
    top_k, pool = 10, 30
    once = flooded = 0
    junk = ["%", "/", ":", "..", "' OR 1=1 --", "🙂", "x" * 300]
    for n in range(1000):
        kind = n % 5
        first = last = None
        if kind == 0:  # near one member's line, in their words
            target = int(rng.choice([i for i, s in enumerate(said) if s["sender_id"][0] == "m"]))
            vector = vectors[target] + unit(rng, 1)[0] * 0.5
            asked = said[target]["text"][:8]
        elif kind == 1:  # the ad, on a day it flooded or over weeks
            vector, asked = ad, "买车优惠"
            first = int(rng.choice(sorted(flood_days)))
            last = first + 1 if n % 2 else min(first + int(rng.integers(2, 40)), 120)
        elif kind == 2:  # the notice, in a model's words and junk
            vector, asked = notice, "打卡提醒 " + " ".join(rng.choice(junk, 2))
        elif kind == 3:  # a day named, as a model's tool call names it
            first = int(rng.integers(120))
            last = first + 1
            day = START + timedelta(days=first)
            vector, asked = unit(rng, 1)[0], f"{day.month}月{day.day}日大家聊了什么"
        else:  # a tic, over a range of days or all
            vector, asked = (laugh, "哈哈") if n % 2 else (ack, "收到")
            if n % 4 == 1:
                first = int(rng.integers(110))
                last = first + int(rng.integers(1, 11))
        vector = (vector / np.linalg.norm(vector)).astype(np.float32)
        bounds = {}
        if first is not None:
            bounds = {
                "time_from": START + timedelta(days=first),
                "time_to": START + timedelta(days=last),
            }
        inside = [i for i in range(len(said)) if first is None or first <= days[i] < (last or 0)]
        readings.clear()
        reader = Reader(FixedModel(vector), None, db)  # type: ignore[arg-type]
        request = EventSearch(query=asked, group_id=group, top_k=top_k, **bounds)
        async with db.tenant(tenant, read_only=True) as session:
            found = (await reader.search_events(session, context, request)).events
        shown = [(e.sender_id, e.occurred_at.astimezone(UTC).date(), e.text) for e in found]
        assert len(set(shown)) == len(shown), (n, asked)
        assert len(shown) == min(top_k, len({statement[i] for i in inside})), (n, asked)
        assert readings.count("nearest") <= 4 and readings.count("lexical") <= 4, n
        expected = reads_to_fill(
            vectors[inside] @ vector,
            [statement[i] for i in inside],
            vector_of[inside],
            pool,
            top_k,
        )
        if expected is not None and (kind == 0 or last == (first or 0) + 1):
            assert readings.count("nearest") == expected, (n, asked)
            once += expected == 1
            flooded += expected > 1
    # Most searches read once; the ad's days read past the ad.
    assert once >= 200 and flooded >= 50, (once, flooded)


async def test_four_months_in_the_archive_a_flood_of_thousands_hides_nothing_else(
    db: Database,
) -> None:
    """The archive over the same four months (``four_months``): the ad's 3,000 copies are
    one statement, more copies than reading deeper reaches. Three hundred searches (the
    ad's, the notice's, a member's line's, random; over all of it or a range of days) each
    show top_k different statements, the ad first where it is asked about, and read the
    nearest no more than four times."""
    rng = np.random.default_rng(45)
    tenant = await new_tenant_id(db, "four-months-archive")
    said, ad = four_months(rng)
    key = "g:月%:x..100"
    vectors = np.stack([s["vector"] for s in said])
    await store_messages(
        db,
        tenant,
        key,
        [s["text"] for s in said],
        vectors,
        senders=[s["sender_id"] for s in said],
        times=[s["at"] for s in said],
    )
    async with db.system() as session:
        await session.execute(text("ANALYZE messages"))  # as autovacuum does after an import
    async with db.system() as session:
        context = await tenant_context(session, tenant, Settings())
    scans: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        # A reading of the nearest (its second pass, where one is needed, reads on from it);
        # the statements at the distances it skips.
        if "WITH pool AS MATERIALIZED" in statement:
            scans.append("nearest")
        elif "DISTINCT ON (sender_id, md5(text))" in statement:
            scans.append("said at")

    event.listen(db.engine.sync_engine, "before_cursor_execute", count)
    days = np.array([(s["at"] - START).days for s in said])
    members = [n for n, s in enumerate(said) if s["sender_id"].startswith("m")]
    try:
        for n in range(300):
            kind, first = n % 4, None
            if kind == 0:
                vector, asked = ad, "买车优惠"
            elif kind == 1:
                vector, asked = said[0]["vector"], "打卡提醒"
            elif kind == 2:
                target = int(rng.choice(members))
                vector = vectors[target] + unit(rng, 1)[0] * 0.5
                asked = said[target]["text"][:8]
            else:
                vector, asked = unit(rng, 1)[0], "大家最近在聊什么"
            bounds = {}
            if n % 3 == 1:
                first = int(rng.integers(0, 100))
                last = first + int(rng.integers(1, 21))
                bounds = {
                    "time_from": START + timedelta(days=first),
                    "time_to": START + timedelta(days=last),
                }
            inside = [i for i in range(len(said)) if first is None or first <= days[i] < last]
            scans.clear()
            vector = (vector / np.linalg.norm(vector)).astype(np.float32)
            request = MessageSearch(query=asked, group_id=key[2:], top_k=12, **bounds)
            async with db.tenant(tenant) as session:
                found = await archive.search(session, context, request, FixedModel(vector))  # type: ignore[arg-type]
            shown = [(hit.sender_id, hit.text) for hit in found.messages]
            assert len(set(shown)) == len(shown) == 12, (n, asked, len(inside), shown)
            if kind == 0 and any(said[i]["text"] == AD for i in inside):
                assert shown[0] == ("ads", AD), n
            assert scans.count("nearest") <= 4 and scans.count("said at") <= 2, (n, asked)

    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", count)


async def test_a_flood_holding_the_asked_words_hides_no_one_else_who_said_them(
    db: Database,
) -> None:
    """A spammer sends an ad naming a member 1,900 times in a day (the events' lexical side
    scores up to 2,000 matches, the archive's every match in a conversation this size); the
    member said one line that names them too. Asked the name (meaning says nothing here: an
    unrelated query vector), the ad's copies score best on the words, and the member's line
    is still found, by the event search and the archive alike."""
    from service.recall.schemas import EventSearch
    from service.recall.service import Reader

    rng = np.random.default_rng(46)
    tenant = await new_tenant_id(db, "word-flood")
    group, ad, vectors = "flood%:words", "王芳 买车找我", unit(rng, 202)
    said = [("ads", ad, vectors[0])] * 1900
    said += [("m01", "王芳明天去杭州出差", vectors[1])]
    said += [(f"m{n % 30:02d}", line(rng, n), vectors[n + 2]) for n in range(200)]
    order = rng.permutation(len(said))
    said = [said[n] for n in order]
    times = [START + timedelta(hours=1, seconds=10 * n) for n in range(len(said))]
    rows = [
        {
            **event_row(tenant, f"e{n}", f"g:{group}", times[n], vector),
            "text": body,
            "sender_id": who,
        }
        for n, (who, body, vector) in enumerate(said)
    ]
    async with db.tenant(tenant) as session:
        for start in range(0, len(rows), 500):
            await events_repository.upsert_events(session, rows[start : start + 500])
    await store_messages(
        db,
        tenant,
        f"g:{group}",
        [body for _, body, _ in said],
        np.stack([vector for _, _, vector in said]),
        senders=[who for who, _, _ in said],
        times=times,
    )
    async with db.system() as session:
        await session.execute(text("ANALYZE messages"))
    async with db.system() as session:
        context = await tenant_context(session, tenant, Settings())
    query = unit(rng, 1)[0]
    reader = Reader(FixedModel(query), None, db)  # type: ignore[arg-type]
    async with db.tenant(tenant, read_only=True) as session:
        request = EventSearch(query="王芳", group_id=group, top_k=10)
        found = (await reader.search_events(session, context, request)).events
    shown = [(e.sender_id, e.text) for e in found]
    assert ("ads", ad) in shown and ("m01", "王芳明天去杭州出差") in shown, shown
    assert len(shown) == 10 and shown.count(("ads", ad)) == 1
    async with db.tenant(tenant) as session:
        request = MessageSearch(query="王芳", group_id=group, top_k=12)
        hits = (await archive.search(session, context, request, FixedModel(query))).messages  # type: ignore[arg-type]
    shown = [(hit.sender_id, hit.text) for hit in hits]
    assert ("ads", ad) in shown and ("m01", "王芳明天去杭州出差") in shown, shown
    assert len(shown) == 12 and shown.count(("ads", ad)) == 1


class SeededModel(FixedModel):
    """A model whose passages' vectors are random, one per text (the same text, the same, in
    every run)."""

    async def passages(self, texts: list[str]) -> list[np.ndarray]:
        return [unit(np.random.default_rng(list(t.encode())), 1)[0] for t in texts]


class ShapeModel(SeededModel):
    """A ``SeededModel`` that gives the copies of a statement, however varied, one vector, as
    a real model gives them nearly one."""

    async def passages(self, texts: list[str]) -> list[np.ndarray]:
        return await super().passages([shape(t) for t in texts])


class NearShapeModel(ShapeModel):
    """A ``ShapeModel`` whose copies of a statement each have their own vector, near the
    statement's (cosine about 0.96), as a real model gives a spammer's varied copies."""

    async def passages(self, texts: list[str]) -> list[np.ndarray]:
        near = zip(
            await super().passages(texts), await SeededModel.passages(self, texts), strict=True
        )
        return [unit_length(said + 0.2 * own) for said, own in near]


def unit_length(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


async def planned_rows(db: Database, tenant: uuid.UUID, key: str, embedded: bool = True) -> int:
    """The planner's count of a conversation's messages (its embedded ones, as searched)."""
    vectors = " AND embedding_half IS NOT NULL" if embedded else ""
    async with db.system() as session:
        plan = await session.execute(
            text(
                "EXPLAIN (FORMAT JSON) SELECT seq FROM messages"
                f" WHERE tenant_id = :t AND conversation_key = :k{vectors}"
            ),
            {"t": tenant, "k": key},
        )
        return int(plan.scalar_one()[0]["Plan"]["Plan Rows"])


async def bulk_messages(
    db: Database, tenant: uuid.UUID, group: str, n: int, vector: np.ndarray
) -> None:
    """``n`` embedded messages of a group, written at once by SQL (one vector for all)."""
    async with db.system() as session:
        await session.execute(
            text(
                "INSERT INTO messages (tenant_id, conversation_key, message_id, request_type,"
                " group_id, sender_id, text, sent_at, embedding)"
                " SELECT :t, :k, 'm' || n, 'group', :g, 'u' || n % 50, 'line ' || n,"
                " CAST(:start AS timestamptz) + n * interval '1 minute',"
                " CAST(:vector AS vector) FROM generate_series(1, :n) n"
            ),
            {
                "t": tenant,
                "k": f"g:{group}",
                "g": group,
                "n": n,
                "start": START,
                "vector": str(vector.tolist()),
            },
        )


async def test_a_backlog_embedded_in_bulk_is_searched_on_statistics_that_count_it(
    db: Database,
) -> None:
    """A group's history of 4,000 messages is posted to a new service and embedded by the
    background job; the group asks at once, before autovacuum's round. The planner must
    count the conversation: estimated at one row (the fresh table's statistics), each search
    joined nested loops over all of it, 1.5–3.5 s a search. Then months of small batches
    (300 jobs of 20 messages) are embedded: the table is analyzed as autovacuum would, each
    time a tenth of it changed, not on every job. Then a second group's history of 1,500
    messages comes: the table's statistics, which knew one group, must count it too."""
    from service.messages.schemas import MessageBatch
    from service.messages.service import EMBED_JOB, Archivist, ingest
    from service.queue.repository import ClaimedJob
    from service.queue.worker import JobContext

    rng = np.random.default_rng(47)
    settings = Settings()
    tenant = await new_tenant_id(db, "backlog")
    async with db.system() as session:
        context = await tenant_context(session, tenant, Settings())
    model = SeededModel(unit(rng, 1)[0])
    archivist = Archivist(db, model, settings)  # type: ignore[arg-type]
    job = JobContext(
        ClaimedJob(tenant, 0, EMBED_JOB, {}, 1, 3, datetime.now(UTC)), db, "test-worker"
    )
    analyses: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().startswith("ANALYZE"):
            analyses.append(statement)

    async def post(group: str, first: int, n: int) -> None:
        batch = MessageBatch(
            request_type="group",
            group_id=group,
            messages=[
                {
                    "message_id": f"m{i}",
                    "sender_id": f"u{i % 37}",
                    "text": line(rng, i),
                    "sent_at": START + timedelta(minutes=i),
                }
                for i in range(first, first + n)
            ],
        )
        async with db.tenant(tenant) as session:
            await ingest(session, context, batch, settings)

    async def estimated(group: str) -> int:
        return await planned_rows(db, tenant, f"g:{group}")

    event.listen(db.engine.sync_engine, "before_cursor_execute", count)
    try:
        first = "历史%:群-.."
        for start in range(0, 4_000, 500):
            await post(first, start, 500)
        assert await archivist.run_embed(job) == {"embedded": 4_000}
        assert 2_000 <= await estimated(first) <= 8_000
        request = MessageSearch(query="西湖边划船", group_id=first, top_k=12)
        async with db.tenant(tenant) as session:
            found = await archive.search(session, context, request, model)  # type: ignore[arg-type]
        assert len(found.messages) == 12
        assert len(analyses) == 1

        analyses.clear()
        for n in range(300):
            await post(first, 4_000 + 20 * n, 20)
            assert await archivist.run_embed(job) == {"embedded": 20}
        # From 4,000 rows to 10,000, each row's insert and embedding two changes: one
        # analysis per 1,000 changes (a tenth of up to 10,000 rows), twelve by the rule; not
        # 300. Changes are reported by each backend a moment after its commit, so on a busy
        # machine some an analysis already saw are counted again after it: up to twice.
        assert len(analyses) <= 24, analyses

        second = "新群:2"
        for start in range(0, 1_500, 500):
            await post(second, start, 500)
        assert await archivist.run_embed(job) == {"embedded": 1_500}
        assert 750 <= await estimated(second) <= 3_000
        assert 8_000 <= await estimated(first) <= 20_000
        # Only the tables a job keeps: a name is spliced into the statement.
        with pytest.raises(ValueError, match="not a table"):
            await statistics.analyze_outgrown(db, ["messages; DROP TABLE events"], 10**6)
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", count)


async def test_a_new_tenants_history_in_a_table_of_others_is_counted_by_the_planner(
    db: Database,
) -> None:
    """A service already holds 120,000 messages of another tenant, analyzed. A new tenant's
    bot brings a group's history of 4,000 messages: a few percent of the table, under
    autovacuum's tenth, so the table's statistics, which had never seen the tenant, counted
    its group at four rows, and each search would join nested loops over all of it. The job
    that embeds them sees that the planner miscounts the group it wrote and analyzes the
    table; analyzed, the tenant and the group are counted together (130 rows before, as the
    product of the tenant's share and the group's); the other tenant's group is still
    counted."""
    from service.messages.schemas import MessageBatch
    from service.messages.service import EMBED_JOB, Archivist, ingest
    from service.queue.repository import ClaimedJob
    from service.queue.worker import JobContext

    rng = np.random.default_rng(53)
    settings = Settings()
    other = await new_tenant_id(db, "incumbent")
    tenant = await new_tenant_id(db, "newcomer")
    await bulk_messages(db, other, "old", 120_000, unit(rng, 1)[0])
    async with db.system() as session:
        await session.execute(text("ANALYZE messages"))
    async with db.system() as session:
        context = await tenant_context(session, tenant, Settings())
    model = SeededModel(unit(rng, 1)[0])
    archivist = Archivist(db, model, settings)  # type: ignore[arg-type]
    job = JobContext(
        ClaimedJob(tenant, 0, EMBED_JOB, {}, 1, 3, datetime.now(UTC)), db, "test-worker"
    )
    for start in range(0, 4_000, 500):
        batch = MessageBatch(
            request_type="group",
            group_id="新来的群",
            messages=[
                {
                    "message_id": f"m{i}",
                    "sender_id": f"u{i % 37}",
                    "text": line(rng, i),
                    "sent_at": START + timedelta(minutes=i),
                }
                for i in range(start, start + 500)
            ],
        )
        async with db.tenant(tenant) as session:
            await ingest(session, context, batch, settings)
    assert await archivist.run_embed(job) == {"embedded": 4_000}

    assert 2_000 <= await planned_rows(db, tenant, "g:新来的群") <= 8_000
    assert 60_000 <= await planned_rows(db, other, "g:old", embedded=False) <= 240_000


async def test_statistics_refreshed_while_another_analysis_runs_still_count_the_rows(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Autovacuum started analyzing the table while a backlog was being embedded (its
    sample taken before the vectors committed); the job's own analysis was skipped as
    already done (``SKIP_LOCKED``), and the group was counted at one embedded row. The job
    now waits for the running analysis and makes its own, but not for long."""
    tenant = await new_tenant_id(db, "waits")
    rng = np.random.default_rng(59)
    async with db.system() as session:
        await session.execute(text("ANALYZE messages"))  # knows the table empty
    await bulk_messages(db, tenant, "g", 3_000, unit(rng, 1)[0])
    async with db.engine.connect() as holder:
        # What a running analysis holds: another one waits for it or, skipping, does nothing.
        await holder.execute(text("LOCK TABLE messages IN SHARE UPDATE EXCLUSIVE MODE"))
        refresh = asyncio.create_task(
            statistics.analyze_outgrown(db, ["messages"], 3_000, {(tenant, "g:g"): 3_000})
        )
        await asyncio.sleep(1.0)
        assert not refresh.done()
        await holder.rollback()
    assert await refresh == ["messages"]

    # Work that holds the table for long (a VACUUM, an index built concurrently) is not
    # waited for: the job goes on, and autovacuum analyzes the table after it.
    monkeypatch.setattr(statistics, "LOCK_WAIT_MS", 300)
    async with db.engine.connect() as holder:
        await holder.execute(text("LOCK TABLE messages IN SHARE UPDATE EXCLUSIVE MODE"))
        waited = asyncio.get_running_loop().time()
        skipped = await statistics.analyze_outgrown(
            db, ["messages"], 3_000, {(tenant, "g:g"): 3_000}
        )
        waited = asyncio.get_running_loop().time() - waited
        await holder.rollback()
    assert skipped == [] and waited < 5
    assert 1_500 <= await planned_rows(db, tenant, "g:g") <= 6_000


async def test_a_flood_in_a_big_group_leaves_the_asked_words_of_others_found(
    db: Database,
) -> None:
    """A group of 8,001 messages (big enough that a term's matches are sampled through the
    index, at most 2,000): a spammer sends an ad naming 王芳 3,000 times over three days,
    each copy varied (digits, emoji, spacing, zero-width characters: ``varied``), a member
    says one line naming her, another member forwards the ad once. Asked the name (meaning
    says nothing: an unrelated query vector), the archive shows the member's line and the
    forward. Before, the ad's copies filled the sample and the line was
    not found. The spammer's copies are each kept with their vector; one a day is indexed
    for its words, the latest, and a search over the third day alone finds it there by its
    words. A member's line said ten times is left as it is; the eleventh makes it a flood,
    however each copy is varied."""
    from service.messages.schemas import MessageBatch
    from service.messages.service import EMBED_JOB, Archivist, ingest
    from service.queue.repository import ClaimedJob
    from service.queue.worker import JobContext

    rng = np.random.default_rng(48)
    settings = Settings()
    tenant = await new_tenant_id(db, "big-flood")
    async with db.system() as session:
        context = await tenant_context(session, tenant, Settings())
    group, ad, line_of_hers = "flood%:big", "王芳 买车找我", "王芳明天去杭州出差"
    said = [("ads", varied(ad, n)) for n in range(3_000)] + [("m01", line_of_hers), ("m02", ad)]
    said += [(f"m{n % 30:02d}", line(rng, n)) for n in range(4_999)]
    said = [said[n] for n in rng.permutation(len(said))]
    # Three days, in order; the spammer's copies spread over all three.
    times = [START + timedelta(seconds=30 * n) for n in range(len(said))]
    model = ShapeModel(unit(rng, 1)[0])  # its query vector is unrelated to every text
    for start in range(0, len(said), 500):
        batch = MessageBatch(
            request_type="group",
            group_id=group,
            messages=[
                {"message_id": f"m{n}", "sender_id": who, "text": body, "sent_at": times[n]}
                for n, (who, body) in enumerate(said[start : start + 500], start=start)
            ],
        )
        async with db.tenant(tenant) as session:
            await ingest(session, context, batch, settings)
    archivist = Archivist(db, model, settings)  # type: ignore[arg-type]
    job = JobContext(ClaimedJob(tenant, 0, EMBED_JOB, {}, 1, 3, datetime.now(UTC)), db, "w")
    assert await archivist.run_embed(job) == {"embedded": len(said)}

    async with db.tenant(tenant) as session:
        request = MessageSearch(query="王芳", group_id=group, top_k=12)
        hits = (await archive.search(session, context, request, model)).messages  # type: ignore[arg-type]
    shown = [(hit.sender_id, hit.text) for hit in hits]
    assert ("m01", line_of_hers) in shown and ("m02", ad) in shown, shown
    # Copies told apart by their numbers are each shown as its own (one digit apart is
    # another fact to the results), so here the ad may come more than once a day.
    assert len(shown) == 12, shown

    days = {(START + timedelta(seconds=30 * n)).date() for n, s in enumerate(said) if s[0] == "ads"}
    assert len(days) == 3
    async with db.system() as session:
        indexed, embedded = (
            await session.execute(
                text(
                    "SELECT count(*) FILTER (WHERE length(lexical) > 0),"
                    " count(*) FILTER (WHERE embedding IS NOT NULL) FROM messages"
                    " WHERE tenant_id = :t AND sender_id = 'ads'"
                ),
                {"t": tenant},
            )
        ).one()
    assert (indexed, embedded) == (3, 3_000)
    # The latest copy of each day is the one indexed, and stays so when a batch is sent
    # again (its messages are stored already: nothing moves).
    latest = text(
        "SELECT DISTINCT ON (CAST(sent_at AS date)) length(lexical) > 0 FROM messages"
        " WHERE tenant_id = :t AND sender_id = 'ads' ORDER BY CAST(sent_at AS date), seq DESC"
    )
    async with db.tenant(tenant) as session:
        await ingest(session, context, batch, settings)
    async with db.system() as session:
        assert list((await session.execute(latest, {"t": tenant})).scalars()) == [True] * 3

    third = min(days) + timedelta(days=2)
    async with db.tenant(tenant) as session:
        request = MessageSearch(
            query="王芳",
            group_id=group,
            top_k=5,
            time_from=datetime.combine(third, datetime.min.time(), UTC),
            time_to=datetime.combine(third, datetime.max.time(), UTC),
        )
        hits = (await archive.search(session, context, request, model)).messages  # type: ignore[arg-type]
    assert "ads" in [hit.sender_id for hit in hits]
    assert all(hit.sent_at.date() == third for hit in hits)

    # A line said a few times a day is left as it is; past ten times lately, a flood.
    async def say(n: int, first: int) -> int:
        batch = MessageBatch(
            request_type="group",
            group_id=group,
            messages=[
                {
                    "message_id": f"ack{i}",
                    "sender_id": "m03",
                    "text": varied("收到 收到", i),
                    "sent_at": times[-1] + timedelta(seconds=i + 1),
                }
                for i in range(first, first + n)
            ],
        )
        async with db.tenant(tenant) as session:
            await ingest(session, context, batch, settings)
        async with db.system() as session:
            indexed = text(
                "SELECT count(*) FROM messages WHERE tenant_id = :t AND sender_id = 'm03'"
                " AND message_id LIKE 'ack%' AND length(lexical) > 0"
            )
            return int((await session.execute(indexed, {"t": tenant})).scalar_one())

    assert await say(10, 0) == 10
    assert await say(1, 10) == 1


# Where 王芳 herself talks, in ``among_talk``.
HERS = ("王芳明天去杭州出差", "王芳说杭州下雨了", "王芳从杭州回来了")


def among_talk(
    rng: np.random.Generator, spam: list[tuple[str, str]], talk: int
) -> list[tuple[str, str]]:
    """What a group said (sender, text): the ``spam`` shuffled among ``talk`` lines of 30
    members, and 王芳's three lines (``HERS``, said by m01) first, midway and last."""
    said = spam + [(f"m{n % 30:02d}", line(rng, n)) for n in range(talk)]
    said = [said[n] for n in rng.permutation(len(said))]
    for at, body in zip((0, len(said) // 2 + 1, len(said) + 2), HERS, strict=True):
        said.insert(at, ("m01", body))
    return said


async def events_indexed(db: Database, tenant: uuid.UUID, senders: str) -> tuple[int, int, int]:
    """Of the events of the ``senders`` (a LIKE pattern), how many are indexed for words, how
    many are in the nearest events' scan, and how many keep their vector."""
    counts = text(
        "SELECT count(*) FILTER (WHERE length(e.lexical) > 0), count(v.event_id),"
        " count(e.embedding) FROM events e"
        " LEFT JOIN event_vectors v ON v.tenant_id = e.tenant_id AND v.event_id = e.id"
        " WHERE e.tenant_id = :t AND e.sender_id LIKE :senders"
    )
    async with db.system() as session:
        found = (await session.execute(counts, {"t": tenant, "senders": senders})).one()
    return found[0], found[1], found[2]


async def told_by_the_historian(
    db: Database,
    tenant: uuid.UUID,
    group: str,
    said: list[tuple[str, str]],
    seconds: int,
    vector: Callable[[int, str], np.ndarray],
) -> list[dict[str, Any]]:
    """Events of what was ``said`` in ``group`` (sender, text), ``seconds`` apart from
    ``START``, the n-th with ``vector(n, sender)``, written as the historian's jobs write
    them, a few at a time; the rows written."""
    from service.events import service as event_service

    rows = [
        {
            **event_row(
                tenant,
                f"e:{n}/%",
                f"g:{group}",
                START + timedelta(seconds=seconds * n),
                vector(n, who),
            ),
            "text": body,
            "sender_id": who,
        }
        for n, (who, body) in enumerate(said)
    ]
    for start in range(0, len(rows), 50):
        async with db.tenant(tenant) as session:
            await event_service.store(session, rows[start : start + 50])
    return rows


async def events_shown(
    db: Database, tenant: uuid.UUID, group: str, asked: str, vector: np.ndarray
) -> list[tuple[str | None, str]]:
    """Who said what among the top 10 the event search shows for ``asked`` in ``group``, the
    question embedded as ``vector``."""
    from service.recall.schemas import EventSearch
    from service.recall.service import Reader

    async with db.system() as session:
        context = await tenant_context(session, tenant, Settings())
    reader = Reader(FixedModel(vector), None, db)  # type: ignore[arg-type]
    async with db.tenant(tenant, read_only=True) as session:
        request = EventSearch(query=asked, group_id=group, top_k=10)
        found = (await reader.search_events(session, context, request)).events
    return [(e.sender_id, e.text) for e in found]


async def test_a_flood_of_events_leaves_the_asked_words_of_others_found(db: Database) -> None:
    """The historian writes a group's events a job at a time: 8,003 of them over three days,
    3,000 an ad naming 王芳 (a bot that notes every line it sees), each copy varied as a
    spammer varies them (``varied``), three where 王芳 herself talks, first, midway and last,
    and one member's forward of the ad. Asked the name
    (meaning says nothing: an unrelated query vector), the event search shows her three
    lines, the ad once a day and the forward. Before, the ad's copies filled the look-up of the
    name's matches (at most 2,000, read by time or as stored) and one of hers was always
    left out. Every copy keeps its vector; one a day is indexed for words and searched by
    meaning, the latest, and stays so when a job is run again. A line told ten times is left as it is; the eleventh,
    varied, makes it a flood."""
    from service.events import service as event_service

    rng = np.random.default_rng(49)
    tenant = await new_tenant_id(db, "event-flood")
    group, ad = "flood%:events", "王芳 买车找我"
    spam = [("ads", varied(ad, n)) for n in range(3_000)] + [("m02", ad)]
    said = among_talk(rng, spam, 4_999)
    ad_vector, query = unit(rng, 2)
    vectors = unit(rng, len(said))
    rows = await told_by_the_historian(
        db, tenant, group, said, 30, lambda n, who: ad_vector if who == "ads" else vectors[n]
    )
    async with db.system() as session:
        await session.execute(text("ANALYZE events"))  # as a big table is, at rest

    found = await events_shown(db, tenant, group, "王芳", query)
    assert all(("m01", body) in found for body in HERS) and ("m02", ad) in found, found
    # Once a day: each day's is another occasion.
    assert [who for who, _ in found].count("ads") == 3, found

    latest = text(
        "SELECT DISTINCT ON (CAST(occurred_at AS date)) length(lexical) > 0 FROM events"
        " WHERE tenant_id = :t AND sender_id = 'ads' ORDER BY CAST(occurred_at AS date),"
        " occurred_at DESC"
    )
    async with db.system() as session:
        assert list((await session.execute(latest, {"t": tenant})).scalars()) == [True] * 3
    assert await events_indexed(db, tenant, "ads") == (3, 3, 3_000)
    # A job run again writes its events again: the same one a day stays indexed.
    last_ads = [n for n, (who, _) in enumerate(said) if who == "ads"][-60:]
    async with db.tenant(tenant) as session:
        await event_service.store(session, [rows[n] for n in last_ads])
    async with db.system() as session:
        assert list((await session.execute(latest, {"t": tenant})).scalars()) == [True] * 3
    assert await events_indexed(db, tenant, "ads") == (3, 3, 3_000)

    # Ten copies of a line are ten occasions; the eleventh makes it a flood.
    async def tell(n: int, first: int) -> int:
        acks = [
            {
                **event_row(
                    tenant,
                    f"ack:{i}",
                    f"g:{group}",
                    START + timedelta(seconds=30 * len(said) + i),
                    ad_vector,
                ),
                "text": varied("收到 收到", i),
                "sender_id": "m03",
            }
            for i in range(first, first + n)
        ]
        async with db.tenant(tenant) as session:
            await event_service.store(session, acks)
        async with db.system() as session:
            indexed = text(
                "SELECT count(*) FROM events WHERE tenant_id = :t AND sender_id = 'm03'"
                " AND id LIKE 'ack:%' AND length(lexical) > 0"
            )
            return int((await session.execute(indexed, {"t": tenant})).scalar_one())

    assert await tell(10, 0) == 10
    assert await tell(1, 10) == 1


async def test_a_bot_farms_ad_is_one_statement_and_hides_no_one_elses_words(
    db: Database,
) -> None:
    """300 accounts of a bot farm send one ad naming 王芳 ten times each over a day and a half
    (no account a flood by itself), each copy varied (``varied``), among 2,000 lines of the
    group's members and three where 王芳 herself talks. Asked the name, the event search
    shows her three lines, whether meaning says nothing (an unrelated query vector) or points
    at the ad (its vector); before, the accounts' copies filled the results. Every copy keeps
    its vector; two a day are indexed for words and searched by meaning, the first and the
    latest. Where meaning points at the ad, the other members' nearest lines fill the ten
    results: before, the ad's 3,000 copies filled the nearest and 7 events were shown."""

    rng = np.random.default_rng(50)
    tenant = await new_tenant_id(db, "bot-farm")
    group, ad = "farm%3A:events", "王芳 买车找我"
    said = among_talk(
        rng, [(f"bot:{n % 300}/%", varied(ad, n // 300)) for n in range(3_000)], 2_000
    )
    ad_vector, query = unit(rng, 2)
    vectors = unit(rng, len(said))
    await told_by_the_historian(
        db,
        tenant,
        group,
        said,
        25,
        lambda n, who: ad_vector if who.startswith("bot:") else vectors[n],
    )

    assert await events_indexed(db, tenant, "bot:%") == (4, 4, 3_000)
    for vector in (query, ad_vector):
        found = await events_shown(db, tenant, group, "王芳", vector)
        assert all(("m01", body) in found for body in HERS), found
        # Once or twice a day (the copy ranked first, and the latest): two days.
        assert 1 <= sum(who.startswith("bot:") for who, _ in found) <= 4, found
        assert len(found) == 10, found
    # The nearest others, by meaning alone: the ad's copies took no place of theirs.
    nearest = sorted(
        (float(vectors[n] @ ad_vector), n) for n, (who, _) in enumerate(said) if who[0] == "m"
    )[-2:]
    for _, n in nearest:
        assert said[n] in found, (said[n], found)


async def test_a_bot_farms_ad_in_the_archive_hides_no_one_elses_words(db: Database) -> None:
    """The archive's side of a bot farm: 300 accounts send one ad naming 王芳 ten times each
    in a day, each copy varied (``varied``) and so at its own distance, among 2,000 messages
    of the group. Asked the name, the search shows her line, and the ad at most twice. Two
    copies of the ad are indexed for words and searched by meaning, the first and the
    latest; each keeps its vector. Where meaning points at the ad, the other members'
    nearest messages are shown: before, the ad's copies filled the nearest, and ten
    messages were shown, the ad's neighbours rather than the nearest. Ten members saying
    "我也去" stay ten statements, each indexed; an eleventh member makes the words a chorus.
    Eleven accounts echoing her next line do not take it over: it is still shown as hers."""
    from service.messages.schemas import MessageBatch
    from service.messages.service import EMBED_JOB, Archivist, ingest
    from service.queue.repository import ClaimedJob
    from service.queue.worker import JobContext

    rng = np.random.default_rng(51)
    settings = Settings()
    tenant = await new_tenant_id(db, "archive-farm")
    async with db.system() as session:
        context = await tenant_context(session, tenant, Settings())
    group, ad, hers = "farm%2F:archive", "王芳 买车找我", "王芳明天去杭州出差"
    said = [(f"bot:{n % 300}%2F", varied(ad, n // 300)) for n in range(3_000)]
    said += [(f"m{n % 30:02d}", line(rng, n)) for n in range(2_000)] + [("m01", hers)]
    said = [said[n] for n in rng.permutation(len(said))]
    times = [START + timedelta(seconds=15 * n) for n in range(len(said))]  # one day
    model = NearShapeModel(unit(rng, 1)[0])

    async def ingest_said(said: list[tuple[str, str]], first: int, times: list[datetime]) -> None:
        for start in range(0, len(said), 500):
            batch = MessageBatch(
                request_type="group",
                group_id=group,
                messages=[
                    {"message_id": f"m{n}", "sender_id": who, "text": body, "sent_at": at}
                    for n, (who, body), at in zip(
                        range(first + start, first + len(said)),
                        said[start : start + 500],
                        times[start : start + 500],
                        strict=False,
                    )
                ],
            )
            async with db.tenant(tenant) as session:
                await ingest(session, context, batch, settings)

    await ingest_said(said, 0, times)
    archivist = Archivist(db, model, settings)  # type: ignore[arg-type]
    job = JobContext(ClaimedJob(tenant, 0, EMBED_JOB, {}, 1, 3, datetime.now(UTC)), db, "w")
    assert await archivist.run_embed(job) == {"embedded": len(said)}

    # Meaning says nothing (an unrelated query vector), or points at the ad (its statement's).
    ad_meaning = (await ShapeModel(model.vector).passages([ad]))[0]
    for asking in (model, FixedModel(ad_meaning)):
        request = MessageSearch(query="王芳", group_id=group, top_k=10)
        async with db.tenant(tenant) as session:
            hits = (await archive.search(session, context, request, asking)).messages  # type: ignore[arg-type]
        shown = [(hit.sender_id, hit.text) for hit in hits]
        assert ("m01", hers) in shown, shown
        assert 1 <= sum(who.startswith("bot:") for who, _ in shown) <= 2, shown
        assert len(shown) == 10, shown
    # The nearest others, by meaning alone: the ad's copies took no place of theirs.
    others = [(who, body) for who, body in said if who[0] == "m"]
    meanings = await model.passages([body for _, body in others])
    for _, nearest in sorted(zip((v @ ad_meaning for v in meanings), others, strict=True))[-3:]:
        assert nearest in shown, (nearest, shown)

    counts = text(
        "SELECT count(*) FILTER (WHERE length(lexical) > 0), count(*) FILTER (WHERE NOT"
        " flood_copy), count(*) FILTER (WHERE embedding IS NOT NULL) FROM messages"
        " WHERE tenant_id = :t AND sender_id LIKE 'bot:%'"
    )
    async with db.system() as session:
        assert tuple((await session.execute(counts, {"t": tenant})).one()) == (2, 2, 3_000)

    # Ten members' "我也去" are ten statements; an eleventh member's makes them a chorus.
    async def joined(said: list[tuple[str, str]], first: int, pattern: str) -> int:
        later = [times[-1] + timedelta(seconds=n + 1) for n in range(first, first + len(said))]
        await ingest_said(said, 10_000 + first, later)
        async with db.system() as session:
            indexed = text(
                "SELECT count(*) FROM messages WHERE tenant_id = :t AND sender_id LIKE :p"
                " AND length(lexical) > 0"
            )
            return int((await session.execute(indexed, {"t": tenant, "p": pattern})).scalar_one())

    going = [(f"j{n}", varied("我也去", n)) for n in range(11)]
    assert await joined(going[:10], 0, "j%") == 10
    assert await joined(going[10:], 10, "j%") == 2
    # Her next line, echoed by eleven accounts at once: hers is the first, and stays shown.
    news = "王芳下周二回上海"
    echoes = [(f"p{n}:%", varied(news, n)) for n in range(11)]
    assert await joined([("m01", news), *echoes], 11, "p%") == 1
    request = MessageSearch(query="王芳 上海", group_id=group, top_k=10)
    async with db.tenant(tenant) as session:
        hits = (await archive.search(session, context, request, model)).messages  # type: ignore[arg-type]
    shown = [(hit.sender_id, hit.text) for hit in hits]
    assert ("m01", news) in shown, shown
