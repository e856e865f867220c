"""Erasure against hostile names and ids, as properties over generated people (hypothesis).

People get ids and display names drawn to collide with each other's text: common words,
numbers, YAML keys, regular-expression and LIKE metacharacters, ':' '/' '%' '\\' in ids.
Erasing one of them must leave every row that is not about them byte-identical (in this
tenant, in their other conversations and in another tenant), delete every row that is theirs
by id, keep others' statements that name them (only the name goes), and leave no trace.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.app import create_app
from service.privacy.erasure import erase_user
from service.privacy.redaction import ERASED, is_distinct_name
from service.profiles.document import Profile, ProfileKey, render, split
from service.runtime import Runtime
from tests.conftest import AppClient, make_settings, raw_connection, serve_app

# Words that other people's texts are made of, and that names and ids are drawn from.
COLLIDING = [
    "is", "2", "tags", "name", "entity_id", "updated_at", "Paris", "Bob", "Ann", "Anna",
    "甄士隐", "士隐", "猫", "*", "(", ")", "%", "_", "..", ".*", "\\", "[", "a|b", "---",
    ":", "'", '"', "#", "- x", "{}", "null", "true", "10001", "1000",
]  # fmt: skip
WORD = st.one_of(st.sampled_from(COLLIDING), st.text("abcXYZ猫狗的 ", min_size=1, max_size=6))
ID = st.one_of(
    st.sampled_from(["2", "10001", "%", "_", "*", "a:b", "a/b", "x%y", "\\", "is", "tags"]),
    st.text("0123456789ab:/%_\\.*", min_size=1, max_size=8),
)
NAME = st.one_of(WORD, st.text("AnBoParis甄士隐 ", min_size=1, max_size=8))
TEXT = st.lists(WORD, min_size=1, max_size=6).map(" ".join)


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[AppClient]:
    async with serve_app(create_app(make_settings(db_url), migrate=False, run_worker=False)) as c:
        yield c


TABLES = {
    "messages": "conversation_key, message_id",
    "events": "id",
    "memos": "id",
    "memories": "id",
    "profiles": "profile_key",
    "profile_revisions": "profile_key, version",
    "todos": "id",
    "jobs": "id",
    "conversations": "conversation_key",
}
# Where each table names a person by id.
ID_COLUMNS = {
    "messages": ["sender_id", "user_id"],
    "events": ["sender_id", "user_id"],
    "memos": ["sender_id", "user_id"],
    "memories": ["user_id"],
    "profiles": ["entity_id"],
    "todos": ["creator_id", "assignee_id", "user_id"],
    "conversations": ["user_id"],
}


async def snapshot(conn: asyncpg.Connection) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Every row of every tenant, by (tenant, table, key), as its full JSON."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for table, key in TABLES.items():
        for r in await conn.fetch(
            f"SELECT tenant_id::text AS t, ({key})::text AS k, to_jsonb(x)::text AS j"
            f" FROM {table} AS x"
        ):
            rows[(r["t"], table, r["k"])] = json.loads(r["j"])
    return rows


def document(key: ProfileKey, name: str, body: str) -> str:
    return render(
        Profile(
            key=key,
            name=name,
            tags=[name],
            updated_at=datetime(2026, 1, 1, tzinfo=UTC),
            source_event_id=None,
            body=body,
        )
    )


async def populate(
    conn: asyncpg.Connection, tenant: uuid.UUID, people: list[tuple[str, str]], texts: list[str]
) -> None:
    """Each person speaks in group g1 (all of them) and g2 (all but the first); texts mention
    each other's names and ids; profiles, memories, memos, todos and queued hand-overs too."""
    await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, 'p')", tenant)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    n = 0
    for i, (pid, name) in enumerate(people):
        groups = ["g1"] if i == 0 else ["g1", "g2"]
        for group in groups:
            key = f"g:{group}"
            for text in texts:
                n += 1
                said = f"{text} {people[(i + 1) % len(people)][1]}"
                await conn.execute(
                    "INSERT INTO messages (tenant_id, conversation_key, message_id, request_type,"
                    " group_id, sender_id, sender_name, text, sent_at)"
                    " VALUES ($1, $2, $3, 'group', $4, $5, $6, $7, $8)",
                    tenant, key, f"m{n}", group, pid, name, said, now,
                )  # fmt: skip
                await conn.execute(
                    "INSERT INTO events (tenant_id, id, conversation_key, request_type, group_id,"
                    " sender_id, request_id, end_seq, kind, perspective, text, source_text,"
                    " is_absolute, occurred_at, timezone, metadata)"
                    " VALUES ($1, $2, $3, 'group', $4, $5, $6, 1, 'observation', 'third', $7,"
                    " $7, true, $8, 'UTC', $9::jsonb)",
                    tenant, f"e{n}", key, group, pid, f"r{n}", said, now,
                    json.dumps({"about": said}),
                )  # fmt: skip
                await conn.execute(
                    "INSERT INTO memos (tenant_id, conversation_key, request_type, group_id,"
                    " sender_id, request_id, end_seq, memo, said_at)"
                    " VALUES ($1, $2, 'group', $3, $4, $5, 1, $6, $7)",
                    tenant, key, group, pid, f"r{n}", said, now,
                )  # fmt: skip
                await conn.execute(
                    "INSERT INTO memories (tenant_id, scope, user_id, group_id, category, content)"
                    " VALUES ($1, 'GROUP', NULL, $2, 'FACT', $3),"
                    "        ($1, 'MEMBER_IN_GROUP', $4, $2, 'PREFERENCE', $3)",
                    tenant, group, said, pid,
                )  # fmt: skip
                await conn.execute(
                    "INSERT INTO todos (tenant_id, conversation_key, group_id, creator_id,"
                    " description) VALUES ($1, $2, $3, $4, $5)",
                    tenant, key, group, pid, said,
                )  # fmt: skip
                payload = {
                    "context": {"group_id": group, "sender_id": pid, "sender_name": name},
                    "observations": [said],
                    "recent_messages": [{"sender_id": p, "text": said} for p, _ in people],
                }
                await conn.execute(
                    "INSERT INTO jobs (tenant_id, kind, payload) VALUES ($1, 'historian.end', $2)",
                    tenant, json.dumps(payload, ensure_ascii=False),
                )  # fmt: skip
            member = ProfileKey("member", pid, group)
            for version in (1, 2):
                body = f"{texts[0]} {people[(i + version) % len(people)][1]}"
                await _profile(conn, tenant, member, name, body, version)
    for group in ("g1", "g2"):
        body = " ".join(name for _, name in people)
        await _profile(conn, tenant, ProfileKey("group", group), group, body, 1)


async def _profile(
    conn: asyncpg.Connection, tenant: uuid.UUID, key: ProfileKey, name: str, body: str, v: int
) -> None:
    doc = document(key, name, body)
    if v > 1:
        old = await conn.fetchval(
            "SELECT document FROM profiles WHERE tenant_id = $1 AND profile_key = $2",
            tenant, key.key,
        )  # fmt: skip
        await conn.execute(
            "INSERT INTO profile_revisions (tenant_id, profile_key, version, document)"
            " VALUES ($1, $2, $3, $4)",
            tenant, key.key, v - 1, old,
        )  # fmt: skip
    await conn.execute(
        "INSERT INTO profiles (tenant_id, profile_key, entity_type, entity_id, group_id, name,"
        " tags, document, body, version, updated_at)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10, '2026-01-01T00:00:00Z')"
        " ON CONFLICT (tenant_id, profile_key) DO UPDATE SET document = EXCLUDED.document,"
        " body = EXCLUDED.body, version = EXCLUDED.version",
        tenant, key.key, key.entity_type, key.entity_id, key.group_id, name,
        json.dumps([name]), doc, body, v,
    )  # fmt: skip


def whole_word(name: str, text: str) -> bool:
    """An independent check of "the text names them": the name with no letter or digit of
    a spaced script glued to either end (Han and kana need no boundary)."""
    edge = r"[A-Za-z0-9_]"
    left = f"(?<!{edge})" if re.match(edge, name[0]) else ""
    right = f"(?!{edge})" if re.match(edge, name[-1]) else ""
    return re.search(left + re.escape(name) + right, text) is not None


def strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def statements(table: str, row: dict[str, Any]) -> list[str]:
    """The texts of a row that are someone's words (not display names or ids)."""
    if table == "profiles":
        return [row["body"]]
    if table == "profile_revisions":
        return [split(row["document"])[1]]
    if table == "jobs":
        return strings(row["payload"].get("observations")) + strings(
            [m for m in row["payload"].get("recent_messages", []) if isinstance(m, dict)]
        )
    columns = {
        "messages": ["text"],
        "events": ["text", "source_text", "metadata"],
        "memos": ["memo"],
        "memories": ["content"],
        "todos": ["description"],
    }.get(table, [])
    return [s for c in columns for s in strings(row.get(c))]


def owned(table: str, row: dict[str, Any], victim: str) -> bool:
    if any(row.get(c) == victim for c in ID_COLUMNS.get(table, [])):
        return table != "profiles" or row["entity_type"] in ("user", "member")
    if table == "profile_revisions":
        return False  # decided by its profile, below
    if table == "jobs":
        return row["payload"]["context"].get("sender_id") == victim
    return False


def in_shared_scope(table: str, row: dict[str, Any]) -> bool:
    """The victim spoke in g1 only."""
    if table in ("profiles", "profile_revisions"):
        return ":g1" in row["profile_key"] or row["profile_key"] == "group:g1"
    if table == "jobs":
        return row["payload"]["context"].get("group_id") == "g1"
    return row.get("group_id") == "g1" or row.get("conversation_key") == "g:g1"


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    people=st.lists(st.tuples(ID, NAME), min_size=2, max_size=3, unique_by=lambda p: p[0]),
    texts=st.lists(TEXT, min_size=1, max_size=2),
)
async def test_erasing_one_person_touches_only_what_is_about_them(
    app: AppClient, db_url: str, people: list[tuple[str, str]], texts: list[str]
) -> None:
    rt: Runtime = app.app.state.runtime
    async with raw_connection(db_url) as conn:
        victim, victim_name = people[0]
        # Texts naming the victim and containing their id, in both groups.
        texts = [*texts, f"{victim_name} said {victim} twice"]
        tenant, bystander = uuid.uuid4(), uuid.uuid4()
        await populate(conn, tenant, people, texts)
        await populate(conn, bystander, people, texts)  # another tenant, same people
        before = await snapshot(conn)
        async with rt.db.tenant(tenant) as session:
            await erase_user(session, tenant, victim, rt.embedder, requested_by="t", keep=5)
        after = await snapshot(conn)
        others = {n.strip() for p, n in people[1:]}
        name = victim_name.strip()
        redactable = is_distinct_name(name) and name not in others and name != victim
        gone_profiles = {
            k[2]
            for k, row in before.items()
            if k[0] == str(tenant) and k[1] == "profiles" and owned("profiles", row, victim)
        }
        for key, row in before.items():
            t, table, _ = key
            mine = t == str(tenant) and (
                owned(table, row, victim)
                or (table == "profile_revisions" and row["profile_key"] in gone_profiles)
                or (table == "conversations" and row["conversation_key"] == f"p:{victim}")
            )
            if mine:
                assert key not in after, f"{table} row of the erased person kept: {row}"
                continue
            assert key in after, f"{table} row of someone else deleted: {row}"
            if after[key] == row:
                continue
            # Changed: only a statement in the victim's conversation that names them (only
            # the marker stands where the name was), or a job quoting a message of theirs.
            assert t == str(tenant) and in_shared_scope(table, row), (
                f"{table} row changed outside the erased person's conversations: {row}"
            )
            quotes = table == "jobs" and any(
                m.get("sender_id") == victim for m in row["payload"].get("recent_messages", [])
            )
            names_them = redactable and any(whole_word(name, s) for s in strings(row))
            assert quotes or names_them, f"{table} row changed: {row} -> {after[key]}"
            if names_them:
                assert ERASED in json.dumps(after[key], ensure_ascii=False)
        # No trace: no id column holds them, no statement in their conversation names them.
        for key, row in after.items():
            t, table, _ = key
            if t != str(tenant):
                continue
            assert not owned(table, row, victim), f"{table} still holds {victim!r}: {row}"
            if redactable and in_shared_scope(table, row) and table not in ("conversations",):
                text = [s for s in statements(table, row) if whole_word(name, s)]
                assert not text, f"{table} still names {name!r}: {row}"
        stone = await conn.fetchrow("SELECT * FROM erasures WHERE tenant_id = $1", tenant)
        plain = hashlib.sha256(f"{tenant}:user:{victim}".encode()).hexdigest()
        assert stone["subject_hash"] != plain and stone["subject_hash"] != victim
