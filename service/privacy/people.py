"""Who a person is in a tenant's data: their ids' rows, their names, where they spoke.

Everything here is found by the person's id in id columns, compared for equality: never by
pattern (a LIKE or a regular expression built from an id lets ``%``, ``_``, ``*`` or ``\\``
reach other people's rows).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import is_group
from service.db import registry
from service.db.registry import names_filter
from service.privacy.redaction import Redactor

__all__ = ["Person", "find_person", "names_filter"]


def _union(part: str) -> TextClause:
    """One query uniting every aggregate's declared SELECTs of a kind (see
    ``service.db.registry.PersonalTable``)."""
    selects = [sql for table in registry.tables() for sql in getattr(table, part)]
    return text("\nUNION\n".join(selects))


# What each aggregate declares, united:
# - own_names: the display names a person went by (:t, :u);
# - shared_names: which of those names (:names) someone or something else also goes by:
#   then a mention of it is not known to be this person's;
# - conversations: the group conversations the person took part in (their private chat is
#   theirs outright);
# - peers: the other people of those conversations (:keys, :groups): their own profiles and
#   memories may name them.


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

        found = [*self.redactor.names, *self.redactor.labels]
        escaped = {json.dumps(n, ensure_ascii=False)[1:-1] for n in found}
        return sorted({*found, *escaped})


async def find_person(session: AsyncSession, tenant_id: uuid.UUID, user_id: str) -> Person:
    """The person ``user_id``: names known to be theirs, and where they spoke."""
    p = {"t": tenant_id, "u": user_id}
    own = {r.name for r in await session.execute(_union("own_names"), p) if r.name}
    own = {n.strip() for n in own if n.strip() and n.strip() != user_id}
    shared = (
        {r.name for r in await session.execute(_union("shared_names"), {**p, "names": sorted(own)})}
        if own
        else set()
    )
    private_key = f"p:{user_id}"
    keys = sorted(
        {r.key for r in await session.execute(_union("conversations"), p) if r.key} - {private_key}
    )
    groups = [k[2:] for k in keys if is_group(k)]
    peers = sorted(
        {
            r.id
            for r in await session.execute(_union("peers"), {**p, "keys": keys, "groups": groups})
            if r.id
        }
    )
    return Person(
        id=user_id,
        private_key=private_key,
        redactor=Redactor(own - shared, user_id, own),
        conversations=keys,
        groups=groups,
        peers=peers,
    )
