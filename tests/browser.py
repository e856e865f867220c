"""Headless Chromium from the distribution's packages, driven by its chromedriver: the
console's and the API documentation's browser tests."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

# Every host name but the loopback's fails to resolve: a page that reaches for another origin
# (a CDN) finds nothing there, as offline or behind a firewall.
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost"


def chromium(*arguments: str) -> Iterator[WebDriver]:
    """A headless Chromium, quit afterwards; skipped (failed under CI) when not installed."""
    binary, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not (binary and driver_path):
        message = "needs Debian's chromium and chromium-driver packages"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    options = Options()
    options.binary_location = binary
    for argument in (
        "--headless=new",
        "--no-sandbox",  # running as root in a container
        "--disable-dev-shm-usage",
        "--window-size=1400,1900",
        "--lang=en-US",
        *arguments,
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
