"""Vector indexes defined once: the models, the migrations' helpers and a re-embedding's
rebuild all read the same definition.

Migrations are history and keep the statements they ran; a later migration that creates or
rebuilds a vector index, and a re-embedding that rebuilds one for vectors of a new
dimension, use ``create_statements`` here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class VectorIndex:
    """An index that carries or searches a vector column.

    ``method`` ``btree`` is a covering index: ``columns`` are its key, ``include`` the
    columns it carries; the vector column rides along while a vector of the dimension fits
    in an entry (``covering_max_dim``), and otherwise stays in the table's rows, kept out of
    TOAST (storage MAIN) so a search reads it from the row. ``method`` ``hnsw`` (or another
    access method) indexes ``vector_column`` with ``opclass`` and ``params`` (``m``,
    ``ef_construction``).
    """

    name: str
    table: str
    vector_column: str
    method: str = "btree"
    columns: tuple[str, ...] = ()
    include: tuple[str, ...] = ()
    covering_max_dim: int | None = None
    opclass: str | None = None
    params: Mapping[str, int] = field(default_factory=dict)

    def covers_vector(self, dimensions: int) -> bool:
        """Whether the index carries the vectors at this dimension."""
        return self.covering_max_dim is not None and int(dimensions) <= self.covering_max_dim

    def storage(self, dimensions: int) -> str:
        """The storage of the vector column: MAIN when a covering index cannot carry it."""
        if self.method == "btree" and not self.covers_vector(dimensions):
            return "MAIN"
        return "EXTERNAL"

    def create_sql(self, dimensions: int) -> str:
        """The CREATE INDEX statement for vectors of ``dimensions``."""
        if self.method == "btree":
            carried = [*self.include]
            if self.covers_vector(dimensions):
                carried.append(self.vector_column)
            sql = f"CREATE INDEX {self.name} ON {self.table} ({', '.join(self.columns)})"
            return sql + (f" INCLUDE ({', '.join(carried)})" if carried else "")
        opclass = f" {self.opclass}" if self.opclass else ""
        sql = (
            f"CREATE INDEX {self.name} ON {self.table}"
            f" USING {self.method} ({self.vector_column}{opclass})"
        )
        if self.params:
            sql += " WITH (" + ", ".join(f"{k} = {int(v)}" for k, v in self.params.items()) + ")"
        return sql

    def drop_sql(self) -> str:
        """The DROP INDEX statement."""
        return f"DROP INDEX {self.name}"
