"""Reproduce the paper's comparison (section V): TOPAS vs the five baselines on
the five workloads at three operating points each, plus the MetaGPT-TL ablation.

    python bench/paper.py [--tasks 200] [--seed 1] [--jobs 2] [--no-write]

One arrival trace per operating point is shared by every policy. Two engine
set-ups are reported:

* paper: as in the paper, the baselines run on the engine's defaults (SGLang
  0.5.3 without a host cache: an evicted prefix is recomputed), while TOPAS
  moves prefixes to and from host memory (`host_cache`);
* same engine: every policy on the engine with the host cache (HiCache-like),
  so only the scheduling decisions differ.

Workload-level numbers average each metric over the operating points; the
comparator is the baseline with the lowest average for that metric (the
paper's rule). The peers (docs/topas.md, "Peers") run on the same engine
too, and a further table sets TOPAS against the best of all there, peers
included. Writes the `paper` section of docs/RESULTS.md, the charts
docs/paper-jct.html and docs/paper-jct.png, and docs/paper-results.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from multiprocessing import Pool
from pathlib import Path
from typing import Any

from _results import at_least, update_section  # bench/_results.py
from _waits import Waits  # bench/_waits.py

from backends.sim.engine import SimBackend
from topasd.profiles import DEFAULT_PROFILE, HardwareProfile, get_profile
from topasd.runner import Run
from topasd.scheduler import make_policy
from topasd.scheduler.baselines import BASELINES
from topasd.scheduler.peers import PEERS
from workflows.builtin import load_workload
from workflows.trace import Trace, generate_trace

WORKLOADS = ("chain3", "dag4", "dag10wide", "metagpt-sop", "metagpt-tl")
PAPER = {  # reductions (%) of mean / p99 JCT vs the best baseline (CALIBRATION.md)
    "chain3": (27.5, 31.7),
    "dag4": (39.8, 49.4),
    "dag10wide": (27.7, 30.8),
    "metagpt-sop": (9.8, 4.5),
    "metagpt-tl": (22.0, 26.6),
}
ABLATION = ("topas", "topas-base", "topas-noreuse", "topas-noaging")
ABLATION_POINT = ("metagpt-tl", 0.0175)
PAPER_ABLATION = (60.5, 53.6)  # full vs topas-base, mean / p99
DOCS = Path(__file__).resolve().parent.parent / "docs"


@dataclass(frozen=True)
class Job:
    workload: str
    rate: float
    policy: str
    engine: str  # "paper" (baseline without host cache) or "same"
    tasks: int
    seed: int


def operating_point(workload: str, rate: float, tasks: int, seed: int, topas: bool,
                    engine: str = "paper") -> tuple[Trace, HardwareProfile]:
    """The fixed arrival trace of one operating point, and the engine a policy
    runs on: TOPAS always moves prefixes to host memory; the baselines do only
    on the same engine (`engine="same"`), else they recompute evicted prefixes."""
    wl = load_workload(workload)
    trace = generate_trace(wl.workflows, rate, tasks, seed, name=wl.name)
    host_cache = engine == "same" or topas
    return trace, get_profile(DEFAULT_PROFILE).with_overrides(host_cache=host_cache)


def run_job(job: Job) -> dict[str, Any]:
    trace, profile = operating_point(job.workload, job.rate, job.tasks, job.seed,
                                     job.policy.startswith("topas"), job.engine)
    sink = Waits()
    result = Run(trace, make_policy(job.policy), SimBackend(profile), sink=sink).execute()
    row = result.summary()
    row.update(workload=job.workload, rate=job.rate, engine=job.engine,
               stage_waits=sink.per_stage(), longest_wait=sink.longest())
    return row


def jobs_for(tasks: int, seed: int, workloads: tuple[str, ...]) -> list[Job]:
    jobs = []
    for name in workloads:
        for rate in load_workload(name).operating_points:
            for policy in BASELINES:
                for engine in ("paper", "same"):
                    jobs.append(Job(name, rate, policy, engine, tasks, seed))
            for policy in ("topas", "topas-paper", *PEERS):
                jobs.append(Job(name, rate, policy, "same", tasks, seed))
    if ABLATION_POINT[0] in workloads:
        for policy in ABLATION[1:]:
            jobs.append(Job(*ABLATION_POINT, policy, "same", tasks, seed))
    return jobs


# ----------------------------------------------------------------- analysis


def workload_table(rows: list[dict[str, Any]], name: str, engine: str) -> dict[str, Any]:
    """Average each metric over the operating points; the comparator per metric
    is the baseline with the lowest average (the paper's rule)."""
    mine = [r for r in rows if r["workload"] == name]
    rates = sorted({r["rate"] for r in mine})

    def avg(policy: str, key: str, eng: str) -> float:
        vals = [r[key] for r in mine if r["policy"] == policy and r["engine"] == eng]
        return sum(vals) / len(vals)

    out: dict[str, Any] = {"workload": name, "engine": engine, "rates": rates}
    peers = engine == "same" and has_peers(mine)
    for key in ("mean_jct_s", "p99_jct_s"):
        base = {p: avg(p, key, engine) for p in BASELINES}
        best = min(base, key=base.__getitem__)
        topas = avg("topas", key, "same")
        out[key] = {"best": best, "best_value": base[best], "topas": topas,
                    "reduction_pct": 100 * (1 - topas / base[best]), "baselines": base}
        if any(r["policy"] == "topas-paper" for r in mine):
            out[key]["topas_paper"] = avg("topas-paper", key, "same")
        if peers:  # the best of all, the peers included (same engine)
            every = {**base, **{p: avg(p, key, engine) for p in PEERS}}
            top = min(every, key=every.__getitem__)
            out[key].update(best_all=top, best_all_value=every[top],
                            reduction_all_pct=100 * (1 - topas / every[top]),
                            peers={p: every[p] for p in PEERS})
    return out


def has_peers(rows: list[dict[str, Any]]) -> bool:
    """Whether the rows hold the peers' runs (older rows hold only the baselines')."""
    return any(r["policy"] in PEERS for r in rows)


def point(rows: list[dict[str, Any]], name: str, rate: float, policy: str,
          engine: str) -> dict[str, Any]:
    return next(r for r in rows if r["workload"] == name and r["rate"] == rate
                and r["policy"] == policy and r["engine"] == engine)


def render(rows: list[dict[str, Any]], args: argparse.Namespace, wall: float) -> str:
    lines = [
        "## The paper's comparison (section V)",
        "",
        f"Command: `python bench/paper.py --tasks {args.tasks} --seed {args.seed}` "
        f"({wall / 60:.1f} min on this machine). Profile `{DEFAULT_PROFILE}`; "
        f"{args.tasks} Poisson task arrivals per operating point, one trace per point "
        "shared by every policy. Reductions are TOPAS vs the best baseline per "
        "workload and metric, each metric averaged over the operating points.",
        "",
    ]
    for engine, title in (("paper", "Paper set-up: baselines without a host cache "
                           "(evicted prefixes are recomputed), TOPAS moves prefixes to host"),
                          ("same", "Same engine: every policy with the host cache")):
        lines += [f"### {title}", "",
                  "| workload | mean JCT: best baseline | TOPAS | change | paper "
                  "| topas-paper | p99 JCT: best baseline | TOPAS | change | paper "
                  "| topas-paper |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name in _names(rows):
            t = workload_table(rows, name, engine)
            m, p = t["mean_jct_s"], t["p99_jct_s"]
            pm, pp = PAPER[name]
            lines.append(
                f"| {name} | {m['best']} {m['best_value']:.1f} s | {m['topas']:.1f} s "
                f"| {-m['reduction_pct']:+.1f}% | -{pm}% | {_vs(m)} "
                f"| {p['best']} {p['best_value']:.1f} s "
                f"| {p['topas']:.1f} s | {-p['reduction_pct']:+.1f}% | -{pp}% | {_vs(p)} |")
        lines.append("")
    if has_peers(rows):
        lines += render_peers(rows)
    lines += ["(Change = TOPAS vs the best baseline: negative means TOPAS is lower, as in "
              "the paper's column. `topas` runs the extensions beyond the paper that "
              "docs/topas.md lists as defaults (\"Extensions\"); `topas-paper` is section IV as "
              "given, shown with its change against the same best baseline. The ablation "
              "variants keep every extension and turn off only what names them.)",
              "",
              "![mean and p99 JCT against arrival rate](paper-jct.png)", "",
              "Interactive charts: [paper-jct.html](paper-jct.html). Raw rows: "
              "[paper-results.json](paper-results.json).", ""]
    lines += render_points(rows)
    if any(r["policy"] == "topas-base" for r in rows):
        lines += render_ablation(rows)
    lines += render_diagnostics(rows)
    return "\n".join(lines)


def render_peers(rows: list[dict[str, Any]]) -> list[str]:
    """TOPAS against the best of all on the same engine, the peers included
    (the tables above keep the paper's five as the comparator)."""
    lines = ["### Same engine, against the best of all: the paper's baselines and the peers",
             "", f"Peers: {', '.join(PEERS)} (docs/topas.md, \"Peers\"); `bench/peers.py` "
             "gives every policy's average.", "",
             "| workload | mean JCT: best of all | TOPAS | change | p99 JCT: best of all "
             "| TOPAS | change |", "|---|---|---|---|---|---|---|"]
    for name in _names(rows):
        t = workload_table(rows, name, "same")
        m, p = t["mean_jct_s"], t["p99_jct_s"]
        lines.append(f"| {name} | {m['best_all']} {m['best_all_value']:.1f} s "
                     f"| {m['topas']:.1f} s | {-m['reduction_all_pct']:+.1f}% "
                     f"| {p['best_all']} {p['best_all_value']:.1f} s | {p['topas']:.1f} s "
                     f"| {-p['reduction_all_pct']:+.1f}% |")
    return [*lines, ""]


def _vs(metric: dict[str, Any]) -> str:
    """topas-paper's average and its change against the best baseline."""
    if "topas_paper" not in metric:
        return "-"
    v = metric["topas_paper"]
    return f"{v:.1f} s ({100 * (v / metric['best_value'] - 1):+.1f}%)"


def _names(rows: list[dict[str, Any]]) -> list[str]:
    return [w for w in WORKLOADS if any(r["workload"] == w for r in rows)]


def render_points(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["### Every operating point (mean / p99 JCT, s)", "",
             "Baselines on the paper set-up, then (in brackets) on the same engine; the "
             "lowest mean of the row (paper set-up and TOPAS) in bold.", "",
             "| workload | rate | " + " | ".join(BASELINES) + " | topas | topas-paper |",
             "|---|---|" + "---|" * (len(BASELINES) + 2)]
    for name in _names(rows):
        for rate in sorted({r["rate"] for r in rows if r["workload"] == name}):
            cells = []
            ours = point(rows, name, rate, "topas", "same")
            paper = {pol: point(rows, name, rate, pol, "paper") for pol in BASELINES}
            best = min(r["mean_jct_s"] for r in (*paper.values(), ours))
            for pol in BASELINES:
                a, b = paper[pol], point(rows, name, rate, pol, "same")
                cells.append(f"{_mean_cell(a, best)}/{a['p99_jct_s']:.0f} "
                             f"({b['mean_jct_s']:.0f}/{b['p99_jct_s']:.0f})")
            cells.append(f"{_mean_cell(ours, best)}/{ours['p99_jct_s']:.0f}")
            sec4 = point(rows, name, rate, "topas-paper", "same")
            cells.append(f"{sec4['mean_jct_s']:.0f}/{sec4['p99_jct_s']:.0f}")
            lines.append(f"| {name} | {rate} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _mean_cell(row: dict[str, Any], best: float) -> str:
    """A row's mean JCT, in bold when it is the lowest of its operating point."""
    text = f"{row['mean_jct_s']:.0f}"
    return f"**{text}**" if row["mean_jct_s"] == best else text


def render_ablation(rows: list[dict[str, Any]]) -> list[str]:
    name, rate = ABLATION_POINT
    got = {p: point(rows, name, rate, p, "same") for p in ABLATION}
    base = got["topas-base"]
    lines = [f"### Ablation on MetaGPT-TL at {rate} task/s", "",
             "| variant | mean JCT s | p99 JCT s | full TOPAS vs variant: mean | p99 |",
             "|---|---|---|---|---|"]
    full = got["topas"]
    for pol, r in got.items():
        dm = 100 * (full["mean_jct_s"] / r["mean_jct_s"] - 1)
        dp = 100 * (full["p99_jct_s"] / r["p99_jct_s"] - 1)
        lines.append(f"| {pol} | {r['mean_jct_s']:.1f} | {r['p99_jct_s']:.1f} | "
                     f"{'' if pol == 'topas' else f'{dm:+.1f}%'} | "
                     f"{'' if pol == 'topas' else f'{dp:+.1f}%'} |")
    dm = 100 * (full["mean_jct_s"] / base["mean_jct_s"] - 1)
    dp = 100 * (full["p99_jct_s"] / base["p99_jct_s"] - 1)
    lines += ["", f"Full TOPAS vs TOPAS-base: {dm:+.1f}% mean / {dp:+.1f}% p99 "
              f"(paper: -{PAPER_ABLATION[0]}% / -{PAPER_ABLATION[1]}%).", ""]
    return lines


def render_diagnostics(rows: list[dict[str, Any]]) -> list[str]:
    """Decision data at each workload's heaviest point, TOPAS beside the baseline
    and the peer with the lowest mean JCT there (same engine), for the
    explanations."""
    lines = ["### Decision data at the heaviest point (same engine)", "",
             "| workload | policy | mean / p50 / p99 JCT s | makespan s | mean batch "
             "| prefix loads "
             "| preemptions | retractions | recomputed tokens | first task s "
             "| mean wait per stage s | longest wait s (stage) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in _names(rows):
        mine = [r for r in rows if r["workload"] == name]
        rate = max(r["rate"] for r in mine)
        best = [min((point(rows, name, rate, p, "same") for p in group),
                    key=lambda r: r["mean_jct_s"])
                for group in (BASELINES, PEERS) if any(r["policy"] in group for r in mine)]
        ours = [point(rows, name, rate, p, "same") for p in ("topas", "topas-paper")
                if any(r["policy"] == p for r in mine)]
        for r in (*best, *ours):
            waits = ", ".join(f"{s} {w:.1f}" for s, w in r["stage_waits"].items())
            lines.append(
                f"| {name} @ {rate} | {r['policy']} | {r['mean_jct_s']:.0f} / "
                f"{r['p50_jct_s']:.0f} / {r['p99_jct_s']:.0f} | {r['makespan_s']:.0f} | "
                f"{r['mean_batch']:.1f} | "
                f"{r['prefix_loads']} | {r['preemptions']} | {r['retractions']} | "
                f"{r['recomputed_tokens']} | {r['first_task_s']:.0f} | {waits} | "
                f"{r['longest_wait'][0]:.0f} ({r['longest_wait'][1]}) |")
    return [*lines, ""]


def charts(rows: list[dict[str, Any]], html: Path) -> None:
    """Mean and p99 JCT against arrival rate, one row of panels per workload."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    names = _names(rows)
    fig = make_subplots(rows=len(names), cols=2, subplot_titles=[
        f"{n}: {m}" for n in names for m in ("mean JCT (s)", "p99 JCT (s)")],
        vertical_spacing=0.06)
    colours = dict(zip((*BASELINES, "topas"), ("#7f7f7f", "#1f77b4", "#2ca02c", "#9467bd",
                                              "#ff7f0e", "#d62728"), strict=True))
    for i, name in enumerate(names, start=1):
        rates = sorted({r["rate"] for r in rows if r["workload"] == name})
        for pol in (*BASELINES, "topas"):
            for eng, dash in (("paper", "solid"), ("same", "dot")):
                if pol == "topas" and eng == "paper":
                    continue
                pts = [point(rows, name, x, pol, eng) for x in rates]
                label = pol if pol == "topas" else f"{pol} ({eng})"
                for col, key in ((1, "mean_jct_s"), (2, "p99_jct_s")):
                    fig.add_trace(go.Scatter(
                        x=rates, y=[p[key] for p in pts], mode="lines+markers", name=label,
                        legendgroup=label, showlegend=(i == 1 and col == 1),
                        line={"color": colours[pol], "dash": dash,
                              "width": 4 if pol == "topas" else 1.5}), row=i, col=col)
                fig.update_xaxes(title_text="arrival rate (task/s)", row=i)
    fig.update_layout(height=330 * len(names), width=1300, template="plotly_white",
                      title="JCT against arrival rate (solid: paper set-up, dotted: same "
                            "engine; TOPAS bold)")
    fig.write_html(html, include_plotlyjs=True, full_html=True)


# --------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=at_least(1), default=200)
    ap.add_argument("--seed", type=at_least(0), default=1)
    ap.add_argument("--jobs", type=at_least(1), default=2)
    ap.add_argument("--workloads", nargs="*", default=list(WORKLOADS),
                    help="a subset to run (printed only: RESULTS records every workload)")
    ap.add_argument("--no-write", action="store_true", help="print, do not touch docs/")
    args = ap.parse_args()
    unknown = sorted(set(args.workloads) - set(WORKLOADS))
    if unknown or not args.workloads:
        ap.error(f"--workloads: choose among {', '.join(WORKLOADS)} (got {unknown or 'none'})")
    if sorted(args.workloads) != sorted(WORKLOADS) and not args.no_write:
        ap.error("a subset of --workloads would replace the whole comparison in "
                 "docs/RESULTS.md under a command that runs them all; add --no-write")
    jobs = jobs_for(args.tasks, args.seed, tuple(args.workloads))
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with Pool(args.jobs) as pool:
        for i, row in enumerate(pool.imap_unordered(run_job, jobs), start=1):
            rows.append(row)
            if sys.stderr.isatty() or i == len(jobs) or i % 20 == 0:
                print(f"{i}/{len(jobs)} runs", file=sys.stderr, flush=True)
    text = render(rows, args, time.perf_counter() - t0)
    if args.no_write:
        print(text)
        return
    html = DOCS / "paper-jct.html"
    charts(rows, html)
    (DOCS / "paper-results.json").write_text(json.dumps(
        sorted(rows, key=lambda r: (r["workload"], r["rate"], r["policy"], r["engine"])),
        indent=1))
    try:
        from console.gantt import screenshot

        screenshot(html, DOCS / "paper-jct.png", width=1300,
                   height=330 * len(_names(rows)) + 120)
    except Exception as exc:  # no browser here: the HTML still holds the charts
        print(f"warning: no PNG of the charts ({exc})", file=sys.stderr)
    print(update_section("paper", text))


if __name__ == "__main__":
    main()
