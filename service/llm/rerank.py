"""A cross-encoder reranker behind an HTTP endpoint, for the read path's final ordering.

``POST {api_url}/rerank`` with ``{model, query, documents, top_n}`` answering
``{"results": [{"index": i, "relevance_score": s}, …]}``: the shape Jina and Cohere defined
and vLLM, Xinference and most hosted rerankers serve. The read path must never wait on it for
long nor fail because of it: one attempt, a short timeout, and the caller keeps its own order
when this raises.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Protocol

import httpx

from service.llm.base import LLMError
from service.observability import LLM_CALLS
from service.settings import RerankerModelSettings


class Reranker(Protocol):
    """Scores documents against a query: one relevance in [0, 1] per document, in order."""

    async def rerank(self, query: str, documents: list[str]) -> list[float]:
        """Relevance of each document to the query."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


class HttpReranker:
    """The ``/rerank`` endpoint of ``models.reranker``."""

    def __init__(self, settings: RerankerModelSettings) -> None:
        self.name = settings.model_name
        self._max = settings.max_documents
        self._timeout = settings.timeout_seconds
        headers = {}
        if settings.api_key.get_secret_value():
            headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
        self._client = httpx.AsyncClient(
            base_url=settings.api_url.rstrip("/") + "/",
            headers=headers,
            timeout=settings.timeout_seconds,
        )

    async def rerank(self, query: str, documents: list[str]) -> list[float]:
        """Relevance of each document, squashed into [0, 1] when the model returns logits."""
        if not documents:
            return []
        documents = documents[: self._max]
        body: dict[str, Any] = {"query": query, "documents": documents, "top_n": len(documents)}
        if self.name:
            body["model"] = self.name
        try:
            # The client's timeout bounds each read, not the answer: a server that sends a byte
            # now and then would hold the read path for as long as it dripped.
            async with asyncio.timeout(self._timeout):
                response = await self._client.post("rerank", json=body)
            response.raise_for_status()
            results = response.json()["results"]
            scores: list[float | None] = [None] * len(documents)
            for item in results:
                scores[int(item["index"])] = float(item["relevance_score"])
        except (TimeoutError, httpx.HTTPError, ValueError, KeyError, TypeError, IndexError) as exc:
            LLM_CALLS.labels("rerank", "error").inc()
            detail = str(exc) or f"no answer within {self._timeout}s"
            raise LLMError(f"reranker failed: {exc.__class__.__name__}: {detail}") from exc
        LLM_CALLS.labels("rerank", "ok").inc()
        # A document the endpoint left out ranks last. Logits (any score outside [0, 1])
        # become probabilities, all of them, so that the order is kept.
        given = [s for s in scores if s is not None and math.isfinite(s)]
        squash = any(not 0.0 <= s <= 1.0 for s in given)
        return [
            (_sigmoid(s) if squash else s) if s is not None and math.isfinite(s) else 0.0
            for s in scores
        ]

    async def close(self) -> None:
        """Release connections."""
        await self._client.aclose()


def _sigmoid(score: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, score))))


def build_reranker(settings: RerankerModelSettings) -> Reranker | None:
    """The configured reranker, or None (no reranking)."""
    return HttpReranker(settings) if settings.configured else None
