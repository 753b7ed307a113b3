"""`topasd sweep`: rates, re-timed traces, the pools' identical rows, the
numbers equal to single `topasd replay` runs, saturation points, and the
chart rendered by headless Chromium offline (skipped only without chromium)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from console.gantt import dump_dom, find_chromium
from topasd.cli import main
from topasd.model import TopasError
from topasd.tuning.pools import InlinePool, LocalPool, open_pool
from topasd.tuning.replays import WALL_CLOCK_FIELDS, ReplayJob, retime, run_replay, trace_rate
from topasd.tuning.sweep import (
    average,
    parse_rates,
    saturation,
    sweep_cases,
    workload_traces,
)
from workflows.builtin import load_workload
from workflows.trace import generate_trace, save_trace

needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="chromium is not installed")
TINY = ["-w", "dag4", "-n", "8"]  # 8 tasks: a replay in a few tens of ms


def run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def sweep_json(tmp_path: Path, *args: str) -> dict[str, Any]:
    res = run("sweep", *args, "--json", "--html", str(tmp_path / "s.html"))
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


# ------------------------------------------------------------------ rates


@pytest.mark.parametrize(("text", "rates"), [
    ("0.1:0.3:5", (0.1, 0.15, 0.2, 0.25, 0.3)),
    ("0.2", (0.2,)),
    ("0.1, 0.2,0.4", (0.1, 0.2, 0.4)),
])
def test_rates_are_a_range_or_a_list(text: str, rates: tuple[float, ...]) -> None:
    assert parse_rates(text) == pytest.approx(rates)


@pytest.mark.parametrize(("text", "says"), [
    ("0.3:0.1:5", "LOW < HIGH"),
    ("0.1:0.3:1", "N >= 2"),
    ("0.1:0.3", "LOW:HIGH:N"),
    ("0.1:0.3:x", "not a whole number"),
    ("0.1,fast", "'fast' is not a number"),
    ("0,0.1", "not a rate > 0"),
    ("0.2,0.1", "increasing order"),
    ("0.1,0.1", "each once"),
    ("nan", "not a rate > 0"),
])
def test_bad_rates_are_one_clear_line(text: str, says: str, tmp_path: Path) -> None:
    with pytest.raises(TopasError, match=re.escape(says)):
        parse_rates(text)
    res = run("sweep", *TINY, "--rates", text, "--html", str(tmp_path / "s.html"))
    assert res.exit_code == 2 and res.output.startswith("error: --rates") and says in res.output


# ------------------------------------------------------------------ traces


def test_retiming_scales_the_gaps_and_keeps_the_tasks(tmp_path: Path) -> None:
    wl = load_workload("dag4")
    tr = generate_trace(wl.workflows, 0.2, 12, 3, name="dag4")
    slow = retime(tr, 0.1)
    assert trace_rate(slow) == 0.1 and [t.stages for t in slow.tasks] == \
        [t.stages for t in tr.tasks]
    assert [t.arrival for t in slow.tasks] == pytest.approx([2 * t.arrival for t in tr.tasks])
    meta_less = retime(tr, 0.2)
    object.__setattr__(meta_less, "meta", {})  # a trace whose header gives no rate
    assert trace_rate(meta_less) == pytest.approx(11 / tr.tasks[-1].arrival)


def test_a_workload_seed_draws_the_same_tasks_at_every_rate() -> None:
    """Why a workload's sweep replays exactly `topasd replay -w W -r R -s S`:
    the sample at each rate is the seed's sample re-timed."""
    traces = workload_traces("metagpt-tl", (0.1, 0.3), (0, 1), 10)  # sampled sizes
    by_seed = {s: [traces[f"rate={r!r} seed={s}"] for r in (0.1, 0.3)] for s in (0, 1)}
    for light, heavy in by_seed.values():
        assert [t.stages for t in light.tasks] == [t.stages for t in heavy.tasks]
        assert [t.arrival for t in heavy.tasks] == pytest.approx(
            [round(t.arrival / 3, 6) for t in light.tasks], abs=2e-6)
    assert [t.stages for t in by_seed[0][0].tasks] != [t.stages for t in by_seed[1][0].tasks]


# ------------------------------------------------------------------ pools


def test_every_pool_gives_the_rows_of_the_replays_one_by_one() -> None:
    traces = workload_traces("dag4", (0.2,), (0,), 8)
    (key,) = traces
    jobs = [ReplayJob.of(key, p) for p in ("topas", "lpm", "fcfs")] + [
        ReplayJob.of(key, "topas", {"beta": 5, "M": 3})]
    expected = [run_replay(j, traces[key]) for j in jobs]
    assert not set(WALL_CLOCK_FIELDS) & set(expected[0])
    assert expected[3]["params"] == {"M": 3, "beta": 5}
    seen: list[int] = []
    with InlinePool(traces) as inline, LocalPool(traces, 2) as local:
        assert inline.run(jobs) == expected
        assert local.run(jobs, lambda: seen.append(1)) == expected
    assert len(seen) == len(jobs)
    with pytest.raises(TopasError, match="no trace 'other'"), InlinePool(traces) as pool:
        pool.run([ReplayJob.of("other", "fcfs")])
    with pytest.raises(TopasError, match="--workers must be at least 1"):
        open_pool(traces, workers=0)


# ------------------------------------------------------------------ the command


def test_sweep_numbers_equal_single_replays(tmp_path: Path) -> None:
    out = sweep_json(tmp_path, *TINY, "--rates", "0.15,0.3", "--seeds", "2", "-p", "topas",
                     "-p", "lpm", "--workers", "2")
    assert len(out["runs"]) == 2 * 2 * 2 and out["seeds"] == 2
    for r in out["runs"]:
        res = run("replay", *TINY, "-r", str(r["rate"]), "-s", str(r["seed"]), "-p",
                  r["policy"], "--json")
        (single,) = json.loads(res.stdout)["runs"]
        assert {k: v for k, v in single.items() if k not in WALL_CLOCK_FIELDS} == \
            {k: v for k, v in r.items() if k not in ("rate", "seed")}
    means = {(p["policy"], p["rate"]): p["mean_jct_s"] for p in out["points"]}
    for (policy, rate), mean in means.items():
        runs = [r["mean_jct_s"] for r in out["runs"] if (r["policy"], r["rate"]) == (policy, rate)]
        assert mean == pytest.approx(sum(runs) / 2)


def test_the_table_marks_each_policys_saturation(tmp_path: Path) -> None:
    res = run("sweep", "-w", "dag4", "-n", "40", "--rates", "0.05,0.3", "-p", "fcfs", "-p",
              "topas", "--workers", "1", "--html", str(tmp_path / "s.html"))
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[1].split() == ["policy", "rate", "mean", "JCT", "p50", "p99", "req/s",
                                "preempt", "recomp", "tok"]
    rows = [ln.split() for ln in lines[2:6]]
    assert [(r[0], r[1]) for r in rows] == [("fcfs", "0.05"), ("fcfs", "0.3"),
                                            ("topas", "0.05"), ("topas", "0.3")]
    fcfs_light, fcfs_heavy = float(rows[0][2]), float(rows[1][2])
    assert fcfs_heavy >= 2 * fcfs_light and rows[1][-1] == "saturated"
    assert float(rows[3][2]) < 2 * float(rows[2][2]) and rows[3][-1] != "saturated"
    assert lines[-1].endswith("fcfs at 0.3 task/s; topas not within the rates")


def test_saturation_is_the_first_rate_at_twice_the_lightest_jct() -> None:
    points = [{"policy": p, "rate": r, "mean_jct_s": j} for p, r, j in (
        ("a", 0.1, 10.0), ("a", 0.2, 19.9), ("a", 0.3, 20.0), ("a", 0.4, 90.0),
        ("b", 0.1, 10.0), ("b", 0.2, 12.0))]
    assert saturation(points) == {"a": 0.3, "b": None}


def test_average_is_over_seeds_per_policy_and_rate() -> None:
    cases = sweep_cases(["x", "y"], [0.1, 0.2], [0, 1])
    assert [c.rate for c in cases[:4]] == [0.2] * 4  # the heaviest first
    keys = ("mean_jct_s", "p50_jct_s", "p99_jct_s", "throughput_req_s", "preemptions",
            "recomputed_tokens", "makespan_s", "retractions", "prefix_loads")
    rows = [dict.fromkeys(keys, float(c.seed) + c.rate) for c in cases]
    points = average(cases, rows)
    assert [(p["policy"], p["rate"], p["seeds"]) for p in points] == [
        ("x", 0.1, 2), ("x", 0.2, 2), ("y", 0.1, 2), ("y", 0.2, 2)]
    assert points[0]["mean_jct_s"] == pytest.approx(0.6)


def test_a_trace_file_is_retimed_around_its_own_rate(tmp_path: Path) -> None:
    wl = load_workload("chain3")
    path = tmp_path / "t.jsonl"
    save_trace(generate_trace(wl.workflows, 0.2, 6, 0, name="chain3"), path)
    out = sweep_json(tmp_path, str(path), "-p", "fcfs", "--workers", "1")
    assert out["rates"] == pytest.approx([0.1, 0.15, 0.2, 0.25, 0.3])
    assert out["trace"]["workload"] == "chain3" and out["seeds"] == 1
    res = run("sweep", str(path), "--seeds", "2", "--html", str(tmp_path / "s.html"))
    assert res.exit_code == 2 and "--seeds draws samples of a --workload" in res.output


@pytest.mark.parametrize(("args", "says"), [
    (["--html", "{tmp}"], "is a folder"),
    (["--html", "{tmp}/no/s.html"], "does not exist"),
    (["-p", "nope"], "unknown policy 'nope'"),
    (["--param", "beta=5", "-p", "lpm"], "no TOPAS policy is selected"),
    (["--ray", "auto", "--workers", "2"], "drop one of them"),
])
def test_sweep_usage_errors(tmp_path: Path, args: list[str], says: str) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--html" not in argv:
        argv += ["--html", str(tmp_path / "s.html")]
    res = run("sweep", *TINY, "--rates", "0.2", *argv)
    assert res.exit_code == 2 and res.output.startswith("error: ") and says in res.output


def test_a_ray_address_where_nothing_answers_fails_fast(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="ray is not installed (pip install 'topasd[tune]')")
    res = run("sweep", *TINY, "--rates", "0.2", "--ray", "127.0.0.1:9", "--html",
              str(tmp_path / "s.html"))
    assert res.exit_code == 2
    assert res.output.startswith("error: --ray 127.0.0.1:9: nothing answers at 127.0.0.1:9")


def test_sweep_without_ray_says_what_to_install(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "ray", None)
    res = run("sweep", *TINY, "--rates", "0.2", "--ray", "auto", "--html",
              str(tmp_path / "s.html"))
    assert res.exit_code == 2
    assert "--ray needs ray, which is not installed: pip install 'topasd[tune]'" in res.output


# ------------------------------------------------------------------ the chart


@needs_chromium
def test_the_chart_draws_one_line_per_policy_offline(tmp_path: Path) -> None:
    html, png = tmp_path / "sweep.html", tmp_path / "sweep.png"
    res = run("sweep", *TINY, "--rates", "0.05:0.4:3", "-p", "fcfs", "-p", "lpm", "-p",
              "topas", "--html", str(html), "--png", str(png), "-q")
    assert res.exit_code == 0, res.output
    page = html.read_text()
    assert not re.search(r"<script[^>]+src=", page)  # plotly.js is inline
    dom = dump_dom(html, offline=True)  # no host resolves but 127.0.0.1
    legend = re.findall(r'class="legendtext"[^>]*>([^<]*)<', dom)
    assert legend == ["fcfs", "lpm", "topas"]
    lines = re.findall(r'<g class="lines"><path class="js-line"', dom)  # not the legend's
    assert len(lines) == 2 * 3  # a line per policy in each panel (mean, p99)
    assert {"mean JCT (s)", "p99 JCT (s)"} <= set(re.findall(r">([^<>]+ JCT \(s\))<", dom))
    assert "saturated" not in legend and "fcfs saturates" not in legend
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
