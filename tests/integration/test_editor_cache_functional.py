"""The editor-session cache through the real HTTP API: a second click of Run re-runs
only what changed, queued runs never use the cache, closing a session drops it, and
the budget evicts."""

from __future__ import annotations

import uuid

import pytest

from tests.helpers import edge, graph, node


def _click(server, doc, session, lane="interactive", **options):
    """Submits ``doc`` as the editor would and returns every event of the run."""
    if session is not None:
        options["editor_session"] = session
    reply = server.submit(doc, lane=lane, **options)
    events = server.events_until_finished(reply["run_id"], timeout=90)
    assert events[-1]["payload"]["status"] == "succeeded", events[-1]
    return events


def _finished(events):
    return {e["node_id"]: e["payload"] for e in events if e["type"] == "node_finished"}


def _cached(events):
    return {n for n, p in _finished(events).items() if p.get("cached") is True}


def _session():
    return f"editor-{uuid.uuid4().hex[:8]}"


def _chain(name="loss"):
    return graph(node("a", "core.Constant", value=2), node("b", "core.Constant", value=3), node("s", "core.Add"),
                 node("m", "core.LogMetric", name=name),
                 edges=(edge("a", "value", "s", "a"), edge("b", "value", "s", "b"), edge("s", "sum", "m", "value")))


def test_a_second_click_reruns_only_the_edited_node(shared_server):
    session = _session()
    first = _click(shared_server, _chain("loss"), session)
    assert _cached(first) == set()
    second = _click(shared_server, _chain("renamed"), session)
    assert _cached(second) == {"a", "b", "s"}
    finished = _finished(second)
    assert "cached" not in finished["m"] and finished["s"]["outputs"] == _finished(first)["s"]["outputs"]
    started = {e["node_id"]: e["payload"] for e in second if e["type"] == "node_started"}
    assert started["s"]["cached"] is True and "cached" not in started["m"]
    # The edited node executed and logged; the cached ones did not execute again.
    assert [(e["node_id"], e["payload"]["name"]) for e in second if e["type"] == "metric"] == [("m", "renamed")]
    figures = shared_server.get(f"/api/editor-sessions/{session}")
    assert figures["editor_session"] == session and figures["entries"] == 5 and figures["bytes"] > 0


def test_a_queued_run_never_uses_the_cache(shared_server):
    session = _session()
    _click(shared_server, _chain(), session)
    assert _cached(_click(shared_server, _chain(), session)) == {"a", "b", "s", "m"}
    # The same graph and the same session, on the queued lane: computed from scratch.
    queued = _click(shared_server, _chain(), session, lane="queued")
    assert _cached(queued) == set() and not any("cached" in p for p in _finished(queued).values())
    assert shared_server.get(f"/api/editor-sessions/{session}")["entries"] == 4


def test_closing_a_session_drops_its_entries(shared_server):
    session = _session()
    _click(shared_server, _chain(), session)
    status, reply = shared_server.anonymous.request("DELETE", f"/api/editor-sessions/{session}")
    assert status == 401 and reply["error"]["code"] == "unauthorized"
    status, reply = shared_server.client.request("DELETE", f"/api/editor-sessions/{session}")
    assert status == 200 and reply == {"editor_session": session, "dropped_entries": 4}
    assert shared_server.get(f"/api/editor-sessions/{session}")["entries"] == 0
    assert _cached(_click(shared_server, _chain(), session)) == set()
    # An unknown session is fine: nothing to drop.
    status, reply = shared_server.client.request("DELETE", "/api/editor-sessions/never-seen")
    assert status == 200 and reply == {"editor_session": "never-seen", "dropped_entries": 0}


def test_sessions_do_not_share_entries_and_the_api_describes_the_cache(shared_server):
    one, other = _session(), _session()
    _click(shared_server, _chain(), one)
    assert _cached(_click(shared_server, _chain(), other)) == set()
    info = shared_server.get("/api/info")
    assert info["capabilities"]["editor_cache"] is True
    assert info["editor_cache"]["budget_bytes"] == 512 * 1024 * 1024 and info["editor_cache"]["entries"] >= 8
    status, text = shared_server.client.request("GET", "/metrics")
    assert status == 200 and "troupe_editor_cache_entries" in text
    paths = shared_server.get("/api/openapi.json")["paths"]
    assert set(paths["/api/editor-sessions/{session}"]) == {"get", "delete"}
    assert paths["/api/editor-sessions/{session}"]["delete"]["security"] == [{"session": []}]


def _data(seed, n):
    return graph(node("data", "torch.SyntheticClassification", n=n, features=20, classes=2, seed=seed))


@pytest.mark.timeout(180)
def test_a_small_budget_evicts_the_least_recently_used(make_server):
    server = make_server(TROUPE_EDITOR_CACHE_MB="1")
    session = _session()
    # About 530 kB of tensors each: one fits in 1 MiB, two do not.
    _click(server, _data(1, 6000), session)
    first = server.get(f"/api/editor-sessions/{session}")
    assert first["entries"] == 1 and 500_000 < first["bytes"] < 600_000 and first["budget_bytes"] == 1 << 20
    _click(server, _data(2, 6000), session)
    second = server.get(f"/api/editor-sessions/{session}")
    assert second["entries"] == 1 and server.get("/api/info")["editor_cache"]["evictions"] == 1
    # An output over the whole budget is simply not kept (and evicts nothing).
    _click(server, _data(3, 20000), session)
    assert server.get(f"/api/editor-sessions/{session}") == second
    assert server.get("/api/info")["editor_cache"]["evictions"] == 1
    assert _cached(_click(server, _data(2, 6000), session)) == {"data"}
    assert _cached(_click(server, _data(1, 6000), session)) == set()  # it was evicted


def test_a_zero_budget_disables_the_cache(make_server):
    server = make_server(TROUPE_EDITOR_CACHE_MB="0")
    session = _session()
    _click(server, _chain(), session)
    assert _cached(_click(server, _chain(), session)) == set()
    assert server.get("/api/info")["capabilities"]["editor_cache"] is False


def _training(eval_batch=50, epochs=3):
    return graph(
        node("data", "torch.SyntheticClassification", n=600, features=8, classes=3, noise=1.0, seed=3),
        node("train_loader", "torch.DataLoader", batch_size=32, shuffle=True),
        node("val_loader", "torch.DataLoader", batch_size=64, shuffle=False),
        node("eval_loader", "torch.DataLoader", batch_size=eval_batch, shuffle=False),
        node("mlp", "torch.MLP", hidden="16"),
        {"id": "adam", "type": "torch.Optimizer", "params": {"kind": "adam", "lr": 0.01}},
        node("trainer", "torch.TrainingLoop", epochs=epochs),
        node("evaluate", "torch.Evaluate"),
        edges=(
            edge("data", "train", "train_loader", "dataset"), edge("data", "val", "val_loader", "dataset"),
            edge("data", "val", "eval_loader", "dataset"), edge("data", "train", "mlp", "data"),
            edge("mlp", "model", "trainer", "model"), edge("adam", "optimizer", "trainer", "optimizer"),
            edge("train_loader", "loader", "trainer", "train"), edge("val_loader", "loader", "trainer", "val"),
            edge("trainer", "model", "evaluate", "model"), edge("eval_loader", "loader", "evaluate", "data"),
        ),
    )


def _series(events, name):
    return [e["payload"]["value"] for e in events if e["type"] == "metric" and e["payload"]["name"] == name]


@pytest.mark.timeout(180)
def test_a_trained_model_is_reused_when_only_the_evaluation_changes(shared_server):
    session = _session()
    first = _click(shared_server, _training(eval_batch=50), session)
    assert len(_series(first, "train_loss")) == 3
    second = _click(shared_server, _training(eval_batch=70), session)
    assert _cached(second) == {"data", "train_loader", "val_loader", "mlp", "adam", "trainer"}
    assert _series(second, "train_loss") == []  # nothing trained again
    before, after = _finished(first), _finished(second)
    assert after["trainer"]["outputs"] == before["trainer"]["outputs"]
    assert after["evaluate"]["outputs"]["accuracy"] == before["evaluate"]["outputs"]["accuracy"]
    assert _series(second, "eval_accuracy") == _series(first, "eval_accuracy")


@pytest.mark.timeout(180)
def test_retraining_starts_from_the_untrained_cached_model(shared_server):
    session = _session()
    _click(shared_server, _training(epochs=2), session, seed=5)
    retrained = _click(shared_server, _training(epochs=4), session, seed=5)
    assert _cached(retrained) == {"data", "train_loader", "val_loader", "eval_loader", "mlp", "adam"}
    # The same run from scratch on the queued lane: the same losses, epoch by epoch. Had
    # the retraining continued from the trained model (or a used shuffle), they'd differ.
    fresh = _click(shared_server, _training(epochs=4), None, lane="queued", seed=5)
    assert _cached(fresh) == set()
    assert _series(retrained, "train_loss") == pytest.approx(_series(fresh, "train_loss"), rel=1e-6)
    assert _finished(retrained)["evaluate"]["outputs"] == pytest.approx(_finished(fresh)["evaluate"]["outputs"])
    # Retraining trained a copy: the cached model is still the untrained one.
    again = _click(shared_server, _training(epochs=3), session, seed=5)
    assert "mlp" in _cached(again) and "trainer" not in _cached(again)
    assert _series(again, "train_loss") == pytest.approx(_series(fresh, "train_loss")[:3], rel=1e-6)


def test_an_editor_session_is_its_submitters_own(make_server):
    """An editor's session name is public (each run's options show it). A class session
    that names it gets an editor session of its own: it does not hold the teacher's
    editor busy (503 editor_session_busy), nor read or drop the teacher's cached nodes."""
    server = make_server()
    bob = server.session(uses=1)
    session = _session()
    _click(server, _chain(), session)
    assert server.get(f"/api/editor-sessions/{session}")["entries"] == 4
    status, reply = bob.request("DELETE", f"/api/editor-sessions/{session}")
    assert (status, reply["dropped_entries"]) == (200, 0), reply
    status, reply = bob.request("GET", f"/api/editor-sessions/{session}")
    assert (status, reply["entries"]) == (200, 0), reply
    assert server.get(f"/api/editor-sessions/{session}")["entries"] == 4
    status, held = bob.request("POST", "/api/runs", {"graph": graph(node("z", "core.Sleep", seconds=60)),
                                                     "options": {"lane": "interactive", "editor_session": session}})
    assert status == 201, held
    try:
        assert _cached(_click(server, _chain(), session)) == {"a", "b", "s", "m"}  # the teacher's, not busy
    finally:
        server.client.request("POST", f"/api/runs/{held['run_id']}/cancel")
