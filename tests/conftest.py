from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Server


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[object]:
    """Starts real servers with the given TROUPE_* settings; stops them at teardown."""
    started: list[Server] = []

    def make(home: Path | None = None, **settings: str) -> Server:
        server = Server(home or tmp_path / f"home{len(started)}", **settings).start()
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
