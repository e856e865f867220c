"""Column types shared by tables: the embedding vector, whose dimension is a deployment setting."""

from __future__ import annotations

from typing import Any

from pgvector.sqlalchemy import Vector

# The largest value of a bigint column (every row id): larger numbers are refused at the edge.
BIGINT_MAX = 2**63 - 1

# The ORM declares vectors without a dimension; the migrations create them with the
# deployment's dimension (memoria_meta.embedding_dim), fixed when the schema is created.
Embedding = Vector


def compare_type(
    context: Any,
    inspected_column: Any,
    metadata_column: Any,
    inspected_type: Any,
    metadata_type: Any,
) -> bool | None:
    """Alembic type comparison that ignores the vector dimension (a deployment setting)."""
    if isinstance(metadata_type, Vector):
        return "vector" not in str(inspected_type).lower()
    return None
