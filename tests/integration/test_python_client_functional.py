"""troupe.Client as a notebook uses it, against a real server (and a real agent): a run
with ``set`` waited on, its metrics, a sweep ranked and its runs listed, a live run
followed across a cut connection, the errors a call ends in, and the sync client inside
a running event loop (a Jupyter kernel's)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading

import pytest

import troupe
from tests.faultproxy import FaultProxy
from tests.helpers import REPO, base_env, graph, hello, node, sleeper, troupe_cmd
from tests.integration.test_workers_functional import read_until, start_agent

pytestmark = pytest.mark.timeout(120)


def _sweep_spec() -> dict:
    return {"base_graph": hello(), "name": "values",
            "sweep_spec": {"method": "grid", "params": [{"node_id": "a", "param": "value", "values": [4, 1, 9]}]},
            "objective": {"metric": "val_loss", "direction": "minimize"}}


def test_a_notebook_runs_with_set_reads_metrics_and_ranks_a_sweep(make_server, tmp_path):
    server = make_server()
    with troupe.Client(server.url, token=server.token) as client:
        run = client.run(hello(), set={"a.value": 5}, name="five", tags=["demo"])
        assert run.ok and run.name == "five" and "demo" in run.record.tags
        assert [(p.step, p.value) for p in run.metrics()["val_loss"]] == [(1, 8.0)]
        assert run.detail().options.params_set == {"a.value": 5}
        assert client.get(run.id[:6]).id == run.id

        sweep = client.sweep(_sweep_spec(), timeout=60)
        assert sweep.state == "finished"
        assert [v.params["a.value"] for v in sweep.ranking] == [1, 4, 9]
        assert sweep.best.objective_value == 4.0
        runs = sweep.runs()
        assert sorted(r.id for r in runs) == sorted(v.run_id for v in sweep.record.variants)
        assert all(r.ok for r in runs)
        assert len(client.runs(sweep=sweep.id[:8])) == 3
        assert {r.id for r in client.runs(limit=2)} <= {r.id for r in client.runs()}

        # and on a real agent, enrolled by the client, the same calls
        command = client.enroll_worker("lab-a")
        assert command.startswith("troupe agent start --url ") and command.endswith("--name lab-a")
        agent = start_agent(server, tmp_path, command)
        try:
            read_until(agent, "connected")
            on_worker = client.run(hello(), target="lab-a", set={"b.value": 10}, timeout=60)
            assert on_worker.ok and on_worker.detail().worker == "lab-a"
            assert on_worker.metrics()["val_loss"][-1].value == 12.0
        finally:
            agent.terminate()
            agent.wait(30)


def test_errors_are_typed(shared_server):
    server = shared_server
    client = troupe.Client(server.url, token=server.token)
    with pytest.raises(troupe.ApiError) as bad:
        client.run(graph(node("x", "core.Nope")))
    assert isinstance(bad.value, troupe.Refused)
    assert (bad.value.status, bad.value.code, bad.value.pointer) == (400, "graph_invalid", "/graph/nodes/0/type")
    with pytest.raises(troupe.NotFound):
        client.get("0123456789abcdef0123456789abcdef")
    with pytest.raises(ValueError, match="has no node 'zz'"):
        client.run(hello(), set={"zz.value": 1})
    reader = troupe.Client(server.url, token="")
    with pytest.raises(troupe.Refused) as refused:
        reader.run(hello())
    assert refused.value.status == 401
    with pytest.raises(troupe.Unreachable):
        troupe.Client("http://127.0.0.1:9", token="x").info()


def test_a_list_limit_below_zero_is_a_value_error(shared_server):
    """limit=-1 returned [] as if no run matched; 0 asks for none and gets none."""
    server = shared_server
    server.wait_status(server.submit(hello())["run_id"], "succeeded")
    client = troupe.Client(server.url, token=server.token)
    for limit in (-1, -500, 1.5, True):
        with pytest.raises(ValueError, match="limit is how many at most: 1 or more"):
            client.runs(limit=limit)
        with pytest.raises(ValueError, match="limit is how many at most"):
            client.runs_frame(limit=limit, group_by="status")
    assert client.runs(limit=0) == [] and len(client.runs(limit=1)) == 1


def test_wait_past_its_timeout_raises_timeout_and_the_run_goes_on(shared_server):
    server = shared_server
    client = troupe.Client(server.url, token=server.token)
    run = client.run(sleeper(30), wait=False)
    with pytest.raises(troupe.Timeout) as late:
        run.wait(timeout=0.5)
    assert not isinstance(late.value, troupe.ApiError)
    assert run.refresh().status in ("queued", "running")
    assert run.cancel().wait(timeout=30).status == "cancelled"


def test_follow_resumes_after_the_connection_is_cut(shared_server):
    server = shared_server
    port = int(server.url.rsplit(":", 1)[1])
    proxy = FaultProxy(port).start()
    try:
        client = troupe.Client(proxy.url, token=server.token)
        ticker = graph(node("t", "core.Ticker", count=40, interval=0.05, name="tick"))
        run = client.run(ticker, wait=False)
        seen: list[int] = []
        cut = threading.Event()
        for event in run.follow():
            seen.append(event.seq)
            if event.type == "metric" and len(seen) > 10 and not cut.is_set():
                cut.set()
                proxy.cut()
                threading.Timer(0.5, proxy.restore).start()
        assert cut.is_set()
        assert seen == list(range(1, len(seen) + 1))  # no gap, no event twice
        assert run.refresh().ok
        assert len(run.metrics()["tick"]) == 40
    finally:
        proxy.close()


def test_the_sync_client_works_inside_a_running_event_loop(shared_server):
    server = shared_server

    async def cell() -> bool:  # a notebook cell: the kernel's loop is running
        client = troupe.Client(server.url, token=server.token)
        return client.run(hello()).ok

    assert asyncio.run(cell())


def test_client_finds_the_server_this_home_runs(make_server):
    server = make_server()
    code = "import troupe; c = troupe.Client(); print(c.url); print(c.run({'version': 1, 'nodes': [], 'edges': []}).ok)"
    found = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=base_env(server.home), capture_output=True,
                           text=True, timeout=60)
    assert found.stdout.split() == [server.url, "True"], found.stderr
    env = {**base_env(server.home.parent / "elsewhere"), "TROUPE_URL": server.url, "TROUPE_TOKEN": server.token}
    named = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert named.stdout.split() == [server.url, "True"], named.stderr


def test_the_terminal_finds_a_server_by_troupe_url_and_enrolls_a_worker(make_server, tmp_path):
    server = make_server()
    env = {**base_env(tmp_path / "another-home"), "TROUPE_URL": server.url, "TROUPE_TOKEN": server.token}
    added = subprocess.run(troupe_cmd("workers", "add", "lab-b"), cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=60)
    assert added.returncode == 0, added.stderr
    command = next(line.strip() for line in added.stdout.splitlines() if line.strip().startswith("troupe agent"))
    agent = start_agent(server, tmp_path, command)
    try:
        read_until(agent, "connected as lab-b")
        listed = subprocess.run(troupe_cmd("workers", "--json"), cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=60)
        assert [w["name"] for w in json.loads(listed.stdout)["workers"]] == ["lab-b"]
    finally:
        agent.terminate()
        agent.wait(30)


def test_wait_outlasts_a_server_away_for_a_restart(shared_server):
    """A server away for longer than a few reopenings (a restart takes seconds; a laptop
    rejoins its network later still) is waited for: the wait ends with the run's end, not
    with Unreachable after eight tries (about 7 s)."""
    server = shared_server
    port = int(server.url.rsplit(":", 1)[1])
    proxy = FaultProxy(port).start()
    try:
        client = troupe.Client(proxy.url, token=server.token)
        run = client.run(graph(node("t", "core.Ticker", count=30, interval=0.1, name="tick")), wait=False)
        proxy.cut()
        waited = threading.Thread(target=lambda: proxy.wait_refused(12) or proxy.restore(), daemon=True)
        waited.start()
        assert run.wait(timeout=90).ok
        assert proxy.refused >= 12
    finally:
        proxy.close()


def test_troupe_url_without_a_token_takes_the_login_this_terminal_holds_for_it(make_server, tmp_path):
    """A student logged in with ``troupe login`` who names the class server in TROUPE_URL
    (copied from the address bar, with its slash) submits as that login, from the
    terminal and from Python, as ``Client(url)`` does: not as no one (401)."""
    server = make_server()
    status, made = server.client.request("POST", "/api/login-links", {"uses": 1})
    assert status == 201, made
    env = {**base_env(tmp_path / "laptop"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    logged = subprocess.run(troupe_cmd("login", made["login_url"], "--name", "ann"), cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    assert logged.returncode == 0, logged.stderr
    env["TROUPE_URL"] = server.url + "/"
    ran = subprocess.run(troupe_cmd("run", str(REPO / "examples" / "hello.json")), cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    code = "import troupe; r = troupe.Client().run({'version': 1, 'nodes': [], 'edges': []}); print(r.ok)"
    found = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert found.stdout.split() == ["True"], found.stderr
    assert {r["submitted_label"] for r in server.get("/api/runs")["runs"]} == {"ann"}


def test_a_sweeps_wait_outlasts_a_server_away_for_a_restart(shared_server):
    """A sweep's (and a study's) wait reads its state again and again: a server that
    answers nothing for a while is waited for, as a run's wait does, not an Unreachable
    at the first read that finds it away."""
    server = shared_server
    port = int(server.url.rsplit(":", 1)[1])
    proxy = FaultProxy(port).start()
    try:
        client = troupe.Client(proxy.url, token=server.token)
        sweep = client.sweep(_sweep_spec(), wait=False)
        proxy.cut()
        threading.Thread(target=lambda: proxy.wait_refused(3) or proxy.restore(), daemon=True).start()
        assert sweep.wait(timeout=90).state == "finished"
        assert proxy.refused >= 3
    finally:
        proxy.close()


def test_a_run_with_tags_the_server_would_refuse_is_not_submitted(make_server):
    """Tags go in a second request after the run's: a tag the server refuses must be
    found before the run is made, or the caller is told it failed while it runs (and
    submits it again)."""
    server = make_server()
    client = troupe.Client(server.url, token=server.token)
    for tags in (["a b"], ["x" * 41], ["ok"] * 1 + [f"t{i}" for i in range(20)]):
        with pytest.raises(ValueError, match="nothing was submitted"):
            client.run(hello(), tags=tags, wait=False)
    assert server.get("/api/runs")["runs"] == []
    run = client.run(hello(), tags=["best", "best", "v1"])
    assert run.ok and run.detail().tags == ["best", "v1"]
