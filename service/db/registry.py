"""What each table holds of people, and which of its texts are embedded.

Every aggregate declares its tables here: which columns are personal (exported with a
subject and erased or redacted with them), which are not and why, how a person's or a
group's rows are found, and which text column each vector column is made of. Erasure,
export and re-embedding loop over these declarations and name no table of their own, so a
new text or vector column is either declared (and then handled) or reported by
``tests/test_registry.py`` against the live schema.

Each module listed in ``AGGREGATES`` declares ``TABLES`` (and ``EMBEDDED``, ``DERIVED`` for
vectors); ``tables()`` and ``embedded()`` read them in that order, which is the order of
every loop (parents before children: the order a whole-tenant export is written in, and the
order a subject's rows are deleted in).
"""

from __future__ import annotations

import importlib
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncSession

# The fields of a row (stored, copied into a job's payload or an export) that name a person
# by id.
PERSON_FIELDS = ("sender_id", "user_id", "creator_id", "assignee_id")

# The modules that declare tables, in the order erasure, export and re-embedding visit them.
AGGREGATES = (
    "service.exports.personal",
    "service.messages.personal",
    "service.events.personal",
    "service.ends.personal",
    "service.memories.personal",
    "service.profiles.personal",
    "service.todos.personal",
    "service.queue.personal",
    "service.tenants.personal",
    "service.privacy.personal",
    "service.audit.personal",
    "service.reembed.personal",
    "service.db.personal",
)


def names_filter(column: str) -> str:
    """A cheap SQL filter: the column holds one of the person's names (``:needles``); the
    exact, word-bounded match is the redactor's, in Python."""
    return (
        "EXISTS (SELECT 1 FROM unnest(CAST(:needles AS text[])) AS n"
        f" WHERE strpos(COALESCE({column}, ''), n) > 0)"
    )


def dumps(value: Any) -> str:
    """A JSON value as stored by a redaction (non-ASCII kept as is)."""
    return json.dumps(value, ensure_ascii=False)


@dataclass
class Redaction:
    """An erasure of a person as seen by the aggregates whose rows may name them.

    ``redactor`` finds and replaces the person's names (``service.privacy.redaction``);
    ``redactor_in`` gives the redactor of a text said in one of their conversations (by its
    key): a name someone else goes by there is kept there. ``redactor`` is the one of a text
    of no single conversation (a peer's own profile or memory): it keeps every name someone
    else goes by in any of the person's conversations.
    ``scope`` binds ``:t`` (the tenant), ``:keys`` (the group conversations the person took
    part in), ``:groups``, ``:peers`` (the people they spoke with) and ``:needles`` (for
    ``names_filter``); ``counts`` gets ``<table>_redacted`` for each row changed.
    """

    session: AsyncSession
    tenant_id: uuid.UUID
    person_id: str
    redactor: Any
    redactor_in: Callable[[str], Any]
    embedder: Any
    keep: int
    scope: dict[str, Any]
    counts: dict[str, int]

    async def rows(self, sql: str) -> list[Row[Any]]:
        """The rows a query over ``scope`` returns."""
        return list(await self.session.execute(text(sql), self.scope))

    def count(self, name: str) -> None:
        """One more row of ``name`` redacted."""
        self.counts[name] = self.counts.get(name, 0) + 1


@dataclass
class Rebuilding:
    """An erasure of a person as seen by the rows made of several people's words (a group's
    day digest), run while the person's own rows are still there to tell which drew on
    them: those are made again of the others' words alone. ``embedder`` makes the vectors
    of the texts made again; ``counts`` gets ``<table>_rebuilt`` for each row made again,
    ``<table>_emptied`` for each deleted because nobody else's words remain."""

    session: AsyncSession
    tenant_id: uuid.UUID
    person_id: str
    embedder: Any
    counts: dict[str, int]
    names: tuple[str, ...] = ()  # the names they went by: redacted where found, not removed
    # Their keyed hash (``service.privacy.keys``): how a derived row names whose words it holds.
    hashed: str = ""

    def count(self, name: str) -> None:
        """One more row counted under ``name``."""
        self.counts[name] = self.counts.get(name, 0) + 1


@dataclass(frozen=True)
class Erasing:
    """An erasure of a subject as the copies of its data see it: ``kind`` ``user`` or
    ``group``, its id, its keyed hash, the names that identify it in a copy, and the id
    fields (``"sender_id"`` …) whose value is the subject's id in a copied row."""

    session: AsyncSession
    tenant_id: uuid.UUID
    kind: str
    subject: str
    subject_hash: str
    names: list[str]
    id_fields: tuple[str, ...]


# The statements of a subject's own rows: (count name, SQL), run in order.
Statements = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class PersonalTable:
    """One table as erasure and export see it.

    ``ids``: columns holding the id of a person, a group or their conversation, by which a
    subject's rows are found (compared for equality). ``personal``: its text, JSON and
    vector columns that hold what people said or are (exported with the subject, deleted
    with their rows, redacted where others' rows name them). ``not_personal``: every other
    such column, with the reason it holds nothing of a person. ``hidden``: columns left out
    of a whole-tenant export (secrets; vectors are left out anyway).

    Erasure of a subject first runs ``erase_copies`` (copies of data, matched by what they
    hold before the rows copied go). Erasure of a person then runs ``rebuild_user`` (rows
    made of several people's words, made again of the others' while the person's rows
    still tell which drew on them), then ``erase_user`` (binds ``:t``, ``:u`` the id,
    ``:pk`` their private conversation, ``:spare`` the erasure's own job), then ``redact``
    if the person has names; of a group, ``erase_group`` (``:t``, ``:g``, ``:k`` its
    conversation). Erasing a tenant deletes every row of the table unless
    ``tenant_erase`` is False (rows that go by cascade, or outlive the tenant).
    ``tenant_key``: the column holding the tenant's id; the tenant's own row (keyed by
    ``id``) is exported before and deleted after every other.

    Export of a person runs ``export_user`` (a SELECT with a boolean ``own`` column: others'
    rows are kept only if they name the person), of a group ``export_group``; a whole tenant
    exports every row unless ``tenant_export`` is False. ``size_*`` are cheap counts of
    indexed rows that size an export or an erasure.

    ``own_names``, ``conversations`` and ``peers`` are SELECTs of one column (``name``,
    ``key``, ``id``), ``namesakes`` of two (``name``, ``key``), that
    ``service.privacy.people`` unites to find who a person is (see there for what each
    binds). A name used outside the person's conversations says nothing of whom a text in
    them means, so only ``namesakes`` keep a name from being redacted.
    """

    table: str
    ids: tuple[str, ...] = ()
    personal: tuple[str, ...] = ()
    not_personal: Mapping[str, str] = field(default_factory=dict)
    hidden: tuple[str, ...] = ()
    erase_copies: Callable[[Erasing], Awaitable[int]] | None = None
    rebuild_user: Callable[[Rebuilding], Awaitable[None]] | None = None
    erase_user: Statements = ()
    erase_group: Statements = ()
    redact: Callable[[Redaction], Awaitable[None]] | None = None
    tenant_erase: bool = True
    tenant_key: str = "tenant_id"
    export_user: str | None = None
    export_group: str | None = None
    export_section: str | None = None  # the name of its section, when not the table's
    tenant_export: bool = True
    size_user: str | None = None
    size_group: str | None = None
    size_tenant: str | None = None
    own_names: tuple[str, ...] = ()
    namesakes: tuple[str, ...] = ()
    conversations: tuple[str, ...] = ()
    peers: tuple[str, ...] = ()

    @property
    def section(self) -> str:
        """The name of the table's section in a subject's export."""
        return self.export_section or self.table


@dataclass(frozen=True)
class Embedded:
    """A vector column made from a row's text, remade by a re-embedding.

    ``key``: the primary key after ``tenant_id`` (the order a re-embedding walks in), with
    its SQL types; ``source``: the columns the embedded text is made of; ``passage``: that
    text, from a row holding the ``source`` columns, exactly as the service embeds it when
    writing (``None``: the single source column as is). ``prefix``: the kind of text the
    embedder is given, which decides its instruction prefix; stored vectors are always
    ``passage`` (``Embedder.passages``), a search's query is never stored.
    """

    table: str
    key: tuple[str, ...]
    key_types: tuple[str, ...]
    source: tuple[str, ...]
    vector: str = "embedding"
    passage: Callable[[Any], str] | None = None
    prefix: str = "passage"

    def __post_init__(self) -> None:
        if self.prefix != "passage":
            raise ValueError(f"{self.table}.{self.vector}: stored vectors are passages")

    @property
    def name(self) -> str:
        """The table's name: a re-embedding pass is one table's."""
        return self.table

    @property
    def shadow(self) -> str:
        """The column a re-embedding fills with the new vectors before the switch."""
        return f"{self.vector}_next"

    @property
    def trigger(self) -> str:
        """The name of the trigger that empties stale shadow vectors during a re-embedding."""
        return f"{self.table}_reembed_stale"

    def text_of(self, row: Any) -> str:
        """The text the row's vector is made of."""
        if self.passage is not None:
            return self.passage(row)
        return str(getattr(row, self.source[0]))


@dataclass(frozen=True)
class DerivedVectors:
    """A vector column copied from another table's vectors (never embedded itself): the
    re-embedding rebuilds it after the switch with ``rebuild``, and first runs ``release``
    when the copy holds on to the column being swapped (a generated column does)."""

    table: str
    column: str
    source: str  # "<table>.<column>" it is copied from
    rebuild: Callable[[AsyncSession, int], Awaitable[None]]
    release: Callable[[AsyncSession], Awaitable[None]] | None = None


def _modules() -> list[Any]:
    return [importlib.import_module(name) for name in AGGREGATES]


def tables() -> list[PersonalTable]:
    """Every declared table (each module's ``TABLES``), in the aggregates' order."""
    return [table for module in _modules() for table in getattr(module, "TABLES", ())]


def table(name: str) -> PersonalTable | None:
    """The declaration of one table, if any."""
    return next((t for t in tables() if t.table == name), None)


def embedded() -> list[Embedded]:
    """Every vector column made from text (each module's ``EMBEDDED``), in that order."""
    return [column for module in _modules() for column in getattr(module, "EMBEDDED", ())]


def derived() -> list[DerivedVectors]:
    """Every vector column copied from another (each module's ``DERIVED``)."""
    return [column for module in _modules() for column in getattr(module, "DERIVED", ())]
