"""The planner's statistics brought up to date after a bulk write, ahead of autovacuum.

Autovacuum analyzes a table once a tenth of it has changed, on its next round (a minute or
more apart; a new database waits its turn among the others). Until then a table that has
outgrown its statistics is planned as if it were still small. A conversation of 6,259
messages stored and embedded in a fresh table was estimated at one row: each search joined
its nearest and their neighbourhoods by nested loops over the whole conversation, 1.5–3.5 s
a search instead of 15–65 ms once analyzed (2026-11).

So a job that has just written many rows (embedding a backlog of messages, importing events)
analyzes the tables it wrote once they have changed by as many rows as their statistics
count: the table at least doubled since it was last analyzed. As a table grows from empty
to N rows that is about log2(N / ``FLOOR``) analyses over its life; below that, autovacuum's
own threshold serves. On Citus the coordinator's tables are empty shells, and each worker's
autovacuum analyzes its shards: nothing is done there.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlalchemy import text

from service.db.engine import Database

log = logging.getLogger(__name__)

# The tables a job may analyze (the name is spliced into ANALYZE, so only these).
TABLES = frozenset({"messages", "events", "event_vectors"})
# Fewer changed rows than this are left to autovacuum (50 rows + 10% of the table).
FLOOR = 1_000

# Which of the tables have changed by as many rows as their statistics count. A table never
# analyzed counts -1 rows. The changes are PostgreSQL's count since the last analysis (each
# backend reports its own within seconds of its commit) or, if more, what the caller just
# wrote itself, which may not be reported yet.
_OUTGROWN = text(
    """
    SELECT c.relname
    FROM pg_class c
    LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
    WHERE c.oid = ANY(SELECT to_regclass(t) FROM unnest(CAST(:tables AS text[])) t)
      AND greatest(coalesce(s.n_mod_since_analyze, 0), :written)
          >= greatest(CAST(:floor AS float8), c.reltuples)
      AND NOT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')
    ORDER BY c.relname
    """
)


async def analyze_outgrown(db: Database, tables: Sequence[str], written: int) -> list[str]:
    """Analyze those of ``tables`` (after a job wrote ``written`` rows to each, committed)
    that have outgrown their statistics; the names of the ones analyzed."""
    unknown = set(tables) - TABLES
    if unknown:
        raise ValueError(f"not a table whose statistics a job keeps: {sorted(unknown)}")
    async with db.system() as session:
        found = await session.execute(
            _OUTGROWN, {"tables": list(tables), "written": written, "floor": FLOOR}
        )
        outgrown = [name for (name,) in found]
        for name in outgrown:
            # SKIP_LOCKED: another worker (or autovacuum) analyzing it already is enough.
            await session.execute(text(f"ANALYZE (SKIP_LOCKED) {name}"))
    if outgrown:
        log.info("statistics refreshed after %d rows written: %s", written, ", ".join(outgrown))
    return outgrown
