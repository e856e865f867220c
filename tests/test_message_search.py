"""Hybrid search of the message archive: words and meaning, hard filters, no duplicates."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from alembic import command

from service.app import create_app
from service.db.migrate import alembic_config
from service.embedding import calibration
from service.messages.repository import CandidateRow, Candidates
from service.messages.search import rank_candidates, stream_of
from service.retrieval.neighbours import StreamPassage, score_stream
from service.retrieval.terms import terms
from service.settings import EmbeddingModelSettings, QuerySettings, Settings
from tests.conftest import (
    FAST_QUEUE,
    AppClient,
    DatabaseFactory,
    TenantHandle,
    make_settings,
    new_tenant,
    raw_connection,
    serve_app,
    wait_for,
)

GROUP = {"request_type": "group", "group_id": "g1", "timezone": "Asia/Shanghai"}
QUIET = {"every_n_messages": 10_000, "pause_minutes": 600.0, "remember_keywords": []}


def messages(lines: list[tuple[str, str]], day: str = "2026-03-01") -> list[dict[str, Any]]:
    return [
        {
            "message_id": f"m{n}",
            "sender_id": sender.lower(),
            "sender_name": sender,
            "text": text,
            "sent_at": f"{day}T10:{n:02d}:00",
        }
        for n, (sender, text) in enumerate(lines)
    ]


async def search(client: AppClient, tenant: TenantHandle, **body: Any) -> list[dict[str, Any]]:
    response = await client.post(
        "/v1/messages/search", json={"group_id": "g1", **body}, headers=tenant.headers
    )
    assert response.status_code == 200, response.text
    return list(response.json()["messages"])


@pytest.fixture
async def words_only(db_url: str) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    """The app without a worker: nothing is embedded, so only the words can find a message."""
    settings = make_settings(db_url, cognitive={"extraction": QUIET})
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        yield client, await new_tenant(client)


@pytest.fixture
async def embedded(db_url: str) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    """The app with its worker: messages are embedded in the background."""
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE, "extraction": QUIET})
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        yield client, await new_tenant(client)


async def store(client: AppClient, tenant: TenantHandle, batch: dict[str, Any]) -> None:
    response = await client.post("/v1/messages", json=batch, headers=tenant.headers)
    assert response.status_code == 202, response.text


async def all_embedded(db_url: str) -> bool:
    async with raw_connection(db_url) as conn:
        return bool(
            await conn.fetchval("SELECT count(*) = 0 FROM messages WHERE embedding IS NULL")
        )


CHAT = [
    ("阿明", "周末大家想去哪里玩？"),
    ("小红", "我想去杭州西湖划船"),
    ("老王", "上次去黄山爬山累坏了"),
    ("阿明", "听说苏州园林很漂亮"),
    ("小红", "我最近在学做红烧肉"),
    ("老王", "有人推荐好看的科幻电影吗"),
    ("Anna", "I painted a sunset over the lake last weekend"),
    ("Ben", "Nice, I went running by the river"),
    ("Anna", "Next time let's bring the kids"),
    ("老王", "下周要交季度报告，好忙"),
]


async def test_a_chinese_word_finds_an_unsegmented_sentence(
    words_only: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = words_only
    await store(client, tenant, {**GROUP, "messages": messages(CHAT)})
    hits = await search(client, tenant, query="西湖", top_k=3)
    assert hits[0]["message_id"] == "m1"
    assert hits[0]["sender_name"] == "小红"
    # A word that appears nowhere finds nothing by its words.
    assert await search(client, tenant, query="故宫") == []


async def test_english_words_match_across_inflections(
    words_only: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = words_only
    await store(client, tenant, {**GROUP, "messages": messages(CHAT)})
    assert (await search(client, tenant, query="Who paints sunsets?"))[0]["message_id"] == "m6"
    assert (await search(client, tenant, query="RUNS"))[0]["message_id"] == "m7"


async def test_time_range_is_a_hard_filter(words_only: tuple[AppClient, TenantHandle]) -> None:
    client, tenant = words_only
    await store(client, tenant, {**GROUP, "messages": messages(CHAT)})
    later = [{**m, "message_id": f"later-{m['message_id']}"} for m in messages(CHAT, "2026-03-08")]
    await store(client, tenant, {**GROUP, "messages": later})
    hits = await search(
        client,
        tenant,
        query="西湖划船",
        time_from="2026-03-08T00:00:00+08:00",
        time_to="2026-03-08T23:59:59+08:00",
        top_k=50,
    )
    assert hits and hits[0]["message_id"] == "later-m1"
    # Neighbours of a match are ranked too, but never from outside the range.
    assert all(h["message_id"].startswith("later-") for h in hits)
    early = await search(client, tenant, query="西湖", time_to="2026-03-01T10:01:00+08:00")
    assert {h["message_id"] for h in early} <= {"m0", "m1"}
    assert early[0]["message_id"] == "m1"


async def test_another_conversation_is_never_returned(
    words_only: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = words_only
    await store(client, tenant, {**GROUP, "messages": messages(CHAT)})
    other = [{**m, "message_id": f"other-{m['message_id']}"} for m in messages(CHAT)]
    await store(client, tenant, {**GROUP, "group_id": "g2", "messages": other})
    await store(
        client,
        tenant,
        {"request_type": "private", "user_id": "u9", "messages": messages(CHAT[:3])},
    )
    for query in ("西湖", "sunset", "周末 西湖 黄山 苏州 红烧肉 电影 报告"):
        hits = await search(client, tenant, query=query, top_k=200)
        assert hits
        assert all(not h["message_id"].startswith("other-") for h in hits)
        assert len({h["message_id"] for h in hits}) == len(hits)
    stranger = await new_tenant(client, "stranger")
    assert await search(client, stranger, query="西湖") == []


async def test_meaning_finds_what_words_miss_and_duplicates_are_dropped(
    embedded: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    client, tenant = embedded
    chat = [*CHAT, ("小红", "我想去杭州西湖划船"), ("阿明", "好主意")]
    await store(client, tenant, {**GROUP, "messages": messages(chat)})
    await wait_for(lambda: all_embedded(db_url))
    hits = await search(client, tenant, query="谁想去西湖？", top_k=5)
    ids = [h["message_id"] for h in hits]
    # The same words by the same person twice: one result, not two.
    assert ids[0] in ("m1", "m10")
    assert not {"m1", "m10"} <= set(ids)
    assert hits == sorted(hits, key=lambda h: -h["score"])
    # No shared word with the query ("boat" / "lake"), found by meaning.
    meaning = await search(client, tenant, query="Who wants to go boating on a lake?", top_k=3)
    assert "m1" in {h["message_id"] for h in meaning} or "m10" in {h["message_id"] for h in meaning}


async def test_everyones_news_that_reads_alike_is_each_its_own_result(
    embedded: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    """The local model puts "bought a new TV" and "bought a new fridge" above 0.97: in a group
    where people's news reads alike, each is its own result, and so are the same words from
    two people; one person's repeat of the same words is one."""
    client, tenant = embedded
    bought = ["我在超市买了一台新电视", "我在超市买了一台新冰箱", "我在超市买了一台新洗衣机"]
    chat = [("小王", bought[0]), ("小李", bought[1]), ("小张", bought[2]), ("小赵", bought[0])]
    chat.append(("小王", bought[0] + "！"))
    await store(client, tenant, {**GROUP, "messages": messages(chat)})
    await wait_for(lambda: all_embedded(db_url))
    hits = await search(client, tenant, query="谁在超市买了东西？", top_k=6)
    told = sorted((h["sender_name"], h["text"].rstrip("！")) for h in hits)
    assert told == sorted(chat[:4])


# Six members each tell the group where their own event is; two of the places are the same.
EVENTS = [
    ("小王", "教育创新研讨会的地点是上海。"),
    ("小李", "快递技能提升行动的地点是上海。"),
    ("小张", "编程心得分享会的地点是上海。"),
    ("小赵", "海畔烧烤节的地点是山东青岛。"),
    ("小陈", "趣跑购物节的地点是上海。"),
    ("小周", "美食创新会的地点是上海。"),
    ("小王", "我今天中午吃了一碗牛肉面。"),
    ("小李", "教育创新研讨会的规模是一百人。"),
]


async def test_a_members_flood_hides_nothing_else_that_was_said(
    embedded: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    """One member sends the same ad two hundred times among the group's talk: asked about
    it, the ad comes once and the rest of the results are the other members' messages on
    the subject, which the ad's copies would otherwise fill both sides' candidates with."""
    client, tenant = embedded
    talk = [
        "买车还是租车划算？",
        "我新买了一辆车，开着很顺",
        "周末一起打羽毛球吧",
        "有人推荐科幻电影吗",
    ]
    rows = []
    for n in range(300):
        sender, said = ("ads", "买车找我，优惠多多") if n % 3 else (f"u{n % 20}", talk[n % 4])
        if sender != "ads":
            said = f"{said}（{n}）"
        rows.append(
            {
                "message_id": f"m{n}",
                "sender_id": sender,
                "sender_name": sender,
                "text": said,
                "sent_at": f"2026-03-01T{8 + n // 60:02d}:{n % 60:02d}:00",
            }
        )
    await store(client, tenant, {**GROUP, "messages": rows})
    await wait_for(lambda: all_embedded(db_url), timeout=120)
    hits = await search(client, tenant, query="买车优惠", top_k=10)
    assert len(hits) == 10
    assert [h["sender_id"] for h in hits].count("ads") == 1
    others = [h["text"] for h in hits if h["sender_id"] != "ads"]
    assert all("车" in said for said in others), others


async def test_in_a_group_the_askers_own_message_comes_first_among_alike_ones(
    embedded: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    """Asked in a group "the event in Shanghai, what is it?": each asker's own event first,
    though five members' read alike. A member named in the question is meant instead, a
    detail asked by its words still wins over the asker's unrelated chatter, and a private
    chat ranks as before."""
    client, tenant = embedded
    await store(client, tenant, {**GROUP, "messages": messages(EVENTS)})
    private = {"request_type": "private", "user_id": "小王", "timezone": "Asia/Shanghai"}
    await store(client, tenant, {**private, "messages": messages(EVENTS[:3])})
    await wait_for(lambda: all_embedded(db_url))
    query = "那个地点是上海的活动是什么？"

    def firsts(hits: list[dict[str, Any]]) -> str:
        return str(hits[0]["sender_name"])

    for asker in ("小王", "小李", "小张", "小陈", "小周"):
        hits = await search(client, tenant, query=query, asker_id=asker.lower(), top_k=3)
        assert firsts(hits) == asker, hits
    # Unknown, or not given: the ranking of the words and meaning alone.
    plain = await search(client, tenant, query=query, top_k=8)
    assert await search(client, tenant, query=query, asker_id="nobody", top_k=8) == plain
    # The question names a member: theirs, whoever asks.
    named = await search(client, tenant, query="小李说的那个上海的活动是什么？", asker_id="小王")
    assert firsts(named) == "小李"
    # The asker's own unrelated words do not outrank the asked detail.
    size = await search(client, tenant, query="教育创新研讨会的规模是多少人？", asker_id="小王")
    assert size[0]["text"] == "教育创新研讨会的规模是一百人。"
    # A private chat is a dialogue: who asks changes nothing there.
    found = []
    for asker in (None, "小王", "bot"):
        body = {"query": query, "user_id": "小王", "top_k": 3}
        response = await client.post(
            "/v1/messages/search",
            json={**body, **({"asker_id": asker} if asker else {})},
            headers=tenant.headers,
        )
        assert response.status_code == 200, response.text
        found.append(response.json()["messages"])
    assert found[0] == found[1] == found[2]


async def test_a_talkative_asker_does_not_bury_what_another_member_announced(
    embedded: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    """A group of 42 where the asker said 300 things about meals and weekends: asking where
    Saturday's dinner is finds the organiser's announcement, not the asker's own talk of
    dinners; asking their own birthday finds theirs among twenty members' birthdays."""
    client, tenant = embedded
    rng = np.random.default_rng(7)
    foods, places = ["火锅", "烤鸭", "面条", "寿司", "烧烤"], ["西湖", "外滩", "公园", "商场"]
    lines = [
        ("小王", f"今天晚饭吃了{rng.choice(foods)}，周末想去{rng.choice(places)}转转")
        for _ in range(300)
    ]
    lines += [(f"成员{n}", f"我的生日是{n % 12 + 1}月{n + 3}日") for n in range(20)]
    lines += [(f"成员{n}", f"最近在看一本关于{rng.choice(places)}的书") for n in range(20, 40)]
    lines.insert(150, ("小李", "周六晚上的聚餐定在楼外楼，六点见。"))
    lines.append(("小王", "我的生日是9月30日"))
    chat = messages(lines[:60]) + [
        {**m, "message_id": f"m{n + 60}", "sent_at": f"2026-03-0{2 + n // 60}T11:{n % 60:02d}:00"}
        for n, m in enumerate(messages(lines[60:]))
    ]
    for start in range(0, len(chat), 100):
        await store(client, tenant, {**GROUP, "messages": chat[start : start + 100]})
    await wait_for(lambda: all_embedded(db_url), timeout=120)
    dinner = await search(client, tenant, query="周六的聚餐在哪里？", asker_id="小王", top_k=5)
    assert dinner[0]["text"] == "周六晚上的聚餐定在楼外楼，六点见。"
    birthday = await search(client, tenant, query="我的生日是几号？", asker_id="小王", top_k=5)
    assert birthday[0]["text"] == "我的生日是9月30日"
    assert birthday[0]["sender_id"] == "小王"


async def test_a_question_naming_a_day_finds_what_was_said_that_day_on_the_callers_clocks(
    embedded: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    """Anna painted something on three days: asked what she painted on a named day, the
    search answers with that day's painting, the day read in the timezone given (default:
    the tenant's, Asia/Shanghai); an unknown timezone is refused by name."""
    client, tenant = embedded
    said = [
        ("2026-03-08T10:00:00Z", "Anna", "I painted a lighthouse by the harbour today"),
        ("2026-03-08T10:05:00Z", "Ben", "Lovely, I went running by the river"),
        ("2026-03-08T17:00:00Z", "Anna", "I painted a sunflower field tonight"),
        ("2026-03-08T17:04:00Z", "Ben", "You paint every day now!"),
        ("2026-03-10T10:00:00Z", "Anna", "I painted a snowy mountain this morning"),
        ("2026-03-10T10:03:00Z", "Ben", "Send me a photo of it"),
    ]
    chat = [
        {
            "message_id": f"d{n}",
            "sender_id": who.lower(),
            "sender_name": who,
            "text": text,
            "sent_at": at,
        }
        for n, (at, who, text) in enumerate(said)
    ]
    await store(client, tenant, {**GROUP, "messages": chat})
    await wait_for(lambda: all_embedded(db_url))
    # 17:00 UTC on the 8th is 01:00 on the 9th in Shanghai.
    for day, zone, painted in (
        ("9 March 2026", None, ("sunflower",)),
        ("March 9, 2026", "Asia/Shanghai", ("sunflower",)),
        ("2026年3月10日", "UTC", ("mountain",)),
        # Both of the 8th's paintings are on the 8th in New York.
        ("2026-03-08", "America/New_York", ("lighthouse", "sunflower")),
    ):
        where = {"timezone": zone} if zone else {}
        hits = await search(
            client, tenant, query=f"What did Anna paint on {day}?", top_k=3, **where
        )
        assert any(word in hits[0]["text"] for word in painted), (day, zone, hits)
    refused = await client.post(
        "/v1/messages/search",
        json={"group_id": "g1", "query": "on 9 March 2026", "timezone": "Mars/Olympus"},
        headers=tenant.headers,
    )
    assert refused.status_code in (400, 422) and "timezone" in refused.text


async def test_the_asker_is_matched_as_an_exact_id(
    words_only: tuple[AppClient, TenantHandle],
) -> None:
    """An asker id is compared whole, never as a pattern: "%" or "_" names no one else, ids
    with ":" work, and an id the archive could not hold is refused by name."""
    client, tenant = words_only
    lines = [(f"m{n}", "周末去西湖划船") for n in range(6)]
    chat = [
        {**m, "sender_id": sender, "sender_name": f"成员{n}"}
        for n, (m, sender) in enumerate(
            zip(messages(lines), ["a%b", "axb", "a_b", "qq:1", "qq:12", "QQ:1"], strict=True)
        )
    ]
    await store(client, tenant, {**GROUP, "messages": chat})
    for asker in ("a%b", "axb", "a_b", "qq:1", "qq:12", "QQ:1"):
        hits = await search(client, tenant, query="西湖划船", asker_id=asker, top_k=6)
        assert hits[0]["sender_id"] == asker
    for bad, reason in (("a/b", "asker_id"), ("x" * 129, "asker_id"), (["a"], "asker_id")):
        response = await client.post(
            "/v1/messages/search",
            json={"group_id": "g1", "query": "西湖", "asker_id": bad},
            headers=tenant.headers,
        )
        assert response.status_code in (400, 422) and reason in response.text, response.text


def test_recency_lifts_close_matches_only() -> None:
    """The design's decay on the fused score: a fresh close match gains, a weak one does not."""
    now = datetime(2026, 3, 1, tzinfo=UTC)
    settings = QuerySettings(
        time_decay_half_life_days_tool=14.0, time_decay_boost=0.2, time_decay_min_similarity=0.35
    )

    def row(seq: int, similarity: float, age_days: float) -> CandidateRow:
        return CandidateRow(
            seq=seq,
            candidate=True,
            message_id=f"m{seq}",
            sender_id=None,
            sender_name=None,
            sent_at=now - timedelta(days=age_days),
            similarity=similarity,
            bm25=0.0,
            terms=None,
            tfs=None,
            idfs=None,
        )

    # Far apart in time, so no neighbourhood: each scores on its own similarity.
    rows = Candidates.of(
        [row(1, 0.8, 140.0), row(2, 0.8, 14.0), row(3, 0.3, 0.0), row(4, 0.2, 140.0)]
    )
    off = settings.model_copy(update={"time_decay_enabled": False})
    plain = {seq: score for seq, score, _ in rank_candidates(rows, "q", off, now)}
    ranked = {seq: score for seq, score, _ in rank_candidates(rows, "q", settings, now)}
    # Relevance scaled onto the candidates: the best 1, the worst 0.
    assert plain[1] == plain[2] == 1.0 and plain[4] == 0.0 and 0 < plain[3] < 1
    # One half-life old: x (1 + 0.2 * 0.5); ten half-lives: almost nothing.
    assert ranked[2] == pytest.approx(1.1)
    assert ranked[1] == pytest.approx(1 + 0.2 * 0.5**10)
    # Below the similarity threshold, fresh or not: unchanged.
    assert ranked[3] == pytest.approx(plain[3])
    assert [seq for seq, _, _ in rank_candidates(rows, "q", settings, now)] == [2, 1, 3, 4]
    # e5's cosines: a fresh unrelated line (0.84) is not lifted above an older answer (0.87).
    e5 = calibration(EmbeddingModelSettings())
    lines = Candidates.of([row(1, 0.87, 140.0), row(2, 0.84, 0.0), row(3, 0.5, 140.0)])
    assert next(seq for seq, _, _ in rank_candidates(lines, "q", settings, now)) == 2
    assert next(seq for seq, _, _ in rank_candidates(lines, "q", settings, now, e5)) == 1


async def test_a_text_rewritten_in_place_is_searched_as_rewritten(
    embedded: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    """A redaction (text replaced, vector and terms cleared) leaves no old word findable;
    the next embedding pass makes the new text searchable."""
    client, tenant = embedded
    await store(client, tenant, {**GROUP, "messages": messages(CHAT)})
    await wait_for(lambda: all_embedded(db_url))
    async with raw_connection(db_url) as conn:
        await conn.execute(
            "UPDATE messages SET text = '我想去[已删除]划船', embedding = NULL,"
            " lexical = ''::tsvector WHERE message_id = 'm1'"
        )
    # Still there as a neighbour of others, but no longer found by its old words.
    assert (await search(client, tenant, query="杭州西湖"))[0]["message_id"] != "m1"
    later = {**messages([("阿明", "好的")], "2026-03-02")[0], "message_id": "m99"}
    await store(client, tenant, {**GROUP, "messages": [later]})
    await wait_for(lambda: all_embedded(db_url))
    hits = await search(client, tenant, query="已删除", top_k=3)
    assert hits[0]["message_id"] == "m1" and hits[0]["text"] == "我想去[已删除]划船"


async def test_the_migration_segments_existing_messages(databases: DatabaseFactory) -> None:
    url = await databases.create_empty()
    config = alembic_config(url, Settings())
    await asyncio.to_thread(command.upgrade, config, "0003")
    tenant = uuid.uuid4()
    async with raw_connection(url) as conn:
        await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, 'old')", tenant)
        await conn.execute(
            "INSERT INTO messages (tenant_id, conversation_key, message_id, request_type,"
            " group_id, text, sent_at) VALUES ($1, 'g:g1', 'a', 'group', 'g1', $2, now()),"
            " ($1, 'g:g1', 'b', 'group', 'g1', $3, now())",
            tenant,
            "我想去杭州西湖划船",
            "She painted sunsets",
        )
        await conn.execute(
            "INSERT INTO conversations (tenant_id, conversation_key, request_type, group_id,"
            " message_count) VALUES ($1, 'g:g1', 'group', 'g1', 2)",
            tenant,
        )
        await asyncio.to_thread(command.upgrade, config, "head")
        found = await conn.fetch(
            "SELECT message_id FROM messages WHERE lexical @@ $1::tsquery ORDER BY 1",
            "'西湖' | 'paint'",
        )
        assert [r["message_id"] for r in found] == ["a", "b"]
        expected = len(set(terms("我想去杭州西湖划船"))) + len(set(terms("She painted sunsets")))
        assert await conn.fetchval("SELECT term_count FROM conversations") == expected


async def test_a_floods_stored_copies_leave_the_dense_search_on_upgrade(
    databases: DatabaseFactory,
) -> None:
    """A database of revision 0020 searched every copy of a flood by meaning. The upgrade
    marks the copies (words unindexed although they have some) and builds the dense search's
    covering index without them; a message without words ("👍") is searched still. The
    dense search reads the index alone (an index-only scan), as before."""
    from sqlalchemy import text as sql_text

    from service.db.engine import Database
    from service.messages.repository import _dense

    url = await databases.create_empty()
    config = alembic_config(url, Settings())
    await asyncio.to_thread(command.upgrade, config, "0020_event_term_rows")
    tenant = uuid.uuid4()
    said = [
        ("a", "我想去杭州西湖划船", "'西湖':1"),
        ("b/%:1", "王芳 买车找我", ""),
        ("c", "👍", ""),
    ]
    async with raw_connection(url) as conn:
        await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, 'old')", tenant)
        for message_id, body, lexical in said:
            await conn.execute(
                "INSERT INTO messages (tenant_id, conversation_key, message_id, request_type,"
                " group_id, text, sent_at, lexical, embedding) VALUES ($1, 'g:g1', $2, 'group',"
                " 'g1', $3, now(), $4::tsvector, $5::vector)",
                tenant,
                message_id,
                body,
                lexical,
                str([1.0] + [0.0] * 383),
            )
        await asyncio.to_thread(command.upgrade, config, "head")
        marked = await conn.fetch("SELECT message_id, flood_copy FROM messages ORDER BY 1")
        assert [tuple(r) for r in marked] == [("a", False), ("b/%:1", True), ("c", False)]
        db = Database(url, pool_size=1)
        try:
            async with db.system() as session:
                # (On Citus, on the shards too.)
                await session.execute(sql_text("SET LOCAL citus.propagate_set_commands = local"))
                await session.execute(sql_text("SET LOCAL enable_seqscan = off"))
                vector = np.array([1.0] + [0.0] * 383, dtype=np.float32)
                params = {
                    "tenant_id": tenant,
                    "conversation_key": "g:g1",
                    "query": vector,
                    "query_unit": vector,
                    "time_from": None,
                    "time_to": None,
                    "dense_pool": 10,
                }
                explain = sql_text("EXPLAIN (FORMAT JSON) " + _dense(False).text)
                plan = json.dumps((await session.execute(explain, params)).scalar_one())
        finally:
            await db.dispose()
        assert '"Index Only Scan"' in plan and '"ix_messages_vectors"' in plan, plan
        await asyncio.to_thread(command.downgrade, config, "0020_event_term_rows")
        columns = await conn.fetch(
            "SELECT 1 FROM information_schema.columns WHERE column_name = 'flood_copy'"
        )
        assert not columns


def test_the_ranking_reads_no_similarity_beyond_the_candidates_close_neighbours() -> None:
    """The search reads a neighbour's vector only within spread + similarity reach of a seed
    (the rest of a window counts its words): whatever the farther rows' similarity, the
    ranking is the same."""
    import random

    from service.messages.search import SEARCH_PLAN

    rng = random.Random(5)
    now = datetime(2026, 3, 1, tzinfo=UTC)
    seeds = (10, 25)
    near = SEARCH_PLAN.spread + SEARCH_PLAN.similarity_reach

    def rows(far_similarity: float | None) -> Candidates:
        out = []
        for seq in range(40):
            away = min(abs(seq - s) for s in seeds)
            similarity = 0.6 + 0.01 * ((seq * 7) % 30)
            if away > near:
                similarity = far_similarity if far_similarity is not None else rng.random()
            out.append(
                CandidateRow(
                    seq=seq,
                    candidate=away <= SEARCH_PLAN.spread,
                    message_id=f"m{seq}",
                    sender_id=str(seq % 2),
                    sender_name=f"成员{seq % 2}",
                    sent_at=now - timedelta(minutes=40 - seq),
                    similarity=similarity,
                    bm25=1.5 if seq in (11, 27) else 0.0,
                    terms=["西湖"] if seq in (11, 27, 30) else None,
                    tfs=[1] if seq in (11, 27, 30) else None,
                    idfs=[2.0] if seq in (11, 27, 30) else None,
                )
            )
        return Candidates.of(out)

    settings = QuerySettings()
    expected = rank_candidates(rows(0.0), "西湖", settings, now)
    assert len(expected) == 10
    for _ in range(5):
        ranked = rank_candidates(rows(None), "西湖", settings, now)
        # The same order and scores (to rounding: the windows are sums over the stream).
        assert [seq for seq, _, _ in ranked] == [seq for seq, _, _ in expected]
        assert [score for _, score, _ in ranked] == pytest.approx([s for _, s, _ in expected])


@pytest.mark.parametrize("senders", [2, 40])
def test_candidate_rows_are_read_as_the_passages_they_are(senders: int) -> None:
    # The rows of a big group's search are read column by column, not made into a passage
    # each: the scores are those of the passages, in a dialogue and in a many-sender group,
    # across pauses that end a sitting, for rows with and without the asked terms.
    rng = np.random.default_rng(senders)
    now = datetime(2026, 3, 1, tzinfo=UTC)
    rows, at = [], now - timedelta(days=30)
    for seq in range(600):
        at += timedelta(minutes=float(rng.choice([1, 3, 90])))
        held = [t for t in ("西湖", "划船", "周末") if rng.random() < 0.15] or None
        sender = int(rng.integers(senders))
        rows.append(
            CandidateRow(
                seq=seq,
                candidate=bool(rng.random() < 0.3),
                message_id=f"m{seq}",
                sender_id=f"u{sender}" if sender else None,
                sender_name=f"Member{sender}",
                sent_at=at,
                similarity=float(rng.uniform(0.6, 0.9)),
                bm25=float(rng.uniform(0, 4)) if held else 0.0,
                terms=held,
                tfs=[int(rng.integers(1, 3)) for _ in held] if held else None,
                idfs=[{"西湖": 2.0, "划船": 3.0, "周末": 0.5}[t] for t in held] if held else None,
            )
        )
    query = "Did Member1 go 划船 on 西湖 that 周末?"
    stream, idfs = stream_of(Candidates.of(rows), query, "u1")
    passages = [
        StreamPassage(
            similarity=r.similarity,
            bm25=r.bm25,
            term_counts=dict(zip(r.terms or [], r.tfs or [], strict=True)),
            speaker_named=r.sender_name == "Member1",
            candidate=r.candidate,
            at=r.sent_at.timestamp(),
            sender=r.sender_id,
            by_asker=r.sender_id == "u1",
        )
        for r in rows
    ]
    assert idfs == {"西湖": 2.0, "划船": 3.0, "周末": 0.5}
    assert stream.speaker_named.sum() == sum(p.speaker_named for p in passages) > 0
    scores = score_stream(stream, idfs)
    assert sum(s is not None for s in scores) == sum(r.candidate for r in rows)
    assert scores == pytest.approx(score_stream(passages, idfs), abs=1e-12)
    # Asked by u1 without naming anyone: their own rows score the same both ways too.
    unnamed = "周末 划船 西湖?"
    stream, idfs = stream_of(Candidates.of(rows), unnamed, "u1")
    assert stream.by_asker is not None and stream.by_asker.sum() > 0
    for p in passages:
        p.speaker_named = False
    scores = score_stream(stream, idfs)
    assert scores == pytest.approx(score_stream(passages, idfs), abs=1e-12)
    assert stream_of(Candidates.of([]), query)[0].similarity.size == 0
