"""`/metrics` of a real daemon, parsed with prometheus_client: the families the
Grafana dashboard (docs/grafana/topasd.json) queries all exist, their values
agree with the state and the decision log, and a thousand plain clients with
distinct system prompts keep every agent-labelled family within the cap."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.daemonkit import Daemon

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana" / "topasd.json"
PROMQL_WORDS = {"by", "le", "sum", "rate", "topk", "histogram_quantile"}


def scrape(d: Daemon) -> dict[str, Any]:
    """family name -> its samples (name, labels, value)."""
    r = d.http.get("/metrics")
    r.raise_for_status()
    return {f.name: f.samples for f in text_string_to_metric_families(r.text)}


def sample_names(families: dict[str, Any]) -> set[str]:
    return {s.name for samples in families.values() for s in samples}


def value(families: dict[str, Any], name: str, **labels: str) -> float:
    family = name.removesuffix("_total").removesuffix("_count").removesuffix("_sum")
    return sum(s.value for s in families[family] if s.name == name
               and all(s.labels.get(k) == v for k, v in labels.items()))


def dashboard_metrics() -> dict[str, set[str]]:
    """Each panel's title -> the metric names its queries read."""
    dash = json.loads(DASHBOARD.read_text())
    out: dict[str, set[str]] = {}
    for panel in dash["panels"]:
        if panel["type"] == "row":
            continue
        names: set[str] = set()
        for target in panel["targets"]:
            expr = re.sub(r'\{[^}]*\}|\[[^]]*\]|"[^"]*"', "", target["expr"])
            names |= {w for w in re.findall(r"[a-z_][a-z0-9_]*", expr)
                      if "_" in w and w not in PROMQL_WORDS}
        out[panel["title"]] = names
    return out


def test_every_dashboard_panel_queries_an_exported_metric(tmp_path: Path) -> None:
    with Daemon(tmp_path, "--workload", "dag4", "--rate", "0.5", "--tasks", "25") as d:
        call = d.http.post("/v1/chat/completions", json={
            "model": "m", "max_tokens": 16,
            "messages": [{"role": "system", "content": "You plan."},
                         {"role": "user", "content": "Plan it."}]})
        assert call.status_code == 200
        st = d.wait_for(lambda s: s["counts"]["tasks_finished"] == 26)
        families = scrape(d)
        exported = sample_names(families)
        panels = dashboard_metrics()
        assert len(panels) >= 20
        for title, names in panels.items():
            assert names, f"panel {title!r} queries no metric"
            assert names <= exported, f"panel {title!r}: not exported: {names - exported}"
        # the values behind the panels
        assert value(families, "topasd_task_jct_seconds_count", workflow="dag4") == 25
        assert value(families, "topasd_task_jct_seconds_count", workflow="agent:*") == 1
        done = st["counts"]["requests_finished"]
        for name in ("topasd_request_queue_time_seconds_count",
                     "topasd_time_to_first_token_seconds_count",
                     "topasd_e2e_request_latency_seconds_count"):
            assert value(families, name) == done, name
        assert {s.labels["stage"] for s in families["topasd_request_queue_time_seconds"]
                if s.labels.get("workflow") == "dag4"} == {"a", "b", "c", "d"}
        hits = value(families, "topasd_prefix_cache_hits_total")
        assert 0 < hits < value(families, "topasd_prefix_cache_queries_total")
        assert 0 <= value(families, "topasd_kv_cache_usage_perc") <= 1
        assert value(families, "process_cpu_seconds_total") > 0
        (info,) = families["topasd_build_info"]
        assert info.labels["policy"] == "topas" and info.labels["backend"] == "sim"
        assert d.stop() == 0
    conn = sqlite3.connect(d.db)
    (generated,) = conn.execute(
        "SELECT sum(output_tokens) FROM requests WHERE finished IS NOT NULL").fetchone()
    queue = [r[0] for r in conn.execute("SELECT queue_s FROM request_log")]
    conn.close()
    assert value(families, "topasd_generation_tokens_total") == generated
    assert value(families, "topasd_request_queue_time_seconds_sum") == pytest.approx(sum(queue))


def test_starvation_shows_while_it_happens(tmp_path: Path) -> None:
    """A call waiting behind a full engine: its workflow's oldest waiting age
    grows while it waits, and the oldest task's age with it."""
    with Daemon(tmp_path, "--budget", "3000", "--grace", "0", speed="1") as d:
        body = {"model": "m", "max_tokens": 2000, "messages": [
            {"role": "system", "content": "x" * 400}, {"role": "user", "content": "go"}]}

        def call() -> None:
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(f"{d.url}/v1/chat/completions", json=body, timeout=120)

        for _ in range(2):
            threading.Thread(target=call, daemon=True).start()
        d.wait_for(lambda s: s["counts"]["requests_waiting"] == 1)
        ages = [value(scrape(d), "topasd_oldest_waiting_seconds", workflow="agent:*")]
        while ages[-1] <= ages[0] + 0.5:
            fam = scrape(d)
            ages.append(value(fam, "topasd_oldest_waiting_seconds", workflow="agent:*"))
        assert value(fam, "topasd_num_requests_waiting", workflow="agent:*") == 1
        assert value(fam, "topasd_num_requests_running", workflow="agent:*") == 1
        assert value(fam, "topasd_oldest_task_age_seconds", workflow="agent:*") >= ages[-1]
        assert ages == sorted(ages)
        assert d.stop() == 0


def families_of(text: str) -> dict[str, Any]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_a_thousand_system_prompts_stay_within_the_agent_cap(tmp_path: Path) -> None:
    """1,000 plain clients, each with a system prompt of its own (an agent
    each), 32 at a time on a paced engine: every agent-labelled family holds at
    most `--metrics-agents` agents plus "other" while they run, and the idle
    ones are retired once they are done."""
    cap = 8
    with Daemon(tmp_path, "--metrics-agents", str(cap), speed="4") as d:
        seen: list[dict[str, Any]] = []

        async def one(http: httpx.AsyncClient, i: int, gate: asyncio.Semaphore) -> None:
            async with gate:
                r = await http.post("/v1/chat/completions", json={
                    "model": "m", "max_tokens": 16, "messages": [
                        {"role": "system", "content": f"You are agent number {i}."},
                        {"role": "user", "content": "hi"}]})
                assert r.status_code == 200, r.text

        async def watch(http: httpx.AsyncClient, done: asyncio.Event) -> None:
            while not done.is_set():
                seen.append(families_of((await http.get("/metrics")).text))
                await asyncio.sleep(0.2)

        async def main() -> None:
            gate, done = asyncio.Semaphore(32), asyncio.Event()
            async with httpx.AsyncClient(base_url=d.url, timeout=120) as http:
                watcher = asyncio.create_task(watch(http, done))
                await asyncio.gather(*(one(http, i, gate) for i in range(1000)))
                done.set()
                await watcher

        asyncio.run(main())
        assert d.state(1)["counts"]["requests_finished"] == 1000
        end = scrape(d)
        folded = 0
        for families in [*seen, end]:
            agent_families = {name: {s.labels["agent"] for s in samples}
                              for name, samples in families.items()
                              if any("agent" in s.labels for s in samples)}
            for name, agents in agent_families.items():
                assert len(agents) <= cap + 1, (name, len(agents))
            folded += "other" in agent_families.get("topasd_requests_running", ())
            workflows = {s.labels["workflow"] for samples in families.values()
                         for s in samples if "workflow" in s.labels}
            assert workflows <= {"agent:*"}
        assert folded, "never more than the cap at once: the test did not test the cap"
        running = {s.labels["agent"] for s in end["topasd_requests_running"]}
        assert not running - {s.labels["agent"] for s in end["topasd_prefix_resident"]
                              if s.value}  # only agents whose prefix stays resident remain
        assert d.stop() == 0
