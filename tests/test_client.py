"""The Python clients against the real app: the async one in-process, the blocking one over a
loopback socket; error mapping, retries and the tool-call helper."""

from __future__ import annotations

import io
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import httpx
import pytest
from openai.types.chat import ChatCompletionMessageToolCall
from openai.types.chat.chat_completion_message_function_tool_call import Function

from service.app import create_app
from service.client import MemoriaAPIError, MemoriaClient, SyncMemoriaClient, retry_after_seconds
from service.context import ConversationContext
from service.memories.schemas import MemoryCreate
from tests.conftest import FAST_QUEUE, make_settings, new_tenant, serve_app
from tests.served import create_tenant, served

GROUP = {
    "request_type": "group",
    "group_id": "100200",
    "group_name": "Python 群",
    "user_id": "10001",
    "sender_id": "10001",
    "sender_name": "张三",
    "bot_id": "20002",
    "bot_name": "小助手",
    "timestamp": "2026-02-21T23:30:00+08:00",
    "timezone": "Asia/Shanghai",
    "location_abs": "上海",
}

MEMBER_DOC = (
    '---\nentity_type: member\nentity_id: "10001"\ngroup_id: "100200"\nname: "张三"\n'
    'tags: ["后端工程师"]\nupdated_at: "2026-02-21T23:30:00+08:00"\n---\n'
    "# 成员侧写\n- 2026-02-21: 张三(10001)对花生过敏\n"
)
USER_DOC = (
    '---\nentity_type: user\nentity_id: "10001"\nname: "张三"\ntags: []\n'
    'updated_at: "2026-02-21T23:30:00+08:00"\n---\n# 用户侧写\n- 张三(10001)喜欢喝茶\n'
)


@pytest.fixture
async def memoria(db_url: str) -> AsyncIterator[MemoriaClient]:
    """The async client on the app in-process (worker running), for a new tenant."""
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    app = create_app(settings, migrate=False, run_worker=True)
    async with serve_app(app) as http:
        tenant = await new_tenant(http)
        transport = httpx.ASGITransport(app=app)
        async with MemoriaClient("http://memoria.test", tenant.key, transport=transport) as client:
            yield client


@pytest.fixture
def loopback(db_url: str) -> Iterator[tuple[str, str]]:
    """The app under uvicorn on 127.0.0.1 with its worker: (base URL, a tenant's key)."""
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    with served(settings) as base_url:
        yield base_url, create_tenant(base_url)


async def test_round_trip(memoria: MemoriaClient) -> None:
    accepted = await memoria.end(
        GROUP, request_id="turn-1", memo="帮张三查了北京的天气", observations=["我明天去北京出差"]
    )
    assert accepted.enqueued and accepted.event_ids == [
        "g:100200:turn-1:1.1",
        "g:100200:turn-1:1.memo",
    ]
    assert accepted.job_id is not None
    job = await memoria.wait_for_job(accepted.job_id)
    assert job.status == "done", job.last_error

    event = await memoria.get_event("g:100200:turn-1:1.1")
    assert event.text == "张三(10001) 2026-02-22 去北京出差" and event.is_absolute
    page = await memoria.list_events(group_id="100200")
    assert {e.id for e in page.events} == {"g:100200:turn-1:1.1", "g:100200:turn-1:1.memo"}
    assert [m.memo for m in await memoria.memos(group_id="100200")] == ["帮张三查了北京的天气"]
    found = await memoria.search_events(query="北京出差", context=GROUP)
    assert found.events[0].id == "g:100200:turn-1:1.1"

    context = await memoria.context(GROUP, message="我去北京出差的事你还记得吗")
    assert "event:g:100200:turn-1:1.1" in {item.id for item in context.events}
    assert "<cognitive_context>" in context.prompt

    created = await memoria.add_memory(
        scope="MEMBER_IN_GROUP",
        group_id="100200",
        user_id="10001",
        category="PREFERENCE",
        content="张三(10001)希望被称为张工",
    )
    assert created.duplicate is False and created.is_active
    again = await memoria.add_memory(
        MemoryCreate(
            scope="MEMBER_IN_GROUP",
            group_id="100200",
            user_id="10001",
            category="PREFERENCE",
            content="张三(10001)希望被称为张工",
        )
    )
    assert again.duplicate is True and again.id == created.id
    hits = await memoria.search_memories(query="怎么称呼张三", group_id="100200", user_id="10001")
    assert created.id in [hit.id for hit in hits]
    changed = await memoria.update_memory(created.id, content="张三(10001)希望被称为张总")
    assert changed.content == "张三(10001)希望被称为张总"
    history = await memoria.memory_history(created.id)
    assert history[0].action == "add" and history[-1].new_content == "张三(10001)希望被称为张总"
    listed = await memoria.list_memories(group_id="100200", category="PREFERENCE")
    assert [m.id for m in listed] == [created.id]
    forgotten = await memoria.forget_memories(ids=[created.id])
    assert forgotten.changed == [created.id]
    assert (await memoria.get_memory(created.id)).is_active is False
    await memoria.delete_memory(created.id)
    with pytest.raises(MemoriaAPIError) as gone:
        await memoria.get_memory(created.id)
    assert gone.value.status == 404

    # The historian has merged the observation into the member profile already.
    merged = await memoria.get_profile("member", "10001", group_id="100200")
    assert "北京出差" in merged.body
    put = await memoria.put_profile(
        "member", "10001", MEMBER_DOC, group_id="100200", if_match=merged.version
    )
    assert put.version == merged.version + 1
    got = await memoria.get_profile("member", "10001", group_id="100200")
    assert got.document == MEMBER_DOC and got.tags == ["后端工程师"]
    revisions = await memoria.profile_revisions("member", "10001", group_id="100200")
    assert revisions[0].document == merged.document
    rolled = await memoria.rollback_profile("member", "10001", merged.version, group_id="100200")
    assert rolled.document == merged.document
    await memoria.put_profile("member", "10001", MEMBER_DOC, group_id="100200")
    profile_hits = await memoria.search_profiles(query="花生过敏", group_id="100200")
    assert profile_hits[0].entity_id == "10001"

    assert await memoria.list_todos(group_id="100200") == []
    assert await memoria.due_todos() == []
    todo = await memoria.add_todo(
        request_type="group", group_id="100200", sender_id="10001", description="整理发票"
    )
    assert todo.status == "PENDING" and todo.creator_id == "10001"
    assert [t.id for t in await memoria.list_todos(group_id="100200")] == [todo.id]
    done = await memoria.update_todo(todo.id, status="COMPLETED")
    assert done.status == "COMPLETED"
    assert (await memoria.list_jobs(status="done")).jobs[0].id == accepted.job_id


async def test_the_rest_of_the_surface(memoria: MemoriaClient) -> None:
    stored = await memoria.store_messages(
        {**GROUP, "messages": [{"message_id": "m-1", "text": "周五一起去爬山吧"}]}
    )
    assert stored.stored == 1
    assert stored.embed_job_id is not None
    await memoria.wait_for_job(stored.embed_job_id)
    searched = await memoria.search_messages(query="爬山", group_id="100200")
    assert searched.messages[0].message_id == "m-1"

    me = await memoria.tenant()
    assert me["key_prefix"] and me["name"] == "acme"
    settings = await memoria.update_settings(timezone="Europe/Berlin", query={"auto_top_k": 5})
    assert settings.timezone == "Europe/Berlin" and settings.query["auto_top_k"] == 5
    assert (await memoria.get_settings()).timezone == "Europe/Berlin"

    key = await memoria.create_key("ci")
    assert key.key.startswith("mk_")
    assert key.id in {k.id for k in await memoria.list_keys()}
    assert (await memoria.revoke_key(key.id)).revoked_at is not None

    with pytest.raises(MemoriaAPIError) as none_yet:
        await memoria.get_persona()
    assert none_yet.value.status == 404
    await memoria.put_persona("你是小助手，说话简短。")
    assert (await memoria.get_persona()).text == "你是小助手，说话简短。"
    await memoria.delete_persona()

    bot = await memoria.put_bot_settings("npc.1", persona="你是铁匠。", query={"auto_top_k": 1})
    assert bot.configured and bot.persona == "你是铁匠。" and bot.query["auto_top_k"] == 1
    assert [b.bot_id for b in await memoria.list_bots()] == ["npc.1"]
    assert (await memoria.get_bot_settings("npc.1")).overrides["query"] == {"auto_top_k": 1}
    with pytest.raises(MemoriaAPIError) as refused:
        await memoria.put_bot_settings("npc.1", query={"auto_top_k": 999})
    assert refused.value.field == "settings.bots.npc.1.query.auto_top_k"
    assert not (await memoria.delete_bot_settings("npc.1")).configured
    assert await memoria.list_bots() == []

    names = {t["function"]["name"] for t in await memoria.list_tools()}
    assert "cognitive_search_memories" in names and "end" in names
    result = await memoria.call_tool("cognitive_search_memories", {"query": "爬山"}, GROUP)
    assert result.name == "cognitive_search_memories" and json.loads(result.content) == []

    exported = io.BytesIO()
    written = await memoria.export_group("100200", exported)
    assert written == len(exported.getvalue()) > 0
    document = json.loads(exported.getvalue())
    assert document["manifest"]["counts"]["messages"] == 1
    receipt = await memoria.erase_group("100200")
    assert receipt["erased"] == "group" and receipt["counts"]["messages"] == 1
    assert (await memoria.erase_user("10001"))["erased"] == "user"


async def test_ids_of_dots_reach_their_own_path(memoria: MemoriaClient) -> None:
    """A person or group whose id is '.' or '..' (the service takes any id without '/') is
    exported and erased as itself: sent bare, the dots were resolved as a path's, and the call
    went to another route or none (a 404 for an erasure of someone whose data stayed)."""
    document = USER_DOC.replace('"10001"', '".."')
    await memoria.put_profile("user", "..", document)
    assert (await memoria.get_profile("user", "..")).entity_id == ".."
    stored = await memoria.store_messages(
        {
            **GROUP,
            "group_id": ".",
            "user_id": "..",
            "sender_id": "..",
            "messages": [{"message_id": "m-1", "text": "周五一起去爬山吧"}],
        }
    )
    assert stored.stored == 1
    exported = io.BytesIO()
    await memoria.export_user("..", exported)
    assert json.loads(exported.getvalue())["manifest"]["counts"]["messages"] == 1
    exported = io.BytesIO()
    await memoria.export_group(".", exported)
    assert json.loads(exported.getvalue())["manifest"]["counts"]["messages"] == 1
    receipt = await memoria.erase_group(".")
    assert receipt["erased"] == "group" and receipt["counts"]["messages"] == 1
    receipt = await memoria.erase_user("..")
    assert receipt["erased"] == "user" and receipt["counts"]["profiles"] == 1


async def test_errors_carry_status_code_message_field_and_request_id(
    memoria: MemoriaClient,
) -> None:
    with pytest.raises(MemoriaAPIError) as missing:
        await memoria.get_memory(987654)
    error = missing.value
    assert (error.status, error.error, error.message) == (404, "not_found", "no such memory")
    assert error.request_id

    with pytest.raises(MemoriaAPIError) as invalid:
        await memoria.list_events(group_id="100200", before="yesterday")
    assert (invalid.value.status, invalid.value.error, invalid.value.field) == (
        422,
        "invalid",
        "before",
    )

    with pytest.raises(MemoriaAPIError) as unscoped:
        await memoria.search_memories(query="anything")
    assert unscoped.value.status == 422 and unscoped.value.field == "group_id"

    with pytest.raises(MemoriaAPIError) as stale:
        await memoria.put_profile("user", "10001", USER_DOC, if_match=3)
    assert stale.value.status == 409 and stale.value.error == "conflict"

    # The request models are the API's: a wrong value fails before anything is sent, with the
    # error the service would have answered.
    with pytest.raises(MemoriaAPIError) as refused:
        await memoria.add_memory(scope="EVERYWHERE", content="x")
    assert (refused.value.status, refused.value.field) == (422, "scope")


def refusing_transport() -> tuple[httpx.MockTransport, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(500, json={"status": 500, "error": "internal_error", "message": "x"})

    return httpx.MockTransport(handler), seen


async def test_a_bad_argument_raises_the_clients_own_error_and_sends_nothing() -> None:
    transport, seen = refusing_transport()
    async with MemoriaClient("http://memoria.test", "mk_a", transport=transport) as client:
        # A conversation without its group id: the service's own 422, not pydantic's error.
        with pytest.raises(MemoriaAPIError) as refused:
            await client.context({"request_type": "group"}, message="hi")
        error = refused.value
        assert (error.status, error.error, error.field) == (422, "invalid", "group_id")
        assert "group_id" in error.message and error.request_id is None
        assert error.body["errors"] and all("field" in e for e in error.body["errors"])
        with pytest.raises(MemoriaAPIError) as wrong_id:
            await client.get_memory("seven")  # type: ignore[arg-type]
        assert (wrong_id.value.status, wrong_id.value.field) == (422, "memory_id")
        with pytest.raises(MemoriaAPIError) as no_group:
            await client.get_profile("member", "10001")
        assert no_group.value.field == "group_id"
        with pytest.raises(MemoriaAPIError) as not_a_call:
            await client.tool_call({"function": {"arguments": "{}"}})
        assert not_a_call.value.status == 422
    with (
        SyncMemoriaClient(
            "http://memoria.test",
            "mk_a",
            transport=httpx.MockTransport(lambda request: httpx.Response(500)),
        ) as blocking,
        pytest.raises(MemoriaAPIError) as sync_refused,
    ):
        blocking.add_memory(scope="GROUP", group_id="1", category="NOPE", content="x")
    assert sync_refused.value.field == "category"
    assert seen == []


async def test_a_bad_key_is_401_and_not_retried() -> None:
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(
            401, json={"status": 401, "error": "unauthorized", "message": "unknown API key"}
        )

    async with MemoriaClient(
        "http://memoria.test", "mk_nope", transport=httpx.MockTransport(handler)
    ) as client:
        with pytest.raises(MemoriaAPIError) as denied:
            await client.tenant()
    assert denied.value.status == 401 and len(calls) == 1
    assert calls[0].headers["authorization"] == "Bearer mk_nope"


def scripted(*answers: int | Exception) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    """A transport answering with these statuses (or raising), then 200 with a tenant."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers[len(seen) - 1] if len(seen) <= len(answers) else 200
        if isinstance(answer, Exception):
            raise answer
        if answer == 200:
            return httpx.Response(
                200, json={"tenant_id": "t", "name": "acme", "key_prefix": "mk_a"}
            )
        body = {"status": answer, "error": "busy", "message": "try later", "request_id": "r"}
        return httpx.Response(answer, json=body, headers={"Retry-After": "0"})

    return httpx.MockTransport(handler), seen


async def test_async_client_retries_503_after_retry_after() -> None:
    transport, seen = scripted(503)
    async with MemoriaClient("http://memoria.test", "mk_a", transport=transport) as client:
        assert (await client.tenant())["name"] == "acme"
    assert len(seen) == 2
    # One logical call, one request id: the service's logs tie the tries together.
    assert seen[0].headers["x-request-id"] == seen[1].headers["x-request-id"]


def test_sync_client_retries_429_and_503_and_connect_errors() -> None:
    transport, seen = scripted(429, httpx.ConnectError("refused"), 503)
    with SyncMemoriaClient(
        "http://memoria.test", "mk_a", transport=transport, backoff_base=0.001
    ) as client:
        assert client.tenant()["name"] == "acme"
    assert len(seen) == 4


@pytest.mark.parametrize("status", [400, 404, 409, 422, 500])
def test_other_errors_are_not_retried(status: int) -> None:
    transport, seen = scripted(status)
    client = SyncMemoriaClient("http://memoria.test", "mk_a", transport=transport)
    with client, pytest.raises(MemoriaAPIError) as failed:
        client.tenant()
    assert failed.value.status == status and len(seen) == 1


async def test_retries_give_up_after_max_retries() -> None:
    transport, seen = scripted(503, 503, 503, 503)
    async with MemoriaClient(
        "http://memoria.test", "mk_a", transport=transport, max_retries=2
    ) as client:
        with pytest.raises(MemoriaAPIError) as failed:
            await client.tenant()
    assert failed.value.status == 503 and failed.value.retry_after == 0.0
    assert len(seen) == 3


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record the blocking client's waits instead of waiting."""
    waits: list[float] = []
    monkeypatch.setattr(time, "sleep", waits.append)
    return waits


def answering(status: int, retry_after: str | None) -> Callable[[httpx.Request], httpx.Response]:
    count = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal count
        count += 1
        if count > 1:
            return httpx.Response(200, json={"name": "acme"})
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        return httpx.Response(status, json={"error": "busy", "message": "wait"}, headers=headers)

    return handler


def test_retry_after_is_honoured(sleeps: list[float]) -> None:
    for value in ("7", "2.5"):
        transport = httpx.MockTransport(answering(429, value))
        with SyncMemoriaClient("http://memoria.test", "mk_a", transport=transport) as client:
            client.tenant()
    assert sleeps == [7.0, 2.5]


def test_without_retry_after_the_backoff_is_exponential_with_jitter(sleeps: list[float]) -> None:
    transport, _ = scripted(503, 503, 503)

    def no_hint(request: httpx.Request) -> httpx.Response:
        response = transport.handle_request(request)
        response.headers.pop("Retry-After", None)
        return response

    with SyncMemoriaClient(
        "http://memoria.test", "mk_a", transport=httpx.MockTransport(no_hint), backoff_base=1.0
    ) as client:
        client.tenant()
    assert len(sleeps) == 3
    assert all(0 <= wait <= 2**attempt for attempt, wait in enumerate(sleeps))


def test_a_retry_after_beyond_the_cap_is_not_waited_for(sleeps: list[float]) -> None:
    transport = httpx.MockTransport(answering(503, "600"))
    with (
        SyncMemoriaClient(
            "http://memoria.test", "mk_a", transport=transport, backoff_cap=30
        ) as client,
        pytest.raises(MemoriaAPIError) as failed,
    ):
        client.tenant()
    assert failed.value.retry_after == 600 and sleeps == []


def test_retry_after_as_an_http_date() -> None:
    later = datetime.now(UTC) + timedelta(seconds=120)
    seconds = retry_after_seconds(format_datetime(later, usegmt=True))
    assert seconds is not None and 100 < seconds <= 120
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0
    assert retry_after_seconds("soon") is None


async def test_tool_call_runs_the_models_calls(memoria: MemoriaClient) -> None:
    context = ConversationContext.model_validate(GROUP)
    ended = await memoria.tool_call(
        {
            "id": "call_1",
            "type": "function",
            "function": {
                "name": "end",
                "arguments": json.dumps(
                    {"memo": "答疑", "observations": ["张三(10001)喜欢 Rust"]}, ensure_ascii=False
                ),
            },
        },
        context,
    )
    accepted = json.loads(ended)
    assert accepted["enqueued"] is True
    await memoria.wait_for_job(accepted["job_id"])

    sdk_call = ChatCompletionMessageToolCall(
        id="call_2",
        type="function",
        function=Function(name="cognitive_search_memories", arguments='{"query": "编程语言"}'),
    )
    content = await memoria.tool_call(sdk_call, GROUP)
    assert any("Rust" in memory["content"] for memory in json.loads(content))

    # What the model got wrong goes back to it as the tool's answer, to correct.
    unknown = json.loads(await memoria.tool_call({"function": {"name": "rm_rf"}}, GROUP))
    assert unknown["error"] == "not_found"
    broken = {"function": {"name": "cognitive_search_events", "arguments": "{not json"}}
    assert json.loads(await memoria.tool_call(broken, GROUP))["field"] == "arguments"
    missing = {"function": {"name": "cognitive_search_memories", "arguments": "{}"}}
    assert json.loads(await memoria.tool_call(missing, GROUP))["field"] == "arguments.query"


def test_sync_client_over_loopback(loopback: tuple[str, str], tmp_path: Path) -> None:
    base_url, key = loopback
    with SyncMemoriaClient(base_url, key) as memoria:
        accepted = memoria.end(GROUP, request_id="s-1", observations=["我明天去北京出差"])
        assert accepted.job_id is not None
        assert memoria.wait_for_job(accepted.job_id).status == "done"
        assert memoria.get_event("g:100200:s-1:1.1").text == "张三(10001) 2026-02-22 去北京出差"
        context = memoria.context(GROUP, message="北京出差")
        assert "event:g:100200:s-1:1.1" in {item.id for item in context.events}

        created = memoria.add_memory(
            scope="GLOBAL", user_id="10001", category="PREFERENCE", content="张三(10001)喜欢喝茶"
        )
        hits = memoria.search_memories(query="喝什么", user_id="10001")
        assert hits[0].id == created.id
        memoria.put_profile("user", "10001", USER_DOC)
        assert memoria.get_profile("user", "10001").document == USER_DOC
        tool_content = memoria.tool_call(
            {
                "function": {
                    "name": "cognitive_get_profile",
                    "arguments": {"entity_type": "user", "entity_id": "10001"},
                }
            },
            GROUP,
        )
        assert json.loads(tool_content)["found"] is True
        memoria.put_bot_settings("npc-1", {"persona": "你是铁匠。"})
        assert memoria.context({**GROUP, "bot_id": "npc-1"}, message="北京").persona == "你是铁匠。"
        assert memoria.delete_bot_settings("npc-1").persona is None

        target = tmp_path / "export.json"
        with target.open("wb") as out:
            written = memoria.export_user("10001", out)
        document = json.loads(target.read_bytes())
        assert written == target.stat().st_size
        assert document["manifest"]["counts"]["memories"] >= 1

        with pytest.raises(MemoriaAPIError) as missing:
            memoria.get_event("no-such-event")
        assert missing.value.status == 404 and missing.value.request_id
        receipt = memoria.erase_user("10001")
        assert receipt["erased"] == "user" and receipt["counts"]["memories"] >= 1
