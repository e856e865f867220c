"""Who a person is in a tenant's data: their ids' rows, their names, where they spoke.

Everything here is found by the person's id in id columns, compared for equality: never by
pattern (a LIKE or a regular expression built from an id lets ``%``, ``_``, ``*`` or ``\\``
reach other people's rows).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.privacy.redaction import Redactor

# The display names a person went by: their own messages, their profiles, the context of
# their hand-overs.
_OWN_NAMES = text(
    """
    SELECT sender_name AS name FROM messages
    WHERE tenant_id = :t AND sender_id = :u AND sender_name IS NOT NULL
    UNION
    SELECT name FROM profiles
    WHERE tenant_id = :t AND entity_id = :u AND entity_type IN ('user', 'member')
    UNION
    SELECT payload -> 'context' ->> 'sender_name' FROM jobs
    WHERE tenant_id = :t AND payload -> 'context' ->> 'sender_id' = :u
      AND payload -> 'context' ->> 'sender_name' IS NOT NULL
    """
)

# Which of those names someone (or something) else also goes by: then a mention of it is
# not known to be this person's.
_SHARED_NAMES = text(
    """
    SELECT sender_name AS name FROM messages
    WHERE tenant_id = :t AND sender_name = ANY(:names) AND sender_id IS DISTINCT FROM :u
    UNION
    SELECT name FROM profiles
    WHERE tenant_id = :t AND name = ANY(:names)
      AND NOT (entity_id = :u AND entity_type IN ('user', 'member'))
    UNION
    SELECT payload -> 'context' ->> 'sender_name' FROM jobs
    WHERE tenant_id = :t AND payload -> 'context' ->> 'sender_name' = ANY(:names)
      AND payload -> 'context' ->> 'sender_id' IS DISTINCT FROM :u
    UNION
    SELECT payload -> 'context' ->> 'bot_name' FROM jobs
    WHERE tenant_id = :t AND payload -> 'context' ->> 'bot_name' = ANY(:names)
    UNION
    SELECT group_name FROM conversations WHERE tenant_id = :t AND group_name = ANY(:names)
    """
)

# The group conversations the person took part in (their private chat is theirs outright).
_CONVERSATIONS = text(
    """
    SELECT conversation_key AS key FROM messages WHERE tenant_id = :t AND sender_id = :u
    UNION SELECT conversation_key FROM events
          WHERE tenant_id = :t AND (sender_id = :u OR user_id = :u)
    UNION SELECT conversation_key FROM memos
          WHERE tenant_id = :t AND (sender_id = :u OR user_id = :u)
    UNION SELECT conversation_key FROM todos
          WHERE tenant_id = :t AND (creator_id = :u OR assignee_id = :u OR user_id = :u)
    UNION SELECT 'g:' || group_id FROM profiles
          WHERE tenant_id = :t AND entity_type = 'member' AND entity_id = :u
    UNION SELECT 'g:' || group_id FROM memories
          WHERE tenant_id = :t AND user_id = :u AND group_id IS NOT NULL
    """
)

# The other people of those conversations: their own profiles and memories may name them.
_PEERS = text(
    """
    SELECT sender_id AS id FROM messages
    WHERE tenant_id = :t AND conversation_key = ANY(:keys) AND sender_id <> :u
    UNION SELECT sender_id FROM events
          WHERE tenant_id = :t AND conversation_key = ANY(:keys) AND sender_id <> :u
    UNION SELECT sender_id FROM memos
          WHERE tenant_id = :t AND conversation_key = ANY(:keys) AND sender_id <> :u
    UNION SELECT entity_id FROM profiles
          WHERE tenant_id = :t AND entity_type = 'member' AND group_id = ANY(:groups)
            AND entity_id <> :u
    """
)


def names_filter(column: str) -> str:
    """A cheap SQL filter: the column holds one of the person's names (``:needles``); the
    exact, word-bounded match is the redactor's, in Python."""
    return (
        "EXISTS (SELECT 1 FROM unnest(CAST(:needles AS text[])) AS n"
        f" WHERE strpos(COALESCE({column}, ''), n) > 0)"
    )


@dataclass(frozen=True)
class Person:
    """A person as the tenant's data knows them."""

    id: str
    private_key: str
    redactor: Redactor
    conversations: list[str]
    groups: list[str]
    peers: list[str]

    @property
    def needles(self) -> list[str]:
        """Strings that a text naming the person must contain, as is or inside JSON: a
        cheap first filter in SQL before the exact match in Python."""
        import json

        escaped = {json.dumps(n, ensure_ascii=False)[1:-1] for n in self.redactor.names}
        return sorted({*self.redactor.names, *escaped})


async def find_person(session: AsyncSession, tenant_id: uuid.UUID, user_id: str) -> Person:
    """The person ``user_id``: names known to be theirs, and where they spoke."""
    p = {"t": tenant_id, "u": user_id}
    own = {r.name for r in await session.execute(_OWN_NAMES, p) if r.name}
    own = {n.strip() for n in own if n.strip() and n.strip() != user_id}
    shared = (
        {r.name for r in await session.execute(_SHARED_NAMES, {**p, "names": sorted(own)})}
        if own
        else set()
    )
    private_key = f"p:{user_id}"
    keys = sorted(
        {r.key for r in await session.execute(_CONVERSATIONS, p) if r.key} - {private_key}
    )
    groups = [k[2:] for k in keys if k.startswith("g:")]
    peers = sorted(
        {r.id for r in await session.execute(_PEERS, {**p, "keys": keys, "groups": groups}) if r.id}
    )
    return Person(
        id=user_id,
        private_key=private_key,
        redactor=Redactor(own - shared),
        conversations=keys,
        groups=groups,
        peers=peers,
    )
