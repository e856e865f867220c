"""Vector indexes defined once: the models, the migrations' helpers and a re-embedding's
rebuild all read the same definition.

Migrations are history and keep the statements they ran; a later migration that creates or
rebuilds a vector index, and a re-embedding that rebuilds one for vectors of a new
dimension, use ``create_statements`` here.
"""

from __future__ import annotations

import math
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
    ``ef_construction``). With ``where``, only the rows it holds are indexed (a partial
    index: a search names the same condition).
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
    where: str | None = None

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
            sql += f" INCLUDE ({', '.join(carried)})" if carried else ""
            return sql + (f" WHERE {self.where}" if self.where else "")
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


# Half-precision copies of unit vectors (the events' and the messages' scans) rank candidates;
# the full-precision vectors decide.
#
# How far approx + 1 may sit from the true distance, for n dimensions (a worst case, not an
# estimate). Rounding to half precision moves each unit vector by at most 2^-11 of its length
# plus 2^-25 per subnormal component, so for unit u, v and their rounded copies u', v':
# |u'.v' - u.v| <= |u'-u| + |v'-v| + |u'-u||v'-v|. Float32 arithmetic adds at most n 2^-24
# to the inner product, 2n 2^-24 to the cosine, and n 2^-24 to each normalization. With
# approx = -(u'.v') (pgvector's <#>) and distance = 1 - u.v: |approx + 1 - distance| <= this.
def half_precision_error(n: int) -> float:
    """The most a unit vector's half-precision inner product can miss, in ``n`` dimensions."""
    rounding = 2**-11 + math.sqrt(n) * 2**-25
    return 1.1 * (2 * rounding + rounding**2 + 5 * n * 2**-24)  # 1.2e-3 at 384 dimensions


def rescoring_ceiling(kth: float, horizon: float, complete: bool, n: int) -> float | None:
    """Whether the exact nearest rows are among candidates picked by their half-precision
    copies and re-scored exactly, in ``n`` dimensions.

    ``kth`` is the k-th best exact distance among the candidates, ``horizon`` the worst
    approx (``<#>``) taken: every row left out has approx >= it, so distance >= horizon + 1
    - error. None when that is beyond ``kth``, or the candidates are every row
    (``complete``): they hold the answer. Else the approx at or under which a row could still
    be nearer: every such row must be scored exactly.
    """
    error = half_precision_error(n)
    if complete or horizon + 1.0 - error > kth:
        return None
    return kth - 1.0 + error
