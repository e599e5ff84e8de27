"""The browser of the dashboard's browser tests: Playwright driving Debian's Chromium
(skips the module that imports it when either is missing)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.dashboard_server import Http

CHROMIUM = os.environ.get("BUDGET_TEST_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                               "(pip install -e '.[test]')")
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"browser tests skipped: no Chromium at {CHROMIUM} "
                "(apt-get install -y chromium)", allow_module_level=True)


@pytest.fixture(scope="module", name="browser")
def browser_fixture() -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(name="page")
def page_fixture(browser: Any) -> Iterator[Any]:
    """A page 1400 x 900 whose console errors (a 404 for a resource included) are kept
    in ``page.console_errors``."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    p = context.new_page()
    p.set_default_timeout(10_000)
    errors: list[str] = []
    p.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    p.console_errors = errors
    yield p
    context.close()


def login(page: Any, http: Http, user: str, password: str) -> None:
    page.goto(http.base + "/login")
    page.fill("input[name=user]", user)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_selector("h1:has-text('Open trees')")
