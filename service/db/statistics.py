"""The planner's statistics brought up to date after a bulk write, ahead of autovacuum.

Autovacuum analyzes a table once a tenth of it has changed, on its next round (a minute or
more apart; a new database waits its turn among the others). Until then a conversation
written in bulk is planned on statistics that do not know it. A conversation of 6,259
messages stored and embedded in a fresh table was estimated at one row: each search joined
its nearest and their neighbourhoods by nested loops over the whole conversation, 1.5–3.5 s
a search instead of 15–65 ms once analyzed (2026-11). A second big group added to a table
that knows only the first is estimated at one row the same way.

So a job that has just written many rows (embedding a backlog of messages, importing
events) applies autovacuum's own rule at once to the tables it wrote: analyzed when a tenth
of the rows they counted has changed since, and at least ``FLOOR`` rows (fewer are left to
autovacuum). It replaces the analysis autovacuum would have made a minute later, so a table
is analyzed about as often as before, each time a tenth bigger. On Citus the coordinator's
tables are empty shells and each worker's autovacuum analyzes its shards: nothing is done
there.

A tenth of a table shared by many tenants can be more than a new tenant's whole history: its
4,000 messages in a table of 100,000 change it by 4 %, and the statistics, which have never
seen the tenant, still count its conversation at one row. So the caller also names the
conversations it wrote, with how many rows each; one of at least ``FLOOR`` that the planner
counts at less than a tenth of them has the table analyzed too (2026-12: a suite's shared
table, analyzed before the tenant came, planned a 4,000-message group at one row).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.engine import Database
from service.errors import Unavailable

log = logging.getLogger(__name__)

# The tables a job may analyze (the name is spliced into ANALYZE, so only these).
TABLES = frozenset({"messages", "events", "event_vectors"})
# Autovacuum's share of a table (autovacuum_analyze_scale_factor's default) ...
SHARE = 0.1
# ... and fewer changed rows than this are left to it (its own threshold is 50 rows).
FLOOR = 1_000

# Which of the tables have changed by a tenth of the rows their statistics count (a table
# never analyzed counts -1 rows). The changes are PostgreSQL's count since the last analysis (each
# backend reports its own within seconds of its commit) or, if more, what the caller just
# wrote itself, which may not be reported yet.
_OUTGROWN = text(
    """
    SELECT c.relname
    FROM pg_class c
    LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
    WHERE c.oid = ANY(SELECT to_regclass(t) FROM unnest(CAST(:tables AS text[])) t)
      AND greatest(coalesce(s.n_mod_since_analyze, 0), :written)
          >= greatest(CAST(:floor AS float8), :share * c.reltuples)
      AND NOT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')
    ORDER BY c.relname
    """
)


# How a search filters a conversation's rows in each table (messages: the embedded ones).
_SEARCHED = {
    "messages": "conversation_key = :key AND embedding_half IS NOT NULL",
    "events": "conversation_key = :key",
    "event_vectors": "conversation_key = :key",
}
_CITUS = text("SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')")
# How long an analysis waits for the table (autovacuum gives way after deadlock_timeout, 1 s).
LOCK_WAIT_MS = 5_000
# At most this many of the biggest conversations written are checked (an EXPLAIN each).
CHECKED = 20

# Rows written to each conversation: (tenant, conversation key) -> rows.
Conversations = Mapping[tuple[uuid.UUID, str], int]


async def analyze_outgrown(
    db: Database, tables: Sequence[str], written: int, conversations: Conversations | None = None
) -> list[str]:
    """Analyze those of ``tables`` (after a job wrote ``written`` rows to each, committed)
    that have outgrown their statistics, or that the planner counts one of the
    ``conversations`` written in at under a tenth of its rows; the names of the ones
    analyzed."""
    unknown = set(tables) - TABLES
    if unknown:
        raise ValueError(f"not a table whose statistics a job keeps: {sorted(unknown)}")
    async with db.system() as session:
        found = await session.execute(
            _OUTGROWN, {"tables": list(tables), "written": written, "floor": FLOOR, "share": SHARE}
        )
        outgrown = [name for (name,) in found]
        big = _big(conversations or {})
        if big and not (await session.execute(_CITUS)).scalar_one():
            for name in tables:
                if name not in outgrown and await _miscounted(session, name, big):
                    outgrown.append(name)
    analyzed = []
    for name in outgrown:
        # Not SKIP_LOCKED: an analysis already running (autovacuum's, begun while these rows
        # were being written) sampled the table without them, and skipping it left a backlog
        # of 4,000 embedded messages counted at one row. This one waits for it (autovacuum
        # gives way to a waiting lock within a second), but not for longer work that holds
        # the table (a manual VACUUM, an index built concurrently by a re-embedding):
        # autovacuum analyzes it after that.
        try:
            async with db.system() as session:
                await session.execute(text(f"SET LOCAL lock_timeout = '{LOCK_WAIT_MS}ms'"))
                await session.execute(text(f"ANALYZE {name}"))
        except Unavailable as exc:
            log.warning("statistics of %s not refreshed: %s", name, exc)
            continue
        analyzed.append(name)
    if analyzed:
        log.info("statistics refreshed after %d rows written: %s", written, ", ".join(analyzed))
    return analyzed


def _big(conversations: Conversations) -> list[tuple[int, tuple[uuid.UUID, str]]]:
    """The biggest of the ``conversations`` of at least ``FLOOR`` rows, biggest first."""
    return sorted(((n, key) for key, n in conversations.items() if n >= FLOOR), reverse=True)[
        :CHECKED
    ]


async def _miscounted(
    session: AsyncSession, table: str, big: list[tuple[int, tuple[uuid.UUID, str]]]
) -> bool:
    """Whether the planner counts one of the ``big`` conversations in ``table`` at under a
    tenth of the rows written to it."""
    counted = text(
        f"EXPLAIN (FORMAT JSON) SELECT 1 FROM {table} WHERE tenant_id = :tenant"
        f" AND {_SEARCHED[table]}"
    )
    for n, (tenant, key) in big:
        plan = (await session.execute(counted, {"tenant": tenant, "key": key})).scalar_one()
        if plan[0]["Plan"]["Plan Rows"] < SHARE * n:
            return True
    return False
