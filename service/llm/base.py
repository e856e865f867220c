"""The chat interface the historian uses: messages in, text or tool calls out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from service.text import bounded


class LLMError(Exception):
    """The model could not give a usable answer (after the provider's retries)."""

    def __init__(self, message: str, *, retryable: bool = True, retry_after: float | None = None):
        # The message may quote the provider's answer, of any length, and is kept (an event's
        # warnings, a job's error) and logged.
        super().__init__(bounded(message))
        self.retryable = retryable
        self.retry_after = retry_after


@dataclass(frozen=True)
class ToolCall:
    """One function call the model asked for; ``arguments`` is None when they were not JSON."""

    id: str
    name: str
    raw_arguments: str
    arguments: dict[str, Any] | None


@dataclass
class ChatResult:
    """The model's answer and what it cost."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def as_message(self) -> dict[str, Any]:
        """The assistant turn to append to the conversation before the tool results."""
        return {
            "role": "assistant",
            "content": self.content or "",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.raw_arguments},
                }
                for call in self.tool_calls
            ],
        }


class ChatModel(Protocol):
    """An LLM that can call tools."""

    name: str

    async def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        purpose: str = "chat",
    ) -> ChatResult:
        """One completion; raises ``LLMError`` when no usable answer came back."""
        ...

    async def close(self) -> None:
        """Release resources."""
        ...
