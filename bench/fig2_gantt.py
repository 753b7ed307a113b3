"""Fig. 2 of the paper as Gantt charts: LPM vs SRPT (`spf`) on A -> B -> C.

Three tasks at t=0 on the `unit` profile (every engine step 1 unit); every
prefix 10 tokens (1 unit over the host link: the prefix setup), every request
1 input + 4 output tokens (4 units); a KV budget of 15 tokens holds one prefix
and one request. `SimBackend(profile, warm_host=True)`: every prefix starts
with a host copy. Both runs go into one decision log; each is exported with
`topasd gantt` and screenshotted with headless Chromium.

    python bench/fig2_gantt.py [--out docs] [--db fig2.db] [--html-dir DIR]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from backends.sim.engine import SimBackend
from console.gantt import export_gantt, figure_height, screenshot
from store import Store
from topasd.model import Workflow
from topasd.profiles import HardwareProfile, get_profile
from topasd.runner import Run
from topasd.scheduler import make_policy
from workflows.spec import workflow_from_dict
from workflows.trace import RoundSpec, TaskRecord, Trace

PREFIX_TOKENS = 10  # 1 unit over the unit profile's 10 B/unit host link
INPUT_TOKENS, OUTPUT_TOKENS = 1, 4  # 1 prefill step + 3 decode steps = 4 units
POLICIES = ("lpm", "spf")


def fig2_workflow() -> Workflow:
    stage = {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS}
    return workflow_from_dict({
        "name": "fig2",
        "description": "Fig. 2: A -> B -> C, one prefix fits",
        "agents": {a: {"prefix_tokens": PREFIX_TOKENS} for a in "ABC"},
        "stages": [{"name": "a", "agent": "A", **stage},
                   {"name": "b", "agent": "B", "after": ["a"], **stage},
                   {"name": "c", "agent": "C", "after": ["b"], **stage}],
    })


def fig2_trace(n_tasks: int = 3) -> Trace:
    wf = fig2_workflow()
    one = (RoundSpec(INPUT_TOKENS, OUTPUT_TOKENS, 0.0),)
    tasks = tuple(TaskRecord(i, wf.name, 0.0, {"a": one, "b": one, "c": one})
                  for i in range(n_tasks))
    return Trace({wf.name: wf}, tasks, {"workload": "fig2", "tasks": n_tasks})


def fig2_profile() -> HardwareProfile:
    """Room for one prefix and one request."""
    return get_profile("unit").with_overrides(budget_tokens=PREFIX_TOKENS + INPUT_TOKENS
                                              + OUTPUT_TOKENS)


def replay_fig2(db: Path) -> dict[str, tuple[int, dict[str, float]]]:
    """Replay the scenario under each policy into `db`: policy -> (run id, summary)."""
    out: dict[str, tuple[int, dict[str, float]]] = {}
    with Store(db) as store:
        for policy in POLICIES:
            sink = store.sink("all")
            backend = SimBackend(fig2_profile(), warm_host=True)
            result = Run(fig2_trace(), make_policy(policy), backend, sink=sink).execute()
            assert sink.run_id is not None
            out[policy] = (sink.run_id, result.summary())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs"), help="where the PNGs go")
    ap.add_argument("--db", type=Path, default=None, help="decision log (default: temporary)")
    ap.add_argument("--html-dir", type=Path, default=None,
                    help="keep the HTML charts here (default: temporary)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fig2-") as tmp:
        db = args.db or Path(tmp) / "fig2.db"
        html_dir = args.html_dir or Path(tmp)
        html_dir.mkdir(parents=True, exist_ok=True)
        runs = replay_fig2(db)
        print("| policy | run | mean JCT | completions | prefix loads | PNG |")
        print("|---|---|---|---|---|---|")
        for policy, (run_id, summary) in runs.items():
            html = html_dir / f"fig2-{policy}.html"
            png = args.out / f"fig2-{policy}.png"
            gantt = export_gantt(db, html, run_id=run_id, view="agents")
            screenshot(html, png, width=1100, height=figure_height(gantt) + 10)
            print(f"| {policy} | {run_id} | {summary['mean_jct_s']:.1f} "
                  f"| first {summary['first_task_s']:.0f}, last {summary['makespan_s']:.0f} "
                  f"| {summary['prefix_loads']} | {png} |")


if __name__ == "__main__":
    main()
