"""What profiles and their kept revisions hold of people: how a subject's profiles are
found, exported, erased and redacted (see ``service.db.registry``)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any

from sqlalchemy import text

from service.context import conversation_key
from service.db.registry import PersonalTable, Rebuilding, Redaction, names_filter
from service.profiles import repository as profiles
from service.profiles.consolidate import digest
from service.profiles.document import Profile, parse, render
from service.profiles.models import EMBEDDED as _PROFILE_DIGEST

# The profiles of the person's groups, of fellow members and of the people they spoke with.
_IN_SCOPE = (
    "((entity_type = 'group' AND entity_id = ANY(:groups))"
    " OR (entity_type = 'member' AND group_id = ANY(:groups))"
    " OR (entity_type = 'user' AND entity_id = ANY(:peers)))"
)
# What an erasure redacts: those, and the private profiles of the people they spoke with
# (which an export of the person never shows: they are another person's private chat).
_REACH = (
    "((entity_type = 'group' AND entity_id = ANY(:groups))"
    " OR (entity_type = 'member' AND group_id = ANY(:groups))"
    " OR (entity_type IN ('user', 'private') AND entity_id = ANY(:peers)))"
)
_OWN = "entity_id = :u AND entity_type IN ('user', 'member', 'private')"


def _redactor(r: Redaction, row: Any) -> Any:
    """A group's and its members' profiles are that group's conversation's; a peer's own
    profile is of none."""
    if row.entity_type == "group":
        return r.redactor_in(f"g:{row.entity_id}")
    if row.entity_type == "member":
        return r.redactor_in(f"g:{row.group_id}")
    return r.redactor


# A word of a text: a run of four or more letters or digits, or two Han characters.
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_'-]{3,}|[\u4e00-\u9fff]{2,}")


def _words(text_: str) -> set[str]:
    words: set[str] = set()
    for run in _WORD.findall(text_):
        if run[0].isascii():
            words.add(run.lower())
        else:
            words.update(run[i : i + 2] for i in range(len(run) - 1))
    return words


# What was said in a group (its messages, its events' texts and what they were rewritten
# from), by the person (``:mine`` true) or by everyone else. The names people go by there (the
# senders', the profiles') are nobody's words: a line naming someone loses only the name.
_SAID_IN_GROUP = """
    SELECT text FROM messages
    WHERE tenant_id = :t AND conversation_key = :k
      AND (sender_id IS NOT DISTINCT FROM :u OR user_id IS NOT DISTINCT FROM :u) = :mine
    UNION ALL
    SELECT text || ' ' || source_text FROM events
    WHERE tenant_id = :t AND conversation_key = :k
      AND (sender_id IS NOT DISTINCT FROM :u OR user_id IS NOT DISTINCT FROM :u) = :mine
"""
_NAMES_IN_GROUP = """
    SELECT DISTINCT sender_name FROM messages
    WHERE tenant_id = :t AND conversation_key = :k AND sender_name IS NOT NULL
    UNION
    SELECT name FROM profiles
    WHERE tenant_id = :t AND ((entity_type = 'group' AND entity_id = :g)
                              OR (entity_type = 'member' AND group_id = :g))
"""
_THEIR_GROUPS = """
    SELECT DISTINCT conversation_key FROM messages
    WHERE tenant_id = :t AND (sender_id = :u OR user_id = :u) AND conversation_key LIKE 'g:%'
    UNION
    SELECT DISTINCT conversation_key FROM events
    WHERE tenant_id = :t AND (sender_id = :u OR user_id = :u) AND conversation_key LIKE 'g:%'
"""
# The group's profiles other than the person's own (erased with them), and their revisions:
# each text with its version, and what replaced it (whose words the next version brought).
_GROUP_PROFILES = """
    SELECT profile_key, document, version, NULL::jsonb AS replaced_by, true AS current
    FROM profiles
    WHERE tenant_id = :t AND ((entity_type = 'group' AND entity_id = :g)
                              OR (entity_type = 'member' AND group_id = :g AND entity_id <> :u))
    UNION ALL
    SELECT r.profile_key, r.document, r.version, r.replaced_by, false AS current
    FROM profile_revisions AS r
    JOIN profiles AS p ON p.tenant_id = r.tenant_id AND p.profile_key = r.profile_key
    WHERE r.tenant_id = :t AND ((p.entity_type = 'group' AND p.entity_id = :g)
                                OR (p.entity_type = 'member' AND p.group_id = :g
                                    AND p.entity_id <> :u))
"""
_THEIR_EVENTS = """
    SELECT id FROM events
    WHERE tenant_id = :t AND conversation_key = :k AND (sender_id = :u OR user_id = :u)
"""


def _without(body: str, only_theirs: set[str], brought: set[str]) -> str:
    """The body less every line the person's changes brought, and every line holding a word
    nobody but the person said."""
    return "\n".join(
        line
        for line in body.split("\n")
        if line.strip() not in brought and not (_words(line) & only_theirs)
    )


async def _only_theirs(r: Rebuilding, key: str, group: str) -> set[str]:
    """The words of the person's that nobody else said in the group (nor is a name there).
    The others' texts are read only until every word of the person's is found among them."""
    params: dict[str, Any] = {"t": r.tenant_id, "u": r.person_id, "k": key, "g": group}
    only: set[str] = set()
    for said in await r.session.execute(text(_SAID_IN_GROUP), {**params, "mine": True}):
        only.update(_words(said.text or ""))
    only -= _words(" ".join([*r.names, r.person_id]))
    for (name,) in await r.session.execute(text(_NAMES_IN_GROUP), params):
        only -= _words(name or "")
    if only:
        others = await r.session.stream(text(_SAID_IN_GROUP), {**params, "mine": False})
        async for said in others:
            only -= _words(said.text or "")
            if not only:
                break
        await others.close()
    return only


Made = Callable[[dict[str, Any], str | None], bool]


def _made_by(hashed: str, events: set[str]) -> Made:
    """Whether a change (what replaced a text, and the event the new text names) was made of
    the person's words: their keyed hash among its ``people``, or their event as its source."""

    def made(cause: dict[str, Any], source_event_id: str | None) -> bool:
        return (bool(hashed) and hashed in cause.get("people", ())) or (
            source_event_id is not None and source_event_id in events
        )

    return made


def _brought(rows: list[Any], texts: dict[int, Profile], theirs: Made) -> set[str]:
    """The lines the person's changes brought to one profile, from its kept texts in order of
    version: a change made of their words brought the lines of the new text the old one
    lacks, however the model worded them; a first version made of their words, all of its
    lines."""
    lines: set[str] = set()
    first = texts[rows[0].version]
    if rows[0].version == 1 and theirs({}, first.source_event_id):
        lines |= _lines(first.body)
    for older, newer in itertools.pairwise(rows):
        if newer.version != older.version + 1:
            continue  # a gap in what is kept: which change brought what cannot be told
        if theirs(older.replaced_by or {}, texts[newer.version].source_event_id):
            lines |= _lines(texts[newer.version].body) - _lines(texts[older.version].body)
    return lines


def _lines(body: str) -> set[str]:
    return {line.strip() for line in body.split("\n") if line.strip()}


async def rebuild_profiles(r: Rebuilding) -> None:
    """The profiles of the person's groups (the group's own, the other members') lose every
    line their changes brought (``_brought``) and every line holding a word only they said in
    that group, and so do the kept revisions. Changed in place, so no revision keeps it."""
    params: dict[str, Any] = {"t": r.tenant_id, "u": r.person_id}
    for (key,) in (await r.session.execute(text(_THEIR_GROUPS), params)).all():
        group = key.removeprefix("g:")
        if conversation_key("group", group, None) != key:
            continue
        only = await _only_theirs(r, key, group)
        said = await r.session.execute(text(_THEIR_EVENTS), {**params, "k": key})
        theirs = _made_by(r.hashed, {event_id for (event_id,) in said})
        kept: dict[str, list[Any]] = {}
        for row in await r.session.execute(text(_GROUP_PROFILES), {**params, "g": group}):
            kept.setdefault(row.profile_key, []).append(row)
        changed: list[tuple[str, Any, Profile]] = []  # (key, the row, its text made again)
        for profile_key, rows in kept.items():
            rows.sort(key=lambda row: row.version)
            texts = {row.version: parse(row.document, stored=True) for row in rows}
            brought = _brought(rows, texts, theirs)
            for row in rows:
                profile = texts[row.version]
                body = _without(profile.body, only, brought)
                if body != profile.body:
                    profile.body = body
                    changed.append((profile_key, row, profile))
        current = [(k, p) for k, row, p in changed if row.current]
        vectors = await r.embedder.passages([digest(p.body) for _, p in current]) if current else []
        for (profile_key, profile), vector in zip(current, vectors, strict=True):
            await r.session.execute(
                text(
                    "UPDATE profiles SET document = :d, body = :b, embedding = :e"
                    " WHERE tenant_id = :t AND profile_key = :k"
                ),
                {**params, "k": profile_key, "d": render(profile), "b": profile.body, "e": vector},
            )
            r.count("profiles_rebuilt")
        for profile_key, row, old in changed:
            if row.current:
                continue
            await r.session.execute(
                text(
                    "UPDATE profile_revisions SET document = :d"
                    " WHERE tenant_id = :t AND profile_key = :k AND version = :v"
                ),
                {**params, "k": profile_key, "v": row.version, "d": render(old)},
            )
            r.count("profile_revisions_rebuilt")


async def redact_profiles(r: Redaction) -> None:
    """Profiles in the person's reach get a new version without the name, and their kept
    revisions are redacted too; the front matter is kept byte for byte (see
    ``Redactor.document``)."""
    for row in await r.rows(
        "SELECT profile_key, entity_type, entity_id, group_id, document, version FROM profiles"
        f" WHERE tenant_id = :t AND {_REACH} AND {names_filter('document')}"
    ):
        redactor = _redactor(r, row)
        if not redactor.mentions(row.document):
            continue
        # The front matter is rebuilt by the renderer from the parsed profile, never edited
        # as text: a name that looks like YAML cannot break it.
        document = redactor.document(row.document)
        if document == row.document:
            continue  # the name was only a YAML key or the like: nothing of theirs to remove
        profile = redactor.profile(parse(row.document, stored=True))
        [vector] = await r.embedder.passages([digest(profile.body)])
        version = await profiles.write(
            r.session,
            r.tenant_id,
            profile,
            document,
            vector,
            expected=row.version,
            replaced_by={"by": "erasure"},
            keep=r.keep,
        )
        if version is not None:
            r.count("profiles_redacted")
    for row in await r.rows(
        "SELECT r.profile_key, r.version, r.document, p.entity_type, p.entity_id, p.group_id"
        " FROM profile_revisions AS r JOIN (SELECT profile_key, entity_type, entity_id,"
        f" group_id FROM profiles WHERE tenant_id = :t AND {_REACH}) AS p"
        " ON p.profile_key = r.profile_key"
        f" WHERE r.tenant_id = :t AND {names_filter('r.document')}"
    ):
        document = _redactor(r, row).document(row.document)
        if document != row.document:
            await r.session.execute(
                text(
                    "UPDATE profile_revisions SET document = :d"
                    " WHERE tenant_id = :t AND profile_key = :k AND version = :v"
                ),
                {"t": r.tenant_id, "k": row.profile_key, "v": row.version, "d": document},
            )
            r.count("profile_revisions_redacted")


# The person's profiles (shared, private, as a member); their revisions go with them (cascade).
PROFILES = PersonalTable(
    table="profiles",
    ids=("entity_id", "group_id", "profile_key"),
    personal=("name", "tags", "document", "body", "embedding"),
    not_personal={
        "entity_type": "a code from a fixed set",
        "source_event_id": "the id of the event the profile last learned from",
    },
    erase_user=(
        (
            "profiles",
            "DELETE FROM profiles WHERE tenant_id = :t AND entity_id = :u"
            " AND entity_type IN ('user', 'member', 'private')",
        ),
    ),
    erase_group=(
        (
            "profiles",
            "DELETE FROM profiles WHERE tenant_id = :t AND ((entity_type = 'group'"
            " AND entity_id = :g) OR (entity_type = 'member' AND group_id = :g))",
        ),
    ),
    rebuild_user=rebuild_profiles,
    redact=redact_profiles,
    export_user=f"""
           SELECT entity_type, entity_id, group_id, name, tags, document, version, updated_at,
                  ({_OWN}) AS own
           FROM profiles
           WHERE tenant_id = :t
             AND ({_OWN} OR ({_IN_SCOPE} AND {names_filter("document")}))
           ORDER BY profile_key""",
    export_group="""
           SELECT entity_type, entity_id, name, tags, document, version FROM profiles
           WHERE tenant_id = :t AND ((entity_type = 'group' AND entity_id = :g)
                                     OR (entity_type = 'member' AND group_id = :g))
           ORDER BY profile_key""",
    own_names=(
        "SELECT name FROM profiles"
        " WHERE tenant_id = :t AND entity_id = :u AND entity_type IN ('user', 'member', 'private')",
    ),
    # The person's group named like them, or another member of it going by the name there.
    namesakes=(
        "SELECT btrim(name) AS name, 'g:' || entity_id AS key FROM profiles"
        " WHERE tenant_id = :t AND entity_type = 'group' AND entity_id = ANY(:groups)"
        " AND btrim(name) = ANY(:names)",
        "SELECT btrim(name) AS name, 'g:' || group_id AS key FROM profiles"
        " WHERE tenant_id = :t AND entity_type = 'member' AND group_id = ANY(:groups)"
        " AND entity_id <> :u AND btrim(name) = ANY(:names)",
    ),
    conversations=(
        "SELECT 'g:' || group_id AS key FROM profiles"
        " WHERE tenant_id = :t AND entity_type = 'member' AND entity_id = :u",
    ),
    peers=(
        "SELECT entity_id AS id FROM profiles WHERE tenant_id = :t AND entity_type = 'member'"
        " AND group_id = ANY(:groups) AND entity_id <> :u",
    ),
)

# Deleted with their profile (cascade), redacted with it (above).
PROFILE_REVISIONS = PersonalTable(
    table="profile_revisions",
    ids=("profile_key",),
    personal=("document",),
    not_personal={
        "replaced_by": "what replaced the version: a code, a job or key id, keyed hashes"
    },
    export_user=f"""
           SELECT r.profile_key, r.version, r.document, r.replaced_by, r.created_at,
                  (p.entity_id = :u AND p.entity_type IN ('user', 'member', 'private')) AS own
           FROM profile_revisions AS r
           JOIN profiles AS p ON p.tenant_id = r.tenant_id AND p.profile_key = r.profile_key
           WHERE r.tenant_id = :t
             AND ((p.entity_id = :u AND p.entity_type IN ('user', 'member', 'private'))
                  OR ((
                      (p.entity_type = 'group' AND p.entity_id = ANY(:groups))
                      OR (p.entity_type = 'member' AND p.group_id = ANY(:groups))
                      OR (p.entity_type = 'user' AND p.entity_id = ANY(:peers)))
                      AND {names_filter("r.document")}))
           ORDER BY r.profile_key, r.version""",
    export_group="""
           SELECT r.profile_key, r.version, r.document, r.replaced_by, r.created_at
           FROM profile_revisions AS r
           JOIN profiles AS p ON p.tenant_id = r.tenant_id AND p.profile_key = r.profile_key
           WHERE r.tenant_id = :t AND ((p.entity_type = 'group' AND p.entity_id = :g)
                                       OR (p.entity_type = 'member' AND p.group_id = :g))
           ORDER BY r.profile_key, r.version""",
)

TABLES = (PROFILES, PROFILE_REVISIONS)
EMBEDDED = (_PROFILE_DIGEST,)
