"""`/metrics`: the daemon's counters in Prometheus's text format.

Names follow the serving engines' (vLLM's `vllm:*`, SGLang's `sglang:*`) for
what they measure, under `topasd_`: `num_requests_running`/`waiting`,
`kv_cache_usage_perc`, `request_queue_time_seconds`,
`time_to_first_token_seconds`, `e2e_request_latency_seconds`,
`prompt_tokens_total`, `generation_tokens_total`, `prefix_cache_queries_total`
and `prefix_cache_hits_total` (tokens), labelled by `workflow` (every call
without a workflow: "agent:*") and, for request latencies, `stage`.
Agent-labelled families hold at most `metrics_agents` agents of their own
(the rest sum into agent="other"; an idle synthesized agent has no series).
docs/api.md#metrics lists every family; docs/grafana/ is a dashboard of them.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator, Mapping

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from topasd.daemon.metrics import OTHER, Histogram, Labelled, Metrics
from topasd.daemon.service import Service
from topasd.model import EventKind, Location

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Collector:
    """Prometheus view of the service's counters (read without locks)."""

    def __init__(self, service: Service, version: str) -> None:
        self.service = service
        self.version = version

    def collect(self) -> Iterator[Metric]:
        svc = self.service
        m = svc.metrics
        yield from self._info()
        yield from _latencies(m)
        yield from _agents(m, svc.settings.metrics_agents)
        yield from _workflows(m, svc.backend.t)
        yield from _engine(svc)
        yield from _counters(svc)

    def _info(self) -> Iterator[Metric]:
        svc = self.service
        info = GaugeMetricFamily("topasd_build_info", "topasd's version, policy, backend, "
                                 "profile and Python (value 1).",
                                 labels=["version", "policy", "backend", "profile", "python"])
        info.add_metric([self.version, svc.policy.name, svc.backend.name, svc.profile.name,
                         platform.python_version()], 1)
        yield info


def _latencies(m: Metrics) -> Iterator[Metric]:
    """JCT by workflow; request latencies by workflow and stage; decision time."""
    yield _hist("topasd_task_jct_seconds", "Task completion time (engine seconds), by "
                "workflow.", ["workflow"], m.jct_by)
    for name, doc, hist in (
            ("topasd_request_queue_time_seconds", "Ready to first admission (engine "
             "seconds; vLLM's request_queue_time).", m.queue_time),
            ("topasd_time_to_first_token_seconds", "Ready to first output token (engine "
             "seconds; where the backend reports a prefill's end).", m.ttft),
            ("topasd_e2e_request_latency_seconds", "Ready to finish (engine seconds).",
             m.e2e)):
        yield _hist(name, doc, ["workflow", "stage"], hist)
    yield _one_hist("topasd_decision_latency_seconds", "Policy decision wall time.",
                    m.decision_latency)


def _agents(m: Metrics, cap: int) -> Iterator[Metric]:
    """Queues and prefixes by agent, at most `cap` agents of their own."""
    labels = m.agent_labels(cap)
    for name, doc, values in (
            ("topasd_requests_waiting", "Waiting requests by agent.", m.waiting),
            ("topasd_requests_running", "Running requests by agent.", m.running),
            ("topasd_prefix_resident", "1 if the agent's prefix is on the GPU (agent="
             "\"other\": how many of the others are).", m.on_gpu)):
        g = GaugeMetricFamily(name, doc, labels=["agent"])
        for label, n in _fold(labels, values).items():
            g.add_metric([label], n)
        yield g
    where = GaugeMetricFamily("topasd_prefix_location", "1 where the agent's prefix lives: "
                              "gpu, host or none (agent=\"other\": how many of the others).",
                              labels=["agent", "location"])
    places: dict[tuple[str, str], int] = {}
    for agent, label in labels.items():
        for loc in Location:
            key = (label, loc.value)
            places[key] = places.get(key, 0) + int(m.location(agent) is loc)
    for (label, place), n in places.items():
        where.add_metric([label, place], n)
    yield where


def _fold(labels: Mapping[str, str], values: Mapping[str, int]) -> dict[str, int]:
    """`values` by agent label (the agents past the cap summed into OTHER)."""
    out: dict[str, int] = {}
    for agent, label in labels.items():
        out[label] = out.get(label, 0) + values.get(agent, 0)
    if OTHER in out:  # last: the agents by name first
        out[OTHER] = out.pop(OTHER)
    return out


def _workflows(m: Metrics, now: float) -> Iterator[Metric]:
    """Queues, tasks and starvation by workflow, and token counters."""
    running: dict[str, int] = {}
    waiting: dict[str, int] = {}
    for rid, req in list(m.requests.items()):
        queue = running if m.phase(rid) == "running" else waiting
        queue[req.workflow] = queue.get(req.workflow, 0) + 1
    tasks: dict[str, int] = {}
    oldest: dict[str, float] = {}
    for workflow, arrival in list(m.tasks.values()):
        tasks[workflow] = tasks.get(workflow, 0) + 1
        oldest[workflow] = min(arrival, oldest.get(workflow, arrival))
    for name, doc, values in (
            ("topasd_num_requests_running", "Requests running, by workflow.", running),
            ("topasd_num_requests_waiting", "Requests waiting, by workflow.", waiting),
            ("topasd_tasks_in_flight_by_workflow", "Tasks arrived and not finished, by "
             "workflow.", tasks),
            ("topasd_oldest_waiting_seconds", "Age of the oldest waiting request (in the "
             "queue since it became ready or was preempted), by workflow: starvation as it "
             "happens.", {w: now - t for w, t in m.waiting_since().items()}),
            ("topasd_oldest_task_age_seconds", "Age of the oldest task in flight, by "
             "workflow.", {w: now - t for w, t in oldest.items()})):
        g = GaugeMetricFamily(name, doc, labels=["workflow"])
        for workflow in sorted(m.workflow_labels.copy()):  # each a series for good
            g.add_metric([workflow], max(0.0, values.get(workflow, 0.0)))
        yield g
    for name, doc, counter, key in (
            ("topasd_prompt_tokens", "Prompt tokens (prefix + input) of finished requests.",
             m.tokens, "prompt"),
            ("topasd_generation_tokens", "Tokens generated by finished requests.", m.tokens,
             "generation"),
            ("topasd_prefix_cache_queries", "Prefix tokens looked up at admissions.",
             m.prefix_cache, "queries"),
            ("topasd_prefix_cache_hits", "Prefix tokens found ready on the GPU at "
             "admissions (the rest were loaded or recomputed).", m.prefix_cache, "hits")):
        c = CounterMetricFamily(name, doc, labels=["workflow"])
        for (workflow, what), n in sorted(counter.copy().items()):
            if what == key:
                c.add_metric([workflow], n)
        yield c


def _engine(svc: Service) -> Iterator[Metric]:
    """The engine's gauges: KV, clock, parameters, readiness."""
    m = svc.metrics
    budget = svc.profile.budget_tokens
    yield _gauge("topasd_kv_cache_usage_perc", "KV budget in use (resident prefixes and "
                 "running requests), 0 to 1 (vLLM's kv_cache_usage_perc; once a second).",
                 m.kv_used / budget if budget else 0.0)
    yield _gauge("topasd_kv_cache_used_tokens", "KV tokens in use (once a second).",
                 m.kv_used)
    yield _gauge("topasd_kv_budget_tokens", "KV budget in tokens.", budget)
    yield _gauge("topasd_prefixes_resident", "Agent prefixes on the GPU.",
                 sum(m.on_gpu.copy().values()))
    yield _gauge("topasd_tasks_in_flight", "Tasks arrived and not finished.",
                 m.tasks_in_flight)
    yield _gauge("topasd_requests_held", "Waiting requests the last decision left out of "
                 "the queue it weighed (TOPAS's phases and lot_size).", m.held)
    yield _gauge("topasd_engine_time_seconds", "The engine's (virtual) clock.", m.t)
    yield _gauge("topasd_params_version", "Live parameter version.", svc.params_version)
    yield _gauge("topasd_ready", "1 while the engine admits work.", int(svc.ready))


def _counters(svc: Service) -> Iterator[Metric]:
    m = svc.metrics
    c = m.counts
    for name, doc, value in (
            ("topasd_tasks_arrived", "Tasks arrived.", c[EventKind.TASK_ARRIVE]),
            ("topasd_tasks_finished", "Tasks finished.", c[EventKind.TASK_FINISH]),
            ("topasd_tasks_abandoned", "Application tasks dropped after task_timeout "
             "without a call.", c[EventKind.TASK_ABANDON]),
            ("topasd_requests_finished", "Requests finished.", c[EventKind.REQUEST_FINISH]),
            ("topasd_requests_withdrawn", "Requests taken back unfinished (their "
             "client went away).", c[EventKind.REQUEST_WITHDRAW]),
            ("topasd_decisions", "Policy decisions.", m.decisions),
            ("topasd_prefix_computes", "Prefixes recomputed by prefill.",
             c[EventKind.PREFIX_COMPUTE_START]),
            ("topasd_param_changes", "Live parameter changes.", m.param_changes),
            ("topasd_tasks_refused_busy", "New tasks refused at the admission bounds "
             "(max_tasks, max_waiting: 429).", svc.refused_busy),
            ("topasd_engine_loop_seconds", "Wall time in the engine and scheduler.",
             m.pump_wall_s),
            ("topasd_scheduler_seconds", "Wall time in policy decisions.",
             m.decide_wall_s)):
        yield _counter(name, doc, value)
    swaps = CounterMetricFamily("topasd_prefix_swaps", "Prefix moves over the host link.",
                                labels=["direction"])
    swaps.add_metric(["in"], c[EventKind.PREFIX_LOAD_START])
    swaps.add_metric(["out"], c[EventKind.PREFIX_OFFLOAD_START])
    yield swaps
    pre = CounterMetricFamily("topasd_preemptions", "Preempted requests (vLLM's "
                              "num_preemptions).", labels=["by"])
    pre.add_metric(["policy"], c[EventKind.PREEMPT])
    pre.add_metric(["engine"], c[EventKind.RETRACT])
    yield pre


def _hist(name: str, doc: str, labels: list[str], hists: Labelled) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=labels)
    for values, h in sorted(hists.by.copy().items()):
        fam.add_metric(list(values), h.cumulative(), h.sum)
    return fam


def _one_hist(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, buckets=h.cumulative(), sum_value=h.sum)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)
