"""Who may read what, as properties over generated conversations (hypothesis), over HTTP.

One tenant per example: 2-4 groups, 3-6 people whose ids recur across the groups, private
and group turns handed over as a bot does (``POST /v1/end`` with observations, and
``POST /v1/messages`` with messages asking to be remembered). Texts carry the phrasings people
use to keep or share a secret; consent is only ever given as data, an observation
``{"text": ..., "shareable": true}``. Every fact carries a marker of its own, so each item an
answer holds is traced back to the turn it came from.

Without an LLM a private turn stays in its private chat unless it is marked shareable and is
not sensitive; then it may also reach its person's own turns in groups (and the groups that
read their user profile), never another person's private chat. A group turn stays in its
group. No wording decides anything. A person's export holds only what their own
conversations may see. (The MCP server forwards every tool to the tools route, bound to the
conversation it was started for: the tools read here are what it reads.) Erasing a person
leaves no row holding their id or their words, and every other turn's words where they were.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from service.app import create_app
from tests.conftest import (
    FAST_QUEUE,
    AppClient,
    TenantHandle,
    make_settings,
    new_tenant,
    raw_connection,
    serve_app,
    wait_for,
)

# What people say to keep a thing to themselves or to let it be known; none of it is consent.
PHRASINGS = [
    "千万不要告诉大家，",
    "这个不可以公开：",
    "don't share this with the group: ",
    "可以告诉大家，",
    "",
]
LIKES = ["围棋", "咖啡", "爬山", "green tea", "jazz", "猫"]
PHONE = "我的手机号是13812345678，"  # sensitive: never shared, marked or not
QUERY = "喜欢 like 记住"
MARKER = re.compile(r"mk[0-9a-f]{12}")
# A core of digits and letters no text or marker holds, between 'u' and 'x': one id is never
# a substring of another id, a marker or a phrasing, so a row holding it is found by text.
ID = st.text("0123456789klmnpq", min_size=1, max_size=6).map(lambda core: f"u{core}x")
# Han names: a one-letter latin name ("i") reads as a pronoun, and its facts as still relative.
NAME = st.text("甄士隐贾雨村宝玉黛钗", min_size=1, max_size=4)


@dataclass(frozen=True)
class Conversation:
    """Where a read is asked from: a group with one of its members speaking, or a private
    chat."""

    group_id: str | None
    user_id: str

    @property
    def context(self) -> dict[str, Any]:
        if self.group_id is None:
            return {"request_type": "private", "user_id": self.user_id, "sender_id": self.user_id}
        return {"request_type": "group", "group_id": self.group_id, "sender_id": self.user_id}

    def __str__(self) -> str:
        if self.group_id is None:
            return f"{self.user_id}'s private chat"
        return f"group {self.group_id} ({self.user_id} speaking)"


@dataclass(frozen=True)
class Origin:
    """The turn a marker was said in, and whether its person let it be known elsewhere."""

    said_in: Conversation
    shareable: bool = False
    via: str = "end"

    def visible_from(self, asker: Conversation, members: set[str], profile_read: bool) -> bool:
        """The rule under test. A group's turn: in that group, whoever of it speaks (what a
        member said of themselves there included), never elsewhere. A private turn: in that private
        chat; marked shareable, also in the person's own turns in groups and, read from their
        user profile, in the groups they are a member of."""
        if self.said_in.group_id is not None:
            return asker.group_id == self.said_in.group_id
        person = self.said_in.user_id
        if asker.group_id is None:
            return asker.user_id == person
        if not self.shareable:
            return False
        return asker.user_id == person or (profile_read and person in members)

    def __str__(self) -> str:
        consent = ", marked shareable" if self.shareable else ""
        return f"{self.said_in} by /v1/{self.via}{consent}"


@dataclass
class World:
    """One example: its groups and their members, and every turn's text."""

    names: dict[str, str]
    groups: dict[str, list[str]]
    turns: list[tuple[Conversation, list[Any], str]] = field(default_factory=list)
    origins: dict[str, Origin] = field(default_factory=dict)

    def conversations(self) -> Iterator[Conversation]:
        for group, members in self.groups.items():
            for user in members:
                yield Conversation(group, user)
        for user in self.names:
            yield Conversation(None, user)


def marker() -> str:
    return f"mk{uuid.uuid4().hex[:12]}"


@st.composite
def worlds(draw: st.DrawFn, consent: bool) -> World:
    """People, groups sharing some of them, and 4-8 turns among them. ``consent``: private
    observations may come as objects marked shareable."""
    ids = draw(st.lists(ID, min_size=3, max_size=6, unique=True))
    names = {i: draw(NAME) for i in ids}
    groups = {
        f"g{n}{draw(st.text('0123456789', min_size=1, max_size=3))}": draw(
            st.lists(st.sampled_from(ids), min_size=2, max_size=len(ids), unique=True)
        )
        for n in range(draw(st.integers(2, 4)))
    }
    world = World(names, groups)
    places = [Conversation(g, u) for g, ms in groups.items() for u in ms]
    places += [Conversation(None, u) for u in ids]
    for _ in range(draw(st.integers(4, 8))):
        where = draw(st.sampled_from(places))
        via = draw(st.sampled_from(["end", "end", "messages"]))
        items: list[Any] = []
        for _ in range(draw(st.integers(1, 2))):
            mark = marker()
            sensitive = draw(st.booleans()) and draw(st.booleans())
            text = (
                draw(st.sampled_from(PHRASINGS))
                + (PHONE if sensitive else "")
                + f"我喜欢{draw(st.sampled_from(LIKES))} {mark}"
            )
            # Consent is an object of the private turn's own; ``shareable: false`` is none.
            given = consent and via == "end" and where.group_id is None and draw(st.booleans())
            marked = given and draw(st.booleans())
            if via == "messages":
                text = draw(st.sampled_from(["记住：", "remember that "])) + text
            items.append({"text": text, "shareable": marked} if given else text)
            world.origins[mark] = Origin(where, shareable=marked and not sensitive, via=via)
        world.turns.append((where, items, via))
    return world


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[AppClient]:
    settings_ = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    async with serve_app(create_app(settings_, migrate=False, run_worker=True)) as c:
        yield c


async def hand_over(client: AppClient, tenant: TenantHandle, world: World) -> None:
    """Every turn as a bot sends it."""
    for n, (where, items, via) in enumerate(world.turns):
        context = {**where.context, "sender_name": world.names[where.user_id]}
        if via == "end":
            body = {**context, "request_id": f"t{n}", "observations": items}
            response = await client.post("/v1/end", json=body, headers=tenant.headers)
            assert response.status_code == 202, f"/v1/end in {where}: {response.text}"
        else:
            messages = [{"message_id": f"m{n}.{k}", "text": t} for k, t in enumerate(items)]
            body = {**context, "messages": messages}
            response = await client.post("/v1/messages", json=body, headers=tenant.headers)
            assert response.status_code == 202, f"/v1/messages in {where}: {response.text}"


async def drain(client: AppClient, tenant: TenantHandle) -> None:
    """Wait until the tenant has no queued or running job; none may have failed."""

    async def idle() -> bool:
        for status in ("queued", "running"):
            page = await client.get(f"/v1/jobs?status={status}", headers=tenant.headers)
            if page.json()["jobs"]:
                return False
        return True

    await wait_for(idle, timeout=60)
    failed = await client.get("/v1/jobs?status=failed", headers=tenant.headers)
    assert failed.json()["jobs"] == [], f"failed jobs: {failed.text}"


def _tool(name: str, context: dict[str, Any], **arguments: Any) -> tuple[str, str, Any]:
    body = {"name": name, "arguments": arguments, "context": context}
    return f"tools/call {name} {json.dumps(arguments)}", "/v1/tools/call", body


def read_requests(asker: Conversation, world: World) -> list[tuple[str, str, Any]]:
    """(label, path, POST body or None for GET) of every read path, asked from ``asker``."""
    context = asker.context
    group, user = asker.group_id, asker.user_id
    scope = {"group_id": group, "user_id": user} if group else {"user_id": user}
    reads: list[tuple[str, str, Any]] = [
        ("POST /v1/context", "/v1/context", {**context, "message": QUERY}),
        (
            "POST /v1/memories/search",
            "/v1/memories/search",
            {"query": QUERY, "top_k": 200, "include_inactive": True, **scope},
        ),
        ("POST /v1/events/search", "/v1/events/search", {"query": QUERY, "top_k": 200, "context": context}),
        ("POST /v1/profiles/search", "/v1/profiles/search", {"query": QUERY, "top_k": 200, "context": context}),
        _tool("cognitive_search_memories", context, query=QUERY, top_k=200),
        _tool("cognitive_search_events", context, query=QUERY, top_k=200),
        _tool("cognitive_search_profiles", context, query=QUERY, top_k=200),
    ]  # fmt: skip
    for other in world.groups:
        reads.append(_tool("cognitive_get_profile", context, entity_type="group", entity_id=other))
    for person in world.names:
        reads.append(_tool("cognitive_get_profile", context, entity_type="user", entity_id=person))
        if group:
            reads.append(
                _tool("cognitive_get_profile", context, entity_type="member", entity_id=person)
            )
    # The profile routes take no conversation: each is asked as the conversation it names.
    if group:
        reads += [
            (f"GET /v1/profiles?group_id={group}", "/v1/profiles", {"group_id": group}),
            (f"GET /v1/profiles/group/{group}", f"/v1/profiles/group/{group}", None),
            (f"GET /v1/profiles/member/{group}/{user}", f"/v1/profiles/member/{group}/{user}", None),
        ]  # fmt: skip
    else:
        reads += [
            (f"GET /v1/profiles?user_id={user}", "/v1/profiles", {"user_id": user}),
            (f"GET /v1/profiles/user/{user}", f"/v1/profiles/user/{user}", None),
        ]
    return reads


async def read(client: AppClient, tenant: TenantHandle, path: str, body: Any) -> Any:
    """An answer's JSON; a refusal (403) or nothing found (404) shows nothing."""
    if path == "/v1/profiles":
        response = await client.get(path, params=body, headers=tenant.headers)
    elif body is None:
        response = await client.get(path, headers=tenant.headers)
    else:
        response = await client.post(path, json=body, headers=tenant.headers)
    if response.status_code in (403, 404):
        return None
    assert response.status_code == 200, f"{path} {body}: {response.status_code} {response.text}"
    return response.json()


def holding(answer: Any, mark: str) -> list[Any]:
    """The innermost objects of an answer that hold ``mark`` (for a failure's message)."""
    if isinstance(answer, list):
        return [h for item in answer for h in holding(item, mark)]
    if not isinstance(answer, dict):
        return [answer] if isinstance(answer, str) and mark in answer else []
    inner = [
        h for value in answer.values() if not isinstance(value, str) for h in holding(value, mark)
    ]
    if inner:
        return inner
    return [answer] if mark in json.dumps(answer, ensure_ascii=False) else []


def is_profile_read(label: str) -> bool:
    return "profile" in label and "context" not in label


async def check_every_read(
    client: AppClient, tenant: TenantHandle, world: World
) -> dict[str, set[Conversation]]:
    """Ask every read path from every conversation; each marker found must be visible there.
    Returns the conversations each marker was seen from."""
    seen: dict[str, set[Conversation]] = {}
    for asker in world.conversations():
        members = set(world.groups.get(asker.group_id or "", []))
        for label, path, body in read_requests(asker, world):
            answer = await read(client, tenant, path, body)
            found = set(MARKER.findall(json.dumps(answer, ensure_ascii=False)))
            for mark in sorted(found):
                seen.setdefault(mark, set()).add(asker)
                origin = world.origins.get(mark)
                assert origin is not None, f"{label} from {asker}: unknown marker {mark}"
                assert origin.visible_from(asker, members, is_profile_read(label)), (
                    f"{label} asked from {asker} shows {mark}, said in {origin}:"
                    f" {holding(answer, mark)}"
                )
    return seen


async def check_exports(client: AppClient, tenant: TenantHandle, world: World) -> None:
    """A person's export (what they are given of their data) holds only what one of their
    own conversations may see: never another person's private chat."""
    for person in world.names:
        response = await client.get(f"/v1/users/{person}/export", headers=tenant.headers)
        assert response.status_code == 200, f"export of {person}: {response.text}"
        theirs = [c for c in world.conversations() if c.user_id == person]
        for mark in sorted(set(MARKER.findall(response.text))):
            origin = world.origins[mark]
            assert any(
                origin.visible_from(c, set(world.groups.get(c.group_id or "", [])), True)
                for c in theirs
            ), f"the export of {person} shows {mark}, said in {origin}"


# Each example is a tenant read dozens of times over HTTP: shrinking one took minutes, and a
# failure already names the path, the conversation and the turn the item came from.
EXAMPLES = settings(
    max_examples=10,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


async def _visibility(app: AppClient, world: World) -> None:
    tenant = await new_tenant(app)
    await hand_over(app, tenant, world)
    await drain(app, tenant)
    seen = await check_every_read(app, tenant, world)
    await check_exports(app, tenant, world)
    # The reads reach what was said: each handed-over turn's conversation shows some of it,
    # and a turn marked shareable reaches its person speaking in a group they are in. (A
    # message is remembered only if the rules find a fact in it that is no longer relative:
    # "don't share this" still says "this".)
    for where, items, via in world.turns:
        if via != "end":
            continue
        own = {m for m, o in world.origins.items() if o.said_in == where}
        assert any(where in seen.get(m, ()) for m in own), (
            f"no read from {where} found what was said there by /v1/{via}: {items}"
        )
        shared = {m for m in own if world.origins[m].shareable}
        theirs = {Conversation(g, where.user_id) for g, ms in world.groups.items()}
        if shared and any(where.user_id in ms for ms in world.groups.values()):
            assert any(theirs & seen.get(m, set()) for m in shared), (
                f"no read from {where.user_id}'s groups found what they marked shareable: {items}"
            )


@EXAMPLES
@given(world=worlds(consent=False))
async def test_no_wording_lets_a_fact_out_of_its_conversation(app: AppClient, world: World) -> None:
    await _visibility(app, world)


@EXAMPLES
@given(world=worlds(consent=True))
async def test_a_fact_marked_shareable_reaches_only_its_persons_conversations(
    app: AppClient, world: World
) -> None:
    await _visibility(app, world)


# Every table of a tenant that holds what people said or who they are.
TABLES = [
    "messages",
    "events",
    "memos",
    "memories",
    "memory_history",
    "profiles",
    "profile_revisions",
    "todos",
    "conversations",
    "jobs",
]


async def rows_as_text(db_url: str, tenant: TenantHandle) -> dict[str, list[str]]:
    """Each table's rows of the tenant, as JSON text."""
    async with raw_connection(db_url) as conn:
        return {
            table: [
                r["j"]
                for r in await conn.fetch(
                    # A vector holds no words; the rest of the row is read whole.
                    f"SELECT (to_jsonb(x) - 'embedding')::text AS j FROM {table} AS x"
                    " WHERE tenant_id = $1",
                    uuid.UUID(tenant.id),
                )
            ]
            for table in TABLES
        }


async def erase(client: AppClient, tenant: TenantHandle, person: str) -> None:
    response = await client.delete(f"/v1/users/{person}", headers=tenant.headers)
    assert response.status_code in (200, 202), f"DELETE /v1/users/{person}: {response.text}"
    await drain(client, tenant)


@EXAMPLES
@given(world=worlds(consent=True), pick=st.integers(0, 5))
async def test_erasing_a_person_leaves_nothing_of_theirs_and_all_of_the_rest(
    app: AppClient, db_url: str, world: World, pick: int
) -> None:
    tenant = await new_tenant(app)
    await hand_over(app, tenant, world)
    await drain(app, tenant)
    speakers = sorted({where.user_id for where, _, _ in world.turns})
    person = speakers[pick % len(speakers)]
    theirs = {m for m, o in world.origins.items() if o.said_in.user_id == person}
    others = set(world.origins) - theirs
    before = await rows_as_text(db_url, tenant)
    held = {m for rows in before.values() for r in rows for m in MARKER.findall(r)}
    assert theirs & held, f"nothing {person!r} said was stored: {world.turns}"
    await erase(app, tenant, person)
    after = await rows_as_text(db_url, tenant)
    for table, rows in after.items():
        for row in rows:
            assert person not in row, f"{table} still holds erased {person!r}: {row}"
            left = theirs.intersection(MARKER.findall(row))
            assert not left, f"{table} still holds {sorted(left)} said by {person!r}: {row}"
    kept = {m for rows in after.values() for r in rows for m in MARKER.findall(r)}
    lost = others - kept
    details = {m: str(world.origins[m]) for m in sorted(lost)}
    assert not lost, f"erasing {person!r} lost others' words: {details}"
