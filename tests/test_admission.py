"""Admission control on a real daemon: at `max_tasks` tasks in flight or
`max_waiting` waiting requests a new task is refused with 429 and a
Retry-After, while calls of the tasks in flight are still served; once work
finishes, new tasks are taken again. The state waited for is read from the
daemon, never assumed from elapsed time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.daemonkit import Daemon
from topasd.daemon.admission import Load, refusal, retry_after


def chat(d: Daemon, task: str | None, stage: str | None) -> httpx.Response:
    meta = {} if task is None else {"topasd": {"task_id": task, "workflow": "chain3",
                                               "stage": stage}}
    return d.http.post("/v1/chat/completions", json={
        "model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "go"}], **meta})


def busy(r: httpx.Response, *words: str) -> None:
    assert r.status_code == 429, r.text
    assert int(r.headers["retry-after"]) >= 1
    err = r.json()["error"]
    assert err["type"] == "rate_limit_error" and "at capacity" in err["message"]
    for w in words:
        assert w in err["message"], err["message"]


def test_at_max_tasks_new_tasks_get_429_and_tasks_in_flight_go_on(tmp_path: Path) -> None:
    with Daemon(tmp_path, "--max-tasks", "2") as d:
        for task in ("t1", "t2"):  # stage a done: each task stays in flight for b and c
            assert chat(d, task, "a").status_code == 200
        assert d.state(1)["counts"]["tasks_in_flight"] == 2
        busy(chat(d, "t3", "a"), "2 tasks in flight (max_tasks 2)")
        busy(chat(d, None, None))  # a plain call opens a task of its own
        busy(d.http.post("/v1/tasks", json={"workflow": "chain3"}))
        with pytest.raises(openai.RateLimitError):  # what the openai client raises
            openai.OpenAI(base_url=f"{d.url}/v1", api_key="k", max_retries=0).completions.create(
                model="m", prompt="hi", max_tokens=2)
        for stage in ("b", "c"):  # the tasks in flight are served
            assert chat(d, "t1", stage).status_code == 200
        st = d.state(1)
        assert st["counts"]["tasks_in_flight"] == 1 and st["counts"]["tasks_refused_busy"] == 4
        assert chat(d, "t3", "a").status_code == 200  # room again
        assert "topasd_tasks_refused_busy_total 4.0" in d.http.get("/metrics").text
        assert d.stop() == 0


def test_at_max_waiting_new_tasks_get_429(tmp_path: Path) -> None:
    """A KV budget for one long request at a time: the second waits, the third
    is refused; the paced engine keeps the first running meanwhile."""
    long = {"workflow": "chain3", "stages": {"a": {"output_tokens": 4000}}}
    with Daemon(tmp_path, "--max-waiting", "1", "--budget", "10000", "--grace", "0",
                speed="1") as d:
        assert d.http.post("/v1/tasks", json=long).status_code == 201
        d.wait_for(lambda st: st["counts"]["requests_running"] == 1)
        assert d.http.post("/v1/tasks", json=long).status_code == 201
        d.wait_for(lambda st: st["counts"]["requests_waiting"] == 1)
        busy(d.http.post("/v1/tasks", json=long), "1 requests waiting (max_waiting 1)")
        assert d.stop() == 0


def test_driver_arrivals_beyond_max_tasks_are_refused_and_counted(tmp_path: Path) -> None:
    """Unpaced, so engine time decides: 20 chain3 tasks 0.02 s apart, each in
    flight for far longer, one place: the first runs, the others are refused."""
    with Daemon(tmp_path, "--workload", "chain3", "--rate", "50", "--tasks", "20",
                "--max-tasks", "1", "--log-level", "warning") as d:
        st = d.wait_for(lambda st: st["counts"]["tasks_finished"]
                        + st["counts"]["tasks_refused_busy"] == 20)
        assert st["counts"]["tasks_arrived"] == 1 and st["counts"]["tasks_refused_busy"] == 19
        r = d.http.get("/v1/tasks/5")
        assert r.status_code == 404 and "was never admitted: the daemon is at capacity: 1 " \
            "tasks in flight (max_tasks 1)" in r.json()["error"]["message"]
        assert d.stop() == 0
    assert d.log.read_text().count("driver task 1 skipped, and any more while") == 1


@pytest.mark.parametrize(("load", "bounds", "expected"), [
    (Load(10, 0, 0, 0, 5.0), (10, 0), 1),  # nothing finished yet: retry in a second
    (Load(10, 0, 100, 0, 50.0), (10, 0), 1),  # 2 tasks/s: one frees within a second
    (Load(30, 0, 10, 0, 100.0), (10, 0), 60),  # 21 to finish at 0.1/s: capped at 60 s
    (Load(0, 50, 0, 20, 10.0), (0, 40), 6),  # 11 requests at 2/s
    (Load(9, 39, 0, 0, 1.0), (10, 40), None),  # below both bounds
    (Load(10**6, 10**6, 0, 0, 1.0), (0, 0), None),  # 0: no bound
])
def test_the_refusal_names_the_bound_and_a_retry_after_from_the_finish_rate(
        load: Load, bounds: tuple[int, int], expected: Any) -> None:
    got = refusal(load, *bounds)
    assert (None if got is None else got.retry_after) == expected
    assert retry_after(1, 0, 0.0) == 1
