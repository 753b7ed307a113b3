"""`/v1/state`: the dashboard's snapshot, built on the engine loop's thread from
the backend's dashboard state, the task book, the ledger and the metrics."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from topasd.daemon.ledger import TaskLedger
from topasd.daemon.metrics import STATS_WINDOW, Metrics, Transfer
from topasd.model import EngineView, Location, Request, TaskView
from topasd.scheduler.residual import ServiceModel, TaskPaths


def request_dict(req: Request) -> dict[str, Any]:
    return {"id": req.id, "task_id": req.task_id, "workflow": req.workflow,
            "stage": req.stage, "round": req.round, "input_tokens": req.input_tokens,
            "output_tokens": req.output_tokens, "generated": req.generated,
            "ready_at": req.ready_at, "preemptions": req.preemptions}


def by_agent(requests: Sequence[Request], limit: int) -> dict[str, list[dict[str, Any]]]:
    """Requests by agent (agents sorted), at most `limit` each."""
    out: dict[str, list[dict[str, Any]]] = {}
    for req in requests:
        out.setdefault(req.agent, []).append(request_dict(req))
    return {a: rs[:limit] for a, rs in sorted(out.items())}


def budget(view: EngineView) -> dict[str, int]:
    """The KV budget and what holds it: resident prefixes, running requests
    and the copies of shared task context on the GPU (each once)."""
    used_prefix = sum(p.tokens for p in view.prefixes.values() if p.location is Location.GPU)
    used_req = sum(r.kv_tokens() for r in view.running)
    used_ctx = sum(c.tokens for c in view.contexts.values() if c.location is Location.GPU)
    return {"tokens": view.budget_tokens, "used": used_prefix + used_req + used_ctx,
            "prefixes": used_prefix, "requests": used_req, "contexts": used_ctx}


def prefixes(view: EngineView, transfers: Mapping[str, Transfer]) -> list[dict[str, Any]]:
    """Each agent's prefix: where it lives, and the move under way."""
    return [{"agent": p.agent, "tokens": p.tokens, "location": str(p.location),
             "ready": p.ready, "host_copy": p.host_copy,
             "transfer": tr.as_dict() if (tr := transfers.get(p.agent)) else None}
            for p in sorted(view.prefixes.values(), key=lambda p: p.agent)]


def tasks(view: EngineView, in_flight: Mapping[int, TaskView], ledger: TaskLedger,
          model: ServiceModel, quantiles: Any, limit: int) -> list[dict[str, Any]]:
    """The first `limit` tasks in flight: their entry, the stages running and
    waiting, and the expected remaining path E[LP] (one pass per DAG)."""
    run_stage: dict[int, dict[str, Request]] = {}
    wait_stage: dict[int, set[str]] = {}
    for req in view.running:
        run_stage.setdefault(req.task_id, {})[req.stage] = req
    for req in view.waiting:
        wait_stage.setdefault(req.task_id, set()).add(req.stage)
    paths = TaskPaths(model, view.costs, view.workflows, quantiles, view.t)
    listed = list(in_flight.values())[:limit]
    paths.lhat_batch([(task, run_stage.get(task.id, {}), [()]) for task in listed
                      if task.workflow in view.workflows])
    out = []
    for task in listed:
        entry = ledger.entries.get(task.id)
        item: dict[str, Any] = entry.as_dict(task) if entry is not None else {"id": task.id}
        on = run_stage.get(task.id, {})
        item["stages_running"] = sorted(on)
        item["stages_waiting"] = sorted(wait_stage.get(task.id, set()) - set(on))
        item["remaining_s"] = (paths.lhat(task, on) if task.workflow in view.workflows
                               else None)
        out.append(item)
    return out


BRIEF_TASK = ("id", "workflow", "client_task_id", "arrival", "stages_done", "stages_total",
              "stages_running", "stages_waiting", "remaining_s")


def brief(state: Mapping[str, Any]) -> dict[str, Any]:
    """`/v1/state?brief=true`: what a dashboard draws, a fraction of the bytes.
    The waiting requests as a count per agent (of the listed ones); each task
    with BRIEF_TASK's fields and `stages_since` (its running and waiting
    stages' first ready time) for its stage table; no `recent_decisions`."""
    out = {k: v for k, v in state.items() if k != "recent_decisions"}
    out["waiting"] = {agent: len(reqs) for agent, reqs in state["waiting"].items()}
    out["tasks"] = [_brief_task(t) for t in state["tasks"]]
    return out


def _brief_task(task: Mapping[str, Any]) -> dict[str, Any]:
    item = {k: task[k] for k in BRIEF_TASK if k in task}
    if "stages" in task:
        stages = task["stages"] or {}
        active = (*task.get("stages_running", ()), *task.get("stages_waiting", ()))
        item["stages_since"] = {v: stages[v]["started_at"] for v in active
                                if stages.get(v, {}).get("started_at") is not None}
    return item


def headline(metrics: Metrics, decision_ms: Sequence[float], t: float) -> dict[str, Any]:
    """Headline numbers: throughput and mean JCT over the whole run, p99 JCT and
    decision latency over the last STATS_WINDOW values (None before the first)."""
    n = sum(metrics.jct.counts)
    jcts = np.fromiter(metrics.recent_jct, float, len(metrics.recent_jct))
    ms = np.asarray(decision_ms[-STATS_WINDOW:], dtype=float)
    return {
        "tasks_finished": int(n),
        "throughput_task_s": n / t if t > 0 else 0.0,
        "jct_mean_s": metrics.jct.sum / n if n else None,
        "jct_p99_s": float(np.percentile(jcts, 99)) if jcts.size else None,
        "decision_ms_mean": float(ms.mean()) if ms.size else None,
        "decision_ms_p99": float(np.percentile(ms, 99)) if ms.size else None,
        "by_workflow": by_workflow(metrics),
    }


def by_workflow(metrics: Metrics) -> dict[str, Any]:
    """Per workflow (`lifecycle.workflow_label`): finished tasks, p50 and p99 JCT,
    and per stage its finished count and p99 duration (first ready -> finish),
    over the recent GROUP_WINDOW of each: what the console judges "late" by."""
    out: dict[str, Any] = {}
    for label, jcts in list(metrics.recent_jct_by.items()):
        xs = np.fromiter(jcts.copy(), float)
        out[label] = {"finished": int(xs.size), "jct_p50_s": float(np.percentile(xs, 50)),
                      "jct_p99_s": float(np.percentile(xs, 99)), "stages": {}}
    for (label, stage), times in list(metrics.recent_stage.items()):
        xs = np.fromiter(times.copy(), float)
        group = out.setdefault(label, {"finished": 0, "jct_p50_s": None, "jct_p99_s": None,
                                       "stages": {}})
        group["stages"][stage] = {"finished": int(xs.size),
                                  "p99_s": float(np.percentile(xs, 99))}
    return out


class SummaryLog:
    """The daemon log's periodic summary line (every `every` wall seconds): what
    is in flight, what finished since the last line, JCT, decisions, KV."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._next = time.monotonic() + every
        self._last: dict[str, int] = {}

    def due(self, now: float) -> bool:
        if now < self._next:
            return False
        self._next = now + self.every
        return True

    def line(self, counts: Mapping[str, int], stats: Mapping[str, Any],
             kv: Mapping[str, int], t: float) -> str:
        """"summary t=…: tasks …; requests …; JCT …; decisions …; preemptions …; KV …"."""
        last, self._last = self._last, dict(counts)

        def new(key: str) -> int:
            return counts.get(key, 0) - last.get(key, 0)

        p99 = stats.get("jct_p99_s")
        mean = stats.get("jct_mean_s")
        jct = ("JCT mean -, p99 -" if mean is None
               else f"JCT mean {mean:.1f}s, p99 {p99:.1f}s")
        dec99 = stats.get("decision_ms_p99")
        used = kv["used"] / kv["tokens"] if kv.get("tokens") else 0.0
        return (f"summary t={t:.1f}s: tasks {counts['tasks_in_flight']} in flight, "
                f"+{new('tasks_arrived')} arrived, +{new('tasks_finished')} finished, "
                f"+{new('tasks_abandoned')} abandoned, +{new('tasks_refused_busy')} refused; "
                f"requests {counts['requests_running']} running, "
                f"{counts['requests_waiting']} waiting, +{new('requests_finished')} finished; "
                f"{jct}; decisions +{new('decisions')}"
                + (f" (p99 {dec99:.2f} ms)" if dec99 is not None else "")
                + f"; preemptions +{new('preemptions')} by the policy, "
                f"+{new('retractions')} by the engine; KV {used:.0%} used")
