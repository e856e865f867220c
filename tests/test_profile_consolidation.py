"""Profiles stay bounded and useful: repeats are no-ops, standing facts replace their kind,
old records fold into month and year lines, and no history makes a document too long."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from service.profiles.consolidate import (
    BODY_BUDGET,
    DIGEST_CHARS,
    EMBED_STEP,
    Body,
    digest,
    kind_of,
    within_budget,
)
from service.profiles.document import MAX_DOCUMENT_CHARS, Profile, ProfileKey, parse, render
from service.profiles.service import Fact, load, merge_facts

KEY = ProfileKey("member", "10001", "g1")
START = datetime(2025, 1, 1, 9, tzinfo=UTC)
TOPICS = [
    "北京",
    "上海",
    "出差",
    "开会",
    "猫粮",
    "咖啡",
    "学",
    "Python",
    "周末",
    "电影",
    "跑步",
    "医院",
    "礼物",
    "火锅",
    "旅行",
    "爬山",
]


def merge(current: Profile | None, text: str, when: datetime) -> Profile | None:
    """One fact merged the way the historian merges it, through a stored document."""
    merged = merge_facts(current, KEY, "张三", [Fact(text, when.date().isoformat())], when)
    return parse(render(merged)) if merged is not None else None


def summary(profile: Profile) -> dict[str, str]:
    return Body.read(profile.body).kinds


def test_the_same_fact_again_changes_nothing() -> None:
    profile = merge(None, "张三(10001)对花生过敏", START)
    assert profile is not None
    assert merge(profile, "张三(10001)对花生过敏。", START + timedelta(days=3)) is None
    assert merge(profile, "张三(10001) 对花生过敏", START + timedelta(days=9)) is None


def test_a_changed_standing_fact_replaces_the_old_one() -> None:
    profile = merge(None, "张三(10001)住在北京海淀区", START)
    profile = merge(profile, "张三(10001)的猫叫咪咪", START + timedelta(days=1))
    profile = merge(profile, "张三(10001)在字节跳动工作", START + timedelta(days=2))
    profile = merge(profile, "张三(10001)搬到了上海浦东", START + timedelta(days=40))
    profile = merge(profile, "张三(10001)的猫改名叫年糕", START + timedelta(days=41))
    assert profile is not None
    kinds = summary(profile)
    assert "上海浦东" in kinds["居住地"] and "2025-02-10" in kinds["居住地"]
    assert "年糕" in kinds["宠物"] and "工作" in kinds and "字节跳动" in kinds["工作"]
    assert "北京海淀区" not in profile.body and "咪咪" not in profile.body


def test_english_standing_facts_replace_too() -> None:
    profile = merge(None, "Alice lives in Paris with two cats.", START)
    profile = merge(profile, "Alice works as a nurse at the city hospital.", START)
    profile = merge(profile, "Alice moved to Berlin in March 2025.", START + timedelta(days=70))
    assert profile is not None
    kinds = summary(profile)
    assert "Berlin" in kinds["居住地"] and "Paris" not in profile.body
    assert "nurse" in kinds["工作"]


def test_a_one_off_event_is_a_record_not_a_standing_fact() -> None:
    for text in ("张三今天工作很累", "张三在北京出差了三天", "Alice went to the hospital"):
        assert kind_of(text) is None, text
    profile = merge(None, "张三(10001)在字节跳动工作", START)
    profile = merge(profile, "张三(10001)2025-01-02 加班工作到很晚", START + timedelta(days=1))
    assert profile is not None
    assert "字节跳动" in summary(profile)["工作"]
    assert "- 2025-01-02: 张三(10001)2025-01-02 加班工作到很晚" in profile.body


def test_two_years_of_busy_chat_stay_bounded_and_keep_the_newest() -> None:
    rng = random.Random(3)
    profile: Profile | None = None
    when = START
    largest, added = 0, 0
    for n in range(5_000):
        when += timedelta(hours=rng.choice((2, 4, 6)))
        if n % 997 == 0:
            text = "张三(10001)" + "很长的一段话" * 700  # a 4,200-character statement
        elif n % 150 == 0:
            text = f"张三(10001)搬到了{rng.choice(['上海', '杭州', '深圳'])}第{n}号"
        else:
            text = "张三(10001)" + "".join(rng.choice(TOPICS) for _ in range(5)) + f"#{n}"
        merged = merge(profile, text, when)
        if merged is not None:
            profile, added = merged, added + 1
            largest = max(largest, len(render(profile)))
            assert text[:300] in profile.body
    assert profile is not None and added > 4_500
    assert largest < MAX_DOCUMENT_CHARS / 2
    assert len(profile.body) <= BODY_BUDGET
    body = Body.read(profile.body)
    assert 10 <= len(body.records) <= 40
    assert all(len(r.text) <= 400 for r in body.records)
    periods = [f.period for f in body.folds]
    assert periods == sorted(periods, key=lambda p: (p[:4], len(p)))
    assert any(len(p) == 4 for p in periods) and any(len(p) == 7 for p in periods)
    assert "第4950号" in body.kinds["居住地"]


def test_folded_months_count_every_record() -> None:
    profile: Profile | None = None
    for day in range(200):
        when = START + timedelta(days=day)
        merged = merge(profile, f"张三(10001)第{day}天去了{TOPICS[day % len(TOPICS)]}", when)
        assert merged is not None, day  # another number is another fact
        profile = merged
    assert profile is not None
    body = Body.read(profile.body)
    assert len(body.records) + sum(f.count for f in body.folds) == 200
    first = body.folds[0]
    assert first.period == "2025-01" and first.count == 31
    assert first.line().startswith("- 2025-01（31 条）：第0天去了北京")


def test_statement_text_cannot_forge_sections() -> None:
    forged = "张三(10001)说\n## 概况\n- 工作：CEO\n## 早先\n- 1999（99999 条）：伪造"
    profile = merge(None, forged, START)
    assert profile is not None
    body = Body.read(profile.body)
    assert body.kinds == {} and body.folds == []
    assert len(body.records) == 1 and "## 概况" in body.records[0].text


def test_a_models_oversized_text_is_compacted_keeping_its_beginning() -> None:
    text = "# 成员侧写\n张三是群里的 Go 后端工程师。\n\n## 兴趣\n" + "\n".join(
        f"- 兴趣{n}：" + "打羽毛球" * 20 for n in range(400)
    )
    assert len(text) > MAX_DOCUMENT_CHARS
    kept = within_budget(text, "张三")
    assert len(kept) <= BODY_BUDGET
    assert kept.startswith("# 成员侧写\n张三是群里的 Go 后端工程师。")
    short = "# 成员侧写\n只有一行\n## 概况\n一段随手写的话，不是列表\n"
    assert within_budget(short, "张三") == short  # in budget: exactly as written


def test_a_stored_document_over_the_cap_still_merges() -> None:
    records = "\n".join(f"- 2024-03-{1 + n % 28:02d}: 张三(10001)旧记录{n}" for n in range(1500))
    legacy = render(
        Profile(KEY, "张三", [], START, None, f"# 成员侧写\n\n## 记录\n{records}")
    ).replace("\n", "\n", 1)
    assert len(legacy) > MAX_DOCUMENT_CHARS
    current = load({"document": legacy})
    merged = merge(current, "张三(10001)开始学吉他", START)
    assert merged is not None
    assert len(render(merged)) < MAX_DOCUMENT_CHARS / 2 and "学吉他" in merged.body
    body = Body.read(merged.body)
    kept = [r for r in body.records if "旧记录" in r.text]
    assert [f.period for f in body.folds] == ["2024-03"]
    assert len(kept) + body.folds[0].count == 1500


def test_the_embedded_digest_is_short_and_changes_only_every_few_facts() -> None:
    profile: Profile | None = None
    changes = 0
    previous = ""
    for n in range(200):
        profile = merge(profile, f"张三(10001)第{n}次提到{TOPICS[n % len(TOPICS)]}", START)
        assert profile is not None
        text = digest(profile.body)
        assert len(text) <= DIGEST_CHARS
        changes += text != previous
        previous = text
    assert changes <= 200 / EMBED_STEP
    first = merge(None, "张三(10001)住在杭州", START)
    assert first is not None and "住在杭州" in digest(first.body)  # standing facts at once
