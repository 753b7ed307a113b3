"""Tasks by the client's id, the task list and each task's requests with the
decisions that admitted or preempted them, on a real daemon over HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.daemonkit import Daemon, rows


def call(d: Daemon, task: str, workflow: str, stage: str, **meta: Any) -> dict[str, Any]:
    r = d.http.post("/v1/chat/completions", json={
        "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "go"}],
        "topasd": {"task_id": task, "workflow": workflow, "stage": stage, **meta}})
    assert r.status_code == 200, r.text
    return r.json()["topasd"]  # type: ignore[no-any-return]


def test_a_task_is_found_by_the_clients_id_with_its_requests_and_decisions(
        tmp_path: Path) -> None:
    with Daemon(tmp_path) as d:
        first = [call(d, "job-1", "chain3", v) for v in ("a", "b", "c")]
        ours = first[0]["task_id"]
        task = d.http.get("/v1/tasks/job-1").json()
        assert (task["id"], task["client_task_id"], task["status"]) == (ours, "job-1", "done")
        assert [(r["stage"], r["state"]) for r in task["requests"]] == [
            ("a", "finished"), ("b", "finished"), ("c", "finished")]
        assert [r["id"] for r in task["requests"]] == [c["request_id"] for c in first]
        for req in task["requests"]:
            assert req["ready"] <= req["admitted"] <= req["finished"]
            (admitted,) = [x["seq"] for x in req["decisions"] if x["action"] == "admit"]
            assert req["id"] in d.http.get(f"/v1/decisions/{admitted}").json()["admit"]
        assert d.http.get(f"/v1/tasks/{ours}").json() == task  # our id: the same task
        # the id again, for another workflow: the latest by default, or by workflow
        again = call(d, "job-1", "dag4", "a", last_in_task=True)
        assert d.http.get("/v1/tasks/job-1").json()["id"] == again["task_id"]
        old = d.http.get("/v1/tasks/job-1", params={"workflow": "chain3"}).json()
        assert old["id"] == ours
        missing = d.http.get("/v1/tasks/job-9")
        assert missing.status_code == 404
        assert "no task 'job-9'" in missing.json()["error"]["message"]
        assert "GET /v1/tasks lists" in missing.json()["error"]["message"]
        assert d.stop() == 0


def test_the_task_list_filters_by_workflow_status_and_client_id(tmp_path: Path) -> None:
    with Daemon(tmp_path, "--grace", "0", speed="1") as d:
        done = [call(d, f"c-{i}", "chain3", "a", last_in_task=True)["task_id"]
                for i in range(3)]
        submitted = [d.http.post("/v1/tasks", json={"workflow": "dag4"}).json()["id"]
                     for _ in range(4)]  # paced: still running below
        every = d.http.get("/v1/tasks").json()
        assert every["total"] == 7 and every["limit"] == 100
        assert [t["id"] for t in every["tasks"]] == [*reversed(submitted), *reversed(done)]
        chain = d.http.get("/v1/tasks", params={"workflow": "chain3", "status": "done"}).json()
        assert [t["id"] for t in chain["tasks"]] == list(reversed(done))
        running = d.http.get("/v1/tasks", params={"status": "running", "limit": 2}).json()
        assert running["total"] == 4 and [t["id"] for t in running["tasks"]] == \
            list(reversed(submitted))[:2]
        mine = d.http.get("/v1/tasks", params={"client_task_id": "c-1"}).json()
        assert [t["id"] for t in mine["tasks"]] == [done[1]]
        assert all("requests" not in t for t in every["tasks"])  # the list stays light
        bad = d.http.get("/v1/tasks", params={"status": "late"})
        assert bad.status_code in (400, 422)
        assert "running, done, abandoned" in bad.json()["error"]["message"]
        assert d.stop() == 0


def test_a_preempted_requests_trail_names_the_decision(tmp_path: Path) -> None:
    with Daemon(tmp_path, "--workload", "dag4", "--rate", "0.5", "--tasks", "30") as d:
        d.wait_for(lambda s: s["counts"]["tasks_finished"] == 30)
        trails = [r for t in d.http.get("/v1/tasks", params={"limit": 30}).json()["tasks"]
                  for r in d.http.get(f"/v1/tasks/{t['id']}").json()["requests"]]
        assert len(trails) == 120
        preempted = [r for r in trails if r["preemptions"]]
        assert preempted, "no preemption: the test tests nothing"
        for r in preempted:
            seqs = [x["seq"] for x in r["decisions"] if x["action"] == "preempt"]
            assert len(seqs) == r["preemptions"]
            detail = d.http.get(f"/v1/decisions/{seqs[0]}").json()
            assert r["id"] in detail["preempt"]
        assert d.stop() == 0


def test_a_held_requests_trail_and_decision_say_it_was_held(tmp_path: Path) -> None:
    """MetaGPT-SOP at 0.2 task/s backs up enough that `phases` holds requests:
    each trail counts the decisions that held it, as the decision log does,
    and the latest of them names it among its held requests."""
    with Daemon(tmp_path, "--workload", "metagpt-sop", "--rate", "0.2", "--tasks", "30") as d:
        d.wait_for(lambda s: s["counts"]["tasks_finished"] == 30)
        trails = [r for t in d.http.get("/v1/tasks", params={"limit": 30}).json()["tasks"]
                  for r in d.http.get(f"/v1/tasks/{t['id']}").json()["requests"]]
        held = [r for r in trails if r["held"]]
        assert len(held) >= 5, "nothing held: the test tests nothing"
        for r in held:
            answer = d.http.get(f"/v1/decisions/{r['last_held']}")
            assert answer.status_code == 200, "the daemon keeps the last 1,024 decisions"
            detail = answer.json()
            assert r["id"] in detail["held"] and r["id"] not in detail["admit"]
            assert detail["requests"][str(r["id"])]["stage"] == r["stage"]
        recent = d.http.get("/v1/state").json()["recent_decisions"]
        gauge = next(line for line in d.http.get("/metrics").text.splitlines()
                     if line.startswith("topasd_requests_held "))
        assert float(gauge.split()[1]) == recent[-1]["n_held"]  # the run is over: no decision
        assert d.stop() == 0  # every decision is in the log once the daemon stopped
    for r in trails:
        stored = [x["decision"] for x in rows(
            d.db, "SELECT decision FROM decision_actions WHERE action = 'hold' AND "
            "request_id = ?", r["id"])]
        assert (r["held"], r["last_held"]) == (len(stored), max(stored, default=None))
    assert recent
    for x in recent:  # each decision event's count of holds, as logged
        (logged,) = rows(d.db, "SELECT n_held FROM decisions WHERE seq = ?", x["seq"])
        assert x["n_held"] == logged["n_held"]
