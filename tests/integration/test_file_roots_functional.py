"""A class session is an untrusted user: the files a node reads lie inside the folders
runs may use (storage labels, uploads, run folders, TROUPE_DATA_ROOTS), refused before
the file is touched (the answer says nothing of whether it exists), and a run's error
never quotes what a file holds; on a worker, against that worker's own folders."""

from __future__ import annotations

from tests.helpers import graph, node
from tests.integration.test_workers_functional import enroll, read_until, start_agent

SECRET = "hunter2-planted-secret"


def reader(path: str) -> dict:
    return graph(node("csv", "torch.CSVDataset", path=path, target="y"))


def test_files_outside_the_roots_are_refused_alike_whether_they_exist_or_not(make_server, tmp_path):
    allowed = tmp_path / "data"
    allowed.mkdir()
    (tmp_path / "private.csv").write_text(f"a,y\n{SECRET},1\n")
    server = make_server(TROUPE_DATA_ROOTS=str(allowed))
    student = server.session(uses=1)
    answers = []
    for path in (str(tmp_path / "private.csv"), str(tmp_path / "missing.csv"), "/etc/passwd",
                 str(allowed / ".." / "private.csv"), "relative.csv", "~nosuchuser/x.csv", f"{allowed}/a\u0000b"):
        status, reply = student.request("POST", "/api/runs", {"graph": reader(path)})
        assert status == 400 and reply["error"]["code"] == "path_not_allowed", reply
        assert reply["error"]["pointer"] == "/graph/nodes/0/params/path" and reply["error"]["node_id"] == "csv"
        answers.append(reply["error"]["message"].replace(path, "PATH"))
    assert len(set(answers)) == 1  # the same words, existing or not
    # An upload reference names an upload's id, nothing else: never a question about a file here.
    upload_answers = set()
    for target in ({}, {"target": {"worker": "any"}}):
        up = "upload:" + "../" * 12
        for path in (up + "etc/passwd", up + "etc/no-such", "upload:" + "b" * 300):
            status, reply = student.request("POST", "/api/runs", {"graph": reader(path), "options": target})
            assert status == 400 and reply["error"]["code"] == "file_not_found", reply
            upload_answers.add(reply["error"]["message"].replace(path.split(":", 1)[1][:80], "ID"))
    assert len(upload_answers) == 1, upload_answers
    checkpoint = graph(node("m", "torch.MLP", hidden="4"), node("l", "torch.LoadCheckpoint", path="/etc/hostname"))
    status, reply = student.request("POST", "/api/runs", {"graph": checkpoint})
    assert status == 400 and reply["error"]["code"] == "path_not_allowed"


def test_a_runs_error_names_the_line_never_what_the_file_holds(make_server, tmp_path):
    server = make_server(TROUPE_DATA_ROOTS=str(tmp_path))
    planted = tmp_path / "planted.csv"
    planted.write_text("a,y\n1,0\n" + f"{SECRET},1\n")
    run_id = server.session(uses=1).request("POST", "/api/runs", {"graph": reader(str(planted))})[1]["run_id"]
    row = server.wait_status(run_id, "failed")
    assert "line 3" in row["error"] and SECRET not in str(server.get(f"/api/runs/{run_id}"))
    headless = tmp_path / "headless.csv"
    headless.write_text(f"{SECRET},other\n1,2\n")
    run_id = server.submit(reader(str(headless)))["run_id"]
    row = server.wait_status(run_id, "failed")
    assert "no column 'y'" in row["error"] and SECRET not in str(server.get(f"/api/runs/{run_id}"))


def test_a_worker_run_reads_only_inside_the_workers_own_roots(make_server, tmp_path):
    server = make_server(TROUPE_WORKER_HEARTBEAT_S="1")
    data = tmp_path / "data"
    data.mkdir()
    (data / "ok.csv").write_text("a,y\n" + "".join(f"{i},{i % 2}\n" for i in range(20)))
    (tmp_path / "private.csv").write_text(f"a,y\n{SECRET},1\n")
    agent = start_agent(server, tmp_path, enroll(server, name="gpu-a")["command"], TROUPE_DATA_ROOTS=str(data))
    try:
        read_until(agent, "connected as gpu-a")
        inside = server.submit(reader(str(data / "ok.csv")), target={"worker": "gpu-a"})["run_id"]
        outside = server.submit(reader(str(tmp_path / "private.csv")), target={"worker": "gpu-a"})["run_id"]
        assert server.wait_status(inside, "succeeded", timeout=90)["status"] == "succeeded"
        row = server.wait_status(outside, "failed", timeout=90)
        assert "outside the folders runs may read" in row["error"] and SECRET not in str(row)
    finally:
        agent.terminate()
        agent.wait(30)


def test_a_link_swapped_while_the_run_waits_is_checked_again_as_the_file_is_opened(make_server, tmp_path):
    from tests.helpers import sleeper

    allowed = tmp_path / "data"
    allowed.mkdir()
    (allowed / "ok.csv").write_text("a,y\n1,0\n2,1\n")
    (tmp_path / "private.csv").write_text(f"a,y\n{SECRET},1\n")
    link = allowed / "link.csv"
    link.symlink_to(allowed / "ok.csv")
    server = make_server(TROUPE_DATA_ROOTS=str(allowed), TROUPE_RUN_QUEUE_MAX_CONCURRENT_CPU="1")
    holder = server.submit(sleeper(30))["run_id"]
    server.wait_status(holder, "running")
    waiting = server.session(uses=1).request("POST", "/api/runs", {"graph": reader(str(link))})[1]["run_id"]
    link.unlink()
    link.symlink_to(tmp_path / "private.csv")  # after the check at submission
    server.client.request("POST", f"/api/runs/{holder}/cancel")
    row = server.wait_status(waiting, "failed")
    assert "leads outside the folders runs may read" in row["error"], row["error"]
    assert SECRET not in str(server.get(f"/api/runs/{waiting}"))
