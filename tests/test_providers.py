"""Providers: the OpenAI-compatible chat client over real HTTP, and both embedders."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from service.embedding import build_embedder
from service.llm import LLMError, build_chat_model
from service.llm.rerank import build_reranker
from service.settings import ChatModelSettings, EmbeddingModelSettings, RerankerModelSettings
from tests.fake_llm import FakeLLM, Reply, hash_vector, tool


def chat_settings(llm: FakeLLM, **overrides: object) -> ChatModelSettings:
    values: dict[str, object] = {
        "api_url": llm.base_url,
        "api_key": "sk-test",
        "model_name": "historian-mini",
        "max_retries": 2,
        "retry_base_seconds": 0.01,
        "timeout_seconds": 2.0,
    }
    values.update(overrides)
    return ChatModelSettings(**values)  # type: ignore[arg-type]


def test_no_endpoint_means_no_llm() -> None:
    assert build_chat_model(ChatModelSettings()) is None


async def test_tool_calls_come_back_parsed(llm: FakeLLM) -> None:
    model = build_chat_model(chat_settings(llm))
    assert model is not None
    llm.script(tool("submit_rewrite", {"text": "王总于 2026-02-22 去北京"}))
    result = await model.chat(
        [{"role": "user", "content": "rewrite"}],
        tools=[{"type": "function", "function": {"name": "submit_rewrite", "parameters": {}}}],
        tool_choice={"type": "function", "function": {"name": "submit_rewrite"}},
    )
    assert result.tool_calls[0].name == "submit_rewrite"
    assert result.tool_calls[0].arguments == {"text": "王总于 2026-02-22 去北京"}
    sent = llm.chat_requests[0]
    assert sent["model"] == "historian-mini"
    assert sent["tool_choice"]["function"]["name"] == "submit_rewrite"
    await model.close()


async def test_malformed_tool_arguments_are_flagged_not_crashed(llm: FakeLLM) -> None:
    model = build_chat_model(chat_settings(llm))
    assert model is not None
    llm.script(tool("submit_rewrite", '{"text": "unterminated'))
    result = await model.chat([{"role": "user", "content": "x"}])
    assert result.tool_calls[0].arguments is None
    assert result.tool_calls[0].raw_arguments.startswith('{"text"')
    await model.close()


async def test_429_and_5xx_are_retried_then_succeed(llm: FakeLLM) -> None:
    model = build_chat_model(chat_settings(llm))
    assert model is not None
    llm.script(
        Reply(status=429, headers={"Retry-After": "0"}),
        Reply(status=503),
        Reply(content="fine"),
    )
    result = await model.chat([{"role": "user", "content": "x"}])
    assert result.content == "fine"
    assert len(llm.chat_requests) == 3
    await model.close()


async def test_retry_after_is_honoured(llm: FakeLLM) -> None:
    model = build_chat_model(chat_settings(llm))
    assert model is not None
    llm.script(Reply(status=429, headers={"Retry-After": "1"}), Reply(content="ok"))
    started = time.monotonic()
    assert (await model.chat([{"role": "user", "content": "x"}])).content == "ok"
    assert time.monotonic() - started >= 0.9
    await model.close()


async def test_persistent_failure_raises_after_the_retries(llm: FakeLLM) -> None:
    model = build_chat_model(chat_settings(llm, max_retries=2))
    assert model is not None
    llm.script(Reply(status=500), Reply(status=500), Reply(status=500), Reply(content="late"))
    with pytest.raises(LLMError) as raised:
        await model.chat([{"role": "user", "content": "x"}], purpose="historian_rewrite")
    assert raised.value.retryable
    assert "historian_rewrite" in str(raised.value)
    assert len(llm.chat_requests) == 3
    await model.close()


async def test_timeouts_are_retried(llm: FakeLLM) -> None:
    model = build_chat_model(chat_settings(llm, timeout_seconds=0.3, max_retries=1))
    assert model is not None
    llm.script(Reply(content="slow", delay=1.0), Reply(content="quick"))
    assert (await model.chat([{"role": "user", "content": "x"}])).content == "quick"
    await model.close()


async def test_an_answer_that_drips_in_is_cut_off_at_the_timeout(llm: FakeLLM) -> None:
    # A byte now and then keeps every read within the timeout; the answer as a whole must
    # still come within it, or the job (and a worker slot) waits for as long as it drips.
    model = build_chat_model(chat_settings(llm, timeout_seconds=0.5, max_retries=1))
    assert model is not None
    llm.script(Reply(content="slow", drip=0.2), Reply(content="quick"))
    answer = await asyncio.wait_for(model.chat([{"role": "user", "content": "x"}]), 30)
    assert answer.content == "quick"
    llm.script(Reply(content="slow", drip=0.2), Reply(content="slow", drip=0.2))
    with pytest.raises(LLMError, match=r"within 0\.5s"):
        await asyncio.wait_for(model.chat([{"role": "user", "content": "x"}]), 30)
    await model.close()


async def test_a_client_error_is_not_retried(llm: FakeLLM) -> None:
    model = build_chat_model(chat_settings(llm))
    assert model is not None
    llm.script(Reply(status=400), Reply(content="never"))
    with pytest.raises(LLMError) as raised:
        await model.chat([{"role": "user", "content": "x"}])
    assert not raised.value.retryable
    assert len(llm.chat_requests) == 1
    await model.close()


async def test_garbage_body_is_an_llm_error(llm: FakeLLM) -> None:
    model = build_chat_model(chat_settings(llm, max_retries=0))
    assert model is not None
    llm.script(Reply(raw_body=b"<html>gateway</html>"))
    with pytest.raises(LLMError):
        await model.chat([{"role": "user", "content": "x"}])
    await model.close()


async def test_local_embedder_understands_chinese_and_english() -> None:
    embedder = build_embedder(EmbeddingModelSettings())
    assert embedder.dimension == 384
    passages = await embedder.passages(
        ["小王下周要去北京出差", "The stock market fell sharply today", "我家的猫喜欢晒太阳"]
    )
    assert all(p.shape == (384,) for p in passages)
    assert all(abs(float(np.linalg.norm(p)) - 1) < 1e-3 for p in passages)
    matrix = np.stack(passages)
    assert int(np.argmax(matrix @ await embedder.query("谁要去北京？"))) == 0
    assert int(np.argmax(matrix @ await embedder.query("cat sleeping in the sun"))) == 2
    assert int(np.argmax(matrix @ await embedder.query("股票下跌"))) == 1
    # A repeated query is answered from the cache with the same vector.
    again = await embedder.query("谁要去北京？")
    assert np.array_equal(again, await embedder.query("谁要去北京？"))
    assert await embedder.passages([]) == []
    await embedder.close()


async def test_openai_compatible_embedder(llm: FakeLLM) -> None:
    embedder = build_embedder(
        EmbeddingModelSettings(
            provider="openai", api_url=llm.base_url, model_name="e", batch_size=2
        )
    )
    vectors = await embedder.passages(["a", "b", "c"])
    assert len(llm.embedding_requests) == 2  # batches of two
    assert np.allclose(vectors[2], hash_vector("c", 384), atol=1e-6)
    await embedder.query("q")
    await embedder.query("q")
    assert len(llm.embedding_requests) == 3  # the second query came from the cache
    await embedder.close()


async def test_an_embedding_that_drips_in_is_cut_off_at_the_timeout(llm: FakeLLM) -> None:
    # As the chat model's answer: each read within the timeout is not enough, the whole
    # answer must come within it, or a turn's write (and its job) waits as long as it drips.
    embedder = build_embedder(
        EmbeddingModelSettings(
            provider="openai",
            api_url=llm.base_url,
            model_name="e",
            timeout_seconds=0.5,
            max_retries=1,
        )
    )
    llm.embedding_drips.extend([0.2])
    [vector] = await asyncio.wait_for(embedder.passages(["a"]), 30)
    assert np.allclose(vector, hash_vector("a", 384), atol=1e-6)
    assert len(llm.embedding_requests) == 2  # the dripping answer was given up and asked again
    llm.embedding_drips.extend([0.2, 0.2])
    with pytest.raises(LLMError, match=r"within 0\.5s"):
        await asyncio.wait_for(embedder.query("b"), 30)
    await embedder.close()


async def test_a_reranking_that_drips_in_is_cut_off_at_the_timeout(llm: FakeLLM) -> None:
    reranker = build_reranker(RerankerModelSettings(api_url=llm.base_url, timeout_seconds=0.5))
    assert reranker is not None
    llm.rerank = lambda query, document: 0.5
    llm.rerank_drip = 0.2
    with pytest.raises(LLMError, match=r"within 0\.5s"):
        await asyncio.wait_for(reranker.rerank("q", ["a", "b"]), 30)
    llm.rerank_drip = 0.0
    assert await reranker.rerank("q", ["a", "b"]) == [0.5, 0.5]
    await reranker.close()
