"""The benches' comparators on hand-made rows: "best baseline" stays the best
of the paper's five (issue 25's bounds are stated against it) and "best of
all" takes the peers in too, in bench/paper.py, bench/generalization.py and
bench/bursts.py; and a peer's or TOPAS's sources never key a baseline's
cached replay."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.benchkit import load_bench
from topasd.scheduler.baselines import BASELINES
from topasd.scheduler.peers import PEERS

KEEP_ZERO = {"makespan_s": 100.0, "mean_batch": 4.0, "prefix_loads": 10, "prefix_computes": 5,
             "preemptions": 0, "retractions": 0, "recomputed_tokens": 1000, "decisions": 50,
             "decision_p99_ms": 1.0, "wall_s": 1.0}


def _cells(text: str, start: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith(start))
    return [c.strip() for c in line.strip("|").split("|")]


# ------------------------------------------------------------ generalization


@pytest.fixture(scope="module")
def gen() -> Any:
    return load_bench("generalization")


def _case_rows(gen: Any, means: dict[str, float], case: tuple[str, int, str],
               rows: dict[Any, dict[str, Any]]) -> None:
    family, seed, load = case
    for policy, mean in means.items():
        job = gen.Job(family, seed, load, policy, 10, (), 1.0)
        rows[job] = {**KEEP_ZERO, "mean_jct_s": mean, "p99_jct_s": 2 * mean}


def _two_cases(gen: Any) -> dict[Any, dict[str, Any]]:
    """Case A: kairos beats every baseline (best lpm 100) at 80, TOPAS 90.
    Case B: the baselines' best (spf 50) beats every peer, TOPAS 40."""
    rows: dict[Any, dict[str, Any]] = {}
    a = {p: 100.0 + 10 * i for i, p in enumerate(("lpm", *[b for b in BASELINES if b != "lpm"]))}
    a |= {p: 120.0 for p in PEERS} | {"kairos": 80.0, "topas": 90.0}
    b = {p: 60.0 for p in BASELINES} | {"spf": 50.0} | {p: 70.0 for p in PEERS}
    b["topas"] = 40.0
    _case_rows(gen, a, ("chain", 0, "heavy"), rows)
    _case_rows(gen, b, ("react", 0, "light"), rows)
    return rows


def test_generalization_compares_with_the_paper_five_unless_told_all(gen: Any) -> None:
    rows = _two_cases(gen)
    paper = gen.compare(rows, "topas")
    every = gen.compare(rows, "topas", gen.everyone_but("topas"))
    assert [r.best_mean for r in paper] == [("lpm", 100.0), ("spf", 50.0)]
    assert [r.best_mean for r in every] == [("kairos", 80.0), ("spf", 50.0)]
    assert [r.mean_ratio for r in paper] == [0.9, 0.8]
    assert every[0].mean_ratio == pytest.approx(90 / 80)
    assert every[0].best_p99 == ("kairos", 160.0)
    assert every[0].comparator["mean_jct_s"] == 80.0
    assert "topas" not in gen.everyone_but("topas")
    assert gen.everyone_but("saga") == (*BASELINES, *(p for p in PEERS if p != "saga"))


def test_generalization_standings_count_each_policys_best_cases(gen: Any) -> None:
    rows = _two_cases(gen)
    lines = gen.standings(rows, "topas", gen.everyone_but("topas"))
    kairos = next(x for x in lines if x.startswith("| kairos |"))
    cells = [c.strip() for c in kairos.strip("|").split("|")]
    assert cells[1] == "1"  # the best of all in case A only
    assert cells[2] == f"{((80 / 100) * (70 / 50)) ** 0.5:.3f}"  # vs the best paper baseline
    assert cells[3] == f"{((90 / 80) * (40 / 70)) ** 0.5:.3f}"  # topas / kairos
    assert cells[4] == "1 / 0 / 1"  # case B won, case A lost
    spf = [c.strip() for c in next(x for x in lines if x.startswith("| spf |"))
           .strip("|").split("|")]
    assert spf[1] == "1"


def test_generalization_versus_all_reports_both_comparators(gen: Any) -> None:
    rows = _two_cases(gen)
    args = argparse.Namespace(policy="topas", draws=1, tasks=10, base=0, family=None,
                              load=None, param=None, versus="all", calls=None, holdout=False,
                              logs={}, engine=())
    every = gen.compare(rows, "topas", gen.everyone_but("topas"))
    text = gen.render_versus(gen.compare(rows, "topas"), every, rows, [], args, "1 s")
    assert "--versus all" in text
    geo = _cells(text, "| geometric mean of mean-JCT ratios")
    assert geo[1] == f"{(0.9 * 0.8) ** 0.5:.3f}"  # vs the best paper baseline
    assert geo[3] == f"{(90 / 80 * 0.8) ** 0.5:.3f}"  # vs the best of all
    mean_all = next(x for x in text.splitlines() if x.startswith("| mean JCT | best of all |"))
    assert "1 / 0 / 1" in mean_all


def test_against_reads_an_earlier_json_and_names_the_cases_that_crossed(
        gen: Any, tmp_path: Path) -> None:
    rows = _two_cases(gen)
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps(gen.json_rows(gen.compare(rows, "topas"))))
    before = gen.read_ratios(earlier)
    assert before == {("chain", 0, "heavy"): (0.9, pytest.approx(0.9)),
                      ("react", 0, "light"): (0.8, pytest.approx(0.8))}
    for job in rows:  # this run: TOPAS 10% slower on the react case (0.88), 2x on chain
        if job.policy == "topas":
            scale = 1.1 if job.family == "react" else 2.0
            rows[job] = {**rows[job], "mean_jct_s": rows[job]["mean_jct_s"] * scale,
                         "p99_jct_s": rows[job]["p99_jct_s"] * scale}
    text = gen.render_against(gen.compare(rows, "topas"), before, earlier)
    assert "2 cases in both runs" in text
    geo = _cells(text, "| geometric mean of mean-JCT ratios")
    assert geo[1] == f"{(0.9 * 0.8) ** 0.5:.3f} (yes)"
    assert geo[2] == f"{(1.8 * 0.88) ** 0.5:.3f} (**no**)"
    crossed = next(x for x in text.splitlines() if x.startswith("- mean <= 1.02x"))
    assert crossed == "- mean <= 1.02x: 0 in (-), 1 out (chain #0 heavy 0.900 -> 1.800)"
    assert "Mean ratio most improved: -" in text
    assert "worsened: chain #0 heavy 0.900 -> 1.800; react #0 light 0.800 -> 0.880" in text


@pytest.mark.parametrize(("content", "why"), [
    (None, "cannot read it"),
    ("{not json", "not JSON: line 1"),
    ('{"case": 1}', "row 0 is not a case's row"),
    ('[{"case": ["chain", 0, "heavy"], "policy": {}}]', "row 0 is not a case's row"),
    ("[]", "it holds no case"),
])
def test_against_rejects_a_file_that_is_no_earlier_run(gen: Any, tmp_path: Path,
                                                        content: str | None, why: str) -> None:
    path = tmp_path / "earlier.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=r"earlier\.json: give a file an earlier") as err:
        gen.read_ratios(path)
    assert why in str(err.value)


def test_against_fails_before_any_replay(gen: Any, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:  # a replay would take minutes, and write a cache
        gen.main(["--against", str(tmp_path / "missing.json"), "--no-cache"])
    assert err.value.code == 2
    assert "missing.json: give a file an earlier" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gen.main(["--ablation", "--against", str(tmp_path / "missing.json")])
    assert "not with --ablation" in capsys.readouterr().err


def test_seeds_sets_each_bound_per_seed_and_names_the_cases_every_seed_misses(
        gen: Any) -> None:
    rows = _two_cases(gen)
    seed0 = gen.compare(rows, "topas")  # 0.9 and 0.8: both within every bound
    for job in rows:  # seed 1: the chain case 1.05x (over 1.02x), the react one 0.8x
        if job.policy == "topas" and job.family == "chain":
            rows[job] = {**rows[job], "mean_jct_s": 105.0}
    seed1 = gen.compare(rows, "topas")
    text = gen.render_seeds({0: seed0, 1: seed1})
    assert "| criterion | seed 0 | seed 1 |" in text
    share = _cells(text, "| mean JCT <= 1.02x")
    assert share[1:] == ["100.0% of cases (worst 0.900x) (yes)",
                         "50.0% of cases (worst 1.050x) (**no**)"]
    assert "- mean > 1.02x under every seed: 0 (-); under some seeds only: 1" in text
    text = gen.render_seeds({0: seed1, 1: seed1})
    assert "- mean > 1.02x under every seed: 1 (chain #0 heavy); under some seeds only: 0" \
        in text


@pytest.mark.parametrize("argv", [
    ["--seeds", "2", "-p", "lpm"],
    ["--seeds", "2", "--param", "seed=3"],
    ["--seeds", "2", "--ablation"],
])
def test_seeds_refuses_what_has_no_quantile_seed_before_any_replay(
        gen: Any, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        gen.main([*argv, "--no-cache"])
    assert err.value.code == 2
    assert "--seeds replays the judged TOPAS under its quantile seeds" in capsys.readouterr().err


def test_calls_judges_topas_on_a_call_logs_tasks(gen: Any, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    log = Path(__file__).resolve().parents[1] / "docs" / "examples" / "calls.jsonl"
    out = tmp_path / "now.json"
    gen.main(["--calls", str(log), "--tasks", "6", "--draws", "2", "--load", "heavy",
              "--load", "burst", "--jobs", "1", "--no-cache", "--worst", "1",
              "--json", str(out)])
    text = capsys.readouterr().out
    assert "## Real call logs (`bench/generalization.py`)" in text
    assert "4 cases: 2 arrival seed(s) of each of 1 call log(s) (`calls:calls`: 11 logged " \
        "tasks) x 2 loads, 6 tasks each" in text
    assert _cells(text, "| calls:calls |")[0] == "calls:calls"
    assert "| calls:calls #0 " in text  # the worst case, diagnosed from its replays
    cases = [tuple(r["case"]) for r in json.loads(out.read_text())]
    assert sorted(cases) == [("calls:calls", s, load) for s in (0, 1)
                             for load in ("burst", "heavy")]


def test_holdout_judges_topas_on_the_shapes_never_in_the_fixed_list(
        gen: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "now.json"
    gen.main(["--holdout", "--family", "tree", "--family", "long_tail", "--tasks", "6",
              "--draws", "1", "--load", "light", "--jobs", "1", "--no-cache", "--worst", "0",
              "--json", str(out)])
    text = capsys.readouterr().out
    assert "## Holdout shapes, never tuned on (`bench/generalization.py`)" in text
    assert "--holdout --family tree --family long_tail" in text  # the command reruns it
    cases = sorted(tuple(r["case"]) for r in json.loads(out.read_text()))
    assert cases == [("long_tail", 0, "light"), ("tree", 0, "light")]
    gen.main(["--holdout", "--tasks", "4", "--draws", "1", "--load", "burst", "--jobs", "1",
              "--no-cache", "--worst", "0", "--json", str(out)])
    assert {r["case"][0] for r in json.loads(out.read_text())} == set(gen.HOLDOUT)
    capsys.readouterr()
    with pytest.raises(SystemExit) as err:
        gen.main(["--holdout", "--calls", str(tmp_path / "x.jsonl"), "--no-cache"])
    assert err.value.code == 2
    assert "give one" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:  # tuned and untuned shapes are never mixed
        gen.main(["--family", "chain", "--family", "tree", "--no-cache"])
    assert err.value.code == 2
    assert "judged apart" in capsys.readouterr().err
    gen.main(["--family", "tree", "--tasks", "4", "--draws", "1", "--load", "light",
              "--jobs", "1", "--no-cache", "--worst", "0"])  # a holdout shape is a holdout run
    assert "## Holdout shapes, never tuned on" in capsys.readouterr().out


@pytest.mark.parametrize(("logs", "holdout", "engine", "kind", "section"), [
    ({}, False, (), "", "generalization"),
    ({}, False, (), "peers", "generalization-peers"),
    ({}, False, (), "ablation", "generalization-ablation"),
    ({"calls:x": ("x", "h")}, False, (), "", "generalization-calls"),
    ({"calls:x": ("x", "h")}, False, (), "ablation", "generalization-ablation-calls"),
    ({}, True, (), "peers", "generalization-peers-holdout"),
    ({}, True, (), "ablation", "generalization-ablation-holdout"),
    ({}, False, (("budget_tokens", 36000),), "", "generalization-engine-budget_tokens=36000"),
    ({}, True, (("budget_tokens", 9000), ("host_cache", False)), "",
     "generalization-holdout-engine-budget_tokens=9000-host_cache=false"),
])
def test_each_case_list_writes_its_own_sections(gen: Any, logs: dict[str, Any], holdout: bool,
                                                engine: tuple[tuple[str, Any], ...], kind: str,
                                                section: str) -> None:
    args = argparse.Namespace(logs=logs, holdout=holdout, engine=engine)
    assert gen.section_name(args, kind) == section


# ------------------------------------------------------------ --engine


def test_engine_fields_take_their_own_types_and_bad_ones_are_named(gen: Any) -> None:
    engine = gen.parse_engine(["budget_tokens=36000", "swap_bytes_per_s=5e9",
                               "host_cache=false", "t_overhead_s=0"])
    assert engine == (("budget_tokens", 36000), ("host_cache", False),
                      ("swap_bytes_per_s", 5e9), ("t_overhead_s", 0.0))
    assert [type(v) for _, v in engine] == [int, bool, float, float]
    profile = gen.engine_profile(engine)
    assert (profile.budget_tokens, profile.host_cache, profile.swap_bytes_per_s) == (
        36000, False, 5e9)
    for item, message in [("pool=3", "pool: not a field of a profile; give one of"),
                          ("name=x", "name: not a field of a profile"),
                          ("budget_tokens=3.5", "give a whole number (the default is 18000)"),
                          ("host_cache=1", "give true or false (the default is true)"),
                          ("swap_bytes_per_s=fast", "give a number"),
                          ("swap_bytes_per_s=0", "swap_bytes_per_s must be > 0"),
                          ("budget_tokens=999", "give at least 1,000 tokens")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            gen.parse_engine([item])


def test_engine_replays_every_policy_on_the_changed_profile(
        gen: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "now.json"
    argv = ["--family", "fork_join", "--tasks", "6", "--draws", "1", "--load", "heavy",
            "--jobs", "1", "--worst", "0", "--json", str(out)]
    gen.main([*argv, "--no-cache", "--engine", "budget_tokens=3000"])
    text = capsys.readouterr().out
    assert "profile `qwen2.5-32b-a100` with budget_tokens=3000. `topas` against" in text
    assert "--engine budget_tokens=3000" in text  # the command reruns it
    small = json.loads(out.read_text())[0]
    gen.main([*argv, "--no-cache"])
    assert "profile `qwen2.5-32b-a100`. `topas` against" in capsys.readouterr().out
    default = json.loads(out.read_text())[0]
    assert small["policy"]["mean_jct_s"] != default["policy"]["mean_jct_s"]
    job = gen.Job("fork_join", 0, "heavy", "lpm", 6, (), 0.05,
                  engine=(("budget_tokens", 3000),))
    trace = gen.job_trace(job)  # drawn for the engine's pool: every request fits it
    for task in trace.tasks:
        wf = trace.workflows[task.workflow]
        assert all(wf.prefix_tokens(v) + r.input_tokens + r.output_tokens <= 3000
                   for v, rounds in task.stages.items() for r in rounds)
    _, row = gen.run_job(job)
    assert "error" not in row and row["mean_jct_s"] > 0


def test_engine_keys_its_own_cached_rows_and_the_default_keeps_its_keys(
        gen: Any, tmp_path: Path) -> None:
    plain = gen.Job("chain", 0, "heavy", "lpm", 10, (), 1.0)
    bigger = gen.Job("chain", 0, "heavy", "lpm", 10, (), 1.0, engine=(("budget_tokens", 36000),))
    cache = gen.Cache(tmp_path)
    assert "engine" not in json.loads(cache._key(plain)[1])  # earlier runs' rows still hit
    cache.put(bigger, {"mean_jct_s": 2.0})
    assert cache.get(plain) is None
    cache.put(plain, {"mean_jct_s": 1.0})
    again = gen.Cache(tmp_path)
    assert (again.get(plain), again.get(bigger)) == ({"mean_jct_s": 1.0}, {"mean_jct_s": 2.0})


def test_engine_that_cannot_serve_a_case_is_named_before_the_cases(
        gen: Any, capsys: pytest.CaptureFixture[str]) -> None:
    log = Path(__file__).resolve().parents[1] / "docs" / "examples" / "calls.jsonl"
    with pytest.raises(SystemExit) as err:  # logged calls are replayed as logged: too large
        gen.main(["--calls", str(log), "--engine", "budget_tokens=1000", "--tasks", "4",
                  "--draws", "1", "--load", "heavy", "--jobs", "1", "--no-cache"])
    assert "no baseline finished calls:calls #0 on this engine" in str(err.value)
    assert "need a larger KV pool (--engine budget_tokens=)" in str(err.value)
    with pytest.raises(SystemExit) as err:
        gen.main(["--engine", "budget_tokens=10", "--no-cache"])
    assert err.value.code == 2
    assert "--engine a 10-token KV pool is too small" in capsys.readouterr().err


def test_calls_refuses_what_is_no_call_log_before_any_replay(
        gen: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "runs.jsonl"
    bad.write_text('{"task": "a", "call": "1", "agent": "x", "prompt_tokens": 10}\n')
    with pytest.raises(SystemExit) as err:
        gen.main(["--calls", str(bad), "--no-cache"])
    assert err.value.code == 2
    assert f"--calls {bad}:1:" in capsys.readouterr().err
    other = tmp_path / "b"
    other.mkdir()
    log = Path(__file__).resolve().parents[1] / "docs" / "examples" / "calls.jsonl"
    (other / "calls.jsonl").write_text(log.read_text())
    with pytest.raises(SystemExit):
        gen.main(["--calls", str(log), "--calls", str(other / "calls.jsonl"), "--no-cache"])
    assert "a second log named 'calls'; rename one" in capsys.readouterr().err


def test_a_baselines_cache_key_reads_neither_topas_nor_a_peer(gen: Any) -> None:
    sched = gen.ROOT / "topasd" / "scheduler"
    peers, topas = sched / "peers", sched / "topas.py"
    assert gen.kind_of("lpm") == "baseline" and gen.kind_of("saga") == "saga"
    assert gen.kind_of("topas-paper") == "topas"
    assert not gen.decides("baseline", peers / "saga.py")
    assert not gen.decides("baseline", peers / "estimates.py")
    assert not gen.decides("baseline", topas)
    assert gen.decides("baseline", sched / "baselines.py")
    assert gen.decides("saga", peers / "saga.py") and gen.decides("saga", sched / "residual.py")
    assert gen.decides("saga", peers / "estimates.py")
    assert not gen.decides("saga", peers / "kairos.py") and not gen.decides("saga", topas)
    assert not gen.decides("topas", peers / "saga.py") and gen.decides("topas", topas)
    assert gen.decides("topas", gen.ROOT / "topasd" / "model.py")


def test_the_cache_keeps_a_baselines_row_across_kinds(gen: Any, tmp_path: Path) -> None:
    job = gen.Job("chain", 0, "heavy", "lpm", 10, (), 1.0)
    first = gen.Cache(tmp_path)
    first.put(job, {"mean_jct_s": 1.0})
    again = gen.Cache(tmp_path)
    assert again.get(job) == {"mean_jct_s": 1.0}
    assert again.get(gen.Job("chain", 0, "heavy", "saga", 10, (), 1.0)) is None
    assert {p.name.split("-")[0] for p in tmp_path.iterdir()} == {"baseline"}


# --------------------------------------------------------------------- paper


def _paper_rows(paper: Any) -> list[dict[str, Any]]:
    """chain3 at two rates: baselines average 100 + i (lpm best, 100), saga
    averages 70 (the best of all), TOPAS 84."""
    rows = []
    for rate, extra in ((1.0, -5.0), (2.0, 5.0)):
        values = {p: 100.0 + i for i, p in enumerate(("lpm", *[b for b in BASELINES
                                                               if b != "lpm"]))}
        values |= {p: 90.0 for p in PEERS} | {"saga": 70.0, "topas": 84.0, "topas-paper": 95.0}
        for policy, value in values.items():
            engines = ("paper", "same") if policy in BASELINES else ("same",)
            for engine in engines:
                rows.append({"workload": "chain3", "rate": rate, "policy": policy,
                             "engine": engine, "mean_jct_s": value + extra,
                             "p99_jct_s": 2 * (value + extra)})
    return rows


def test_paper_keeps_the_best_baseline_and_adds_the_best_of_all() -> None:
    paper = load_bench("paper")
    rows = _paper_rows(paper)
    same = paper.workload_table(rows, "chain3", "same")["mean_jct_s"]
    assert (same["best"], same["best_value"]) == ("lpm", 100.0)
    assert same["reduction_pct"] == pytest.approx(16.0)
    assert (same["best_all"], same["best_all_value"]) == ("saga", 70.0)
    assert same["reduction_all_pct"] == pytest.approx(100 * (1 - 84 / 70))
    assert "best_all" not in paper.workload_table(rows, "chain3", "paper")["mean_jct_s"]
    cells = _cells("\n".join(paper.render_peers(rows)), "| chain3 |")
    assert cells[1] == "saga 70.0 s" and cells[2] == "84.0 s" and cells[3] == "+20.0%"
    assert cells[4] == "saga 140.0 s"


def test_paper_rows_without_peers_render_as_before() -> None:
    paper = load_bench("paper")
    rows = [r for r in _paper_rows(paper) if r["policy"] not in PEERS]
    assert not paper.has_peers(rows)
    assert "best_all" not in paper.workload_table(rows, "chain3", "same")["mean_jct_s"]


# -------------------------------------------------------------------- bursts


def test_bursts_give_topas_over_the_best_baseline_and_over_the_best_of_all() -> None:
    bursts = load_bench("bursts")
    rows = []
    for name in bursts.WORKLOADS:
        for i, policy in enumerate(bursts.POLICIES):
            mean = {"topas": 90.0, "spf": 100.0, "continuum": 60.0}.get(policy, 200.0 + i)
            rows.append({"workload": name, "rate": 1.0, "policy": policy, "mean": mean,
                         "p99": 2 * mean, "makespan": 1.0, "preemptions": 0})
    args = argparse.Namespace(tasks=5, factor=4.0, seed=1, engine="same")
    cells = _cells(bursts.render(rows, args, 1.0), "| chain3 |")
    assert cells[-2] == "0.900"
    assert cells[-1] == "**1.500**"
    assert len(cells) == 2 + len(bursts.POLICIES) + 2


# --------------------------------------------------------------- peer sweeps


def test_peer_sweeps_vary_each_chosen_parameter_alone() -> None:
    sweeps = load_bench("peer_sweeps")
    for peer in PEERS:
        chosen = sweeps.defaults(peer)
        got = sweeps.settings(peer)
        assert got[0] == ()  # the chosen setting, once
        assert len(got) == len(set(got)) == 1 + sum(len(v) - 1
                                                   for v in sweeps.GRIDS[peer].values())
        assert all(len(s) == 1 and s[0][1] != chosen[s[0][0]] for s in got[1:])
    assert sweeps.defaults("kairos") == {"slot_s": 0.5, "max_slots": 512}


def test_peer_sweeps_rank_the_chosen_value_by_geometric_mean() -> None:
    """kairos's slot_s over two cases: 0.25 is 10% better on one case and
    equal on the other; the chosen 0.5 ranks second of four."""
    sweeps = load_bench("peer_sweeps")
    means = {0.25: (90.0, 50.0), 1.0: (100.0, 60.0), 2.0: (120.0, 50.0)}
    rows = [{"peer": "kairos", "params": (), "case": c, "mean": m}
            for c, m in zip(("x", "y"), (100.0, 50.0), strict=True)]
    for value, pair in means.items():
        rows += [{"peer": "kairos", "params": (("slot_s", value),), "case": c, "mean": m}
                 for c, m in zip(("x", "y"), pair, strict=True)]
    pts = sweeps.sweep(rows, "kairos", "slot_s", 0.5)
    assert [p.value for p in pts] == [0.25, 0.5, 1.0, 2.0]
    assert pts[1].chosen and pts[1].means == {"x": 100.0, "y": 50.0}
    assert sweeps.rank(pts) == 2
    line = next(x for x in sweeps.summary(rows, ["kairos"]) if "slot_s" in x)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3:] == ["2 of 4", "0.25", f"{0.9 ** 0.5 - 1:+.1%}",
                         f"{(1.2 / 0.9) ** 0.5 - 1:.1%}"]  # 2.0 over 0.25
