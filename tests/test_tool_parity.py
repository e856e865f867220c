"""One schema per operation: ``POST /v1/tools/call`` (and ``memoria mcp``) read a tool's
arguments by the schema of the REST route it mirrors, and advertise that schema's own JSON
schema, so the two surfaces cannot disagree on a default, a limit or an older field name.

Every tool with a REST twin is sent the same random arguments both ways, and what comes back
(and, for ``end``, what is stored) is compared.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any, get_type_hints

import httpx
import pytest
from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel

from service.app import create_app
from service.client import MemoriaClient
from service.ends.routes import EndController
from service.mcp_server import Conversation, build_server
from service.memories.routes import MemoryController
from service.profiles.routes import ProfileController
from service.recall.routes import RecallController
from tests.conftest import (
    FAST_QUEUE,
    AppClient,
    TenantHandle,
    make_settings,
    new_tenant,
    serve_app,
    until_finished,
)

# Each tool and the REST route it mirrors: (method, path, the route's handler).
TWINS: dict[str, tuple[str, str, Any]] = {
    "cognitive_search_events": ("POST", "/v1/events/search", RecallController.search_events),
    "cognitive_search_profiles": ("POST", "/v1/profiles/search", ProfileController.search),
    "cognitive_search_memories": ("POST", "/v1/memories/search", MemoryController.search),
    "end": ("POST", "/v1/end", EndController.end),
}


def some_id() -> str:
    """A random chat id (digits, as bots send QQ numbers)."""
    return str(random.randrange(10**8, 10**10))


def word() -> str:
    return uuid.uuid4().hex[:10]


# The MCP server serves one conversation: it offers no argument that names a group.
NAMES_A_GROUP = ("group_id", "target_group_id")


def resolved(schema: Any, definitions: dict[str, Any]) -> Any:
    """A JSON schema with its ``$ref``s to ``definitions`` written out."""
    if isinstance(schema, list):
        return [resolved(v, definitions) for v in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        named = definitions[schema["$ref"].split("/")[-1]]
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return resolved({**named, **rest}, definitions)
    return {k: resolved(v, definitions) for k, v in schema.items()}


def rest_schema(handler: Any) -> type[BaseModel]:
    """The body schema the REST route reads."""
    model: type[BaseModel] = get_type_hints(handler.fn)["data"]
    return model


@pytest.fixture
async def running(db_url: str) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        yield client, await new_tenant(client, f"t-{word()}")


async def test_each_tool_advertises_the_schema_of_its_rest_route(
    running: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = running
    listed = await client.get("/v1/tools", headers=tenant.headers)
    assert listed.status_code == 200
    advertised = {d["function"]["name"]: d["function"]["parameters"] for d in listed.json()}
    for name, (_, _, handler) in TWINS.items():
        schema = rest_schema(handler).model_json_schema()
        parameters = advertised[name]
        assert set(parameters["properties"]) <= set(schema["properties"]), name
        for field, given in parameters["properties"].items():
            assert given == resolved(schema["properties"][field], schema.get("$defs", {})), (
                name,
                field,
            )
        wanted = [f for f in schema.get("required", []) if f in parameters["properties"]]
        assert parameters["required"] == wanted, name


async def test_an_mcp_client_lists_the_same_schemas(
    running: tuple[AppClient, TenantHandle],
) -> None:
    """``memoria mcp`` offers the API's schemas, less the arguments that would name a group."""
    client, tenant = running
    listed = await client.get("/v1/tools", headers=tenant.headers)
    advertised = {d["function"]["name"]: d["function"]["parameters"] for d in listed.json()}
    by_mcp = {
        "search_events": "cognitive_search_events",
        "get_profile": "cognitive_get_profile",
        "search_profiles": "cognitive_search_profiles",
        "search_memories": "cognitive_search_memories",
        "end": "end",
    }
    async with MemoriaClient("http://127.0.0.1:9", tenant.key) as unused:
        server = build_server(unused, Conversation(group_id=some_id(), sender_id=some_id()))
        offered = {t.name: t.input_schema for t in await server.list_tools()}
    for name, api_name in by_mcp.items():
        expected = advertised[api_name]
        properties = {k: v for k, v in expected["properties"].items() if k not in NAMES_A_GROUP}
        assert offered[name]["properties"] == properties, name
        assert offered[name]["required"] == expected["required"], name


def conversation() -> dict[str, Any]:
    person = some_id()
    if random.random() < 0.5:
        return {"request_type": "private", "user_id": person, "sender_id": person}
    return {"request_type": "group", "group_id": some_id(), "sender_id": person, "user_id": person}


def turns() -> list[dict[str, Any]]:
    """The same turn in every shape either surface has read: the names of today and the
    older ones (``action_summary``, ``summary``, ``new_info`` as text or a list)."""
    memo, facts = f"回复了 {word()}", [f"用户喜欢 {word()} 牌的茶", f"群里定了 {word()} 计划"]
    return [
        {"memo": memo, "observations": facts},
        {"action_summary": memo, "new_info": facts[0]},
        {"action_summary": memo, "new_info": facts},
        {"summary": memo},
        {"new_info": facts[1]},
        {"memo": memo, "observations": [{"text": facts[0], "shareable": True}, facts[1]]},
        {"memo": memo, "observations": facts, "shareable": [1], "force": "yes"},
    ]


def whose(context: dict[str, Any]) -> dict[str, str]:
    if context["request_type"] == "group":
        return {"group_id": context["group_id"]}
    return {"user_id": context["user_id"]}


async def stored(client: AppClient, tenant: TenantHandle, context: dict[str, Any]) -> Any:
    """What a conversation holds after its turn: its memo log and its events."""
    h = tenant.headers
    memos = (await client.get("/v1/memos", params=whose(context), headers=h)).json()
    events = (await client.get("/v1/events", params=whose(context), headers=h)).json()
    return (
        [m["memo"] for m in memos],
        sorted((e["kind"], e["text"]) for e in events["events"]),
    )


def comparable(accepted: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in accepted.items() if k not in ("request_id", "job_id", "event_ids")} | {
        "events": len(accepted["event_ids"])
    }


@pytest.mark.parametrize("shape", range(len(turns())))
async def test_end_reads_the_same_turn_through_either_surface(
    running: tuple[AppClient, TenantHandle], shape: int
) -> None:
    client, tenant = running
    turn = turns()[shape]
    answers, holdings = [], []
    for surface in ("rest", "tool"):
        context = conversation()
        if surface == "rest":
            response = await client.post(
                "/v1/end", json={**context, **turn}, headers=tenant.headers
            )
            assert response.status_code == 202, response.text
            accepted = response.json()
        else:
            body = {"name": "end", "arguments": turn, "context": context}
            response = await client.post("/v1/tools/call", json=body, headers=tenant.headers)
            assert response.status_code == 200, response.text
            accepted = response.json()["result"]
        if accepted.get("job_id") is not None:
            job = await until_finished(client, tenant, accepted["job_id"])
            assert job["status"] == "done", job
        answers.append(comparable(accepted))
        holdings.append(await stored(client, tenant, context))
    assert answers[0] == answers[1]
    assert holdings[0] == holdings[1]
    assert holdings[0] != ([], []), "the turn stored nothing"


def profile(kind: str, ident: str, group: str | None, trait: str) -> str:
    extra = f'group_id: "{group}"\n' if group else ""
    return (
        f'---\nentity_type: {kind}\nentity_id: "{ident}"\n{extra}name: n{ident}\ntags: []\n'
        f'updated_at: "2026-02-22T10:30:00+08:00"\n---\n{kind} {ident} 喜欢 {trait}\n'
    )


async def seed(client: AppClient, tenant: TenantHandle) -> tuple[list[dict[str, Any]], str]:
    """Random groups and people with profiles, memories and events; the conversations."""
    h, trait = tenant.headers, word()
    groups, people = [some_id() for _ in range(2)], [some_id() for _ in range(4)]
    members = [(groups[0], people[0]), (groups[0], people[1]), (groups[1], people[2])]
    puts = [(f"/v1/profiles/user/{u}", profile("user", u, None, trait)) for u in people]
    puts += [(f"/v1/profiles/group/{g}", profile("group", g, None, trait)) for g in groups]
    puts += [(f"/v1/profiles/member/{g}/{u}", profile("member", u, g, trait)) for g, u in members]
    for path, document in puts:
        response = await client.put(path, json={"document": document}, headers=h)
        assert response.status_code == 200, response.text
    memories: list[dict[str, Any]] = [
        {"scope": "GROUP", "group_id": g, "content": f"群 {g} 常聊 {trait}"} for g in groups
    ]
    memories += [
        {"scope": "MEMBER_IN_GROUP", "group_id": g, "user_id": u, "content": f"{u} 爱 {trait}"}
        for g, u in members
    ]
    memories += [{"scope": "GLOBAL", "user_id": u, "content": f"{u} 喜欢 {trait}"} for u in people]
    memories += [{"scope": "PRIVATE", "user_id": u, "content": f"{u} 私下 {trait}"} for u in people]
    for memory in memories:
        response = await client.post("/v1/memories/", json=memory, headers=h)
        assert response.status_code == 201, response.text
    contexts: list[dict[str, Any]] = [
        {"request_type": "group", "group_id": g, "sender_id": u, "user_id": u} for g, u in members
    ]
    contexts += [{"request_type": "private", "user_id": u, "sender_id": u} for u in people]
    for context in contexts:
        turn = {"memo": f"聊了 {trait}", "observations": [f"{context['sender_id']} 喜欢 {trait}"]}
        response = await client.post("/v1/end", json={**context, **turn}, headers=h)
        assert response.status_code == 202, response.text
        await until_finished(client, tenant, response.json()["job_id"])
    return contexts, trait


def arguments_for(
    name: str, trait: str, context: dict[str, Any], contexts: list[dict[str, Any]]
) -> dict[str, Any]:
    """Random arguments of one tool, some aimed at other conversations."""
    other = random.choice(contexts)
    top_k = random.choice([None, 1, 3, 20])
    given: dict[str, Any] = {"query": random.choice([trait, f"喜欢 {trait}", word()])}
    if name == "cognitive_search_events":
        given["target_group_id"] = random.choice([None, other.get("group_id")])
        given["target_user_id"] = random.choice([None, other["sender_id"]])
    elif name == "cognitive_search_profiles":
        given["entity_type"] = random.choice([None, "user", "group", "member"])
        given["group_id"] = random.choice([None, context.get("group_id"), other.get("group_id")])
    else:
        given["categories"] = random.choice([None, ["FACT"], ["PREFERENCE", "FACT"]])
    given["top_k"] = top_k
    return {k: v for k, v in given.items() if v is not None}


def rest_body(name: str, arguments: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    """The REST twin's body for a tool call made in ``context``."""
    if name != "cognitive_search_memories":
        return {**arguments, "context": context}
    group = context.get("group_id") if context["request_type"] == "group" else None
    return {**arguments, "group_id": group, "user_id": context["sender_id"]}


def hits(name: str, answer: Any) -> list[tuple[Any, ...]]:
    if name == "cognitive_search_events":
        return [(e["id"], e["text"]) for e in answer["events"]]
    if name == "cognitive_search_profiles":
        return [(p["entity_type"], p["entity_id"], p["group_id"]) for p in answer]
    return [(m["id"], m["content"]) for m in answer]


@pytest.mark.parametrize(
    "name", ["cognitive_search_events", "cognitive_search_profiles", "cognitive_search_memories"]
)
async def test_a_search_answers_the_same_through_either_surface(
    running: tuple[AppClient, TenantHandle], name: str
) -> None:
    client, tenant = running
    contexts, trait = await seed(client, tenant)
    method, path, _ = TWINS[name]
    for _ in range(12):
        context = random.choice(contexts)
        arguments = arguments_for(name, trait, context, contexts)
        body = {"name": name, "arguments": arguments, "context": context}
        tool = await client.post("/v1/tools/call", json=body, headers=tenant.headers)
        rest = await client.request(
            method, path, json=rest_body(name, arguments, context), headers=tenant.headers
        )
        assert tool.status_code == rest.status_code, (arguments, tool.text, rest.text)
        if rest.status_code == 200:
            assert hits(name, tool.json()["result"]) == hits(name, rest.json()), arguments


@pytest.mark.parametrize("kind", ["private", "group"])
async def test_a_tenant_whose_tools_cross_groups_finds_the_same_eight_profiles(
    running: tuple[AppClient, TenantHandle], kind: str
) -> None:
    """With ``allow_cross_group_tools``, a private chat's or a group's search_profiles
    without top_k or entity_type finds what the tenant's REST search finds: 8 users and
    groups."""
    client, tenant = running
    h, trait = tenant.headers, word()
    people, groups = [some_id() for _ in range(6)], [some_id() for _ in range(4)]
    for kind, ids in (("user", people), ("group", groups)):
        for ident in ids:
            document = profile(kind, ident, None, trait)
            response = await client.put(
                f"/v1/profiles/{kind}/{ident}", json={"document": document}, headers=h
            )
            assert response.status_code == 200, response.text
    setting = {"query": {"allow_cross_group_tools": True}}
    assert (await client.patch("/v1/settings", json=setting, headers=h)).status_code == 200
    context = {"request_type": kind, "user_id": people[0], "sender_id": people[0]}
    if kind == "group":
        context["group_id"] = groups[0]
    body = {"name": "cognitive_search_profiles", "arguments": {"query": trait}, "context": context}
    tool = (await client.post("/v1/tools/call", json=body, headers=h)).json()["result"]
    rest = (await client.post("/v1/profiles/search", json={"query": trait}, headers=h)).json()
    assert len(tool) == len(rest) == 8
    assert {p["entity_type"] for p in rest} == {"user", "group"}
    assert hits("cognitive_search_profiles", tool) == hits("cognitive_search_profiles", rest)


@pytest.mark.parametrize(
    "turn",
    [{"action_summary": "提醒了 {w}", "new_info": "{p} 喜欢 {w}"}, {"summary": "提醒了 {w}"}],
)
async def test_an_mcp_end_reads_the_older_names(
    running: tuple[AppClient, TenantHandle], turn: dict[str, str]
) -> None:
    """The names the original bot's end tool used reach memory through ``memoria mcp`` too."""
    client, tenant = running
    group, person, w = some_id(), some_id(), word()
    given = {k: v.format(w=w, p=person) for k, v in turn.items()}
    transport = httpx.ASGITransport(app=client.app)
    async with MemoriaClient("http://memoria.test", tenant.key, transport=transport) as api:
        server = build_server(api, Conversation(group_id=group, sender_id=person))
        result = await server.call_tool("end", given)
    assert isinstance(result, CallToolResult) and not result.is_error, result
    [content] = result.content
    assert isinstance(content, TextContent)
    accepted = json.loads(content.text)
    if accepted.get("job_id") is not None:
        await until_finished(client, tenant, accepted["job_id"])
    memos, events = await stored(client, tenant, {"request_type": "group", "group_id": group})
    assert memos == [f"提醒了 {w}"]
    if "new_info" in given:
        assert any(w in text for _, text in events), events
