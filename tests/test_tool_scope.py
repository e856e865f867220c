"""Property: a tool call sees exactly what the REST route it mirrors sees from the same
conversation, and never more than the conversation's reach (``allow_cross_group_tools`` off).

Hypothesis draws conversations (two groups, three people, private chats) and arguments aimed
at other groups and other people; each call goes to ``POST /v1/tools/call`` and to its REST
mirror, and both answers are compared with each other and with the reach the rules define.
Hypothesis runs in a thread; the HTTP calls run on the test's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.app import create_app
from tests.conftest import AppClient, TenantHandle, make_settings, new_tenant, serve_app

T = TypeVar("T")

GROUPS = ["G1", "G2"]
PEOPLE = ["u1", "u2", "u3"]
MEMBERS = {("G1", "u1"), ("G2", "u2")}  # u3 is in no group: only private chats
EXAMPLES = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _doc(kind: str, ident: str, group: str | None = None) -> str:
    extra = f'group_id: "{group}"\n' if group else ""
    return (
        f'---\nentity_type: {kind}\nentity_id: "{ident}"\n{extra}name: {ident}\ntags: []\n'
        f'updated_at: "2026-02-22T10:30:00+08:00"\n---\n{kind} {ident} {group or ""} 喜欢爬山\n'
    )


@pytest.fixture
async def seeded(db_url: str) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    """A tenant with profiles and memories in two groups and three private chats."""
    app = create_app(make_settings(db_url), migrate=False, run_worker=False)
    async with serve_app(app) as client:
        tenant = await new_tenant(client)
        h = tenant.headers
        puts = [(f"/v1/profiles/user/{u}", _doc("user", u)) for u in PEOPLE]
        puts += [(f"/v1/profiles/group/{g}", _doc("group", g)) for g in GROUPS]
        puts += [(f"/v1/profiles/member/{g}/{u}", _doc("member", u, g)) for g, u in MEMBERS]
        for path, document in puts:
            response = await client.put(path, json={"document": document}, headers=h)
            assert response.status_code == 200, response.text
        memories: list[dict[str, Any]] = [
            {"scope": "GROUP", "group_id": g, "content": f"群 {g} 每周五爬山"} for g in GROUPS
        ]
        memories += [
            {"scope": "MEMBER_IN_GROUP", "group_id": g, "user_id": u, "content": f"{u} 在 {g} 爬山"}
            for g, u in MEMBERS
        ]
        for u in PEOPLE:
            memories.append({"scope": "GLOBAL", "user_id": u, "content": f"{u} 喜欢爬山"})
            memories.append({"scope": "PRIVATE", "user_id": u, "content": f"{u} 私下说想爬山"})
        for memory in memories:
            response = await client.post("/v1/memories/", json=memory, headers=h)
            assert response.status_code == 201, response.text
        yield client, tenant


def conversations() -> st.SearchStrategy[dict[str, Any]]:
    group = st.builds(
        lambda g, s: {"request_type": "group", "group_id": g, "sender_id": s, "user_id": s},
        st.sampled_from(GROUPS),
        st.sampled_from(PEOPLE),
    )
    private = st.builds(
        lambda u: {"request_type": "private", "user_id": u, "sender_id": u},
        st.sampled_from(PEOPLE),
    )
    return st.one_of(group, private)


def reach(conversation: dict[str, Any]) -> set[tuple[str, str, str | None]]:
    """The profiles a conversation may see, as (entity_type, entity_id, group_id)."""
    if conversation["request_type"] == "private":
        return {("user", conversation["user_id"], None)}
    group, person = conversation["group_id"], conversation["sender_id"]
    seen = {("group", group, None), ("user", person, None)}
    for g, u in MEMBERS:
        if g == group:
            seen |= {("member", u, g), ("user", u, None)}
    return seen


def memory_scope_ok(conversation: dict[str, Any], memory: dict[str, Any]) -> bool:
    """Whether a memory may be read in a conversation (the hard filter of the read path)."""
    if conversation["request_type"] == "private":
        return memory["scope"] in ("PRIVATE", "GLOBAL") and memory["content"].startswith(
            conversation["user_id"]
        )
    group, person = conversation["group_id"], conversation["sender_id"]
    if memory["scope"] == "PRIVATE":
        return False
    if memory["scope"] == "GLOBAL":
        return bool(memory["content"].startswith(person))
    if memory["scope"] == "GROUP":
        return f"群 {group} " in memory["content"]
    # A member's item said in the group is read by every member there.
    return bool(memory["content"].endswith(f" 在 {group} 爬山"))


class Bridge:
    """Runs the app's HTTP calls on the test's loop from Hypothesis' thread."""

    def __init__(self, client: AppClient, tenant: TenantHandle) -> None:
        self.client, self.tenant = client, tenant
        self.loop = asyncio.get_running_loop()

    def run(self, call: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(call, self.loop).result(timeout=60)

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return self.run(self.client.post(path, json=body, headers=self.tenant.headers))

    def tool(self, name: str, arguments: Any, context: dict[str, Any]) -> httpx.Response:
        body = {"name": name, "arguments": arguments, "context": context}
        return self.post("/v1/tools/call", body)


QUERIES = st.sampled_from(["爬山", "喜欢", "G1", "u2 私下", "hiking"])
TOP_K = st.one_of(st.none(), st.integers(1, 20))


async def test_profile_search_tool_matches_rest_and_reach(
    seeded: tuple[AppClient, TenantHandle],
) -> None:
    bridge = Bridge(*seeded)

    @EXAMPLES
    @given(
        conversation=conversations(),
        query=QUERIES,
        entity_type=st.sampled_from([None, "user", "group", "member"]),
        group_id=st.sampled_from([None, *GROUPS]),
        top_k=TOP_K,
    )
    def check(
        conversation: dict[str, Any],
        query: str,
        entity_type: str | None,
        group_id: str | None,
        top_k: int | None,
    ) -> None:
        arguments = {"query": query, "entity_type": entity_type, "group_id": group_id}
        arguments = {k: v for k, v in arguments.items() if v is not None}
        if top_k is not None:
            arguments["top_k"] = top_k
        tool = bridge.tool("cognitive_search_profiles", arguments, conversation)
        rest = bridge.post("/v1/profiles/search", {**arguments, "context": conversation})
        assert tool.status_code == rest.status_code, (tool.text, rest.text)
        if tool.status_code != 200:
            own = conversation.get("group_id") if conversation["request_type"] == "group" else None
            assert tool.status_code == 403 and group_id not in (None, own)
            return
        found = {(p["entity_type"], p["entity_id"], p["group_id"]) for p in tool.json()["result"]}
        assert found == {(p["entity_type"], p["entity_id"], p["group_id"]) for p in rest.json()}
        assert found <= reach(conversation), found - reach(conversation)

    await asyncio.to_thread(check)


async def test_get_profile_tool_answers_only_within_reach(
    seeded: tuple[AppClient, TenantHandle],
) -> None:
    bridge = Bridge(*seeded)

    @EXAMPLES
    @given(
        conversation=conversations(),
        entity_type=st.sampled_from(["user", "group", "member"]),
        entity_id=st.sampled_from(PEOPLE + GROUPS),
    )
    def check(conversation: dict[str, Any], entity_type: str, entity_id: str) -> None:
        arguments = {"entity_type": entity_type, "entity_id": entity_id}
        response = bridge.tool("cognitive_get_profile", arguments, conversation)
        group = conversation.get("group_id") if conversation["request_type"] == "group" else None
        if entity_type == "member":
            if group is None:
                assert response.status_code == 422
                return
            wanted = ("member", entity_id, group)
        else:
            wanted = (entity_type, entity_id, None)
        if wanted not in reach(conversation) and entity_type != "member":
            assert response.status_code == 403, response.text
            return
        assert response.status_code == 200, response.text
        result = response.json()["result"]
        exists = wanted[0] != "member" or (group, entity_id) in MEMBERS
        exists = exists and (wanted[0] != "user" or entity_id in PEOPLE)
        exists = exists and (wanted[0] != "group" or entity_id in GROUPS)
        assert result["found"] is exists
        if exists:
            assert f"{entity_type} {entity_id}" in result["document"]

    await asyncio.to_thread(check)


async def test_memory_search_tool_matches_rest_and_scope(
    seeded: tuple[AppClient, TenantHandle],
) -> None:
    bridge = Bridge(*seeded)

    @EXAMPLES
    @given(
        conversation=conversations(),
        query=QUERIES,
        categories=st.one_of(st.none(), st.just(["FACT"]), st.just(["PREFERENCE"])),
        top_k=TOP_K,
    )
    def check(
        conversation: dict[str, Any],
        query: str,
        categories: list[str] | None,
        top_k: int | None,
    ) -> None:
        arguments: dict[str, Any] = {"query": query}
        if categories is not None:
            arguments["categories"] = categories
        if top_k is not None:
            arguments["top_k"] = top_k
        tool = bridge.tool("cognitive_search_memories", arguments, conversation)
        group = conversation.get("group_id") if conversation["request_type"] == "group" else None
        rest = bridge.post(
            "/v1/memories/search",
            {
                **arguments,
                "top_k": top_k or 12,  # the tenant default of tool calls
                "group_id": group,
                "user_id": conversation["sender_id"],
            },
        )
        assert tool.status_code == rest.status_code == 200, (tool.text, rest.text)
        found = tool.json()["result"]
        assert [m["id"] for m in found] == [m["id"] for m in rest.json()]
        for memory in found:
            assert memory_scope_ok(conversation, memory), memory

    await asyncio.to_thread(check)


async def test_event_search_tool_matches_rest(seeded: tuple[AppClient, TenantHandle]) -> None:
    bridge = Bridge(*seeded)

    @EXAMPLES
    @given(
        conversation=conversations(),
        target_group=st.sampled_from([None, *GROUPS]),
        target_user=st.sampled_from([None, *PEOPLE]),
    )
    def check(
        conversation: dict[str, Any], target_group: str | None, target_user: str | None
    ) -> None:
        arguments: dict[str, Any] = {"query": "爬山"}
        if target_group:
            arguments["target_group_id"] = target_group
        if target_user:
            arguments["target_user_id"] = target_user
        tool = bridge.tool("cognitive_search_events", arguments, conversation)
        rest = bridge.post("/v1/events/search", {**arguments, "context": conversation})
        assert tool.status_code == rest.status_code, (tool.text, rest.text)
        group = conversation.get("group_id") if conversation["request_type"] == "group" else None
        elsewhere = (target_group and target_group != group) or (
            group is None and target_user and target_user != conversation["user_id"]
        )
        assert (tool.status_code == 403) == bool(elsewhere), tool.text

    await asyncio.to_thread(check)


@pytest.mark.parametrize(
    ("name", "arguments", "field"),
    [
        ("cognitive_search_memories", {"query": "x", "top_k": "abc"}, "arguments.top_k"),
        ("cognitive_search_memories", {"query": "x", "categories": 5}, "arguments.categories"),
        ("cognitive_search_memories", {"query": "x" * 5000}, "arguments.query"),
        ("cognitive_search_profiles", {"query": "x", "top_k": 10_000}, "arguments.top_k"),
        ("cognitive_search_events", {"query": "x", "top_k": "many"}, "arguments.top_k"),
        ("cognitive_get_profile", {"entity_type": "user", "entity_id": "u" * 500}, "entity_id"),
        ("end", {"memo": "m", "group_id": "G1"}, "arguments.group_id"),
        ("end", {"memo": "m", "request_type": "private", "user_id": "u2"}, "request_type"),
        ("cognitive_search_events", {"query": "x", "context": {}}, "arguments.context"),
    ],
)
async def test_malformed_tool_arguments_are_named_not_500(
    seeded: tuple[AppClient, TenantHandle], name: str, arguments: dict[str, Any], field: str
) -> None:
    client, tenant = seeded
    conversation = {"request_type": "group", "group_id": "G2", "sender_id": "u2"}
    response = await client.post(
        "/v1/tools/call",
        json={"name": name, "arguments": arguments, "context": conversation},
        headers=tenant.headers,
    )
    assert response.status_code == 422, response.text
    assert field in response.text


async def test_end_tool_writes_only_into_its_own_conversation(
    seeded: tuple[AppClient, TenantHandle],
) -> None:
    """An ``end`` call made in G2 lands in G2's memo log, whatever the model's arguments."""
    client, tenant = seeded
    conversation = {"request_type": "group", "group_id": "G2", "sender_id": "u2"}
    response = await client.post(
        "/v1/tools/call",
        json={"name": "end", "arguments": {"memo": "answered u2"}, "context": conversation},
        headers=tenant.headers,
    )
    assert response.status_code == 200, response.text
    g2 = await client.get("/v1/memos", params={"group_id": "G2"}, headers=tenant.headers)
    g1 = await client.get("/v1/memos", params={"group_id": "G1"}, headers=tenant.headers)
    assert [m["memo"] for m in g2.json()] == ["answered u2"]
    assert g1.json() == []


async def test_a_tool_call_needs_its_conversation(seeded: tuple[AppClient, TenantHandle]) -> None:
    """Without a context, event search named any group or user: now it is refused."""
    client, tenant = seeded
    response = await client.post(
        "/v1/tools/call",
        json={
            "name": "cognitive_search_events",
            "arguments": {"query": "x", "target_group_id": "G1"},
        },
        headers=tenant.headers,
    )
    assert response.status_code == 422
    assert "context" in response.text
