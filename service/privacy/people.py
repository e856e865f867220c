"""Who a person is in a tenant's data: their ids' rows, their names, where they spoke.

Everything here is found by the person's id in id columns, compared for equality: never by
pattern (a LIKE or a regular expression built from an id lets ``%``, ``_``, ``*`` or ``\\``
reach other people's rows).
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Mapping
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
# - conversations: the group conversations the person took part in (their private chat is
#   theirs outright);
# - namesakes: which of their names (:names) someone or something else goes by inside one
#   of those conversations (:keys, :groups), and there (``key``): a mention of the name in
#   that conversation is not known to be this person's. Nowhere else: a stranger in another
#   group who posts under the name is nobody the person's conversations could mean;
# - peers: the other people of those conversations (:keys, :groups): their own profiles and
#   memories may name them.


@dataclass(frozen=True)
class Person:
    """A person as the tenant's data knows them.

    ``redactor`` names them where no one else of any of their conversations goes by the
    name (a text of no single conversation, an export's test of what is about them);
    ``local`` holds the redactor of each conversation where someone does, and ``unshared``
    is that of the others.
    """

    id: str
    private_key: str
    redactor: Redactor
    unshared: Redactor
    local: Mapping[str, Redactor]
    conversations: list[str]
    groups: list[str]
    peers: list[str]

    def redactor_in(self, key: str) -> Redactor:
        """The redactor of a text said in the conversation ``key``."""
        return self.local.get(key, self.unshared)

    @property
    def needles(self) -> list[str]:
        """Strings that a text naming the person for certain must contain, as is or inside
        JSON: a cheap first filter in SQL before the exact match in Python."""
        return _needles(self.redactor)

    @property
    def mention_needles(self) -> list[str]:
        """The same for a text that names them in any one of their conversations."""
        return _needles(self.unshared)


def _needles(redactor: Redactor) -> list[str]:
    found = [*redactor.names, *redactor.labels]
    escaped = {json.dumps(n, ensure_ascii=False)[1:-1] for n in found}
    return sorted({*found, *escaped})


async def _namesakes(
    session: AsyncSession, params: dict[str, object], names: set[str]
) -> dict[str, set[str]]:
    """Of ``names``, those someone else goes by, per conversation of the person's."""
    found: dict[str, set[str]] = defaultdict(set)
    if names and params["keys"]:
        rows = await session.execute(_union("namesakes"), {**params, "names": sorted(names)})
        for r in rows:
            if r.name and r.name.strip() in names:
                found[r.key].add(r.name.strip())
    return found


async def find_person(session: AsyncSession, tenant_id: uuid.UUID, user_id: str) -> Person:
    """The person ``user_id``: names known to be theirs, and where they spoke."""
    p: dict[str, object] = {"t": tenant_id, "u": user_id}
    own = {r.name for r in await session.execute(_union("own_names"), p) if r.name}
    own = {n.strip() for n in own if n.strip() and n.strip() != user_id}
    private_key = f"p:{user_id}"
    keys = sorted(
        {r.key for r in await session.execute(_union("conversations"), p) if r.key} - {private_key}
    )
    groups = [k[2:] for k in keys if is_group(k)]
    p = {**p, "keys": keys, "groups": groups}
    peers = sorted({r.id for r in await session.execute(_union("peers"), p) if r.id})
    namesakes = await _namesakes(session, p, own)
    # One redactor per set of names kept: a person in many groups with the same namesake
    # in each compiles it once.
    shielded = frozenset(set().union(*namesakes.values()))
    kept: dict[frozenset[str], Redactor] = {}
    for names in [frozenset(), shielded, *map(frozenset, namesakes.values())]:
        if names not in kept:
            kept[names] = Redactor(own - names, user_id, own)
    return Person(
        id=user_id,
        private_key=private_key,
        redactor=kept[shielded],
        unshared=kept[frozenset()],
        local={key: kept[frozenset(names)] for key, names in namesakes.items()},
        conversations=keys,
        groups=groups,
        peers=peers,
    )
