"""A study against what happens beside it: a cancel while its actor is still starting
attempts stops every attempt; an attempt refused as a single run would be (its flavor
edited since) halts the study with the reason instead of leaving it running with nothing
in flight; a graceful stop while a study starts its attempts leaves no run stored
without its actor."""

from __future__ import annotations

import pytest

from tests.helpers import edge, graph, node
from tests.integration.test_studies_functional import OBJECTIVE, post, study_body, variants, wait_state

ACTIVE = ("queued", "running")


@pytest.mark.timeout(90)
def test_a_cancel_right_after_creation_stops_every_attempt_the_study_started(make_server):
    server = make_server(TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="4")
    for _ in range(3):
        study = post(server, study_body(variants(*range(12), seconds=30), repeats=1))
        status, cancelled = server.client.request("POST", f"/api/studies/{study['id']}/cancel")
        assert (status, cancelled["state"]) == (200, "cancelled")

        def settled(study_id=study["id"]):
            current = server.get(f"/api/studies/{study_id}")
            runs = server.get(f"/api/runs?study_id={study_id}&limit=100")["runs"]
            # Every attempt's run ends, however many were started after the cancel's read.
            return len(runs) == len(current["attempts"]) and not [r for r in runs if r["status"] in ACTIVE]

        server.poll_until(settled, timeout=20)
        assert server.get(f"/api/studies/{study['id']}")["state"] == "cancelled"


@pytest.mark.timeout(60)
def test_an_attempt_refused_halts_the_study_with_the_reason_and_resume_tries_again(make_server):
    server = make_server()
    assert server.client.request("POST", "/api/flavors", {"name": "f1", "cpus": 1})[0] == 201
    sleep = node("z", "core.Sleep", seconds=0.3)
    sleep["resources"] = {"flavor": "f1", "cpus": 1}
    base = graph(node("c", "core.Constant", value=1), sleep, node("m", "core.LogMetric", name="val_loss"),
                 edges=(edge("c", "value", "z", "x"), edge("z", "x", "m", "value")), name="base")
    body = {"base_graph": base, "objective": OBJECTIVE, "budget": {"max_parallel_runs": 1},
            "variants": [{"name": f"v{i}", "params": [{"node_id": "c", "param": "value", "value": i}]}
                         for i in range(3)]}
    study = post(server, body)
    # The next attempts' flavor now says 2 cpus where their node says 1: refused as a run would be.
    assert server.client.request("PUT", "/api/flavors/f1", {"cpus": 2})[0] == 200
    halted = wait_state(server, study["id"], "halted", "finished")
    assert halted["state"] == "halted" and halted["halt_reason"].startswith("attempt_refused: flavor_conflict"), halted
    assert server.client.request("PUT", "/api/flavors/f1", {"cpus": 1})[0] == 200
    assert server.client.request("POST", f"/api/studies/{study['id']}/resume", {})[0] == 200
    done = wait_state(server, study["id"], "finished", "halted")
    assert done["state"] == "finished" and len(done["ranking"]) == 3, done


@pytest.mark.timeout(120)
def test_a_stop_while_a_study_starts_its_attempts_stores_no_run_without_its_actor(make_server, tmp_path):
    home = tmp_path / "home"
    server = make_server(home=home)
    # A plugin's job starts its study without waiting for its first attempts (a study's
    # POST waits, for its session's quota): the stop comes while they are being started.
    # Each attempt the stop interrupts is tried again and counts against max_runs.
    spec = study_body(variants(*range(12), seconds=0.2), repeats=1, budget={"max_runs": 40})
    studies = []
    for key in range(6):  # several at once: a submission is in the placer's mailbox as the stop begins
        status, job = server.client.request("POST", "/api/plugins/p/jobs",
                                            {"kind": "study", "spec": spec, "idempotency_key": f"k{key}"})
        assert status == 201, job
        studies.append(job["study_id"])
    server.stop()
    output = "".join(server.output)
    assert "actor placer crashed" not in output and "Traceback" not in output, output[-3000:]
    again = make_server(home=home)
    for study_id in studies:
        done = wait_state(again, study_id, "finished", "halted")
        assert done["state"] == "finished" and len(done["ranking"]) == 12, done
        runs = again.get(f"/api/runs?study_id={study_id}&limit=100")["runs"]
        assert sorted(r["id"] for r in runs) == sorted(a["run_id"] for a in done["attempts"])
