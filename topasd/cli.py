"""The `topasd` command line."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click

from topasd.model import INT64_MAX, MAX_BUDGET, TopasError
from topasd.profiles import DEFAULT_PROFILE, PROFILES, HardwareProfile, get_profile
from topasd.scheduler import POLICY_NAMES
from topasd.scheduler import native as compiled_search

# workflows.builtin.BUILTIN, spelled out so that `--help` does not import the
# workload loader (tests/test_cli.py checks they agree)
BUILTIN_NAMES = "table1, chain3, dag4, dag10wide, metagpt-sop, metagpt-tl"

BACKENDS = ("sim", "vllm", "sglang")
REPLAY_BACKENDS = ("sim", "vllm")  # `replay --backend vllm --model DIR` (docs/vllm.md)
VLLM_BUDGET = 16384  # default KV pool of --backend vllm (backends.vllm.POOL_TOKENS), tokens
VLLM_CLOCKS = ("steps", "cpu", "profile")  # replay's choices of VllmBackend's clock
DETACHED_ENV = "TOPASD_DETACHED"  # set for the foreground child `start --detach` runs


class TopasGroup(click.Group):
    """Turns expected errors (bad input) into one clear line and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TopasError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(2)


@click.group(cls=TopasGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="topasd")
def main() -> None:
    """topasd: workflow-aware prefix-state scheduling (TOPAS) for multi-agent LLM serving.

    \b
    Try:
      topasd start --workload chain3 --rate 0.3
      topasd replay --workload chain3 --rate 0.2 --policy all
      topasd trace gen --workload dag4 --rate 0.12 --tasks 200 -o dag4.jsonl
      topasd replay dag4.jsonl --policy lpm --policy spf --json
    """


# ----------------------------------------------------------------- trace


@main.group()
def trace() -> None:
    """Write workload traces (JSON Lines, docs/trace-format.md)."""


@trace.command("gen")
@click.option("--workload", "-w", required=True, metavar="NAME|SPEC",
              help=f"A built-in workload ({BUILTIN_NAMES}) or the path of a workflow "
                   "spec file.")
@click.option("--rate", "-r", type=float, required=True, help="Poisson arrival rate, task/s.")
@click.option("--tasks", "-n", type=click.IntRange(min=1), default=200, show_default=True,
              help="Number of task arrivals.")
@click.option("--seed", "-s", type=click.IntRange(0, INT64_MAX), default=0, show_default=True,
              help="Sampling seed.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True, allow_dash=True),
              required=True, help="Where to write the trace (.jsonl); '-': standard output.")
def trace_gen(workload: str, rate: float, tasks: int, seed: int, output: str) -> None:
    """Sample a trace of TASKS arrivals of a workload at RATE task/s."""
    from workflows.trace import save_trace, write_trace

    with _progress(tasks, "sampling", False) as tick:
        tr = _generated_trace(workload, rate, tasks, seed,
                              progress=lambda k: tick(k, tasks, math.nan))
    if output == "-":
        write_trace(tr, click.get_text_stream("stdout"))
    else:
        save_trace(tr, output)
    n_req = sum(len(r) for t in tr.tasks for r in t.stages.values())
    click.echo(f"wrote {len(tr.tasks)} tasks, {n_req} requests, last arrival at "
               f"{tr.tasks[-1].arrival:.1f}s to {'standard output' if output == '-' else output}",
               err=True)


def _generated_trace(workload: str, rate: float, tasks: int, seed: int,
                     progress: Callable[[int], None] | None = None) -> Any:
    from workflows.builtin import load_workload
    from workflows.trace import generate_trace

    wl = load_workload(workload)
    try:
        return generate_trace(wl.workflows, rate, tasks, seed, name=wl.name, progress=progress)
    except KeyboardInterrupt:  # Ctrl-C while sampling: nothing ran or was written
        click.echo("\ninterrupted while sampling the trace; nothing was run or written",
                   err=True)
        sys.exit(130)


# ---------------------------------------------------------------- replay


@main.command()
@click.argument("trace_file", required=False, type=click.Path(dir_okay=False))
@click.option("--workload", "-w", metavar="NAME|SPEC",
              help="Generate the trace from a workload instead of reading TRACE_FILE: "
                   f"{BUILTIN_NAMES}, or a workflow spec file.")
@click.option("--rate", "-r", type=float, default=None,
              help="Arrival rate for --workload (default: its middle operating point).")
@click.option("--tasks", "-n", type=click.IntRange(min=1), default=200, show_default=True,
              help="Tasks for --workload.")
@click.option("--seed", "-s", type=click.IntRange(0, INT64_MAX), default=0, show_default=True,
              help="Seed for --workload.")
@click.option("--policy", "-p", "policies", multiple=True, default=("all",), show_default=True,
              help=f"Policy to run, repeatable, or 'all' ({', '.join(POLICY_NAMES)}); also "
                   "the TOPAS ablation variants topas-base, topas-noreuse, topas-noaging.")
@click.option("--backend", "-b", type=click.Choice(REPLAY_BACKENDS), default="sim",
              show_default=True,
              help="sim: the simulator; vllm: a real vLLM engine on this CPU (needs --model).")
@click.option("--model", "model", type=click.Path(), default=None, metavar="DIR",
              help="With --backend vllm: the model directory (`topasd model tiny -o DIR` "
                   "writes one).")
@click.option("--clock", type=click.Choice(VLLM_CLOCKS), default=None,
              help="With --backend vllm: what engine time is [default: steps, each step's "
                   "wall time]; cpu: its CPU time (a machine with other load); profile: "
                   "the profile's modelled time (deterministic) (docs/vllm.md).")
@click.option("--profile", default=DEFAULT_PROFILE, show_default=True,
              type=click.Choice(sorted(PROFILES)),
              help="Hardware profile of the simulator (with --backend vllm, the policy's "
                   "cost hints if given; default: the tiny CPU model's fitted costs).")
@click.option("--budget", type=click.IntRange(min=1, max=MAX_BUDGET), default=None,
              help=f"Override the profile's KV budget (tokens) [default: the profile's]; "
                   f"with --backend vllm the KV pool, rounded up to whole blocks "
                   f"[default: {VLLM_BUDGET}].")
@click.option("--json", "as_json", is_flag=True, help="Print {\"runs\": [...]} as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--db", "db_path", type=click.Path(dir_okay=False), default=None,
              help="Append one run per policy to this SQLite decision log.")
@click.option("--log-candidates", "log_candidates", metavar="all|top:N|none", default=None,
              help="Candidates per decision written to --db (default: all).")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
              help="A TOPAS parameter for the TOPAS policies of this replay, repeatable "
                   "(beta=10, rho=3, H_age=30, M=6, K=0, preempt_margin=0, start_gate=false, "
                   "hol_age=200, ...; defaults and ranges: docs/topas.md); the baselines "
                   "take none.")
def replay(trace_file: str | None, workload: str | None, rate: float | None, tasks: int,
           seed: int, policies: tuple[str, ...], backend: str, model: str | None,
           clock: str | None, profile: str, budget: int | None, as_json: bool, quiet: bool,
           db_path: str | None, log_candidates: str | None, params: tuple[str, ...]) -> None:
    """Run a workload trace through one or more policies in virtual time.

    TRACE_FILE is a trace written by `topasd trace gen` (`-` reads it from
    standard input: `topasd trace gen -w chain3 -r 0.3 -o - | topasd replay -`).

    -w NAME|SPEC generates the trace instead: NAME a built-in workload, SPEC
    the path of a YAML or JSON workflow spec (format: docs/trace-format.md).

    Prints one row per policy; every policy sees the same trace. Columns
    (times in s): mean JCT, p50, p99 (task completion time); makespan (last
    finish); req/s (LLM requests finished per second); 1st task (first task
    finished); batch, peak (mean and largest running batch); loads (prefix
    loads from host), load GB (bytes moved), computes (prefix prefills);
    preempt (by the policy), retract (by the engine, out of KV), recomp tok
    (tokens prefilled again after both); dec ms, dec p99 (decision wall
    time, mean and p99). --json gives the same under longer names. With
    --db, every decision, candidate and engine event of each run is logged
    to one SQLite file (see `topasd gantt`).

    With --backend vllm the trace runs through a real vLLM engine on this
    CPU, TOPAS (or the baseline) deciding inside vLLM's scheduler; its token
    counts become synthetic token ids with exact output lengths, and time is
    the sum of measured engine steps (docs/vllm.md).

    \b
    Try:
      topasd model tiny -o tiny-model
      topasd replay --workload chain3 --tasks 3 -p topas --backend vllm --model tiny-model
    """
    vllm_opts = _vllm_options(backend, model, budget, clock)
    tr = _load_or_generate(trace_file, workload, rate, tasks, seed, _given("tasks", "seed"))
    if vllm_opts is not None:
        if click.get_current_context().get_parameter_source("profile") is \
                click.core.ParameterSource.COMMANDLINE:
            vllm_opts["profile"] = get_profile(profile)
        prof = _vllm_profile(vllm_opts)
    else:
        prof = get_profile(profile)
        if budget is not None:
            prof = prof.with_overrides(budget_tokens=budget)
    tr.check_fits(prof.budget_tokens, _vllm_context(vllm_opts))
    names = _policy_names(policies)
    tuned = _topas_params(names, _param_flags(params)) if params else {}
    store = _open_store(db_path, log_candidates)  # last: bad input leaves no log file
    rows: list[dict[str, Any]] = []
    try:
        for name in names:
            sink = None if store is None else store.sink(log_candidates or "all")
            with _progress(len(tr.tasks), f"{name:>13}", quiet or as_json) as tick:
                rows.append(_run_one(tr, name, prof, tick, sink, vllm_opts,
                                     tuned if name in _topas_names() else {}))
            if sink is not None:
                rows[-1]["run_id"] = sink.run_id
    except KeyboardInterrupt:  # Ctrl-C: keep what finished
        _interrupted(name, rows, store, sink, tr.meta, prof)
    if store is not None:
        ids = [r["run_id"] for r in rows]
        click.echo(f"decision log: {store.path} (run{'s' if len(ids) > 1 else ''} "
                   f"{', '.join(map(str, ids))})", err=True)
        store.close()
    clock_used = None if vllm_opts is None else vllm_opts.get("clock", "steps")
    if as_json:
        engine = {"backend": backend} | ({} if clock_used is None else {"clock": clock_used})
        click.echo(json.dumps({"trace": dict(tr.meta), "profile": prof.name, **engine,
                               "search": compiled_search.status().reason, "runs": rows},
                              indent=2))
    else:
        click.echo(_table(rows, tr.meta, prof, None if clock_used is None
                          else f"vLLM engine, clock {clock_used}"))
        if tuned:
            click.echo("TOPAS parameters: " + ", ".join(
                f"{k}={json.dumps(v) if isinstance(v, bool) or v is None else v}"
                for k, v in tuned.items()))


def _interrupted(name: str, rows: list[dict[str, Any]], store: Any, sink: Any, meta: Any,
                 prof: HardwareProfile) -> NoReturn:
    """After Ctrl-C in a replay: the policies that finished, where the cut run is,
    exit 130 (as a shell reports SIGINT)."""
    click.echo(f"\ninterrupted during {name}", err=True)
    if rows:
        click.echo(_table(rows, meta, prof))
    if store is not None:
        cut = f"; run {sink.run_id} ({name}) is marked interrupted" if sink is not None and \
            sink.run_id is not None else ""
        done = ", ".join(str(r["run_id"]) for r in rows)
        click.echo(f"decision log: {store.path} (finished run{'s' if len(rows) != 1 else ''}: "
                   f"{done or 'none'}{cut})", err=True)
        store.close()
    sys.exit(130)


def _given(*names: str) -> set[str]:
    """Which of these options the command line (or the environment) set."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    return {n for n in names if ctx.get_parameter_source(n) not in (ParameterSource.DEFAULT,
                                                                     None)}


def _load_or_generate(trace_file: str | None, workload: str | None, rate: float | None,
                      tasks: int, seed: int, given: frozenset[str] | set[str] = frozenset(),
                      ) -> Any:
    from workflows.builtin import load_workload
    from workflows.trace import load_trace

    if trace_file and workload:
        raise TopasError("give either TRACE_FILE or --workload, not both")
    if trace_file:
        ignored = [flag for flag, used in (("--rate", rate is not None),
                                           ("--tasks", "tasks" in given),
                                           ("--seed", "seed" in given)) if used]
        if ignored:
            verb = "shapes" if len(ignored) == 1 else "shape"
            raise TopasError(f"{', '.join(ignored)} only {verb} a trace made from --workload; "
                             f"TRACE_FILE {trace_file} already fixes its tasks (drop them)")
        return load_trace(trace_file)
    if not workload:
        raise TopasError("give a TRACE_FILE (see `topasd trace gen`) or --workload NAME")
    if rate is None:
        points = load_workload(workload).operating_points
        if not points:
            raise TopasError(f"workload {workload!r} lists no operating points; pass --rate")
        rate = points[len(points) // 2]
    return _generated_trace(workload, rate, tasks, seed)


def _policy_names(policies: tuple[str, ...]) -> list[str]:
    from topasd.scheduler import ALL_POLICY_NAMES

    names: list[str] = []
    for p in policies:
        for name in (POLICY_NAMES if p == "all" else (p,)):
            if name not in ALL_POLICY_NAMES:
                raise TopasError(f"unknown policy {name!r}; choose from "
                                 f"{', '.join(ALL_POLICY_NAMES)} or 'all'")
            if name not in names:
                names.append(name)
    return names


def _topas_names() -> frozenset[str]:
    from topasd.scheduler.params import VARIANTS

    return frozenset(VARIANTS)


def _topas_params(names: list[str], params: dict[str, Any]) -> dict[str, Any]:
    """--param values, checked against every TOPAS policy of the replay."""
    from topasd.scheduler import build_policy, policy_params
    from topasd.scheduler.param_specs import canonical_param

    topas = [n for n in names if n in _topas_names()]
    if not topas:
        raise TopasError("--param sets TOPAS parameters, but no TOPAS policy is selected; "
                         "add -p topas (the baselines take no parameters)")
    taken = [policy_params(build_policy(name, params)) for name in topas]  # names a bad parameter
    # as the policy took them (k=1e5 is 100000, M=6.0 is 6)
    return {canonical_param(k): taken[0][canonical_param(k)] for k in params}


def _run_one(tr: Any, name: str, prof: HardwareProfile,
             tick: Callable[[int, int, float], None], sink: Any = None,
             vllm_opts: dict[str, Any] | None = None,
             params: dict[str, Any] | None = None) -> dict[str, Any]:
    from backends.sim.engine import SimBackend
    from topasd.runner import Run
    from topasd.scheduler import build_policy

    if vllm_opts is None:
        backend: Any = SimBackend(prof)
    else:
        from backends.vllm import make_backend

        backend = make_backend(**vllm_opts)
    try:
        result = Run(tr, build_policy(name, params or {}), backend, sink=sink,
                     progress=tick).execute()
    finally:
        if vllm_opts is not None:
            backend.close()
    row = result.summary()
    if params:
        row["params"] = dict(params)
    return row


def _vllm_options(backend: str, model: str | None, budget: int | None,
                  clock: str | None = None) -> dict[str, Any] | None:
    """`make_backend` keywords for --backend vllm (None for the simulator)."""
    if backend != "vllm":
        if model is not None:
            raise TopasError("--model needs --backend vllm (the simulator takes no model)")
        if clock is not None:
            raise TopasError("--clock needs --backend vllm (the simulator's time is modelled)")
        return None
    if model is None:
        raise TopasError("--backend vllm needs --model DIR; write a tiny model with "
                         "`topasd model tiny -o DIR`")
    from backends.vllm import read_model_config

    read_model_config(model)
    return {"model": model, "budget_tokens": budget or VLLM_BUDGET,
            **({} if clock is None else {"clock": clock})}


def _vllm_context(opts: dict[str, Any] | None) -> tuple[int, str] | None:
    """vLLM's max_model_len for --model and --budget, and its fix (None: the sim)."""
    if opts is None:
        return None
    from backends.vllm import read_model_config
    from backends.vllm.backend import context_fix, context_tokens

    context = context_tokens(read_model_config(opts["model"]), opts["budget_tokens"])
    return context, context_fix(context, opts["budget_tokens"])


def _vllm_profile(opts: dict[str, Any]) -> HardwareProfile:
    """The cost profile a vLLM run reports (the pool as the backend will size it)."""
    from backends.vllm import read_model_config
    from backends.vllm.backend import cpu_profile, pool_tokens

    budget = pool_tokens(opts["budget_tokens"])
    given = opts.get("profile")
    if given is not None:
        return given.with_overrides(budget_tokens=budget)
    return cpu_profile(budget, 512, read_model_config(opts["model"]))


def _open_store(db_path: str | None, log_candidates: str | None) -> Any:
    """The decision log for --db (None without it); checks --log-candidates."""
    from store import CandidateLog, Store

    if db_path is None:
        if log_candidates is not None:
            raise TopasError("--log-candidates needs --db FILE (the decision log to write)")
        return None
    CandidateLog.parse(log_candidates or "all")
    return Store(db_path)


@contextmanager
def _progress(total: int, label: str, hidden: bool) -> Iterator[Callable[[int, int, float], None]]:
    if hidden or not sys.stderr.isatty():
        yield lambda done, n, t: None
        return
    import time

    progress: Any = click.progressbar(
        length=total, label=label, file=sys.stderr, show_pos=True,
        item_show_func=lambda t: None if t is None or math.isnan(t) else f"engine t={t:,.0f}s")
    with progress as bar:
        shown = [0.0]

        def tick(done: int, n: int, t: float) -> None:
            bar.current_item = t  # tasks done, and the engine time (it moves when none is)
            if done > bar.pos:
                bar.update(done - bar.pos)
            elif time.monotonic() - shown[0] > 0.5:
                bar.render_progress()
            else:
                return
            shown[0] = time.monotonic()

        yield tick


# ----------------------------------------------------------------- model


@main.group()
def model() -> None:
    """Model directories for the vLLM backend (nothing is downloaded)."""


@model.command("tiny")
@click.option("--output", "-o", type=click.Path(file_okay=False), required=True,
              help="The directory to write (created if missing).")
@click.option("--layers", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Decoder layers (1-64).")
@click.option("--hidden", type=click.IntRange(64, 4096), default=128, show_default=True,
              help="Hidden size, a multiple of 64 up to 4096 (head size 32; the key/value "
                   "heads must divide the query heads).")
@click.option("--vocab", type=click.IntRange(64, 262_144), default=2048, show_default=True,
              help="Vocabulary size (64-262,144; dummy weights fill hidden x vocab twice).")
def model_tiny(output: str, layers: int, hidden: int, vocab: int) -> None:
    """Write a tiny Qwen2-style config.json; vLLM runs it with dummy weights.

    \b
    Try:
      topasd model tiny -o tiny-model
      topasd replay --workload chain3 --tasks 3 -p topas --backend vllm --model tiny-model
    """
    from backends.vllm.tiny import write_tiny_model

    path = write_tiny_model(output, layers=layers, hidden=hidden, vocab=vocab)
    click.echo(f"wrote {path / 'config.json'}: Qwen2, {layers} layers, hidden {hidden}, "
               f"vocab {vocab} (dummy weights at load)", err=True)


# ---------------------------------------------------------------- native


@main.group()
def native() -> None:
    """The compiled TOPAS search (mypyc): same decisions, ~1.4x faster at paper scale.

    \b
    Build it once after installing topasd, and again after editing the
    search (topasd/scheduler/residual.py, bounds.py, topas.py, params.py),
    topasd/model.py or changing Python; it needs mypy, a C compiler and
    Python's headers (pip install -e '.[native]'; python3-dev):
      topasd native build
    Until then topasd runs the pure-Python search, which decides the same.
    Builds live in $TOPASD_NATIVE_CACHE, else $XDG_CACHE_HOME/topasd/native
    (~/.cache/topasd/native);
    TOPASD_NATIVE=0 runs pure Python.
    """


@native.command("build")
@click.option("--verbose", "-v", is_flag=True, help="Show mypyc's and the compiler's output.")
def native_build(verbose: bool) -> None:
    """Compile topasd/scheduler's search into the per-user cache (~30 s)."""
    click.echo("compiling topasd.scheduler (residual, bounds, topas) with mypyc ...", err=True)
    where = compiled_search.build(log=verbose)
    click.echo(f"built {where}; topasd processes started from now on use it"
               + ("" if compiled_search.enabled() else " (not with TOPASD_NATIVE=0, as now)"))


@native.command("status")
def native_status() -> None:
    """Say whether topasd started here (this environment) runs the compiled
    search, and why (not); `topasd status` says it of a running daemon."""
    st = compiled_search.status()
    where = "is in" if st.active else "would go in (topasd native build)"
    click.echo(f"{st.reason}\nthe build for these sources {where}: {st.build_dir}")


# ----------------------------------------------------------------- daemon


@main.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML settings file (default: $TOPAS_CONFIG, else ./topasd.toml if present).")
@click.option("--backend", "-b", type=click.Choice(BACKENDS), default=None,
              help="Engine backend [default: sim]: the simulator, vLLM on this CPU "
                   "(docs/vllm.md) or SGLang on GPUs (docs/sglang.md).")
@click.option("--model-path", default=None, metavar="PATH",
              help="vllm/sglang: the model (vllm: a directory, `topasd model tiny -o DIR`).")
@click.option("--tp-size", type=click.IntRange(min=1), default=None,
              help="sglang: tensor-parallel ranks [default: 1].")
@click.option("--dp-size", type=click.IntRange(min=1), default=None,
              help="sglang: data-parallel replicas, one TOPAS each [default: 1].")
@click.option("--mem-fraction", type=float, default=None,
              help="sglang: mem_fraction_static [default: SGLang's].")
@click.option("--hicache/--no-hicache", default=None,
              help="sglang: hierarchical KV cache, so prefixes move to host memory "
                   "[default: off].")
@click.option("--hicache-size", type=click.IntRange(min=0), default=None,
              help="sglang: host KV pool per rank, GB.")
@click.option("--profile", default=None, metavar="NAME",
              help=f"Hardware profile of the simulator: {', '.join(sorted(PROFILES))} "
                   f"[default: {DEFAULT_PROFILE}].")
@click.option("--budget", type=click.IntRange(min=1, max=MAX_BUDGET), default=None,
              help="Override the profile's KV budget (tokens); with --backend sglang, "
                   "at most the pool SGLang reports.")
@click.option("--policy", "-p", default=None, metavar="NAME",
              help="Scheduling policy [default: topas].")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
              help="A policy parameter, repeatable (beta=10, rho=1, H_age=30, M=6, K=0, ...).")
@click.option("--db", "db_path", default=None, metavar="FILE",
              help="SQLite decision log [default: topasd.db].")
@click.option("--log-candidates", default=None, metavar="all|top:N|none",
              help="Candidates per decision written to the log [default: top:8].")
@click.option("--host", default=None, help="Address to listen on [default: 127.0.0.1].")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="Port [default: 8470]; 0 picks a free one.")
@click.option("--token", default=None,
              help="Bearer token for mutating endpoints (required off loopback).")
@click.option("--speed", default=None, metavar="X|max",
              help="Sim clock: engine seconds per wall second, or 'max' (unpaced) "
                   "[default: 1].")
@click.option("--workload", "-w", default=None, metavar="NAME|SPEC",
              help="Feed tasks of this workload with the built-in driver.")
@click.option("--rate", "-r", type=float, default=None,
              help="Driver arrival rate, task/s (default: the workload's middle operating "
                   "point).")
@click.option("--tasks", "-n", type=click.IntRange(min=1), default=None,
              help="Stop the driver after this many tasks (default: unbounded); then it "
                   "plays the trace `topasd trace gen` writes for the same workload, rate, "
                   "seed and count, so `topasd replay` reruns the daemon's work (with no API "
                   "clients, decision for decision).")
@click.option("--seed", "-s", type=click.IntRange(0, INT64_MAX), default=None,
              help="Sampling seed [default: 0].")
@click.option("--workflow", "workflows", multiple=True, metavar="SPEC",
              help="Register a workflow spec file for /v1/tasks and OpenAI calls, repeatable.")
@click.option("--grace", type=float, default=None,
              help="Seconds running work may finish after SIGTERM [default: 30].")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None,
              help="Output tokens of an OpenAI call without max_tokens [default: 256].")
@click.option("--model", default=None,
              help="Model name listed by /v1/models [default: topasd-sim; with "
                   "--model-path, its folder's name].")
@click.option("--task-timeout", type=float, default=None,
              help="Drop an application-driven task after this many seconds without a "
                   "call [default: 600; 0: never].")
@click.option("--runtime-file", default=None, metavar="FILE",
              help="Where the bound address is recorded for status/stop/console.")
@click.option("--log-level", default=None, type=click.Choice(["debug", "info", "warning",
                                                              "error"]),
              help="Log level (logs go to stderr) [default: info].")
@click.option("--log-file", default=None, metavar="FILE",
              help="Also log to this file (appended); with --detach, the daemon's only log "
                   "[default with --detach: beside the runtime file].")
@click.option("--detach", is_flag=True, help="Start in the background and return.")
@click.option("--print-config", is_flag=True, help="Print the merged settings and exit.")
def start(config_path: str | None, backend: str | None, model_path: str | None,
          tp_size: int | None, dp_size: int | None, mem_fraction: float | None,
          hicache: bool | None, hicache_size: int | None, profile: str | None,
          budget: int | None, policy: str | None, params: tuple[str, ...],
          db_path: str | None, log_candidates: str | None, host: str | None,
          port: int | None, token: str | None, speed: str | None, workload: str | None,
          rate: float | None, tasks: int | None, seed: int | None,
          workflows: tuple[str, ...], max_tokens: int | None, model: str | None,
          grace: float | None, task_timeout: float | None,
          runtime_file: str | None,
          log_level: str | None, log_file: str | None, detach: bool,
          print_config: bool) -> None:
    """Run the daemon: the engine, the TOPAS scheduler and the HTTP API.

    Settings: flag > TOPAS_* environment variable > topasd.toml > default.
    Runs in the foreground (logs on stderr) until SIGTERM/SIGINT, which stop
    admitting tasks, let running work finish (--grace), flush the store and
    exit 0.

    \b
    Try:
      topasd start --workload chain3 --rate 0.3
      topasd start --port 0 --speed max --print-config
      topasd start --backend vllm --model-path tiny-model --workload chain3 --rate 2
      topasd start --backend sglang --model-path Qwen/Qwen2.5-7B-Instruct --hicache
    """
    from topasd.config import load_settings, render

    flags: dict[str, Any] = {
        "backend": backend, "model_path": model_path, "tp_size": tp_size,
        "dp_size": dp_size, "mem_fraction": mem_fraction, "hicache": hicache,
        "hicache_size": hicache_size,
        "profile": profile, "budget": budget, "policy": policy,
        "params": _param_flags(params) if params else None, "db": db_path,
        "log_candidates": log_candidates, "host": host, "port": port, "token": token,
        "speed": speed, "workload": workload, "rate": rate, "tasks": tasks, "seed": seed,
        "workflows": list(workflows) or None, "max_tokens": max_tokens, "model": model,
        "grace": grace, "task_timeout": task_timeout,
        "runtime_file": runtime_file,
        "log_level": log_level, "log_file": log_file,
    }
    loaded = load_settings(flags, config=config_path)
    if print_config:
        click.echo(render(loaded))
        return
    if detach:
        _detach(loaded.settings)
        return
    from topasd.api import serve

    _setup_logging(loaded.settings.log_level,
                   None if os.environ.get(DETACHED_ENV) else loaded.settings.log_file)
    code = serve(loaded.settings, on_ready=lambda info: click.echo(
        f"topasd listening on {info['url']} (pid {info['pid']}, runtime file "
        f"{loaded.settings.runtime_file})", nl=True))
    sys.exit(code)


def _param_flags(items: tuple[str, ...]) -> dict[str, Any]:
    from topasd.config import parse_value

    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise TopasError(f"--param: expected NAME=VALUE, got {item!r}")
        key = name.strip()
        if key.lower() in {k.lower() for k in out}:
            raise TopasError(f"--param: {key} is given twice; give each parameter once")
        out[key] = parse_value(value.strip())
    return out


def _setup_logging(level: str, log_file: str | None = None) -> None:
    """Log to stderr, and to `log_file` too when given (a detached daemon's stderr
    already is its log file)."""
    import logging

    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        try:
            handlers.append(logging.FileHandler(log_file))
        except OSError as exc:
            raise TopasError(f"cannot write the daemon log {log_file} ({exc.strerror}); give "
                             "another --log-file") from None
    logging.basicConfig(level=level.upper(), handlers=handlers,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _detach(settings: Any) -> None:
    """Start this command again without --detach in a new session; wait until it listens."""
    import subprocess
    import time
    from pathlib import Path

    from topasd.config import read_runtime, stop_command

    runtime = Path(settings.runtime_file)
    other = read_runtime(runtime)
    if other is not None:
        raise TopasError(f"a daemon already runs (pid {other.get('pid')}, {other.get('url')}); "
                         f"stop it with `{stop_command(runtime)}` or give another --runtime-file")
    log_path = Path(settings.log_file or runtime.with_suffix(".log"))
    if not runtime.parent.is_dir():
        raise TopasError(f"runtime file {runtime}: folder {runtime.parent} does not exist; "
                         "create it or give another --runtime-file")
    args = [a for a in sys.argv[1:] if a != "--detach"]  # the same command, in the foreground
    try:
        log_fh = open(log_path, "ab")  # noqa: SIM115 (closed below, the child keeps its copy)
    except OSError as exc:
        flag = "--log-file" if settings.log_file else "--runtime-file (the log sits beside it)"
        raise TopasError(f"cannot write the daemon log {log_path} ({exc.strerror}); give "
                         f"another {flag}") from None
    with log_fh:
        proc = subprocess.Popen([sys.executable, "-m", "topasd.cli", *args],
                                stdin=subprocess.DEVNULL, stdout=log_fh, stderr=log_fh,
                                start_new_session=True, env={**os.environ, DETACHED_ENV: "1"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        info = read_runtime(runtime)
        if info is not None and info.get("pid") == proc.pid:
            click.echo(f"topasd started in the background: {info['url']} (pid {proc.pid}, "
                       f"log {log_path})")
            return
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["?"]
            raise TopasError(f"the daemon exited with status {proc.returncode}: {tail[0]} "
                             f"(log {log_path})")
        time.sleep(0.05)
    raise TopasError(f"the daemon did not start listening within 60 s (pid {proc.pid}, log "
                     f"{log_path})")


def _runtime_info(runtime_file: str | None, config_path: str | None) -> tuple[Any, Any]:
    from topasd.config import raw_setting, read_runtime

    path = str(raw_setting("runtime_file", {"runtime_file": runtime_file}, config=config_path))
    return path, read_runtime(path)


@main.command()
@click.option("--runtime-file", default=None, metavar="FILE",
              help="The daemon's runtime file (default: as `topasd start`).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML settings file naming runtime_file.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the daemon's state as JSON ({\"running\": false, ...} and exit "
                   "status 2 when none runs).")
def status(runtime_file: str | None, config_path: str | None, as_json: bool) -> None:
    """Show whether a daemon runs, where, and what it is doing."""
    import json

    import httpx

    path, info = _runtime_info(runtime_file, config_path)
    if info is None:
        why = (f"no daemon running (no live runtime file at {path}); start one with "
               "`topasd start`")
        if as_json:  # a script gets JSON either way (and the exit status)
            click.echo(json.dumps({"running": False, "daemon": None, "error": why}))
        raise TopasError(why)
    try:
        reply = httpx.get(f"{info['url']}/v1/state", params={"limit": 1}, timeout=10)
        state = reply.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise TopasError(f"daemon pid {info['pid']} at {info['url']} does not answer ({exc})"
                         ) from None
    if reply.status_code != 200:
        message = (state.get("error") or {}).get("message") if isinstance(state, dict) else None
        raise TopasError(f"daemon pid {info['pid']} at {info['url']} answered GET /v1/state "
                         f"with {reply.status_code}: {message or reply.text[:200]}; see its "
                         "log")
    if as_json:
        click.echo(json.dumps({"running": True, "daemon": info, "state": state}, indent=2))
        return
    c = state.get("counts", {})
    backend = info.get("backend", "sim")  # the speed paces the simulator only
    paced = f", speed {state.get('speed')}" if backend == "sim" else f", {backend} backend"
    click.echo(f"topasd {info.get('version', '?')} running: {info['url']} (pid {info['pid']})\n"
               f"  policy {state.get('policy')}, engine t={state.get('t', 0):.1f}s{paced}"
               f"{', draining' if state.get('draining') else ''}\n"
               f"  TOPAS search: {info.get('search', '?')}\n"
               f"  tasks: {c.get('tasks_in_flight', 0)} in flight, {c.get('tasks_finished', 0)} "
               f"finished; requests: {c.get('requests_running', 0)} running, "
               f"{c.get('requests_waiting', 0)} waiting; decisions {c.get('decisions', 0)}\n"
               f"  store: {info.get('db')} (run {info.get('run_id')})")


@main.command()
@click.option("--runtime-file", default=None, metavar="FILE",
              help="The daemon's runtime file (default: as `topasd start`).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML settings file naming runtime_file.")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="Seconds to wait for the daemon to exit.")
def stop(runtime_file: str | None, config_path: str | None, timeout: float) -> None:
    """Stop the daemon (SIGTERM: running work finishes within its grace period)."""
    import os
    import signal
    import time

    from topasd.config import stop_command

    path, info = _runtime_info(runtime_file, config_path)
    if info is None:
        raise TopasError(f"no daemon running (no live runtime file at {path})")
    pid = int(info["pid"])
    os.kill(pid, signal.SIGTERM)
    again = stop_command(path)
    deadline = time.monotonic() + timeout
    told = False
    while time.monotonic() < deadline:
        if _exited(pid):  # not just its runtime file gone: the engine may still be closing
            click.echo(f"topasd (pid {pid}) stopped")
            return
        if not told and time.monotonic() > deadline - timeout + 1.0:
            told = True  # still draining after a second: say why this waits
            click.echo(f"topasd (pid {pid}) is letting running work finish (its grace "
                       f"period); `{again}` again stops it now", err=True)
        time.sleep(0.1)
    raise TopasError(f"topasd (pid {pid}) did not exit within {timeout:.0f} s; it is still "
                     f"finishing work (see its log): `{again}` again stops it now and keeps "
                     "its log whole (SIGKILL would lose the last moments of it)")


def _exited(pid: int) -> bool:
    """The process is gone, or a zombie waiting for its parent to reap it."""
    from topasd.model import pid_alive

    if not pid_alive(pid):
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


# --------------------------------------------------------------- console


@main.command("console")
@click.option("--url", default=None, metavar="URL",
              help="The daemon's address (default: found through its runtime file).")
@click.option("--db", "db_path", type=click.Path(dir_okay=False), default=None,
              help="Replay a recorded run of this decision log instead of watching a daemon.")
@click.option("--run", "run_id", type=int, default=None,
              help="With --db: the run to replay (default: the latest).")
@click.option("--at", "at", type=float, default=None,
              help="With --db: start the time cursor here, in seconds (default: the start).")
@click.option("--runtime-file", default=None, metavar="FILE",
              help="The daemon's runtime file (default: as `topasd start`).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML settings file naming runtime_file.")
@click.option("--token", default=None, envvar="TOPAS_TOKEN", show_envvar=True,
              help="Bearer token for PATCH /v1/params on a daemon that needs one.")
@click.option("--keymap", type=click.Path(dir_okay=False), default=None,
              help="TOML file rebinding keys by binding id (see the help screen, `?`).")
@click.option("--poll", type=click.FloatRange(min=0.05), default=0.5, show_default=True,
              help="Seconds between state polls of a live daemon.")
def console_cmd(url: str | None, db_path: str | None, run_id: int | None, at: float | None,
                runtime_file: str | None, config_path: str | None, token: str | None,
                keymap: str | None, poll: float) -> None:
    """The operator console (TUI): watch and steer the local daemon, or replay a log.

    Panels: KV residency, tasks in flight, the decision feed with every
    candidate's score terms, headline numbers; `p` edits the parameters
    (PATCH /v1/params), `?` lists the keys, ctrl+p opens the command palette.

    \b
    Try:
      topasd start --workload chain3 --rate 0.3 --detach
      topasd console
      topasd console --db topasd.db --run 1
    """
    from console.app import ConsoleApp
    from console.keys import load_keymap
    from console.sources import ReplaySource, find_daemon

    if db_path is not None and url is not None:
        raise TopasError("give --url (a live daemon) or --db (a recorded run), not both")
    if db_path is None and (run_id is not None or at is not None):
        raise TopasError("--run and --at need --db FILE (the decision log to replay)")
    if at is not None and not math.isfinite(at):
        raise TopasError(f"--at {at}: give a finite time in seconds")
    keys = load_keymap(keymap) if keymap else None
    if db_path is not None:
        source = ReplaySource(db_path, run_id)
        ConsoleApp(replay=source, keymap=keys, at=at).run()
        return
    target = find_daemon(url, runtime_file, token, config_path)
    ConsoleApp(target, keymap=keys, poll_s=poll).run()


# ----------------------------------------------------------------- gantt


@main.command()
@click.argument("db", type=click.Path(dir_okay=False), required=False)
@click.option("--db", "db_option", type=click.Path(dir_okay=False), default=None,
              help="The decision log DB, as the positional DB (as `topasd console --db`).")
@click.option("--run", "run_id", type=int, default=None,
              help="Run id in DB (default: the latest; `topasd replay --db` prints them).")
@click.option("--view", type=click.Choice(["agents", "tasks"]), default="agents",
              show_default=True, help="One lane per agent, or one lane per task.")
@click.option("--output", "-o", type=click.Path(dir_okay=False), required=True,
              help="The HTML file to write (works offline: plotly.js is embedded).")
@click.option("--window", metavar="START:END", default=None,
              help="Only this time window, in seconds.")
@click.option("--max-bars", type=click.IntRange(min=1), default=None,
              help="Aggregate or window past this many bars and preemption marks "
                   "(default 4000); the tasks view also shows at most 200 task lanes.")
@click.option("--png", type=click.Path(dir_okay=False), default=None,
              help="Also save a screenshot (needs Debian's chromium).")
def gantt(db: str | None, db_option: str | None, run_id: int | None, view: str, output: str,
          window: str | None, max_bars: int | None, png: str | None) -> None:
    """Export a run of a decision log DB as a Plotly Gantt chart (HTML).

    \b
    Try:
      topasd replay --workload chain3 --policy lpm --tasks 20 --db run.db
      topasd gantt run.db -o gantt.html
    """
    from console.gantt import (
        DEFAULT_MAX_BARS,
        export_gantt,
        figure_height,
        png_file,
        screenshot,
    )

    if db and db_option and db != db_option:
        raise TopasError(f"two decision logs given ({db} and --db {db_option}): give one")
    db = db or db_option
    if not db:
        raise TopasError("give the decision log: `topasd gantt run.db -o gantt.html` (or --db)")
    if png:
        png_file(png)  # a bad path is named before the work, not after it
    g = export_gantt(db, output, run_id=run_id, view=view, window=_window(window),
                     max_bars=max_bars or DEFAULT_MAX_BARS)
    click.echo(g.summary(output), err=True)
    for note in g.notes:
        click.echo(f"  note: {note}", err=True)
    if png:
        screenshot(output, png, height=figure_height(g) + 20)
        click.echo(f"wrote {png}", err=True)


def _window(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise TopasError(f"--window: expected START:END in seconds, got {text!r}") from None
    if not (math.isfinite(a) and math.isfinite(b)):
        raise TopasError(f"--window: START and END must be finite numbers of seconds, got "
                         f"{text!r}")
    if not a < b:
        raise TopasError(f"--window: START must be below END, got {text!r}")
    return a, b


_COLUMNS = (
    ("policy", "policy", "{}"),
    ("mean JCT", "mean_jct_s", "{:.1f}"),
    ("p50", "p50_jct_s", "{:.1f}"),
    ("p99", "p99_jct_s", "{:.1f}"),
    ("makespan", "makespan_s", "{:.1f}"),
    ("req/s", "throughput_req_s", "{:.3f}"),
    ("1st task", "first_task_s", "{:.1f}"),
    ("batch", "mean_batch", "{:.1f}"),
    ("peak", "peak_batch", "{}"),
    ("loads", "prefix_loads", "{}"),
    ("load GB", "prefix_load_gb", "{:.1f}"),
    ("computes", "prefix_computes", "{}"),
    ("preempt", "preemptions", "{}"),
    ("retract", "retractions", "{}"),
    ("recomp tok", "recomputed_tokens", "{}"),
    ("dec ms", "decision_mean_ms", "{:.3f}"),
    ("dec p99", "decision_p99_ms", "{:.3f}"),
)


def _table(rows: list[dict[str, Any]], meta: Any, prof: HardwareProfile,
           engine: str | None = None) -> str:
    cells = [[h for h, _, _ in _COLUMNS]]
    cells += [[fmt.format(row[k]) for _, k, fmt in _COLUMNS] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(_COLUMNS))]
    from workflows.trace import is_number  # a header's rate is free-form

    known = [f"workload {meta['workload']}" if "workload" in meta else "",
             f"rate {meta['rate']} task/s" if is_number(meta.get("rate")) else ""]
    lines = [", ".join(x for x in (*known, f"{rows[0]['tasks']} tasks", f"profile {prof.name}",
                                   engine or "") if x) + " (times in s)"]
    for r in cells:
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    return "\n".join(lines)




if __name__ == "__main__":
    main()
