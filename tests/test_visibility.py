"""The privacy rule itself (``service.visibility``): where an item may be shown, derived once,
and the reader's filter, the same in Python and in SQL.

The read paths over HTTP are checked in ``test_visibility_properties.py``; this file checks
the rule they all go through, over every place and every reader of a small universe whose ids
repeat across groups, and over generated texts and marks.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import column
from sqlalchemy.dialects import postgresql

from service.visibility import (
    PROFILE_SCOPES,
    SCOPES,
    Columns,
    Viewer,
    Visibility,
    derive,
    narrowest,
    of_profile,
)
from tests.conftest import plain_dsn

# Ids that repeat across kinds: "a" is a person and a group, as platform ids are.
PEOPLE = ("a", "b", "g")
GROUPS = ("g", "h", "a")


def places() -> Iterator[Visibility]:
    """Every place an item of the universe can have."""
    for person in PEOPLE:
        yield Visibility("PRIVATE", None, person)
        yield Visibility("GLOBAL", None, person)
        for group in GROUPS:
            yield Visibility("MEMBER_IN_GROUP", group, person)
    for group in GROUPS:
        yield Visibility("GROUP", group, None)


def readers() -> Iterator[Viewer]:
    """Every reader: each group with no person or each person, each private chat, each
    narrowing to a subset of scopes."""
    subsets = [tuple(c) for n in range(len(SCOPES) + 1) for c in itertools.combinations(SCOPES, n)]
    for scopes in subsets:
        for group in GROUPS:
            for person in (None, *PEOPLE):
                yield Viewer(group, person, scopes)
        for person in PEOPLE:
            yield Viewer(None, person, scopes)


def reach(viewer: Viewer) -> set[Visibility]:
    return {p for p in places() if viewer.sees(p)}


def test_a_private_item_is_read_only_in_its_persons_private_chat() -> None:
    for viewer in readers():
        for place in reach(viewer):
            if place.scope == "PRIVATE":
                assert viewer.group_id is None and viewer.user_id == place.user_id
            if place.scope in ("GROUP", "MEMBER_IN_GROUP"):
                assert viewer.group_id == place.group_id
            if place.scope == "GLOBAL":
                assert viewer.user_id == place.user_id
            assert place.scope in viewer.scopes


def test_a_group_reads_its_members_items_and_a_private_chat_its_own() -> None:
    # Whoever is served in a group reads what every member said there, and of GLOBAL items
    # only their own; nothing of another group, nothing PRIVATE.
    assert reach(Viewer("g", "a")) == {
        Visibility("GROUP", "g"),
        *(Visibility("MEMBER_IN_GROUP", "g", p) for p in PEOPLE),
        Visibility("GLOBAL", None, "a"),
    }
    assert reach(Viewer("h", "b")) == {
        Visibility("GROUP", "h"),
        *(Visibility("MEMBER_IN_GROUP", "h", p) for p in PEOPLE),
        Visibility("GLOBAL", None, "b"),
    }
    assert reach(Viewer("g", None)) == {
        Visibility("GROUP", "g"),
        *(Visibility("MEMBER_IN_GROUP", "g", p) for p in PEOPLE),
    }
    assert reach(Viewer.private("a")) == {
        Visibility("PRIVATE", None, "a"),
        Visibility("GLOBAL", None, "a"),
    }


async def test_the_sql_filter_reads_what_the_rule_says(db_url: str) -> None:
    """``Viewer.where`` as PostgreSQL runs it selects exactly what ``Viewer.sees`` says, for
    every reader and place of the universe."""
    rows = list(places())
    values = ", ".join(
        f"({n}, '{p.scope}', {repr(p.group_id) if p.group_id else 'NULL'}, "
        f"{repr(p.user_id) if p.user_id else 'NULL'})"
        for n, p in enumerate(rows)
    )
    columns = Columns(column("scope"), column("group_id"), column("user_id"))  # type: ignore[arg-type]
    connection = await asyncpg.connect(plain_dsn(db_url))
    try:
        checked = 0
        for viewer in readers():
            clause = viewer.where(columns).compile(
                dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}
            )
            found = await connection.fetch(
                f"SELECT n FROM (VALUES {values}) AS p(n, scope, group_id, user_id) WHERE {clause}"
            )
            assert {rows[r["n"]] for r in found} == reach(viewer), viewer
            checked += 1
        assert checked == 16 * (len(GROUPS) * (len(PEOPLE) + 1) + len(PEOPLE))
    finally:
        await connection.close()


def test_a_reader_writes_only_where_it_reads() -> None:
    for viewer in readers():
        for place in places():
            if viewer.allows(place.scope, place.group_id, place.user_id):
                # A group that serves no one person writes GLOBAL items of its members.
                assert viewer.sees(place) or (
                    place.scope == "GLOBAL" and viewer.group_id and not viewer.user_id
                )
                # Serving one person, it files member items under that person only.
                if place.scope == "MEMBER_IN_GROUP" and viewer.user_id:
                    assert place.user_id == viewer.user_id


def test_a_member_item_is_read_by_every_member_of_its_group_and_nowhere_else() -> None:
    item = Visibility("MEMBER_IN_GROUP", "g", "b")
    for viewer in readers():
        if "MEMBER_IN_GROUP" not in viewer.scopes:
            assert not viewer.sees(item)
        else:
            assert viewer.sees(item) == (viewer.group_id == "g"), viewer
    assert Viewer("g", "a").sees(item) and Viewer("g", "b").sees(item)
    assert not Viewer("h", "b").sees(item)  # the same person in another group
    assert not Viewer.private("b").sees(item)  # the person's private chat
    assert not Viewer.private("a").sees(item)


def test_a_profile_is_shown_where_its_kind_says() -> None:
    assert set(PROFILE_SCOPES) == {"user", "group", "member", "private"}
    for viewer in readers():
        if viewer.scopes != SCOPES:
            continue
        for kind, ident, group in viewer.profiles():
            assert viewer.sees(of_profile(kind, ident, group))
    assert not Viewer("g", "a").sees(of_profile("private", "a"))
    assert not Viewer.private("a").sees(of_profile("private", "b"))
    assert not Viewer("h", "a").sees(of_profile("group", "g"))


ID = st.text("ab:g%", min_size=1, max_size=4)
KEY = st.builds(lambda kind, ident: f"{kind}:{ident}", st.sampled_from("gp"), ID)
# What people say when they tell a secret or let a thing be known, sensitive data in disguise,
# and plain facts: none of it decides anything.
TEXT = st.sampled_from(
    [
        "我在偷偷准备惊喜，千万不要告诉大家",
        "可以告诉大家，我喜欢猫",
        "don't share this with the group: I am moving",
        "我的手机号是１３８００１３８０００",
        "我有心脏病，在打胰岛素",
        "alice＠example.com is my mail",
        "I like jazz",
    ]
)


@given(KEY, st.one_of(st.none(), ID), st.booleans(), TEXT)
def test_an_item_is_never_wider_than_its_source_without_the_persons_mark(
    key: str, about: str | None, marked: bool, text: str
) -> None:
    said = Visibility.of_conversation(key, about)
    place = derive(key, about, marked=marked, text=text)
    if not marked:
        assert place == said  # no wording widens anything
    if place.scope == "GLOBAL":
        assert marked
        assert place.user_id == (about or said.user_id)
        assert not any(w in text for w in ("１３８", "心脏病", "＠"))
    else:
        assert place == said


@given(st.sampled_from(list(places())), st.sampled_from(list(places())))
def test_narrowing_stays_within_the_ceiling(wanted: Visibility, ceiling: Visibility) -> None:
    placed = narrowest(wanted, ceiling)
    assert placed.within(ceiling)
    assert placed == (wanted if wanted.within(ceiling) else ceiling)


@pytest.mark.parametrize("person", ["a", "a:b", "%"])
def test_a_private_chat_is_its_persons_conversation(person: str) -> None:
    viewer = Viewer.private(person)
    assert viewer.conversation_key == f"p:{person}"
    assert Viewer.of_key(viewer.conversation_key) == viewer
    assert Viewer.of_key(f"g:{person}", "b") == Viewer(person, "b")
