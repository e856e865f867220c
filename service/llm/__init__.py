"""Chat LLM providers for the historian: an OpenAI-compatible endpoint, or none."""

from __future__ import annotations

from service.llm.base import ChatModel, ChatResult, LLMError, ToolCall
from service.settings import ChatModelSettings


def build_chat_model(settings: ChatModelSettings) -> ChatModel | None:
    """The configured chat model, or None when no endpoint is configured (rules only)."""
    if not settings.configured:
        return None
    from service.llm.openai_compat import OpenAIChat

    return OpenAIChat(settings)


__all__ = ["ChatModel", "ChatResult", "LLMError", "ToolCall", "build_chat_model"]
