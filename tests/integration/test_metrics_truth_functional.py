"""``/metrics`` says what the API says: the workers by state are those of the Workers
list, not zeros whatever the workers; every family matches the API it mirrors, counters
end in ``_total``, OpenMetrics is served when asked for, and a real Prometheus scrapes
troupe and answers a query from what it scraped."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from collections import Counter

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import edge, graph, hello, node
from tests.integration.test_workers_functional import enroll, read_until, start_agent


def _workers_gauge(server) -> dict[str, float]:
    _, text = server.client.request("GET", "/metrics")
    family = next(f for f in text_string_to_metric_families(str(text)) if f.name == "troupe_workers")
    return {sample.labels["state"]: sample.value for sample in family.samples}


def _listed(server) -> Counter[str]:
    return Counter(w["state"] for w in server.get("/api/workers")["workers"])


def test_workers_by_state_in_metrics_are_the_workers_list(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agents = [start_agent(server, tmp_path / name, enroll(server, name=name)["command"], machine=name)
              for name in ("m1", "m2")]
    try:
        for agent, name in zip(agents, ("m1", "m2"), strict=True):
            read_until(agent, f"connected as {name}")
        assert _listed(server) == Counter({"connected": 2})
        assert _workers_gauge(server) == {"connected": 2, "disconnected": 0, "failed": 0}
        agents[0].terminate()  # one goes away: disconnected within its grace
        agents[0].wait(30)
        server.poll_until(lambda: _listed(server) == Counter({"connected": 1, "disconnected": 1}))
        assert _workers_gauge(server) == {"connected": 1, "disconnected": 1, "failed": 0}
    finally:
        for agent in agents:
            agent.terminate()
            agent.wait(30)


def _scrape(server, accept: str = "") -> tuple[str, str]:
    parts = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", "/metrics", headers={"Accept": accept} if accept else {})
    response = conn.getresponse()
    body = response.read().decode()
    conn.close()
    assert response.status == 200, body
    return response.getheader("Content-Type") or "", body


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _summed(samples: dict, name: str) -> float:
    return sum(value for (sample, _), value in samples.items() if sample == name)


@pytest.mark.timeout(180)
def test_every_family_says_what_the_api_says(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"])
    try:
        read_until(agent, "connected as gpu-a")
        done = [server.submit(hello())["run_id"] for _ in range(2)]
        failing = graph(node("c", "core.Constant", value=1), node("f", "core.Fail", message="no"),
                        edges=(edge("c", "value", "f", "x"),))
        failed = server.submit(failing)["run_id"]
        remote = server.submit(hello(), target={"worker": "gpu-a"})["run_id"]
        for run_id in [*done, remote]:
            server.wait_status(run_id, "succeeded", timeout=60)
        server.wait_status(failed, "failed")
        _, text = _scrape(server)
        samples = _samples(text)
        for state in ("succeeded", "failed", "queued", "running"):
            listed = len(server.get(f"/api/runs?status={state}&limit=500")["runs"])
            assert samples[("troupe_runs", (("state", state),))] == listed, state
        for row in server.get("/api/queues")["queues"]:
            key = (("queue_key", row["queue_key"]),)
            assert (samples[("troupe_queue_depth", key)], samples[("troupe_queue_running", key)],
                    samples[("troupe_queue_limit", key)]) == (row["queued"], row["running"], row["limit"])
        assert samples[("troupe_runs_finished_total", (("status", "succeeded"),))] == 3
        assert samples[("troupe_runs_finished_total", (("status", "failed"),))] == 1
        assert _summed(samples, "troupe_run_duration_seconds_count") == 4
        assert _summed(samples, "troupe_queue_wait_seconds_count") == 4
        assert samples[("troupe_queue_wait_seconds_count", (("queue_key", "gpu-a/cpu"),))] == 1
        for name in ("troupe_run_duration_seconds", "troupe_queue_wait_seconds"):
            _assert_cumulative(samples, name)
        assert samples[("troupe_worker_runs_total", (("worker", "gpu-a"),))] == 1
        assert samples[("troupe_artifacts_pending", (("worker", "gpu-a"),))] == 0
        assert samples[("troupe_workers", (("state", "connected"),))] == 1
        for family in text_string_to_metric_families(text):
            if family.type == "counter":
                assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family.name
        kind, open_text = _scrape(server, "application/openmetrics-text; version=1.0.0,text/plain;q=0.5")
        assert kind.startswith("application/openmetrics-text") and open_text.endswith("# EOF\n"), kind
        assert "troupe_runs_finished_total{status=\"succeeded\"} 3.0" in open_text
        strict = {f.name: f for f in openmetrics_families(open_text)}  # raises on a malformed histogram
        assert sum(s.value for s in strict["troupe_queue_wait_seconds"].samples if s.name.endswith("_count")) == 4
    finally:
        agent.terminate()
        agent.wait(30)


def _assert_cumulative(samples: dict, name: str) -> None:
    """Each queue key's buckets only grow with ``le``, a quick run counts below a minute,
    and the +Inf bucket is the count."""
    keys = {labels for (sample, labels) in samples if sample == name + "_count"}
    assert keys, name
    for labels in keys:
        key = dict(labels)["queue_key"]
        buckets = sorted((float(dict(lab)["le"]), value) for (sample, lab), value in samples.items()
                         if sample == name + "_bucket" and dict(lab)["queue_key"] == key)
        counts = [value for _, value in buckets]
        assert counts == sorted(counts) and buckets[-1][0] == float("inf"), (name, buckets)
        assert counts[-1] == samples[(name + "_count", labels)] == dict(buckets)[60.0], (name, buckets)
        assert samples[(name + "_sum", labels)] >= 0 and (name + "_created", labels) in samples


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.timeout(180)
def test_a_real_prometheus_scrapes_troupe_and_answers_from_it(make_server, tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("needs Debian's prometheus package (.ci/run installs it)")
    server = make_server()
    for _ in range(2):
        server.wait_status(server.submit(hello())["run_id"], "succeeded")
    port = _free_port()
    target = urllib.parse.urlsplit(server.url).netloc
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs: [{{job_name: troupe, static_configs: [{{targets: ['{target}']}}]}}]\n")
    prometheus = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={tmp_path / 'data'}",
                                   f"--web.listen-address=127.0.0.1:{port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        query = urllib.parse.urlencode({"query": 'troupe_runs_finished_total{status="succeeded"}'})

        def answered() -> list:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?{query}", timeout=5) as reply:
                    return json.loads(reply.read())["data"]["result"]
            except OSError:
                return []

        server.poll_until(lambda: bool(answered()), timeout=90)
        (found,) = answered()
        assert found["metric"]["job"] == "troupe" and float(found["value"][1]) == 2.0, found
    finally:
        prometheus.terminate()
        prometheus.wait(30)
