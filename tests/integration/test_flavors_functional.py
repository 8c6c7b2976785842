"""Flavors (issue 14, point 4; 003): named sizes stored in the database, read again each
time a run is built, refused when they disagree with a number, never deleted from under
a run that still uses them."""

from __future__ import annotations

import apsw

from tests.helpers import graph, hello, node


def flavored(name: str, seconds: float = 0.0, **resources) -> dict:
    return graph({**node("z", "core.Sleep", seconds=seconds), "resources": {"flavor": name, **resources}})


def test_four_are_seeded_once_and_a_deleted_one_stays_deleted(make_server):
    server = make_server()
    names = [f["name"] for f in server.get("/api/flavors")["flavors"]]
    assert names == ["cpu-large", "cpu-small", "gpu-large", "gpu-small"]
    assert server.get("/api/flavors/gpu-small")["memory_gib"] == 6
    assert server.client.request("DELETE", "/api/flavors/cpu-large")[0] == 200
    server.stop()
    again = make_server(home=server.home)
    assert [f["name"] for f in again.get("/api/flavors")["flavors"]] == ["cpu-small", "gpu-large", "gpu-small"]


def test_create_replace_round_trip_and_refusals(shared_server):
    client = shared_server.client
    status, made = client.request("POST", "/api/flavors", {"name": "tiny", "cpus": 1, "ram": "512M",
                                                            "duration_s": 30, "description": "a quick check"})
    assert status == 201 and made["ram"] == 512 and made["gpus"] is None
    assert client.request("POST", "/api/flavors", {"name": "tiny"})[1]["error"]["code"] == "flavor_exists"
    # An editor writes back the whole object it read, name and unset fields included.
    read = shared_server.get("/api/flavors/tiny")
    status, written = client.request("PUT", "/api/flavors/tiny", {**read, "ram": "1G"})
    assert status == 200 and written == {**read, "ram": 1024}
    status, reply = client.request("PUT", "/api/flavors/tiny", {"name": "other", "cpus": 2})
    assert (status, reply["error"]["code"], reply["error"]["pointer"]) == (409, "name_mismatch", "/name")
    for body, pointer in (({"name": "x", "ram": "lots"}, "/ram"), ({"name": "x", "ram": "1\uff10G"}, "/ram"),
                          ({"name": "Bad Name"}, "/name"),
                          ({"name": "x", "cpus": 0}, "/cpus"), ({"name": "x", "shape": 1}, "/shape"),
                          ({"name": "x", "duration_s": 2e9}, "/duration_s")):  # past any run's (1e999 read back null)
        status, reply = client.request("POST", "/api/flavors", body)
        assert (status, reply["error"]["pointer"]) == (400, pointer), reply
    assert client.request("PUT", "/api/flavors/nope", {"cpus": 1})[1]["error"]["code"] == "flavor_not_found"
    assert client.request("GET", "/api/flavors/nope")[0] == 404
    assert shared_server.anonymous.request("POST", "/api/flavors", {"name": "y"})[0] == 401
    assert client.request("DELETE", "/api/flavors/tiny")[0] == 200
    assert client.request("GET", "/api/flavors/tiny")[0] == 404


def test_a_node_gets_its_flavors_sizes_a_disagreeing_number_or_unknown_name_is_refused(shared_server):
    client = shared_server.client
    client.request("POST", "/api/flavors", {"name": "one-core", "cpus": 1, "ram": 4096})
    same = shared_server.submit(flavored("one-core", cpus=1, ram="4G"))  # equal by value
    assert same["warnings"] == []
    assert shared_server.events_until_finished(same["run_id"])[-1]["payload"]["status"] == "succeeded"
    error = shared_server.submit(flavored("one-core", cpus=3), expect=400)["error"]
    assert (error["code"], error["pointer"]) == ("flavor_conflict", "/graph/nodes/0/resources/cpus")
    error = shared_server.submit(flavored("no-such"), expect=400)["error"]
    assert (error["code"], error["pointer"]) == ("unknown_flavor", "/graph/nodes/0/resources/flavor")
    error = shared_server.submit(hello(), expect=400, target={"flavor": "no-such"})["error"]
    assert (error["code"], error["pointer"]) == ("unknown_flavor", "/options/target/flavor")
    error = shared_server.submit(hello(), expect=400, target={"worker": "any", "flavor": "gpu-small",
                                                              "memory_gib": 5})["error"]
    assert (error["code"], error["pointer"]) == ("flavor_conflict", "/options/target/memory_gib")


def test_an_edit_changes_the_next_run_and_a_flavor_in_use_cannot_be_deleted(make_server):
    server = make_server(TROUPE_CPUS="2")
    client = server.client
    client.request("POST", "/api/flavors", {"name": "mine", "cpus": 1})
    first = server.submit(flavored("mine", seconds=60))["run_id"]
    server.wait_status(first, "running")
    assert server.get("/api/resources")["cpus"]["holders"][0]["cpus"] == 1
    status, reply = client.request("DELETE", "/api/flavors/mine")
    assert status == 409 and reply["error"]["code"] == "flavor_in_use" and f"run {first}" in reply["error"]["message"]
    client.request("PUT", "/api/flavors/mine", {"cpus": 5})
    second = server.submit(flavored("mine"))  # read again: 5 cpus now, more than this server lends
    assert second["warnings"] == ["node z asks for 5 cpus; this server lends (TROUPE_CPUS) 2: cut down to 2"]
    client.request("POST", f"/api/runs/{first}/cancel")
    server.events_until_finished(first)
    server.events_until_finished(second["run_id"])
    assert client.request("DELETE", "/api/flavors/mine")[0] == 200


def test_a_flavors_budget_on_a_run_in_this_server_is_ignored_with_a_warning(shared_server):
    reply = shared_server.submit(hello(), target={"flavor": "gpu-small"})
    events = shared_server.events_until_finished(reply["run_id"])
    warning = next(e for e in events if e["type"] == "warning")
    assert warning["payload"]["code"] == "flavor_budget_ignored" and events[-1]["payload"]["status"] == "succeeded"
    assert shared_server.get(f"/api/runs/{reply['run_id']}")["memory_budget_mib"] is None


def test_a_flavor_an_older_server_stored_out_of_todays_bounds_refuses_its_runs_and_stops_nothing(make_server):
    server = make_server()
    server.client.request("POST", "/api/flavors", {"name": "vast", "ram": 4096})
    server.stop()
    # As a server before the text bound kept "2000000T": more MB than a size may hold.
    with apsw.Connection(str(server.home / "troupe.db")) as db:
        db.execute("UPDATE flavors SET ram = ? WHERE name = 'vast'", (2**41,))
    again = make_server(home=server.home)
    error = again.submit(flavored("vast"), expect=400)["error"]
    assert (error["code"], error["pointer"]) == ("flavor_invalid", "/graph/nodes/0/resources/flavor"), error
    assert again.events_until_finished(again.submit(hello())["run_id"])[-1]["payload"]["status"] == "succeeded"
