"""The API documentation and the landing answer: Swagger UI from this process's own files, which
renders in a headless Chromium that can reach nothing but this machine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from service.apidocs import service_version
from tests.browser import OFFLINE, chromium
from tests.conftest import make_settings
from tests.served import served

pytestmark = pytest.mark.slow


@pytest.fixture
def site(db_url: str) -> Iterator[str]:
    """The app on a loopback port (no worker: the docs need none)."""
    with served(make_settings(db_url), run_worker=False) as base_url:
        yield base_url


@pytest.fixture
def offline_browser() -> Iterator[WebDriver]:
    """Headless Chromium for which every other host is unreachable."""
    yield from chromium(OFFLINE)


def test_the_docs_page_loads_only_files_of_this_origin(site: str) -> None:
    for path in ("/schema", "/schema/swagger"):
        response = httpx.get(f"{site}{path}")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/html")
        policy = response.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy
        assert "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy
        assert "frame-ancestors 'none'" in policy
        # Nothing from a CDN: no absolute URL at all, and every file with its integrity.
        assert "http://" not in response.text and "https://" not in response.text
        assert response.text.count('integrity="sha384-') == 3
    page = httpx.get(f"{site}/schema").text
    bundle = page.split('<script src="', 1)[1].split('"', 1)[0]
    assert bundle.startswith("/schema/swagger-ui-5.")
    script = httpx.get(f"{site}{bundle}")
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/javascript")
    assert len(script.content) > 500_000  # the real bundle, not a stub
    assert "immutable" in script.headers["cache-control"]
    # Only the page's own files are served from the package, nothing else of its directory.
    folder = bundle.rsplit("/", 1)[0]
    for other in ("index.html", "swagger-ui-bundle.js.map", "..%2F..%2Fpyproject.toml"):
        assert httpx.get(f"{site}{folder}/{other}").status_code == 404


def test_the_docs_render_in_a_browser_with_no_network(
    site: str, offline_browser: WebDriver
) -> None:
    browser = offline_browser
    browser.get(f"{site}/schema")
    WebDriverWait(browser, 30, poll_frequency=0.2).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")
    )
    paths = {
        e.text.replace("\u200b", "")
        for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")
    }
    assert {"/v1/end", "/v1/context", "/v1/memories/search"} <= paths
    assert "Memoria" in browser.find_element(By.CSS_SELECTOR, ".info .title").text

    requested = set()
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            requested.add(message["params"]["request"]["url"])
    origins = {urlsplit(url).netloc for url in requested if url.startswith("http")}
    assert origins == {urlsplit(site).netloc}, requested
    problems = [
        e["message"]
        for e in browser.get_log("browser")
        if e["level"] == "SEVERE" and "favicon.ico" not in e["message"]
    ]
    assert problems == []  # no refused script or style (CSP), no failed load


def test_the_root_points_to_the_console_the_docs_and_the_version(site: str) -> None:
    answer = httpx.get(f"{site}/")
    assert answer.status_code == 200
    body = answer.json()
    assert body["version"] == service_version() and body["version"][0].isdigit()
    assert (body["console"], body["docs"]) == ("/console", "/schema")
    for path in (body["console"], body["docs"], body["openapi"], body["health"]):
        assert httpx.get(f"{site}{path}").status_code == 200, path
    page = httpx.get(f"{site}/", headers={"Accept": "text/html,*/*;q=0.8"})
    assert page.headers["content-type"].startswith("text/html")
    assert 'href="/console"' in page.text and 'href="/schema"' in page.text
    assert service_version() in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
