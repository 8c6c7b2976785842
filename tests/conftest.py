from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Server


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``make test`` runs two pytest-xdist workers (``--dist loadgroup``): a module's tests
    stay on one worker, so its shared server starts once, and every test that builds the
    LAN (one fixed subnet, tests.lan) runs on the same worker, never two at once."""
    for item in items:
        group = "lan" if "lan" in getattr(item, "fixturenames", ()) else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[object]:
    """Starts real servers with the given TROUPE_* settings; stops them at teardown."""
    started: list[Server] = []

    def make(home: Path | None = None, port: int = 0, preexec: Any = None, **settings: str) -> Server:
        server = Server(home or tmp_path / f"home{len(started)}", preexec, port=port, **settings).start()
        started.append(server)
        return server

    yield make
    for server in started:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for tests that only read or add independent runs."""
    server = Server(tmp_path_factory.mktemp("shared"), TROUPE_SIMULATED_ACCELERATORS="cuda:0,cuda:1").start()
    yield server
    server.kill()


@pytest.fixture
def lan() -> Iterator[str]:
    """A network namespace of the test's own, reaching this machine over a veth pair at
    ``tests.lan.HOST_SIDE`` (skips with the reason where namespaces cannot be made)."""
    from tests.lan import build_lan

    yield from build_lan()
