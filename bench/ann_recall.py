"""Approximate nearest-neighbour recall on real embeddings, next to the random vectors of the
million-event benchmarks.

``event_search_scale.py`` and ``context_latency.py`` seed random unit vectors, and on them no
approximate first stage came near the exact scan (``event_search_designs.py``: HNSW recall@10
.83 at ef_search 1,000, binary quantization .66 at R = 1,000, in a 50,000-event group). Random
vectors in 384 dimensions have no structure to exploit: every point is about as far from a
question as every other. This measures the same designs on what the service really stores:
the local embedder's vectors of the dev sets' messages (LoCoMo turns and MemDaily messages,
passages) and questions (queries). Side by side, for the same number of points:

* ``real``: the embeddings themselves;
* ``random``: random unit vectors, as the million-event benchmarks seed;
* ``gauss``: vectors drawn from a normal distribution with the real ones' mean and covariance
  (their common direction and their spectrum, without their topics); also at 50,000 points,
  the busiest group's size, as a stand-in that real text would beat (it does at the real
  count).

For each, recall@10 against the exact top 10 by inner product of
  A. pgvector's HNSW (m 16, ef_construction 64) at several ef_search, with the time per query;
  B. binary quantization, the best R by hamming distance re-scored exactly: of the vectors as
     they are (pgvector's ``binary_quantize``), and of the vectors less their mean.

Run: python bench/ann_recall.py [--data DIR] [--queries 400] [--vectors FILE.npz]
     (--vectors keeps the embeddings in a file and reuses it)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import asyncpg
import numpy as np
from pgvector.asyncpg import register_vector

from service.db.embedded import embedded_url, stop_embedded
from service.embedding.local import LocalEmbedder
from service.settings import EmbeddingModelSettings

DATA = Path(__file__).resolve().parents[2] / "shared/bench"
K = 10
EF_SEARCH = (10, 40, 100, 200)
POOLS = (50, 100, 200, 400, 1000)


def texts(data: Path) -> tuple[list[str], list[str]]:
    """The dev sets' messages and questions: LoCoMo's turns, MemDaily's pooled messages."""
    passages: list[str] = []
    questions: list[str] = []
    for name in ("locomo_dev.jsonl", "memdaily-zh/memdaily_events_pools.jsonl"):
        for line in (data / name).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row["kind"] == "question":
                questions.append(row["question"])
            elif row.get("text"):
                passages.append(row["text"])
    return passages, questions


async def embeddings(data: Path, cache: Path | None) -> tuple[np.ndarray, np.ndarray]:
    if cache is not None and cache.exists():
        kept = np.load(cache)
        return kept["passages"], kept["queries"]
    passages, questions = texts(data)
    embedder = LocalEmbedder(EmbeddingModelSettings())
    try:
        started = time.perf_counter()
        p = np.array(await embedder.passages(passages), dtype=np.float32)
        q = np.array([await embedder.query(text) for text in questions], dtype=np.float32)
        print(
            f"embedded {len(p):,} passages and {len(q):,} questions in "
            f"{time.perf_counter() - started:.0f} s"
        )
    finally:
        await embedder.close()
    if cache is not None:
        np.savez(cache, passages=p, queries=q)
    return p, q


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def gauss_like(x: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    mean = x.mean(axis=0)
    return unit(rng.multivariate_normal(mean, np.cov(x - mean, rowvar=False), size=n))


def recall(found: list[list[int]] | np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / K for f, t in zip(found, truth, strict=True)]))


def quantized(points: np.ndarray, queries: np.ndarray, truth: np.ndarray, centre: bool) -> str:
    shift = points.mean(axis=0) if centre else 0.0
    bits = ((points - shift) > 0).astype(np.float32)
    asked = ((queries - shift) > 0).astype(np.float32)
    # Hamming distance = bits that differ, as matrix products of 0/1 vectors.
    hamming = asked @ (1 - bits).T + (1 - asked) @ bits.T
    order = np.argsort(hamming, axis=1, kind="stable")
    scores = queries @ points.T
    figures = []
    for pool in POOLS:
        best = order[:, :pool]
        kept = np.take_along_axis(scores, best, axis=1)
        found = np.take_along_axis(best, np.argsort(-kept, axis=1)[:, :K], axis=1)
        figures.append(f"R {pool} {recall(found, truth):.3f}")
    return ", ".join(figures)


async def hnsw(
    conn: asyncpg.Connection, points: np.ndarray, queries: np.ndarray, truth: np.ndarray
) -> str:
    await conn.execute("DROP TABLE IF EXISTS ann_points")
    await conn.execute("CREATE TABLE ann_points (id int PRIMARY KEY, v vector(384))")
    await conn.copy_records_to_table("ann_points", records=[(i, v) for i, v in enumerate(points)])
    started = time.perf_counter()
    await conn.execute(
        "CREATE INDEX ON ann_points USING hnsw (v vector_ip_ops) WITH (m = 16, ef_construction = 64)"
    )
    figures = [f"build {time.perf_counter() - started:.1f} s"]
    for ef in EF_SEARCH:
        await conn.execute(f"SET hnsw.ef_search = {ef}")
        started = time.perf_counter()
        found = [
            [
                r["id"]
                for r in await conn.fetch(
                    f"SELECT id FROM ann_points ORDER BY v <#> $1 LIMIT {K}", q
                )
            ]
            for q in queries
        ]
        took = (time.perf_counter() - started) / len(queries) * 1000
        figures.append(f"ef {ef} {recall(found, truth):.3f} ({took:.1f} ms)")
    return ", ".join(figures)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--vectors", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)

    passages, questions = await embeddings(args.data, args.vectors)
    passages, questions = unit(passages), unit(questions)
    questions = questions[rng.permutation(len(questions))[: args.queries]]
    n, dim = passages.shape
    sets = {
        "real": (passages, questions),
        "random": (
            unit(rng.standard_normal((n, dim))),
            unit(rng.standard_normal((len(questions), dim))),
        ),
        "gauss": (gauss_like(passages, n, rng), gauss_like(questions, len(questions), rng)),
        "gauss 50,000": (
            gauss_like(passages, 50_000, rng),
            gauss_like(questions, len(questions), rng),
        ),
    }
    with tempfile.TemporaryDirectory(prefix="memoria-ann-") as folder:
        conn = await asyncpg.connect(embedded_url(Path(folder)).replace("+asyncpg", ""))
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            await register_vector(conn)
            for name, (points, queries) in sets.items():
                scores = queries @ points.T
                truth = np.argsort(-scores, axis=1)[:, :K]
                print(
                    f"\n{name}: {len(points):,} points, {len(queries)} questions; inner product "
                    f"mean {scores.mean():.3f}, best {scores.max(axis=1).mean():.3f}"
                )
                print(f"  A. HNSW: {await hnsw(conn, points, queries, truth)}")
                print(f"  B. binary, as stored: {quantized(points, queries, truth, centre=False)}")
                print(
                    f"     binary, less the mean: {quantized(points, queries, truth, centre=True)}"
                )
        finally:
            await conn.close()
            stop_embedded()


if __name__ == "__main__":
    asyncio.run(main())
