"""The similarity calibration of the configured embedder, measured on real data.

Every embedder has its own range of cosines: multilingual-e5-small puts nearly every pair of
chat lines between 0.75 and 0.95, related or not, while other models spread them over
[0, 1]. The ranking maps raw cosines onto one scale (``similarity_floor`` → 0,
``similarity_ceiling`` → 1, in ``[models.embedding]``) so that the seeds' thresholds and
time decay mean the same with any model. This measures both points for the embedder the
settings name (``MEMORIA_MODELS__EMBEDDING__…`` or ``MEMORIA_CONFIG``):

- the floor is the median cosine of a question and a line that does not answer it (an
  unrelated event calibrates to about 0);
- the ceiling puts the 90th percentile of those unrelated pairs at
  ``time_decay_min_similarity`` (0.35): nine unrelated events in ten are never lifted by the
  recency boost, and the boost (×1.2 at most) is worth a few hundredths of a cosine, not
  the whole gap between a related and an unrelated text.

Pairs come from LoCoMo (English questions and the turns of their conversation) and MADial
(Chinese dialogues and the user's memories); the evidence pairs are shown for comparison.

Run: python bench/similarity_calibration.py [--data DIR] [--conversations 1]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retrieval_quality import DATA, load_locomo, load_madial, madial_queries, turn_text

from service.embedding import build_embedder
from service.embedding.base import calibration
from service.settings import QuerySettings, load_settings


def quantiles(values: list[float]) -> str:
    marks = (5, 50, 90, 95, 99)
    shown = np.quantile(values, [m / 100 for m in marks])
    return "  ".join(f"p{p} {v:.3f}" for p, v in zip(marks, shown, strict=True))


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=DATA, help="folder of the bench data")
    parser.add_argument("--conversations", type=int, default=1, help="LoCoMo ones used")
    args = parser.parse_args()
    settings = load_settings().models.embedding
    embedder = build_embedder(settings)
    related: list[float] = []
    unrelated: list[float] = []
    try:
        turns, questions = load_locomo(args.data / "locomo_dev.jsonl")
        for conv_id in list(turns)[: args.conversations]:
            rows = turns[conv_id]
            ids = [t["turn_id"] for t in rows]
            passages = np.array(await embedder.passages([turn_text(t) for t in rows]))
            for q in (q for q in questions if q["conv_id"] == conv_id):
                cosines = passages @ await embedder.query(q["question"])
                for turn_id, cosine in zip(ids, cosines, strict=True):
                    (related if turn_id in q["evidence"] else unrelated).append(float(cosine))
        memories, dialogues = load_madial(args.data / "madial-zh")
        embedded: dict[int, np.ndarray] = {}
        for user, query, relevant in madial_queries(dialogues):
            rows = memories[user]
            if user not in embedded:
                embedded[user] = np.array(await embedder.passages([m["event"] for m in rows]))
            cosines = embedded[user] @ await embedder.query(query[-1000:])
            for memory, cosine in zip(rows, cosines, strict=True):
                (related if str(memory["id"]) in relevant else unrelated).append(float(cosine))
    finally:
        await embedder.close()

    floor = float(np.median(unrelated))
    threshold = QuerySettings().time_decay_min_similarity
    ceiling = min(1.0, floor + (float(np.quantile(unrelated, 0.9)) - floor) / threshold)
    print(f"embedder {embedder.name}: {len(unrelated)} unrelated, {len(related)} related pairs")
    print(f"  unrelated cosines: {quantiles(unrelated)}")
    print(f"  related cosines:   {quantiles(related)}")
    print(f"  similarity_floor = {floor:.3f}\n  similarity_ceiling = {ceiling:.3f}")
    current = calibration(settings)
    print(f"  configured: floor {current.floor}, ceiling {current.ceiling}")
    for name, values in (("unrelated", unrelated), ("related", related)):
        share = np.mean([current.similarity(v) >= threshold for v in values])
        print(f"  {name} pairs at or above {threshold} once calibrated: {share:.1%}")


if __name__ == "__main__":
    asyncio.run(main())
