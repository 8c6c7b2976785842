"""A real browser for the e2e tests: Debian's Chromium driven by Playwright, kept off the
network, one page per test against a real server on loopback."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Where the shots go: a temporary folder, so that `make test` leaves a clean checkout;
# `make screenshots` points it at docs/images to renew the README's and the docs' images.
IMAGES = Path(os.environ.get("TROUPE_SCREENSHOTS") or Path(tempfile.gettempdir()) / "troupe-screenshots")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"]

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - .ci/run installs it
    sync_playwright = None  # type: ignore[assignment]  # without playwright the browser tests skip

MISSING = sync_playwright is None or not Path(CHROMIUM).exists()
REASON = "browser tests need Debian's chromium and the playwright package (.ci/run installs both)"


@pytest.fixture
def open_page(make_server) -> Iterator[Callable[..., tuple[Any, Any, list[str]]]]:
    """``open_page(**settings)`` -> (server, tab, console errors) at 1440x900, showing
    ``view`` (the Runs list unless a test works in the editor, ``#/editor``)."""
    if MISSING:
        pytest.skip(REASON)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)

        def open_one(width: int = 1440, view: str = "#/runs", **settings: str) -> tuple[Any, Any, list[str]]:
            server = make_server(**settings)
            tab = browser.new_page(viewport={"width": width, "height": 900})
            errors: list[str] = []
            tab.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            tab.on("pageerror", lambda error: errors.append(str(error)))
            tab.goto(server.login_url)  # logs in the way a user does: the link `troupe start` printed
            tab.locator("#editor-status").get_by_text("nodes").wait_for()  # the editor has its catalog
            show(tab, view)
            return server, tab, errors

        yield open_one
        browser.close()


def show(tab: Any, view: str) -> None:
    """Goes to a view by its address, as a link or the toolbar's Editor/Results does."""
    tab.evaluate("(view) => { location.hash = view; }", view)
    shown = "#canvas" if view == "#/editor" else "#results"
    tab.locator(shown).wait_for(state="visible")


def screenshot(tab: Any, name: str) -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(IMAGES / name))


def confirm(tab: Any, label: str) -> None:
    """Presses the primary button of the open dialog (the page's own, not window.confirm)."""
    dialog = tab.locator("dialog[open]")
    dialog.get_by_role("button", name=label).click()
    dialog.wait_for(state="hidden")
