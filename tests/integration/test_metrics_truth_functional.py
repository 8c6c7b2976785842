"""``/metrics`` says what the API says: the workers by state are those of the Workers
list, not zeros whatever the workers."""

from __future__ import annotations

from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

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
