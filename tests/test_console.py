"""The operator's console in a real headless Chromium: a conversation's profiles with their
revision diffs, a rollback through the page, memories with their history, events, the queue,
search, and stored hostile HTML shown as text."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from selenium.common.exceptions import NoAlertPresentException, TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.browser import chromium
from tests.conftest import ADMIN, ADMIN_TOKEN, FAST_QUEUE, make_settings
from tests.served import served

pytestmark = pytest.mark.slow

GROUP = "100200"
HOSTILE = "群公告 <img src=x onerror=\"document.title='pwned'\"> 请勿点击"


def group_doc(*lines: str) -> str:
    body = "\n".join(f"- {line}" for line in lines)
    return (
        f'---\nentity_type: group\nentity_id: "{GROUP}"\nname: "Python 群"\ntags: ["技术"]\n'
        f'updated_at: "2026-03-01T10:00:00+08:00"\n---\n# 群侧写\n{body}\n'
    )


OLDEST = group_doc("群规：禁止发广告", "话题：Python")
MIDDLE = group_doc("群规：禁止发广告", "话题：Python 与 Rust", "每周五晚上有分享会")
NEWEST = group_doc("群规：禁止发广告和刷屏", "话题：Python 与 Rust", "每周五晚上有分享会")


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    """Headless Chromium from the distribution's packages, driven by its chromedriver."""
    yield from chromium()


@pytest.fixture
def site(db_url: str) -> Iterator[str]:
    """The app on a loopback port with its worker."""
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    with served(settings) as base_url:
        yield base_url


class Api:
    """A tenant's view of the served app over HTTP."""

    def __init__(self, base_url: str, key: str) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=30)
        self.headers = {"Authorization": f"Bearer {key}"}

    def call(self, method: str, path: str, expect: int = 200, **kwargs: Any) -> Any:
        headers = {**self.headers, **kwargs.pop("headers", {})}
        response = self.http.request(method, path, headers=headers, **kwargs)
        assert response.status_code == expect, response.text
        return response.json()


def new_tenant(base_url: str, name: str) -> tuple[str, str]:
    response = httpx.post(f"{base_url}/admin/tenants", json={"name": name}, headers=ADMIN)
    assert response.status_code == 201, response.text
    body = response.json()
    return body["tenant_id"], body["api_key"]["key"]


def seed(api: Api) -> dict[str, Any]:
    """A group with events, a finished job, memories with history, and a profile with revisions."""
    accepted = api.call(
        "POST",
        "/v1/end",
        expect=202,
        json={
            "request_type": "group",
            "group_id": GROUP,
            "group_name": "Python 群",
            "sender_id": "10001",
            "sender_name": "张三",
            "bot_id": "20002",
            "bot_name": "小助手",
            "timestamp": "2026-03-01T21:00:00+08:00",
            "request_id": "turn-1",
            "observations": ["我下周三去杭州参加技术大会"],
        },
    )
    deadline = time.monotonic() + 60
    while api.call("GET", f"/v1/jobs/{accepted['job_id']}")["status"] != "done":
        assert time.monotonic() < deadline, "the end job did not finish"
        time.sleep(0.1)

    hiking = api.call(
        "POST",
        "/v1/memories",
        expect=201,
        json={
            "scope": "MEMBER_IN_GROUP",
            "group_id": GROUP,
            "user_id": "10001",
            "category": "PREFERENCE",
            "content": "张三(10001)喜欢周末爬山",
        },
    )
    api.call(
        "PATCH",
        f"/v1/memories/{hiking['id']}",
        json={"content": "张三(10001)喜欢周末爬山和游泳", "reason": "补充了游泳"},
    )
    hostile = api.call(
        "POST",
        "/v1/memories",
        expect=201,
        json={"scope": "GROUP", "group_id": GROUP, "category": "FACT", "content": HOSTILE},
    )

    current = api.http.get(f"/v1/profiles/group/{GROUP}", headers=api.headers)
    version = current.json()["version"] if current.status_code == 200 else 0
    versions = {}
    for name, document in (("oldest", OLDEST), ("middle", MIDDLE), ("newest", NEWEST)):
        version = api.call(
            "PUT",
            f"/v1/profiles/group/{GROUP}",
            json={"document": document},
            headers={"If-Match": str(version)},
        )["version"]
        versions[name] = version
    return {"memory_id": hiking["id"], "hostile_id": hostile["id"], "versions": versions}


def wait(driver: WebDriver, condition: Callable[[WebDriver], Any], timeout: float = 20) -> Any:
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition)


def section(driver: WebDriver, name: str) -> WebElement:
    return driver.find_element(By.ID, name)


def loaded(name: str, needle: str) -> Callable[[WebDriver], bool]:
    return lambda d: needle in section(d, name).text


def test_console_page_has_a_strict_content_security_policy(site: str) -> None:
    response = httpx.get(f"{site}/console")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    policy = response.headers["content-security-policy"]
    assert "default-src 'none'" in policy
    assert "connect-src 'self'" in policy
    assert "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy
    assert "script-src 'sha256-" in policy and "style-src 'sha256-" in policy
    assert "frame-ancestors 'none'" in policy
    # Nothing from anywhere else: the page is whole by itself.
    assert "http://" not in response.text and "https://" not in response.text
    assert "/console" not in httpx.get(f"{site}/schema/openapi.json").json()["paths"]


def test_an_operator_inspects_a_group_and_rolls_back_its_profile(
    site: str, browser: WebDriver
) -> None:
    tenant_id, key = new_tenant(site, "acme")
    new_tenant(site, "someone-else")
    api = Api(site, key)
    seeded = seed(api)
    versions = seeded["versions"]
    errors: list[str] = []

    browser.get(f"{site}/console")
    browser.find_element(By.ID, "key").send_keys(key)
    browser.find_element(By.ID, "conversation").send_keys(GROUP)
    browser.find_element(By.ID, "open").click()

    # The profile, its revisions newest first, and the diff of each change.
    wait(browser, loaded("profiles", "禁止发广告和刷屏"))
    profiles = section(browser, "profiles")
    card = profiles.find_element(By.CSS_SELECTOR, f'article[data-profile="group {GROUP}"]')
    assert card.get_attribute("data-version") == str(versions["newest"])
    revisions = card.find_elements(By.CSS_SELECTOR, "li.revision")
    assert [r.get_attribute("data-version") for r in revisions][:2] == [
        str(versions["middle"]),
        str(versions["oldest"]),
    ]
    newest_change = revisions[0].find_element(By.CSS_SELECTOR, "pre.diff")
    assert [e.text for e in newest_change.find_elements(By.CSS_SELECTOR, ".del")] == [
        "- - 群规：禁止发广告"
    ]
    assert [e.text for e in newest_change.find_elements(By.CSS_SELECTOR, ".add")] == [
        "+ - 群规：禁止发广告和刷屏"
    ]
    older_change = revisions[1].find_element(By.CSS_SELECTOR, "pre.diff")
    assert [e.text for e in older_change.find_elements(By.CSS_SELECTOR, ".add")] == [
        "+ - 话题：Python 与 Rust",
        "+ - 每周五晚上有分享会",
    ]
    assert "api" in revisions[0].text  # what made the change

    # Memories, newest first; one opens onto its history.
    wait(browser, loaded("memories", "张三(10001)喜欢周末爬山和游泳"))
    memory = section(browser, "memories").find_element(
        By.CSS_SELECTOR, f'details[data-id="{seeded["memory_id"]}"]'
    )
    memory.find_element(By.TAG_NAME, "summary").click()
    wait(browser, lambda d: len(memory.find_elements(By.CSS_SELECTOR, "ul.history li")) == 2)
    history = memory.find_elements(By.CSS_SELECTOR, "ul.history li")
    assert [h.get_attribute("data-action") for h in history] == ["add", "update"]
    assert memory.find_element(By.CSS_SELECTOR, "ul.history del").text == "张三(10001)喜欢周末爬山"
    assert "补充了游泳" in history[1].text

    # Stored HTML is shown as text: no element was made of it and its script never ran.
    hostile = section(browser, "memories").find_element(
        By.CSS_SELECTOR, f'details[data-id="{seeded["hostile_id"]}"] .content'
    )
    assert hostile.text == HOSTILE
    assert browser.find_elements(By.TAG_NAME, "img") == []
    assert browser.title == "Memoria console"

    # The end job's event, and the queue.
    wait(browser, loaded("events", "杭州"))
    events = section(browser, "events").find_elements(By.CSS_SELECTOR, "ul.events li")
    assert any("10001" in e.text and "技术大会" in e.text for e in events)
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#queue tbody"))
    queue = section(browser, "queue")
    assert queue.find_element(By.CSS_SELECTOR, '[data-status="failed"]').text == "failed: 0"
    assert "end" in queue.find_element(By.CSS_SELECTOR, "tbody").text
    assert "done" in queue.find_element(By.CSS_SELECTOR, "tbody").text

    # Search the conversation.
    browser.find_element(By.ID, "query").send_keys("张三爬山游泳")
    section(browser, "search").find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(browser, lambda d: "Searching" not in section(d, "search").text)
    found = section(browser, "search").find_element(By.CSS_SELECTOR, '[data-kind="Memories"]')
    assert "张三(10001)喜欢周末爬山和游泳" in found.find_element(By.CSS_SELECTOR, "li").text

    if path := os.environ.get("CONSOLE_SCREENSHOT"):
        browser.save_screenshot(path)

    # Roll back to the oldest of the three texts, through the page.
    card.find_element(
        By.CSS_SELECTOR, f'button.rollback[data-version="{versions["oldest"]}"]'
    ).click()
    alert = wait(browser, lambda d: _alert(d))
    assert f"version {versions['oldest']}" in alert.text
    alert.accept()
    wait(browser, loaded("profiles", f"version {versions['newest'] + 1}"))
    assert "now has the text of" in browser.find_element(By.ID, "notice").text

    profile = api.call("GET", f"/v1/profiles/group/{GROUP}")
    assert profile["document"] == OLDEST
    assert profile["version"] == versions["newest"] + 1
    kept = {r["version"]: r for r in api.call("GET", f"/v1/profiles/group/{GROUP}/revisions")}
    assert kept[versions["newest"]]["document"] == NEWEST
    assert kept[versions["newest"]]["replaced_by"]["by"] == "rollback"
    assert kept[versions["newest"]]["replaced_by"]["to_version"] == versions["oldest"]

    # The key lived in sessionStorage only, and "Forget key" clears it.
    stored = browser.execute_script("return sessionStorage.getItem('memoria.console')")
    assert key in stored
    assert browser.execute_script("return localStorage.length") == 0
    assert browser.get_cookies() == []
    browser.find_element(By.ID, "forget").click()
    assert browser.execute_script("return sessionStorage.getItem('memoria.console')") is None
    assert not section(browser, "profiles").is_displayed()

    # The admin token works within a tenant it picks.
    browser.find_element(By.ID, "key").send_keys(ADMIN_TOKEN)
    browser.find_element(By.ID, "conversation").send_keys(GROUP)
    browser.find_element(By.ID, "open").click()
    wait(browser, lambda d: len(Select(d.find_element(By.ID, "tenant")).options) == 3)
    assert "pick" in browser.find_element(By.ID, "error").text
    Select(browser.find_element(By.ID, "tenant")).select_by_value(tenant_id)
    browser.find_element(By.ID, "open").click()
    wait(browser, loaded("profiles", f"version {versions['newest'] + 1}"))
    assert "admin in acme" in browser.find_element(By.ID, "status").text

    for entry in browser.get_log("browser"):
        if entry["level"] == "SEVERE":
            errors.append(entry["message"])
    assert errors == []


def _alert(driver: WebDriver) -> Any:
    try:
        return driver.switch_to.alert
    except NoAlertPresentException:
        return False


def test_a_wrong_key_is_reported_on_the_page(site: str, browser: WebDriver) -> None:
    browser.get(f"{site}/console")
    browser.find_element(By.ID, "key").send_keys("mk_aaaaaaaaaa_" + "x" * 43)
    browser.find_element(By.ID, "conversation").send_keys(GROUP)
    browser.find_element(By.ID, "open").click()
    try:
        wait(browser, lambda d: d.find_element(By.ID, "error").is_displayed(), timeout=10)
    except TimeoutException:
        pytest.fail("no error shown for a wrong key")
    assert "401" in browser.find_element(By.ID, "error").text
    assert not section(browser, "profiles").is_displayed()
