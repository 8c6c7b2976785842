"""A login link opened in a browser that already has a session (issue 62): the address
bar does not keep it (on a projector, a link that still opens a session is there for the
room to read); the page says the link was not used, and the browser keeps its session."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import MISSING, REASON

pytestmark = pytest.mark.skipif(MISSING, reason=REASON)
sync_api = pytest.importorskip("playwright.sync_api", reason=REASON)
expect = sync_api.expect


def test_a_link_opened_in_a_logged_in_browser_leaves_the_address_bar(open_page):
    server, tab, errors = open_page()
    status, made = server.client.request("POST", "/api/login-links", {"uses": 2})
    assert status == 201, made
    tab.goto(made["login_url"] + "#/runs")
    expect(tab.locator("#link-unspent")).to_contain_text("was not used")
    assert "token" not in tab.url and tab.url == f"{server.url}/#/runs", tab.url
    expect(tab.locator('.tab[data-tab="people"]')).to_be_visible()  # still the teacher's page
    tab.reload()
    tab.locator("#results").wait_for(state="visible")
    expect(tab.locator('.tab[data-tab="people"]')).to_be_visible()
    assert tab.url == f"{server.url}/#/runs" and tab.locator("#link-unspent").count() == 0
    link = next(link for link in server.get("/api/login-links")["links"] if link["kind"] == "class")
    assert (link["uses_left"], link["sessions"]) == (2, 0)  # the link is left for the students it was made for
    assert errors == []
