"""An OpenAI-compatible chat endpoint through the official ``openai`` client."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import openai

from service.llm.base import ChatResult, LLMError, ToolCall
from service.observability import LLM_CALLS, LLM_TOKENS
from service.settings import ChatModelSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

_RETRYABLE = (
    TimeoutError,  # the whole answer took longer than timeout_seconds
    openai.RateLimitError,
    openai.InternalServerError,
    openai.APITimeoutError,
    openai.APIConnectionError,
)


class OpenAIChat:
    """Chat completions with tool calls; retries 429, 5xx and timeouts with backoff."""

    def __init__(self, settings: ChatModelSettings) -> None:
        self.name = settings.model_name
        self._settings = settings
        # Retries are ours (below) so that Retry-After, jitter and the cap are under our control.
        self._client = openai.AsyncOpenAI(
            base_url=settings.api_url,
            api_key=settings.api_key.get_secret_value() or "none",
            timeout=settings.timeout_seconds,
            max_retries=0,
        )

    async def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        purpose: str = "chat",
    ) -> ChatResult:
        """One completion, retried on transient failures up to ``max_retries`` times."""
        kwargs: dict[str, Any] = {
            "model": self.name,
            "messages": messages,
            "max_tokens": self._settings.max_tokens,
            "temperature": self._settings.temperature,
        }
        if tools:
            kwargs["tools"] = tools
            if tool_choice is not None:
                kwargs["tool_choice"] = tool_choice

        async def ask() -> ChatResult:
            return _result(await self._client.chat.completions.create(**kwargs))

        result = await answered(
            ask,
            purpose=purpose,
            timeout_seconds=self._settings.timeout_seconds,
            max_retries=self._settings.max_retries,
            retry_base_seconds=self._settings.retry_base_seconds,
        )
        LLM_TOKENS.labels(purpose, "prompt").inc(result.prompt_tokens)
        LLM_TOKENS.labels(purpose, "completion").inc(result.completion_tokens)
        return result

    async def close(self) -> None:
        """Close the HTTP client."""
        await self._client.close()


async def answered(
    call: Callable[[], Awaitable[T]],
    *,
    purpose: str,
    timeout_seconds: float,
    max_retries: int,
    retry_base_seconds: float,
) -> T:
    """What ``call`` (a request of the ``openai`` client) returns, each try given
    ``timeout_seconds`` in all; 429, 5xx and timeouts are retried up to ``max_retries`` times
    with backoff, and ``LLMError`` is raised when no try answered."""
    attempt = 0
    while True:
        try:
            # The client's timeout bounds each read, not the answer: a server that sends
            # a byte now and then would hold the job, and a worker slot, for ever.
            async with asyncio.timeout(timeout_seconds):
                answer = await call()
            LLM_CALLS.labels(purpose, "ok").inc()
            return answer
        except _RETRYABLE as exc:
            LLM_CALLS.labels(purpose, type(exc).__name__).inc()
            if attempt >= max_retries:
                detail = str(exc) or f"no answer within {timeout_seconds}s"
                raise LLMError(
                    f"{purpose}: {type(exc).__name__} after {attempt + 1} tries: {detail}",
                    retry_after=_retry_after(exc),
                ) from exc
            delay = _retry_after(exc) or _backoff(attempt, retry_base_seconds)
            log.warning("%s: %s, retrying in %.2fs", purpose, type(exc).__name__, delay)
            attempt += 1
            await asyncio.sleep(delay)
        except openai.APIStatusError as exc:
            LLM_CALLS.labels(purpose, f"http_{exc.status_code}").inc()
            raise LLMError(f"{purpose}: HTTP {exc.status_code}: {exc}", retryable=False) from exc
        except (openai.APIError, ValueError) as exc:  # unparseable body and the like
            raise LLMError(f"{purpose}: malformed response: {exc}") from exc


def _backoff(attempt: int, base: float, cap: float = 30.0) -> float:
    # Full jitter: spreads retries of many workers instead of synchronizing them.
    return float(random.uniform(0, min(cap, base * 2**attempt)))  # noqa: S311


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    if response is None:
        return None
    value = response.headers.get("retry-after")
    try:
        return min(float(value), 60.0) if value is not None else None
    except ValueError:
        return None


def _result(response: Any) -> ChatResult:
    if not getattr(response, "choices", None):
        raise LLMError("the response has no choices")
    message = response.choices[0].message
    calls = []
    for call in message.tool_calls or []:
        raw = call.function.arguments or ""
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = None
        if parsed is not None and not isinstance(parsed, dict):
            parsed = None
        calls.append(
            ToolCall(id=call.id, name=call.function.name, raw_arguments=raw, arguments=parsed)
        )
    usage = getattr(response, "usage", None)
    return ChatResult(
        content=message.content,
        tool_calls=calls,
        prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
        completion_tokens=getattr(usage, "completion_tokens", 0) or 0,
    )
