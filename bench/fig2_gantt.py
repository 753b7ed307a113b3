"""Fig. 2 of the paper as Gantt charts: LPM vs SRPT (`spf`) on A -> B -> C.

Three tasks at t=0 on `workflows.fig2.fig2_profile(1)` (every engine step 1
unit); every prefix 100 tokens (1 unit over the host link: the prefix setup),
every request 1 input + 4 output tokens (4 units); a KV budget of 105 tokens
holds one prefix and one request. `SimBackend(profile, warm_host=True)`:
every prefix starts with a host copy. Both runs go into one decision log; each is exported with
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
from topasd.runner import Run
from topasd.scheduler import make_policy
from workflows.fig2 import fig2_profile, fig2_trace

POLICIES = ("lpm", "spf")


def replay_fig2(db: Path) -> dict[str, tuple[int, dict[str, float]]]:
    """Replay the scenario under each policy into `db`: policy -> (run id, summary)."""
    out: dict[str, tuple[int, dict[str, float]]] = {}
    with Store(db) as store:
        for policy in POLICIES:
            sink = store.sink("all")
            backend = SimBackend(fig2_profile(1), warm_host=True)
            trace = fig2_trace([0.0] * 3)
            result = Run(trace, make_policy(policy), backend, sink=sink).execute()
            assert sink.run_id is not None
            out[policy] = (sink.run_id, result.summary())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
