"""What profiles and their kept revisions hold of people: how a subject's profiles are
found, exported, erased and redacted (see ``service.db.registry``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from service.db.registry import PersonalTable, Redaction, names_filter
from service.profiles import repository as profiles
from service.profiles.consolidate import digest
from service.profiles.document import parse
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
    not_personal={"replaced_by": "what replaced the version: a code and a job or key id"},
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
