"""Plugin jobs: a study a plugin owns, idempotent per key."""

from __future__ import annotations

import copy

from tests.integration.test_studies_functional import study_body, variants, wait_state


def test_a_job_is_created_once_per_key_and_seen_only_by_its_plugin(shared_server):
    spec = study_body(variants(1), repeats=1)
    body = {"kind": "study", "spec": spec, "idempotency_key": "nightly-1"}
    status, first = shared_server.client.request("POST", "/api/plugins/grader/jobs", body)
    assert status == 201, first
    assert first["plugin_id"] == "grader" and first["kind"] == "study" and first["idempotency_key"] == "nightly-1"
    status, again = shared_server.client.request("POST", "/api/plugins/grader/jobs", body)
    assert status == 200 and again["id"] == first["id"] and again["study_id"] == first["study_id"]
    other = {**body, "spec": study_body(variants(2), repeats=1)}
    status, conflict = shared_server.client.request("POST", "/api/plugins/grader/jobs", other)
    assert status == 409 and conflict["error"]["code"] == "idempotency_conflict"
    done = wait_state(shared_server, first["study_id"], "finished")
    assert done["plugin_id"] == "grader"
    jobs = shared_server.get("/api/plugins/grader/jobs")["jobs"]
    assert [j["id"] for j in jobs] == [first["id"]] and jobs[0]["state"] == "finished"
    assert shared_server.get(f"/api/plugins/grader/jobs/{first['id']}")["study_id"] == first["study_id"]
    assert shared_server.get("/api/plugins/other/jobs")["jobs"] == []
    status, _ = shared_server.client.request("GET", f"/api/plugins/other/jobs/{first['id']}")
    assert status == 404


def test_a_job_needs_a_key_a_known_kind_and_a_valid_spec(shared_server):
    spec = study_body(variants(1), repeats=1)
    status, reply = shared_server.client.request("POST", "/api/plugins/grader/jobs", {"kind": "study", "spec": spec})
    assert status == 400 and reply["error"]["pointer"] == "/idempotency_key"
    status, reply = shared_server.client.request("POST", "/api/plugins/grader/jobs",
                                                 {"kind": "sweep", "spec": spec, "idempotency_key": "k"})
    assert status == 400 and reply["error"]["pointer"] == "/kind"
    bad = {**spec, "repeats": 0}
    status, reply = shared_server.client.request("POST", "/api/plugins/grader/jobs",
                                                 {"kind": "study", "spec": bad, "idempotency_key": "k2"})
    assert status == 400 and reply["error"]["pointer"] == "/spec/repeats"
    bad = {**spec, "variants": [{"name": "a", "params": [{"node_id": "x", "param": "value", "value": 1}]}]}
    status, reply = shared_server.client.request("POST", "/api/plugins/grader/jobs",
                                                 {"kind": "study", "spec": bad, "idempotency_key": "k3"})
    assert status == 400 and reply["error"]["pointer"] == "/spec/variants/0/params/0/node_id"
    # The same code and words as POST /api/studies gives for the same mistake.
    bad = {**spec, "options": {"target": {"worker": "w", "bogus": 1}}}
    status, reply = shared_server.client.request("POST", "/api/plugins/grader/jobs",
                                                 {"kind": "study", "spec": bad, "idempotency_key": "k4"})
    assert status == 400 and reply["error"]["code"] == "unknown_target_option", reply
    assert reply["error"]["pointer"] == "/spec/options/target/bogus"
    assert reply["error"]["message"].startswith("spec/options/target/bogus: "), reply
    status, _ = shared_server.client.request("GET", "/api/plugins/BAD%20ID/jobs")
    assert status == 404


def test_a_job_asked_for_again_is_the_same_job_whatever_the_server_holds_now(shared_server):
    client = shared_server.client
    assert client.request("POST", "/api/flavors", {"name": "plugin-small", "cpus": 1})[0] == 201
    spec = copy.deepcopy(study_body(variants(1), repeats=1))  # the shared base graph stays as it is
    spec["base_graph"]["nodes"][1]["resources"] = {"flavor": "plugin-small"}
    body = {"kind": "study", "spec": spec, "idempotency_key": "flavored-1"}
    status, first = client.request("POST", "/api/plugins/grader/jobs", body)
    assert status == 201, first
    wait_state(shared_server, first["study_id"], "finished")
    assert client.request("DELETE", "/api/flavors/plugin-small")[0] == 200  # the spec would not pass now
    status, again = client.request("POST", "/api/plugins/grader/jobs", body)
    assert status == 200 and again["id"] == first["id"], again
