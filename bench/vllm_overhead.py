"""Scheduler time per engine step: TOPAS in vLLM vs vLLM's default scheduler.

One invocation runs the same trace through a real vLLM engine on this CPU
(tiny dummy-weight Qwen2) three times: vLLM's own scheduler alone, FCFS
decisions carried out by `PolicyScheduler`, and TOPAS. Scheduler time per step
counts what scheduling costs around the model's forward pass:

- vLLM default: `Scheduler.schedule()` + `update_from_output()`;
- topasd: the same two calls of `PolicyScheduler` (carrying out decisions,
  gating admission, pinning prefixes), plus building the policy's view and
  validating/handing over its decision, plus the policy's own decision time.

    python bench/vllm_overhead.py              # writes its docs/RESULTS.md section
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from _results import at_least, update_section  # bench/_results.py

from backends.vllm import make_backend, write_tiny_model
from backends.vllm.workload import DEFAULT_BUDGET, chain3_cpu
from topasd.runner import Run
from topasd.scheduler import make_policy
from workflows.trace import Trace


def _run(model: Path, trace: Trace, policy: str, native: bool) -> dict[str, Any]:
    backend = make_backend(str(model), budget_tokens=DEFAULT_BUDGET, native=native)
    try:
        result = Run(trace, make_policy(policy), backend).execute()
    finally:
        backend.close()
    s = backend.stats
    decide_s = sum(result.decision_ms) / 1e3
    total = s.sched_s + (0.0 if native else s.policy_io_s + decide_s)
    return {
        "label": "vLLM default scheduler" if native else f"PolicyScheduler + {policy}",
        "steps": s.steps, "decisions": 0 if native else result.decisions,
        "engine_us": s.sched_s / s.steps * 1e6,
        "io_us": 0.0 if native else s.policy_io_s / s.steps * 1e6,
        "policy_us": 0.0 if native else decide_s / s.steps * 1e6,
        "total_us": total / s.steps * 1e6,
        "step_ms": s.busy_s / s.steps * 1e3,
        "mean_jct_s": result.summary()["mean_jct_s"],
        "preemptions": s.preemptions + s.retractions,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=at_least(1), default=12)
    ap.add_argument("--rate", type=float, default=4.0, help="task arrivals per second")
    ap.add_argument("--seed", type=at_least(0), default=1)
    ap.add_argument("--no-write", action="store_true", help="do not update docs/RESULTS.md")
    args = ap.parse_args()
    wall0 = time.perf_counter()
    trace = chain3_cpu(tasks=args.tasks, rate=args.rate, seed=args.seed, input_tokens=64,
                       output_tokens=64)
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_model(Path(tmp) / "tiny")
        _run(model, trace, "fcfs", native=True)  # warm-up: a process's first engine is slow
        rows = [_run(model, trace, "fcfs", native=True), _run(model, trace, "fcfs", False),
                _run(model, trace, "topas", False)]
    text = _report(args, rows, time.perf_counter() - wall0)
    print(text)
    if not args.no_write:
        print(f"updated {update_section('vllm_overhead', text)}")


def _report(args: argparse.Namespace, rows: list[dict[str, Any]], wall_s: float) -> str:
    base, topas = rows[0], rows[-1]
    lines = [
        "## Scheduler overhead in vLLM (`bench/vllm_overhead.py`)",
        "",
        f"Command: `python bench/vllm_overhead.py --tasks {args.tasks} --rate {args.rate} "
        f"--seed {args.seed}` ({wall_s / 60:.1f} min). The same Chain-3 trace "
        f"(`backends/vllm/workload.py`, 64 input and 64 output tokens per stage, "
        f"{DEFAULT_BUDGET}-token KV pool) through vLLM 0.32 on this CPU with the tiny "
        "dummy-weight Qwen2, once per scheduler after one discarded warm-up run. Times "
        "are wall-clock per engine step: "
        "vLLM's `schedule()` + `update_from_output()` (engine part); for topasd also "
        "the view and decision hand-over (I/O) and the policy's `decide()`.",
        "",
        "| scheduler | steps | decisions | engine part | view + apply | policy | total "
        "per step | engine step | mean JCT | preemptions + retractions |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['steps']} | {r['decisions']} | {r['engine_us']:.0f} us | "
            f"{r['io_us']:.0f} us | {r['policy_us']:.0f} us | {r['total_us']:.0f} us | "
            f"{r['step_ms']:.2f} ms | {r['mean_jct_s']:.3f} s | {r['preemptions']} |")
    lines += [
        "",
        f"Ratio, TOPAS to vLLM's default scheduler, scheduler time per step: "
        f"**{topas['total_us'] / base['total_us']:.2f}x** "
        f"({topas['total_us']:.0f} us vs {base['total_us']:.0f} us; the whole engine step "
        f"takes {topas['step_ms']:.2f} ms). Wall-clock numbers on a shared 2-core machine: "
        "reruns move them by some percent.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
