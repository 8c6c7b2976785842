"""A classroom in real browsers (issue 28): the teacher on the server's machine makes a
class link; two students, each a browser context of a Chromium that runs on a machine
of the test's own LAN (a network namespace), open it; one runs a graph, the other sees
it and cannot manage workers; a browser without a link sees only how to log in; the
teacher sees who is connected and revokes one. Screenshots go to docs/images."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import CHROMIUM, FLAGS, MISSING, REASON, screenshot
from tests.lan import HOST_SIDE

pytestmark = pytest.mark.skipif(MISSING, reason=REASON)
sync_api = pytest.importorskip("playwright.sync_api", reason=REASON)
expect = sync_api.expect


def chromium_in(namespace: str, folder: Path) -> str:
    """A Chromium that starts inside ``namespace``: a student's machine."""
    wrapper = folder / "chromium-in-lan"
    wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {namespace} {CHROMIUM} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


def on_lan(url: str, port: str) -> str:
    """A link as a student on the test's LAN reaches it (the server prints each of its
    addresses; the LAN's is the one this test made)."""
    return f"http://{HOST_SIDE}:{port}/?{url.split('?', 1)[1]}" if "?" in url else f"http://{HOST_SIDE}:{port}/"


def test_a_teacher_and_two_students(make_server, lan, tmp_path):
    server = make_server(TROUPE_HOST="0.0.0.0")
    port = server.url.rsplit(":", 1)[1]
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_in(lan, tmp_path), headless=True, args=FLAGS,
                                             env={**os.environ})
        errors: list[str] = []
        trouble: list[str] = []  # what a page that never ran its script met: said if the wall stays down

        def context_page(url: str):
            page = browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("requestfailed", lambda request: trouble.append(f"{request.url}: {request.failure}"))
            page.on("console", lambda message: trouble.append(message.text) if message.type == "error" else None)
            page.goto(url)
            return page

        # Someone with the address but no link sees only how to log in.
        stranger = context_page(on_lan("", port))
        # The wall goes up once the page has asked /api/info (a cold browser on a busy CI
        # machine may take more than expect's default 5 s); when it stays down, the failure
        # says what the page's requests met.
        try:
            expect(stranger.locator("#login-wall")).to_contain_text("open the login link you were given",
                                                                    timeout=30_000)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nfailed requests and console errors: {trouble}") from None
        expect(stranger.locator("#run-graph")).to_be_hidden()
        screenshot(stranger, "classroom-login.png")

        teacher = context_page(on_lan(server.login_url, port))
        teacher.locator("#editor-status").get_by_text("nodes").wait_for()
        teacher.get_by_role("link", name="Results").click()  # the editor first; results a click away
        teacher.get_by_role("button", name="Connected").click()
        teacher.get_by_role("button", name="New class link…").click()
        dialog = teacher.locator("dialog[open]")
        dialog.locator('input[name="uses"]').fill("2")
        dialog.get_by_role("button", name="Make the link").click()
        link = dialog.locator("[data-login-link]")
        expect(link).to_contain_text("?token=")
        screenshot(teacher, "classroom-class-link.png")
        class_link = on_lan(link.inner_text(), port)
        dialog.get_by_role("button", name="Close").click()
        for _ in range(3):  # a chat app previewing the link (a GET, no script) spends none of its two uses
            preview = subprocess.run(["ip", "netns", "exec", lan, "curl", "-s", "-o", "/dev/null", "-w",
                                      "%{http_code}", class_link], capture_output=True, text=True, timeout=30)
            assert preview.stdout == "200", preview

        ann = context_page(class_link)
        ann.locator("#editor-status").get_by_text("nodes").wait_for()
        ann.locator("#examples").select_option("hello")
        ann.get_by_role("button", name="Run", exact=True).click()
        expect(ann.locator("#editor-status")).to_contain_text("run succeeded", timeout=30_000)
        run_id = server.get("/api/runs")["runs"][0]["id"]
        expect(ann.locator("#my-name")).to_contain_text("You: guest ")  # a generated name until she gives one
        ann.locator("#my-name").click()
        ann.locator("dialog[open] input[name=name]").fill("Ann Lee")
        ann.locator("dialog[open]").get_by_role("button", name="Save").click()
        expect(ann.locator("#my-name")).to_have_text("You: Ann Lee")

        bob = context_page(class_link)
        # The link is spent by the page, which then loads "/" again: what is clicked before
        # the logged-in page is there is lost with the first one.
        bob.locator("#editor-status").get_by_text("nodes").wait_for()
        bob.get_by_role("link", name="Results").click()
        bob.locator(f'tr[data-run="{run_id}"] .status.succeeded').wait_for()  # everyone sees every run
        expect(bob.locator('.tab[data-tab="people"]')).to_be_hidden()  # who is connected: the teacher's
        screenshot(bob, "classroom-student.png")
        bob.get_by_role("button", name="Workers").click()
        expect(bob.locator("#add-worker")).to_be_hidden()  # workers: the teacher's
        status, made = server.client.request("POST", "/api/login-links", {"read_only": True})
        assert status == 201
        projector = context_page(on_lan(made["login_url"], port))  # a projector: reads only
        projector.locator(f'tr[data-run="{run_id}"]').wait_for()
        expect(projector.locator(".login-banner")).to_contain_text("Read-only")
        expect(projector.locator("#run-graph")).to_be_hidden()
        spent = context_page(class_link)  # the third browser: two uses only
        expect(spent.locator("#login-wall")).to_contain_text("already used up", timeout=30_000)

        teacher.get_by_role("button", name="Connected").click()
        rows = teacher.locator("#session-rows tr")
        expect(rows).to_have_count(4)  # the teacher's own browser, two students and the projector
        expect(teacher.locator("#session-rows")).to_contain_text("Ann Lee")  # by the name she gave
        expect(teacher.locator("#session-rows")).not_to_contain_text("browser 10.")
        screenshot(teacher, "classroom-connected.png")
        sessions = server.get("/api/sessions")["sessions"]
        bob_session = [s for s in sessions if s["kind"] == "class"][-1]["id"]
        teacher.locator(f'tr[data-session="{bob_session}"]').get_by_role("button", name="Revoke").click()
        expect(rows).to_have_count(3)
        # Revoked: logged out, the open page too (its stream refused, it reloads by itself).
        expect(bob.locator("#login-wall")).to_be_visible(timeout=30_000)
        ann.reload()
        ann.get_by_role("link", name="Results").click()
        ann.locator(f'tr[data-run="{run_id}"]').wait_for()  # the other student goes on
        ann.get_by_role("button", name="Log out").click()  # ends the session on the server
        expect(ann.locator("#login-wall")).to_be_visible()
        ann_session = next(s for s in sessions if s["kind"] == "class")["id"]
        assert {s["id"]: s["revoked"] for s in server.get("/api/sessions")["sessions"]}[ann_session] is True
        browser.close()
    assert errors == []
