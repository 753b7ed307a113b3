"""`topasd sweep` (policies across arrival rates and seeds) and `topasd tune`
(TOPAS's parameters for a trace, Optuna), their replays on a local process
pool or a Ray cluster (`topasd.tuning`)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from topasd.cli.options import BUILTIN_NAMES, param_flags, token_file_option, workload_option
from topasd.cli.replay import _given, _load_or_generate, _policy_names, _topas_params
from topasd.model import MAX_BUDGET, TopasError
from topasd.profiles import DEFAULT_PROFILE, PROFILES, get_profile
from topasd.scheduler import POLICY_NAMES, TUNABLE_NAMES
from topasd.tuning.pools import ReplayPool, open_pool
from topasd.tuning.replays import trace_rate
from workflows.trace import Trace

TRACE_RATES = (0.5, 0.75, 1.0, 1.25, 1.5)  # a trace file's default rates, times its own


def _pool_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--profile, --budget, --workers, --ray, --json, --quiet."""
    for option in reversed((
        click.option("--profile", default=DEFAULT_PROFILE, show_default=True,
                     type=click.Choice(sorted(PROFILES)), help="Hardware profile of the "
                     "simulator."),
        click.option("--budget", type=click.IntRange(min=1, max=MAX_BUDGET), default=None,
                     help="Override the profile's KV budget (tokens)."),
        click.option("--workers", type=click.IntRange(min=1), default=None,
                     help="Local processes running the replays [default: one per core; 1: "
                          "this process]."),
        click.option("--ray", "ray_address", metavar="ADDRESS|auto", default=None,
                     help="Run the replays as Ray tasks on the cluster at ADDRESS (auto: the "
                          "one this machine belongs to; start one with `ray start --head`). "
                          "Needs `pip install 'topasd[tune]'` here and topasd on every node."),
        click.option("--json", "as_json", is_flag=True, help="Print the results as JSON."),
        click.option("--quiet", "-q", is_flag=True, help="No progress bar."),
    )):
        fn = option(fn)
    return fn


@contextmanager
def _replays_bar(total: int, label: str, hidden: bool) -> Iterator[Callable[[], None]]:
    """A progress bar of replays with an ETA on a terminal's stderr; a no-op
    elsewhere or when `hidden`."""
    if hidden or not sys.stderr.isatty():
        yield lambda: None
        return
    bar_cm: Any = click.progressbar(length=total, label=label, file=sys.stderr,
                                    show_pos=True, show_eta=True)
    with bar_cm as bar:
        yield lambda: bar.update(1)


@contextmanager
def _pool(traces: Mapping[str, Trace], workers: int | None, ray: str | None,
          what: str, hidden: bool) -> Iterator[ReplayPool]:
    """The replay pool, saying where `what` runs; Ctrl-C ends it (exit 130)."""
    pool = open_pool(traces, workers, ray)
    try:
        if not hidden:
            click.echo(f"{what} on {pool.where}", err=True)
        yield pool
    except KeyboardInterrupt:
        pool.close()
        click.echo("\ninterrupted; nothing was written", err=True)
        sys.exit(130)
    finally:
        pool.close()


def _writable(path: str, flag: str) -> Path:
    """`path` as an output file; TopasError for a folder or an unwritable place."""
    out = Path(path)
    if out.is_dir() or path.endswith(("/", os.sep)):
        raise TopasError(f"{flag} {path}: is a folder; name a file in it")
    folder = out.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise TopasError(f"{flag} {path}: the folder {folder} does not exist or is not "
                         "writable; give another path")
    return out


# ------------------------------------------------------------------ sweep


@click.command()
@click.argument("trace_file", required=False, type=click.Path(dir_okay=False))
@workload_option(f"Sweep a workload instead of TRACE_FILE: {BUILTIN_NAMES}, or a workflow "
                 "spec file.")
@click.option("--rates", metavar="LOW:HIGH:N|R1,R2,...", default=None,
              help="Arrival rates, task/s: N evenly from LOW to HIGH, or a list [default: "
                   "the workload's operating points; a trace's own rate x 0.5 to 1.5].")
@click.option("--seeds", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --workload: samples of it (seeds 0..N-1), each at every rate.")
@click.option("--tasks", "-n", type=click.IntRange(min=1), default=200, show_default=True,
              help="Tasks per sample of --workload.")
@click.option("--policy", "-p", "policies", multiple=True, default=("all",), show_default=True,
              help=f"Policy to sweep, repeatable, or 'all' ({', '.join(POLICY_NAMES)}).")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
              help="A TOPAS parameter for the TOPAS policies, repeatable (docs/topas.md).")
@click.option("--html", "html_path", default="sweep.html", show_default=True, metavar="FILE",
              help="Where to write the chart (offline HTML, plotly.js inline).")
@click.option("--png", "png_path", default=None, metavar="FILE",
              help="Also a PNG of the chart (needs Debian's chromium).")
@_pool_options
def sweep(trace_file: str | None, workload: str | None, rates: str | None, seeds: int,
          tasks: int, policies: tuple[str, ...], params: tuple[str, ...], html_path: str,
          png_path: str | None, profile: str, budget: int | None, workers: int | None,
          ray_address: str | None, as_json: bool, quiet: bool) -> None:
    """Replay policies at a range of arrival rates: how each behaves as load grows.

    Every policy runs at every rate and seed; a trace is re-timed to each
    rate (the gaps between arrivals scaled; its tasks keep their sizes). A
    workload's seed draws the same tasks at every rate, so each replay is
    exactly `topasd replay -w NAME -r RATE -s SEED -p POLICY`. The replays
    run in parallel: one process per core, or Ray tasks with --ray.

    Prints, per policy and rate (means over the seeds): mean, p50 and p99 JCT,
    requests finished per second, preemptions and tokens prefilled again;
    each policy's saturation point (the first rate whose mean JCT is twice
    that at the lowest rate). Writes a chart of mean and p99 JCT against the
    rate, one line per policy, the saturation points marked.

    \b
    Try:
      topasd sweep -w dag4 --rates 0.1:0.3:5 --seeds 2
      topasd sweep my-trace.jsonl --rates 0.5,1,2 -p topas -p lpm --png sweep.png
      topasd sweep -w chain3 --ray auto --json > sweep.json
    """
    from topasd.tuning import sweep as sw

    names = _policy_names(policies)
    tuned = _topas_params(names, param_flags(params)) if params else {}
    out_html = _writable(html_path, "--html")
    out_png = None if png_path is None else _writable(png_path, "--png")
    traces, chosen, meta = _sweep_traces(trace_file, workload, rates, seeds, tasks)
    prof = get_profile(profile) if budget is None else \
        get_profile(profile).with_overrides(budget_tokens=budget)
    for tr in traces.values():
        tr.check_fits(prof.budget_tokens)
    cases = sw.sweep_cases(names, chosen, range(seeds if workload else 1))
    jobs = [c.job(tuned if c.policy in TUNABLE_NAMES else {}, profile, budget) for c in cases]
    what = (f"sweep: {len(jobs)} replays ({len(names)} policies x {len(chosen)} rates x "
            f"{seeds if workload else 1} seed{'s' if workload and seeds > 1 else ''})")
    with _pool(traces, workers, ray_address, what, quiet or as_json) as pool, \
            _replays_bar(len(jobs), "sweep", quiet or as_json) as done:
        rows = pool.run(jobs, done)
    points = sw.average(cases, rows)
    sat = sw.saturation(points)
    title = f"{meta.get('workload') or trace_file}: JCT against arrival rate"
    _sweep_chart(points, sat, title, out_html, out_png)
    if as_json:
        runs = [{"rate": c.rate, "seed": c.seed, **r} for c, r in zip(cases, rows, strict=True)]
        click.echo(json.dumps({"trace": meta, "profile": prof.name, "rates": list(chosen),
                               "seeds": seeds if workload else 1, "policies": names,
                               "params": tuned, "saturation": sat, "points": points,
                               "runs": runs, "html": str(out_html)}, indent=2))
        return
    click.echo(f"{title} ({meta.get('tasks', '?')} tasks, profile {prof.name}; times in s)")
    click.echo(sw.sweep_table(points, sat))
    click.echo(sw.saturation_note(sat))


def _sweep_traces(trace_file: str | None, workload: str | None, rates: str | None,
                  seeds: int, tasks: int) -> tuple[dict[str, Trace], tuple[float, ...],
                                                   dict[str, Any]]:
    """The sweep's trace table, its rates, and the header of its source."""
    from topasd.tuning import sweep as sw

    chosen = None if rates is None else sw.parse_rates(rates)
    if trace_file is None:
        if workload is None:
            raise TopasError("give a TRACE_FILE (see `topasd trace gen`) or --workload NAME")
        from workflows.builtin import load_workload

        chosen = chosen or tuple(load_workload(workload).operating_points)
        if not chosen:
            raise TopasError(f"workload {workload!r} lists no operating points; pass --rates")
        traces = sw.workload_traces(workload, chosen, range(seeds), tasks)
        return traces, chosen, {"workload": workload, "tasks": tasks, "seeds": seeds}
    if seeds > 1:
        raise TopasError("--seeds draws samples of a --workload; TRACE_FILE is one fixed "
                         "sample (drop --seeds, or sweep -w NAME)")
    base = _load_or_generate(trace_file, workload, None, tasks, 0, _given("tasks"))
    own = trace_rate(base)
    chosen = chosen or tuple(round(own * f, 9) for f in TRACE_RATES)
    return sw.retimed_traces(base, chosen), chosen, dict(base.meta)


def _sweep_chart(points: Sequence[dict[str, Any]], sat: Mapping[str, float | None],
                 title: str, out_html: Path, out_png: Path | None) -> None:
    """Write the HTML chart (and its PNG)."""
    from topasd.tuning.chart import sweep_figure, write_html

    write_html(sweep_figure(points, sat, title), out_html, title)
    click.echo(f"wrote {out_html}", err=True)
    if out_png is not None:
        from console.gantt import screenshot

        screenshot(out_html, out_png, width=1400, height=560)
        click.echo(f"wrote {out_png}", err=True)


# ------------------------------------------------------------------- tune


@click.command()
@click.argument("trace_file", required=False, type=click.Path(dir_okay=False))
@workload_option(f"Tune on a sample of a workload instead of TRACE_FILE: {BUILTIN_NAMES}, or "
                 "a workflow spec file.")
@click.option("--rate", "-r", type=float, default=None,
              help="Arrival rate for --workload (default: its middle operating point).")
@click.option("--tasks", "-n", type=click.IntRange(min=2), default=200, show_default=True,
              help="Tasks for --workload.")
@click.option("--seed", "-s", type=click.IntRange(min=0), default=0, show_default=True,
              help="Sampling seed for --workload.")
@click.option("--policy", "-p", default="topas", show_default=True,
              type=click.Choice(TUNABLE_NAMES), help="The TOPAS policy to tune.")
@click.option("--trials", type=click.IntRange(min=1), default=30, show_default=True,
              help="Parameter sets to try (the first: the defaults).")
@click.option("--batch", type=click.IntRange(min=1), default=4, show_default=True,
              help="Trials proposed at once and replayed in parallel; the trials depend on "
                   "--search-seed and --batch only, not on where they run.")
@click.option("--search-seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the search (Optuna's TPE sampler).")
@click.option("--objective", type=click.Choice(("mean", "p99", "mix")), default="mean",
              show_default=True, help="Minimise mean JCT, p99 JCT, or a mix of the two.")
@click.option("--p99-weight", type=float, default=None,
              help="With --objective mix: the objective is (1-W) x mean + W x p99 JCT "
                   "[default: 0.5].")
@click.option("--train", type=float, default=0.5, show_default=True,
              help="Fraction of the tasks, first by arrival, the search replays; the rest "
                   "are held out to check the result.")
@click.option("--search", "search", metavar="NAME,...", default=None,
              help="Parameters to search [default: beta, rho, H_age, M, K and every "
                   "extension parameter].")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
              help="Hold a parameter at VALUE (not searched), repeatable.")
@click.option("--toml", "toml_path", default="topasd-tuned.toml", show_default=True,
              metavar="FILE", help="Where to write the best parameters as a topasd.toml "
                                   "fragment (topasd start --config FILE).")
@click.option("--patch", "patch_path", default="topasd-tuned.json", show_default=True,
              metavar="FILE", help="Where to write them as a PATCH /v1/params body.")
@click.option("--apply", "apply_url", metavar="URL", default=None,
              help="Also send them to the daemon at URL (PATCH URL/v1/params).")
@token_file_option
@_pool_options
def tune(trace_file: str | None, workload: str | None, rate: float | None, tasks: int,
         seed: int, policy: str, trials: int, batch: int, search_seed: int, objective: str,
         p99_weight: float | None, train: float, search: str | None, params: tuple[str, ...],
         toml_path: str, patch_path: str, apply_url: str | None, token_file: str | None,
         profile: str, budget: int | None, workers: int | None, ray_address: str | None,
         as_json: bool, quiet: bool) -> None:
    """Search TOPAS's parameters for the lowest JCT on a trace, and check the
    result on tasks the search never saw.

    The trace's tasks are split by arrival time: the first --train of them
    are replayed for every trial (Optuna's TPE, seeded; the first trial is
    the defaults), the rest are held out. The best parameters are then
    replayed on the held-out part beside the defaults and every baseline and
    peer (continuum, astraea, kairos, saga, tokencake): a gain there is real,
    a gain on the training part alone is overfit.

    Writes the best parameters as a topasd.toml fragment (--toml; `topasd
    start --config FILE`) and as a PATCH /v1/params body (--patch; --apply URL
    sends it to a running daemon). Replays run on one process per core, or as
    Ray tasks with --ray; either way the same numbers. Needs `pip install
    'topasd[tune]'` (Optuna).

    \b
    Try:
      topasd trace gen -w metagpt-tl -r 0.0175 -n 200 -o tl.jsonl
      topasd tune tl.jsonl --trials 30
      topasd tune tl.jsonl --objective p99 --search beta,rho,srpt --param M=6
      topasd tune tl.jsonl --apply http://127.0.0.1:8470
    """
    from topasd.tuning import report
    from topasd.tuning.pools import require
    from topasd.tuning.replays import split_by_arrival
    from topasd.tuning.search import HELD_OUT, TRAIN
    from topasd.tuning.search import tune as run_tune

    require("optuna", "topasd tune")
    setup = _tune_setup(policy, params, search, trials, batch, search_seed, objective,
                        p99_weight, profile, budget)
    outputs = _writable(toml_path, "--toml"), _writable(patch_path, "--patch")
    token = _apply_token(apply_url, token_file)
    tr = _load_or_generate(trace_file, workload, rate, tasks, seed, _given("tasks", "seed"))
    tr.check_fits(get_profile(profile).budget_tokens if budget is None else budget)
    parts = dict(zip((TRAIN, HELD_OUT), split_by_arrival(tr, train), strict=True))
    total = 2 * (1 + len(setup.baselines)) + trials + 1
    hidden = quiet or as_json
    with _pool(parts, workers, ray_address, f"tune: {total} replays", hidden) as pool, \
            _replays_bar(total, "tune", hidden) as done:
        result = run_tune(pool, setup, done)
        where = pool.where
    name = trace_file or f"{workload} ({len(tr.tasks)} tasks)"
    _write_outputs(result, name, *outputs)
    applied = None if apply_url is None else report.apply(apply_url, report.patch_body(result),
                                                          token)
    if as_json:
        click.echo(json.dumps(_tune_json(result, name, outputs, applied), indent=2))
        return
    click.echo(report.report_text(result, name, where))
    if applied is not None:
        click.echo(f"applied to {apply_url}: parameters version {applied.get('version')}, "
                   f"effective from decision {applied.get('effective_from_decision')}")


def _tune_setup(policy: str, params: tuple[str, ...], search: str | None, trials: int,
                batch: int, seed: int, objective: str, p99_weight: float | None,
                profile: str, budget: int | None) -> Any:
    """The search's setup from the flags; TopasError naming a bad one."""
    from topasd.tuning.search import Objective, TuneSetup
    from topasd.tuning.space import search_names

    if p99_weight is not None and objective != "mix":
        raise TopasError("--p99-weight weighs --objective mix; add --objective mix or drop it")
    weight = {"mean": 0.0, "p99": 1.0}.get(objective, 0.5 if p99_weight is None else p99_weight)
    fixed = _topas_params([policy], param_flags(params)) if params else {}
    baselines = tuple(n for n in POLICY_NAMES if n not in TUNABLE_NAMES)
    return TuneSetup(policy, search_names(search, policy, fixed), fixed, trials, batch, seed,
                     Objective(weight), profile, budget, baselines)


def _apply_token(url: str | None, token_file: str | None) -> str | None:
    """The bearer token --apply sends, checked on the daemon before the search (a
    daemon that is not there, or refuses the token, fails fast)."""
    if url is None:
        if token_file is not None:
            raise TopasError("--token-file is for --apply URL; add --apply or drop it")
        return None
    if not url.startswith(("http://", "https://")):
        raise TopasError(f"--apply {url}: give the daemon's URL, e.g. http://127.0.0.1:8470")
    from topasd.config import client_token
    from topasd.tuning.report import check_daemon

    token = client_token(token_file)
    check_daemon(url, token)
    return token


def _write_outputs(result: Any, name: str, toml_out: Path, patch_out: Path) -> None:
    from topasd.tuning import report

    toml_out.write_text(report.toml_fragment(result, name), encoding="utf-8")
    patch_out.write_text(json.dumps(report.patch_body(result), indent=2) + "\n",
                         encoding="utf-8")
    click.echo(f"wrote {toml_out} (topasd start --config {toml_out}) and {patch_out} "
               f"(PATCH /v1/params body)", err=True)


def _tune_json(result: Any, name: str, outputs: tuple[Path, Path],
               applied: dict[str, Any] | None) -> dict[str, Any]:
    from topasd.tuning import report

    return {"trace": name, "policy": result.setup.policy,
            "objective": result.setup.objective.label, "seed": result.setup.seed,
            "batch": result.setup.batch, "space": [d.describe() for d in result.space],
            "trials": [{"number": t.number, "params": dict(t.params), "value": t.value,
                        "mean_jct_s": t.row["mean_jct_s"], "p99_jct_s": t.row["p99_jct_s"]}
                       for t in result.trials],
            "best": {"number": result.best.number, "value": result.best.value,
                     "params": report.best_params(result)},
            "best_baseline": result.best_baseline, "gains": report.gains(result),
            "verdict": report.verdict(result), "train": dict(result.train),
            "held_out": dict(result.held_out), "toml": str(outputs[0]),
            "patch": str(outputs[1]), "applied": applied}


COMMANDS = [sweep, tune]
