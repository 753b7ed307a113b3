"""`topasd tune`: the search space from the parameter specs, a reproducible
search wherever it runs (one process, a process pool, Ray), the held-out
check, the topasd.toml fragment and PATCH body a daemon takes (a real daemon
on 127.0.0.1 for --apply), and clear errors."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.daemonkit import Daemon
from topasd.cli import main
from topasd.config import load_settings
from topasd.model import TopasError
from topasd.scheduler.param_specs import SPEC_BY_NAME
from topasd.scheduler.params import PAPER, TopasParams
from topasd.scheduler.peers import PEERS
from topasd.tuning.pools import InlinePool, LocalPool
from topasd.tuning.replays import ReplayJob, run_replay, split_by_arrival
from topasd.tuning.report import gains, verdict
from topasd.tuning.search import HELD_OUT, TRAIN, Objective, Trial, TuneResult, TuneSetup, tune
from topasd.tuning.space import SEARCHED, search_names, search_space
from topasd.tuning.sweep import sweep_cases
from workflows.builtin import load_workload
from workflows.trace import generate_trace, save_trace

pytest.importorskip("optuna", reason="optuna is not installed (pip install 'topasd[tune]')")

TINY = ["-w", "metagpt-tl", "-r", "0.02", "-n", "12"]  # 6 tasks to train on, 6 held out


def run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def tune_json(tmp_path: Path, *args: str) -> dict[str, Any]:
    res = run("tune", *TINY, "--trials", "5", "--batch", "2", "--json",
              "--toml", str(tmp_path / "t.toml"), "--patch", str(tmp_path / "t.json"), *args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def tiny_parts() -> dict[str, Any]:
    wl = load_workload("metagpt-tl")
    tr = generate_trace(wl.workflows, 0.02, 12, 0, name="metagpt-tl")
    return dict(zip((TRAIN, HELD_OUT), split_by_arrival(tr, 0.5), strict=True))


# ------------------------------------------------------------------ space


def test_the_space_lies_inside_the_specs_ranges_around_the_defaults() -> None:
    space = search_space("topas", SEARCHED, time_scale=300.0)
    assert [d.name for d in space] == list(SEARCHED)
    assert {"beta", "rho", "h_age", "m", "k", "srpt", "overdue", "keep_idle"} <= set(SEARCHED)
    defaults = TopasParams()
    for d in space:
        spec = SPEC_BY_NAME[d.name]
        assert d.nullable == spec.nullable
        if d.choices:
            assert set(d.choices) == ({True, False} if spec.kind == "bool" else
                                      set(spec.choices))
            continue
        assert spec.range is not None and spec.range[0] <= d.low < d.high <= spec.range[1]
        value = getattr(defaults, d.name)
        assert value is None or d.low <= value <= d.high
    by_name = {d.name: d for d in space}
    assert (by_name["h_age"].low, by_name["h_age"].high, by_name["h_age"].log) == (30, 3000, True)
    assert (by_name["beta"].low, by_name["beta"].high, by_name["beta"].log) == (0, 200, False)
    assert (by_name["m"].low, by_name["m"].high) == (0, 16)  # M's whole range


def test_what_is_searched_leaves_out_what_is_fixed() -> None:
    assert "beta" not in search_names(None, "topas", ["beta"])
    assert "M" not in search_names(None, "topas", []) and "m" in search_names(None, "topas", [])
    paper = search_names(None, "topas-paper", [])
    assert not set(PAPER) & set(paper) and {"beta", "rho", "preempt"} <= set(paper)
    assert search_names("beta, H_age,beta", "topas", []) == ("beta", "h_age")
    for text, policy, fixed, says in (("nope", "topas", [], "'nope' is not a TOPAS parameter"),
                                      ("beta", "topas", ["beta"], "--param fixes it"),
                                      ("srpt", "topas-paper", [], "topas-paper fixes it"),
                                      (",", "topas", [], "name at least one"),
                                      ("mu", "topas", [], "mu is the hardware's")):
        with pytest.raises(TopasError, match=says):
            search_names(text, policy, fixed)


# ------------------------------------------------------------------ the search


def test_the_search_is_the_same_in_one_process_and_in_a_pool() -> None:
    parts = tiny_parts()
    setup = TuneSetup("topas", ("beta", "rho", "h_age", "srpt", "keep_idle"), {"m": 4},
                      trials=5, batch=2, seed=7, baselines=("fcfs", "lpm"))
    with InlinePool(parts) as inline:
        one = tune(inline, setup)
    ticks: list[int] = []
    with LocalPool(parts, 2) as local:
        two = tune(local, setup, lambda: ticks.append(1))
    assert [(t.params, t.value) for t in one.trials] == [(t.params, t.value) for t in two.trials]
    assert one.held_out == two.held_out and one.train == two.train
    assert len(ticks) == 2 * 3 + 5 + 1  # every replay reported once
    first = one.trials[0]
    assert first.params == {"beta": 20.0, "rho": 1.0, "h_age": None, "srpt": 1.0,
                            "keep_idle": True}  # the defaults
    assert first.value == pytest.approx(one.train["defaults"]["mean_jct_s"])
    assert one.best.value == min(t.value for t in one.trials) <= first.value
    assert len({json.dumps(t.params, sort_keys=True) for t in one.trials}) == 5
    direct = run_replay(ReplayJob.of(HELD_OUT, "topas", {"m": 4, **one.best.params}),
                        parts[HELD_OUT])
    assert one.held_out["tuned"] == direct  # the held-out check is the best's replay
    assert one.best_baseline == min(("fcfs", "lpm"),
                                    key=lambda b: one.train[b]["mean_jct_s"])


def test_the_objective_weighs_mean_and_p99() -> None:
    row = {"mean_jct_s": 10.0, "p99_jct_s": 30.0}
    assert [Objective(w).of(row) for w in (0.0, 0.25, 1.0)] == [10.0, 15.0, 30.0]
    assert [Objective(w).label for w in (0.0, 0.25, 1.0)] == [
        "mean JCT", "0.75 x mean + 0.25 x p99 JCT", "p99 JCT"]
    with pytest.raises(TopasError, match=r"--p99-weight must be in \[0, 1\]"):
        Objective(1.5)


@pytest.mark.parametrize(("train", "held", "says"), [
    (90.0, 90.0, "the gain holds on the held-out tasks"),
    (99.5, 90.0, "more chance than fit"),
    (90.0, 99.5, "does not hold on the held-out tasks"),
    (100.0, 100.0, "nothing better than the defaults"),
])
def test_the_verdict_needs_a_gain_on_both_parts(train: float, held: float, says: str) -> None:
    def row(mean: float) -> dict[str, Any]:
        return {"mean_jct_s": mean, "p99_jct_s": 2 * mean, "tasks": 5}

    best = Trial(3, {"beta": 5.0}, train, row(train))
    result = TuneResult(TuneSetup("topas", ("beta",)), (), (best,), best,
                        {"defaults": row(100.0)}, {"tuned": row(held), "defaults": row(100.0)})
    assert says in verdict(result)
    assert gains(result)["held_out_vs_defaults"] == pytest.approx(1 - held / 100)


def test_tune_reports_writes_and_repeats_itself(tmp_path: Path) -> None:
    out = tune_json(tmp_path, "--search", "beta,rho,srpt", "--param", "M=4",
                    "--objective", "mix", "--p99-weight", "0.5")
    again = tune_json(tmp_path, "--search", "beta,rho,srpt", "--param", "M=4",
                      "--objective", "mix", "--p99-weight", "0.5", "--workers", "1")
    assert out["trials"] == again["trials"] and out["held_out"] == again["held_out"]
    assert out["objective"] == "0.5 x mean + 0.5 x p99 JCT" and len(out["trials"]) == 5
    assert set(out["held_out"]) == {"tuned", "defaults", "fcfs", "lpm", "parrot-fcfs",
                                    "autellix-las", "spf", *PEERS}
    best = out["best"]["params"]
    assert best["m"] == 4 and set(best) == {"m", "beta", "rho", "srpt"}
    body = json.loads((tmp_path / "t.json").read_text())
    assert body == {"policy": "topas", **best}
    frag = (tmp_path / "t.toml").read_text()
    assert tomllib.loads(frag) == {"policy": "topas", "params": best}
    loaded = load_settings(config=str(tmp_path / "t.toml"), environ={}).settings
    assert loaded.policy == "topas" and loaded.params == best  # what the daemon reads


def test_the_text_report_compares_on_the_held_out_part(tmp_path: Path) -> None:
    res = run("tune", *TINY, "--trials", "3", "--search", "beta", "--toml",
              str(tmp_path / "t.toml"), "--patch", str(tmp_path / "t.json"))
    assert res.exit_code == 0, res.output
    text = res.stdout
    assert text.startswith("tuned topas on metagpt-tl (12 tasks): 3 trials (TPE, seed 0, 4 at "
                           "a time, on 2 local processes); objective: mean JCT")
    assert "training part: the first 6 tasks by arrival; held out: the last 6" in text
    assert "topas, tuned" in text and "topas, defaults" in text and "(best baseline)" in text
    assert "held out: tuned " in text and "vs the defaults (training: " in text
    assert "best: trial " in text
    assert f"wrote {tmp_path / 't.toml'}" in res.stderr


def test_unset_parameters_are_null_in_the_body_and_comments_in_toml(tmp_path: Path) -> None:
    out = tune_json(tmp_path, "--search", "beta", "--param", "overdue=null")
    assert out["best"]["params"]["overdue"] is None
    assert json.loads((tmp_path / "t.json").read_text())["overdue"] is None
    frag = (tmp_path / "t.toml").read_text()
    assert "give `topasd start --param overdue=null`" in frag
    assert "overdue" not in tomllib.loads(frag)["params"]


def test_apply_patches_a_running_daemon_with_its_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("a-token-of-twenty-chars\n")
    token.chmod(0o600)
    with Daemon(tmp_path / "d", "--policy", "lpm", "--token-file", str(token),
                token="a-token-of-twenty-chars") as d:
        wrong = tmp_path / "wrong"
        wrong.write_text("not-the-token\n")
        res = run("tune", *TINY, "--trials", "2", "--search", "beta", "--apply", d.url,
                  "--token-file", str(wrong), "--toml", str(tmp_path / "w.toml"), "--patch",
                  str(tmp_path / "w.json"))
        assert res.exit_code == 2 and "the daemon refused the parameters (HTTP 403)" in \
            res.output and (tmp_path / "w.toml").exists()  # the result is kept
        out = tune_json(tmp_path, "--search", "beta,rho", "--apply", d.url, "--token-file",
                        str(token))
        assert "policy" in out["applied"]["changed"]
        now = d.http.get("/v1/params").json()
        assert now["policy"] == "topas" and now["version"] == out["applied"]["version"]
        for name, value in out["best"]["params"].items():
            assert now["params"][name] == value
        d.stop()


@pytest.mark.parametrize(("args", "says"), [
    (["--p99-weight", "0.3"], "--p99-weight weighs --objective mix"),
    (["--objective", "mix", "--p99-weight", "2"], "--p99-weight must be in [0, 1]"),
    (["--train", "1.5"], "--train must be a fraction between 0 and 1"),
    (["--train", "0.01"], "leaves no training task"),
    (["--search", "beta,nope"], "'nope' is not a TOPAS parameter"),
    (["--param", "beta=-1"], "beta=-1 is out of range"),
    (["--apply", "127.0.0.1:8470"], "give the daemon's URL"),
    (["--token-file", "tok"], "--token-file is for --apply URL"),
    (["--apply", "http://127.0.0.1:9"], "--apply http://127.0.0.1:9: cannot reach the daemon"),
])
def test_tune_usage_errors(tmp_path: Path, args: list[str], says: str) -> None:
    res = run("tune", *TINY, "--trials", "1", "--toml", str(tmp_path / "t.toml"), "--patch",
              str(tmp_path / "t.json"), *args)
    assert res.exit_code == 2 and res.output.startswith("error: ") and says in res.output
    assert not (tmp_path / "t.toml").exists()  # refused before the search


def test_tune_refuses_a_baseline() -> None:
    res = run("tune", *TINY, "-p", "lpm")
    assert res.exit_code == 2 and "'lpm' is not one of 'topas'" in res.output


def test_tune_without_optuna_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "optuna", None)
    res = run("tune", *TINY)
    assert res.exit_code == 2
    assert res.output == ("error: topasd tune needs optuna, which is not installed: "
                          "pip install 'topasd[tune]'\n")


def test_tune_reads_a_trace_file(tmp_path: Path) -> None:
    wl = load_workload("chain3")
    path = tmp_path / "t.jsonl"
    save_trace(generate_trace(wl.workflows, 0.3, 10, 1, name="chain3"), path)
    res = run("tune", str(path), "--trials", "2", "--search", "rho", "--toml",
              str(tmp_path / "t.toml"), "--patch", str(tmp_path / "t.json"), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["trace"] == str(path)


# ------------------------------------------------------------------ Ray


def test_sweep_and_tune_on_ray_equal_the_process_pool(tmp_path: Path) -> None:
    """A local Ray instance (2 CPUs) runs a sweep and a short search through
    the CLI's --ray; both give the process pool's numbers."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'topasd[tune]')")
    sweep_args = ["sweep", "-w", "dag4", "-n", "8", "--rates", "0.1,0.3", "--seeds", "2",
                  "-p", "topas", "-p", "spf", "--json", "--html", str(tmp_path / "s.html")]
    tune_args = ["tune", *TINY, "--trials", "4", "--batch", "2", "--search", "beta,srpt",
                 "--json", "--toml", str(tmp_path / "t.toml"), "--patch",
                 str(tmp_path / "t.json")]
    local = [run(*a, "--workers", "2") for a in (sweep_args, tune_args)]  # before Ray's threads
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False,
             _node_ip_address="127.0.0.1",  # the instance stays on loopback
             runtime_env={"env_vars": {"PYTHONPATH": ":".join(sys.path)}})
    try:
        on_ray = [run(*a, "--ray", "auto") for a in (sweep_args, tune_args)]
        assert ray.is_initialized()  # the CLI used this instance and left it running
    finally:
        ray.shutdown()
    for mine, theirs in zip(local, on_ray, strict=True):
        assert mine.exit_code == 0 and theirs.exit_code == 0, (mine.output, theirs.output)
    sweeps = [json.loads(r.stdout) for r in (local[0], on_ray[0])]
    assert sweeps[0]["runs"] == sweeps[1]["runs"] and sweeps[0]["points"] == sweeps[1]["points"]
    assert len(sweeps[0]["runs"]) == len(sweep_cases(["topas", "spf"], [0.1, 0.3], [0, 1]))
    tunes = [json.loads(r.stdout) for r in (local[1], on_ray[1])]
    for key in ("trials", "best", "train", "held_out", "gains"):
        assert tunes[0][key] == tunes[1][key], key
