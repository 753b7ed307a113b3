"""`/metrics`: the daemon's counters in Prometheus's text format."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from topasd.daemon.metrics import Histogram
from topasd.daemon.service import Service
from topasd.model import EventKind

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Collector:
    """Prometheus view of the service's counters (read without locks)."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        svc = self.service
        m = svc.metrics
        c = m.counts
        yield _hist("topasd_task_jct_seconds", "Task completion time (engine seconds).", m.jct)
        yield _hist("topasd_decision_latency_seconds", "Policy decision wall time.",
                    m.decision_latency)
        for name, doc, agents in (
                ("topasd_requests_waiting", "Waiting requests by agent.", m.waiting),
                ("topasd_requests_running", "Running requests by agent.", m.running),
                ("topasd_prefix_resident", "1 if the agent's prefix is on the GPU.", m.on_gpu)):
            g = GaugeMetricFamily(name, doc, labels=["agent"])
            for agent, n in sorted(agents.copy().items()):
                g.add_metric([agent], n)
            yield g
        yield _gauge("topasd_prefixes_resident", "Agent prefixes on the GPU.",
                     sum(m.on_gpu.copy().values()))
        yield _gauge("topasd_tasks_in_flight", "Tasks arrived and not finished.",
                     m.tasks_in_flight)
        yield _gauge("topasd_engine_time_seconds", "The engine's (virtual) clock.", m.t)
        yield _gauge("topasd_kv_budget_tokens", "KV budget in tokens.",
                     svc.profile.budget_tokens)
        yield _gauge("topasd_params_version", "Live parameter version.", svc.params_version)
        yield _gauge("topasd_ready", "1 while the engine admits work.", int(svc.ready))
        for name, doc, value in (
                ("topasd_tasks_arrived", "Tasks arrived.", c[EventKind.TASK_ARRIVE]),
                ("topasd_tasks_finished", "Tasks finished.", c[EventKind.TASK_FINISH]),
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
        pre = CounterMetricFamily("topasd_preemptions", "Preempted requests.", labels=["by"])
        pre.add_metric(["policy"], c[EventKind.PREEMPT])
        pre.add_metric(["engine"], c[EventKind.RETRACT])
        yield pre


def _hist(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, buckets=h.cumulative(), sum_value=h.sum)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)

