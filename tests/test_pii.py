"""Personal and sensitive data is found however it is typed: full-width forms, invisible
characters between the digits, separators between a number's groups. What is found is masked
at the characters the person typed, and what only looks like a number (a date, a price, a
version) is left alone."""

from __future__ import annotations

import sys
import unicodedata
import uuid
from datetime import date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service import pii
from service.app import create_app
from service.errors import Invalid
from service.historian.conversation import Conversation
from service.historian.memory_tools import REGISTRY, Scene, validate_call
from tests.conftest import (
    FAST_QUEUE,
    AppClient,
    TenantHandle,
    llm_settings,
    make_settings,
    new_tenant,
    serve_app,
    until_finished,
)
from tests.fake_llm import FakeLLM, Reply, tool

ZERO_WIDTH = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"]


def full_width(text: str) -> str:
    """The text as a Chinese input method's full-width mode types it."""
    return "".join(
        chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else "\u3000" if c == " " else c for c in text
    )


def id_checksum(first17: str) -> str:
    """The ISO 7064 MOD 11-2 check character of a Chinese ID number."""
    weights = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2]
    return "10X98765432"[sum(int(d) * w for d, w in zip(first17, weights, strict=True)) % 11]


# (typed, the kind found, what the masked text reads)
FORMS = [
    ("电话１３８００１３８０００", "phone", "电话138****8000"),
    ("电话 138.0013.8000 可用", "phone", "电话 138****8000 可用"),
    ("号码13\u200b800\u200c138\u200d000\u2060", "phone", "号码138****8000\u2060"),
    ("号码\ufeff138\ufeff0013\ufeff8000。", "phone", "号码\ufeff138****8000。"),
    ("写信到 alice＠example.com 吧", "email", "写信到 a***@example.com 吧"),
    ("call (415) 555-0134 after six", "phone", "call 415****0134 after six"),
    ("身份证１１０１０１１９９００３０７４５１４", "id_number", "身份证110***********4514"),
    ("心脏病史三年", "health", "心脏病史三年"),
    ("每天打胰岛素", "health", "每天打胰岛素"),
]


@pytest.mark.parametrize(("typed", "kind", "masked"), FORMS)
def test_each_form_is_sensitive_and_masked_where_it_was_typed(
    typed: str, kind: str, masked: str
) -> None:
    assert pii.sensitive(typed) == [kind]
    assert pii.mask(typed) == masked
    if kind != "health":
        assert pii.apply(typed, "drop") == (None, [kind])
        assert pii.apply(typed, "mask") == (masked, [kind])
        (finding,) = pii.find(typed)
        assert typed[finding.start : finding.end] == finding.text


@pytest.mark.parametrize(
    "text",
    [
        "我们 2026.11.30 见",
        "2026-11-30 13:45 开会",
        "售价 ¥1,299.00，原价 1599.00 元",
        "升级到 Python 3.11.7 了",
        "版本 3.11.7 于 2026.11.30 发布，售价 199.00 元",
        "从 1999 年到 2026 年",
        "第 138 期，共 2026 页",
        "读数 3.0125 12345678，误差 0.0134",
        "ｖｅｒｓｉｏｎ　３．１１．７，２０２６．１１．３０",
        "今天去药店买了点药",
        "透析一下这个问题的本质",
        "heart of the matter",
        "屋里比屋外冷",
    ],
)
def test_what_only_looks_like_data_stays_non_sensitive(text: str) -> None:
    assert pii.sensitive(text) == []
    assert pii.mask(text) == text


@pytest.mark.parametrize(
    "text",
    [
        "她有高血压",
        "孩子有哮喘",
        "他有癫痫",
        "查出乙肝",
        "在做化疗",
        "每周去医院做透析",
        "在吃抗抑郁的药",
        "每周一次心理咨询",
        "He has heart disease",
        "on insulin since May",
        "started chemotherapy",
        "needs dialysis twice a week",
        "has epilepsy",
        "my asthma is back",
        "确诊为HIV阳性",
        "ＨＩＶ阳性",
        "心\u200b脏\u200d病",
    ],
)
def test_health_terms_are_sensitive(text: str) -> None:
    assert pii.sensitive(text) == ["health"]


def test_every_format_character_is_invisible_to_the_checks() -> None:
    """The table of ignored characters holds every format (Cf) character Python knows."""
    missing = [
        f"U+{c:04X}"
        for c in range(sys.maxunicode + 1)
        if unicodedata.category(chr(c)) == "Cf" and chr(c) not in pii._IGNORED
    ]
    assert missing == []


# -- random variations of real data ----------------------------------------------------------

mobiles = st.builds(
    lambda second, rest: f"1{second}{rest}",
    st.sampled_from("3456789"),
    st.text("0123456789", min_size=9, max_size=9),
)
emails = st.builds(
    lambda name, host, tld: f"{name}@{host}.{tld}",
    st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=12),
    st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=10),
    st.text("abcdefghijklmnopqrstuvwxyz", min_size=2, max_size=5),
)
ids = st.builds(
    lambda region, born, seq: (lambda first17: first17 + id_checksum(first17))(
        f"{region}{born:%Y%m%d}{seq:03d}"
    ),
    st.integers(110000, 659999),
    st.dates(date(1930, 1, 1), date.today() - timedelta(days=1)),
    st.integers(0, 999),
)
SEPARATORS = ["", "", " ", "-", ".", "－", "．", "\u3000", "\u2010"]
PREFIXES = ["我的", "记一下：", "联系方式 ", "好的，"]
SUFFIXES = ["", "，谢谢", " 随时找我", "。"]


@st.composite
def disguised(draw: st.DrawFn, value: str) -> str:
    """``value`` with its characters in full width now and then, and zero-width characters
    between them: every character stays, and stays in its place."""
    out = []
    for n, char in enumerate(value):
        if n and draw(st.booleans()):
            out.append("".join(draw(st.lists(st.sampled_from(ZERO_WIDTH), max_size=3))))
        out.append(full_width(char) if draw(st.booleans()) else char)
    return "".join(out)


def separated(draw: st.DrawFn, mobile: str) -> str:
    """The number in its 3-4-4 groups, with a separator (or none) between each two."""
    first, second = (draw(st.sampled_from(SEPARATORS)) for _ in range(2))
    return f"{mobile[:3]}{first}{mobile[3:7]}{second}{mobile[7:]}"


@st.composite
def typed_mobiles(draw: st.DrawFn) -> tuple[str, str]:
    mobile = draw(mobiles)
    return mobile, draw(disguised(separated(draw, mobile)))


def check_found_and_masked(draw: st.DrawFn, kind: str, value: str, typed: str) -> None:
    prefix, suffix = draw(st.sampled_from(PREFIXES)), draw(st.sampled_from(SUFFIXES))
    text = prefix + typed + suffix
    assert pii.sensitive(text) == [kind], text
    masked = pii.mask(text)
    assert masked == prefix + pii.mask_one(value) + suffix, text
    # The value is in no form in what is kept, and what is kept is found no more.
    assert value not in pii.normalise(masked).text
    assert pii.find(masked) == []
    assert pii.apply(text, "drop") == (None, [kind])


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_disguised_mobile_numbers_are_found_and_masked(data: st.DataObject) -> None:
    mobile, typed = data.draw(typed_mobiles())
    check_found_and_masked(data.draw, "phone", mobile, typed)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_disguised_emails_are_found_and_masked(data: st.DataObject) -> None:
    email = data.draw(emails)
    check_found_and_masked(data.draw, "email", email, data.draw(disguised(email)))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_disguised_id_numbers_are_found_and_masked(data: st.DataObject) -> None:
    number = data.draw(ids)
    check_found_and_masked(data.draw, "id_number", number, data.draw(disguised(number)))


@settings(max_examples=200)
@given(
    st.dates(date(1900, 1, 1), date(2100, 12, 31)),
    st.sampled_from([".", "-", "/", "．"]),
    st.tuples(st.integers(0, 20), st.integers(0, 99), st.integers(0, 999)),
    st.integers(0, 99_999),
    st.integers(0, 99),
)
def test_dates_versions_and_prices_are_not_personal_data(
    day: date, sep: str, version: tuple[int, int, int], yuan: int, fen: int
) -> None:
    text = (
        f"{day.year}{sep}{day.month:02d}{sep}{day.day:02d} 发布了 "
        f"{version[0]}.{version[1]}.{version[2]}，售价 {yuan}.{fen:02d} 元，{day.year} 年"
    )
    assert pii.sensitive(text) == []
    assert pii.sensitive(full_width(text)) == []


# -- the historian's memory tools ----------------------------------------------------------


def test_the_memory_tools_keep_every_form_out_of_a_global_memory() -> None:
    speaker = str(uuid.uuid4().int)[:8]
    chat = Conversation(
        key="g:1",
        request_type="group",
        group_id="1",
        group_name="群",
        speaker_id=speaker,
        speaker_name="张三",
        participants={speaker: "张三"},
        moment=datetime(2026, 2, 21, 23, 30, tzinfo=ZoneInfo("Asia/Shanghai")),
        shareable=frozenset({0}),
    )
    for typed, _, _ in FORMS:
        told = {"content": f"张三({speaker}) {typed}", "scope": "GLOBAL", "item": 0}
        with pytest.raises(Invalid, match="GLOBAL memory is read in every group"):
            validate_call("add_memory", told, Scene(chat, {}, set(), offered=frozenset(REGISTRY)))


# -- over HTTP ---------------------------------------------------------------------------------


async def test_a_global_memory_refuses_every_form(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    user = uuid.uuid4().hex[:10]
    for typed, kind, _ in FORMS:
        response = await client.post(
            "/v1/memories/",
            json={"scope": "GLOBAL", "user_id": user, "content": f"{user} {typed}"},
            headers=tenant.headers,
        )
        assert response.status_code == 422, (typed, response.text)
        assert response.json()["field"] == "content" and kind in response.json()["message"]


async def test_a_disguised_confidence_told_to_be_shared_stays_private(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    """A private fact the person lets be known (marked shareable) becomes GLOBAL unless it
    is sensitive; a full-width or zero-width-split number is sensitive all the same."""
    client, tenant = offline
    user = uuid.uuid4().hex[:10]
    private = {"request_type": "private", "user_id": user, "sender_id": user}
    observations = [
        {"text": f"Alice({user})的联系方式：{typed}", "shareable": True} for typed, *_ in FORMS
    ]
    response = await client.post(
        "/v1/end",
        json={**private, "sender_name": "Alice", "observations": observations, "force": True},
        headers=tenant.headers,
    )
    assert response.status_code == 202, response.text
    job = await until_finished(client, tenant, response.json()["job_id"])
    assert job["status"] == "done", job
    memories = await client.get(f"/v1/memories/?user_id={user}", headers=tenant.headers)
    assert memories.status_code == 200, memories.text
    assert memories.json(), "the facts are remembered"
    assert {m["scope"] for m in memories.json()} == {"PRIVATE"}, memories.json()


async def test_the_mask_policy_masks_every_disguised_form(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    await client.patch("/v1/settings", json={"pii_policy": "mask"}, headers=tenant.headers)
    request = uuid.uuid4().hex
    user = uuid.uuid4().hex[:10]
    people = [(typed, masked) for typed, kind, masked in FORMS if kind != "health"]
    response = await client.post(
        "/v1/end",
        json={
            "request_type": "private",
            "user_id": user,
            "sender_id": user,
            "request_id": request,
            "observations": [f"Alice({user}){typed}" for typed, _ in people],
            "force": True,
        },
        headers=tenant.headers,
    )
    assert response.status_code == 202, response.text
    event_ids = [e for e in response.json()["event_ids"] if not e.endswith("memo")]
    assert len(event_ids) == len(people), event_ids
    await until_finished(client, tenant, response.json()["job_id"])
    for event_id, (_, masked) in zip(event_ids, people, strict=False):
        stored = await client.get(f"/v1/events/{event_id}", headers=tenant.headers)
        assert stored.status_code == 200, stored.text
        assert stored.json()["text"] == f"Alice({user}){masked}", stored.json()["text"]
    memory = await client.post(
        "/v1/memories/",
        json={"scope": "PRIVATE", "user_id": user, "content": f"{user} {people[0][0]}"},
        headers=tenant.headers,
    )
    assert memory.status_code == 201, memory.text
    assert memory.json()["content"] == f"{user} {people[0][1]}"


async def test_a_group_fact_the_model_files_as_global_stays_out_of_global(
    db_url: str, llm: FakeLLM
) -> None:
    """The memory step's model, told in a group, files each form as a GLOBAL memory (read in
    every conversation of the person) from an item the person marked shareable; none becomes
    one, while a harmless fact does."""
    settings = make_settings(
        db_url, cognitive={"queue": {**FAST_QUEUE, "job_max_retries": 0}}, **llm_settings(llm)
    )
    user, group = uuid.uuid4().hex[:10], uuid.uuid4().hex[:10]
    harmless = f"用户A({user}) 喜欢攀岩"
    calls = [
        ("add_memory", {"content": f"用户A({user}) {typed}", "scope": "GLOBAL", "item": 0})
        for typed, *_ in FORMS
    ] + [("add_memory", {"content": harmless, "scope": "GLOBAL", "item": 0})]

    def answer(request: dict[str, Any]) -> Reply:
        name = request["tools"][0]["function"]["name"]
        if name == "submit_rewrite":
            return tool("submit_rewrite", {"rewrites": [{"index": 0, "text": harmless}]})
        if name == "add_memory" and request["messages"][-1]["role"] == "user":
            return Reply(tool_calls=calls)
        return Reply(content="nothing to change")

    llm.default = answer
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        tenant = await new_tenant(client)
        response = await client.post(
            "/v1/end",
            json={
                "request_type": "group",
                "group_id": group,
                "group_name": "攀岩群",
                "sender_id": user,
                "sender_name": "用户A",
                "bot_id": "20002",
                "timestamp": "2026-02-21T23:30:00+08:00",
                "observations": [{"text": "我喜欢攀岩", "shareable": True}],
            },
            headers=tenant.headers,
        )
        assert response.status_code == 202, response.text
        job = await until_finished(client, tenant, response.json()["job_id"])
        assert job["status"] == "done", job
        listed = await client.get(
            f"/v1/memories/?user_id={user}&scope=GLOBAL", headers=tenant.headers
        )
        assert [m["content"] for m in listed.json()] == [harmless], job["result"]["notes"]
