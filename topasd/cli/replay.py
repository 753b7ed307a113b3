"""`topasd replay`: run a trace through policies in virtual time (the
simulator, or a real vLLM engine on this CPU), print the JCT table, and
optionally log every decision to a store file."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import click

from topasd.cli.options import (
    BUILTIN_NAMES,
    param_flags,
    sampling_options,
    workload_option,
)
from topasd.cli.trace import generated_trace, max_line_bytes_option, progress
from topasd.model import MAX_BUDGET, TopasError
from topasd.profiles import DEFAULT_PROFILE, PROFILES, HardwareProfile, get_profile
from topasd.scheduler import (
    ALL_POLICY_NAMES,
    POLICY_NAMES,
    TUNABLE_NAMES,
    build_policy,
    policy_params,
)
from topasd.scheduler import native as compiled_search
from topasd.scheduler.param_specs import canonical_param
from workflows.lines import DEFAULT_MAX_LINE_BYTES
from workflows.trace import is_number

if TYPE_CHECKING:
    from backends.base import Backend
    from backends.sglang import SGLangOptions
    from backends.sglang.backend import SGLangBackend
    from store import Store, StoreSink

# `replay --backend vllm|sglang --model DIR` (docs/vllm.md, docs/sglang.md)
REPLAY_BACKENDS = ("sim", "vllm", "sglang")
VLLM_BUDGET = 16384  # default KV pool of --backend vllm (backends.vllm.POOL_TOKENS), tokens
VLLM_CLOCKS = ("steps", "cpu", "profile")  # replay's choices of VllmBackend's clock


def policies_epilog() -> str:
    """The policies --policy takes, from the registry, in a block click does not
    rewrap (wrapping would split `topas-paper` at its hyphen)."""
    variants = [n for n in ALL_POLICY_NAMES if n not in POLICY_NAMES]
    topas = [n for n in variants if n in TUNABLE_NAMES]
    oracles = [n for n in variants if n not in TUNABLE_NAMES]
    return ("\b\nPolicies (--policy NAME, repeatable):\n"
            f"  all (the default) runs: {', '.join(POLICY_NAMES)}\n"
            f"  TOPAS variants, by name only: {', '.join(topas)}\n"
            f"  peers with an oracle, by name only: {', '.join(oracles)}")


@click.command(epilog=policies_epilog())
@click.argument("trace_file", required=False, type=click.Path(dir_okay=False))
@workload_option("Generate the trace from a workload instead of reading TRACE_FILE: "
                 f"{BUILTIN_NAMES}, or a workflow spec file.")
@click.option("--rate", "-r", type=float, default=None,
              help="Arrival rate for --workload (default: its middle operating point).")
@sampling_options("Tasks for --workload.", "Seed for --workload.")
@click.option("--policy", "-p", "policies", multiple=True, default=("all",), show_default=True,
              help="Policy to run, repeatable, or 'all' (the policies are listed at the end).")
@click.option("--backend", "-b", type=click.Choice(REPLAY_BACKENDS), default="sim",
              show_default=True,
              help="sim: the simulator; vllm: a real vLLM engine on this CPU; sglang: a "
                   "real SGLang engine (on a CPU with SGLANG_USE_CPU_ENGINE=1; one engine "
                   "serves every policy). Both need --model.")
@click.option("--model", "--model-path", "model", type=click.Path(), default=None,
              metavar="DIR", help="With --backend vllm or sglang: the model directory "
                                  "(`topasd model tiny -o DIR` writes one).")
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
@max_line_bytes_option("trace")
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
           clock: str | None, profile: str, budget: int | None, max_line_bytes: int,
           as_json: bool, quiet: bool,
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
    the sum of measured engine steps (docs/vllm.md). With --backend sglang
    the same runs through a real SGLang engine (one engine for every policy,
    its cache flushed between them) in wall-clock time (docs/sglang.md).

    \b
    Try:
      topasd model tiny -o tiny-model
      topasd replay --workload chain3 --tasks 3 -p topas --backend vllm --model tiny-model
    """
    sglang_opts = _sglang_options(backend, model, budget, clock)
    vllm_opts = _vllm_options(backend, model, budget, clock) if sglang_opts is None else None
    tr = _load_or_generate(trace_file, workload, rate, tasks, seed,
                           _given("tasks", "seed", "max_line_bytes"), max_line_bytes)
    prof = _replay_profile(vllm_opts, profile, budget, sglang_opts)
    tr.check_fits(prof.budget_tokens, _vllm_context(vllm_opts))
    names = _policy_names(policies)
    tuned = _topas_params(names, param_flags(params)) if params else {}
    store = _open_store(db_path, log_candidates)  # last: bad input leaves no log file
    rows = _run_all(tr, names, prof, store, log_candidates or "all", vllm_opts, tuned,
                    quiet or as_json, sglang_opts)
    clock_used = None if vllm_opts is None else vllm_opts.get("clock", "steps")
    if sglang_opts is not None:
        clock_used = "wall"
    if as_json:
        engine = {"backend": backend} | ({} if clock_used is None else {"clock": clock_used})
        click.echo(json.dumps({"trace": dict(tr.meta), "profile": prof.name, **engine,
                               "search": compiled_search.status().reason, "runs": rows},
                              indent=2))
        return
    engine_name = "SGLang" if sglang_opts is not None else "vLLM"
    click.echo(table(rows, tr.meta, prof, None if clock_used is None
                     else f"{engine_name} engine, clock {clock_used}"))
    if tuned:
        click.echo("TOPAS parameters: " + ", ".join(
            f"{k}={json.dumps(v) if isinstance(v, bool) or v is None else v}"
            for k, v in tuned.items()))


def _replay_profile(vllm_opts: dict[str, Any] | None, profile: str,
                    budget: int | None, sglang_opts: SGLangOptions | None = None
                    ) -> HardwareProfile:
    """The cost profile of the runs: --profile (and --budget, or the pool
    SGLang is asked for), or vLLM's."""
    if vllm_opts is None:
        prof = get_profile(profile)
        if sglang_opts is not None and sglang_opts.max_total_tokens is not None:
            budget = sglang_opts.max_total_tokens
        return prof if budget is None else prof.with_overrides(budget_tokens=budget)
    if click.get_current_context().get_parameter_source("profile") is \
            click.core.ParameterSource.COMMANDLINE:
        vllm_opts["profile"] = get_profile(profile)
    return _vllm_profile(vllm_opts)


def _run_all(tr: Any, names: list[str], prof: HardwareProfile, store: Store | None,
             log_candidates: str, vllm_opts: dict[str, Any] | None, tuned: dict[str, Any],
             hidden: bool, sglang_opts: SGLangOptions | None = None) -> list[dict[str, Any]]:
    """One row per policy; Ctrl-C keeps what finished (`_interrupted`). An
    SGLang engine is started once and serves every policy (reset between)."""
    rows: list[dict[str, Any]] = []
    sink: StoreSink | None = None
    name = names[0]
    shared = None
    try:
        if sglang_opts is not None:
            from backends.sglang import make_backend as sglang_backend

            shared = sglang_backend(sglang_opts, prof)
        for name in names:
            sink = None if store is None else store.sink(log_candidates)
            with progress(len(tr.tasks), f"{name:>13}", hidden) as tick:
                rows.append(_run_one(tr, name, prof, tick, sink, vllm_opts,
                                     tuned if name in TUNABLE_NAMES else {}, shared))
            if sink is not None:
                rows[-1]["run_id"] = sink.run_id
    except KeyboardInterrupt:  # Ctrl-C: keep what finished
        _interrupted(name, rows, store, sink, tr.meta, prof)
    finally:
        if shared is not None:
            shared.close()
    if store is not None:
        ids = [r["run_id"] for r in rows]
        click.echo(f"decision log: {store.path} (run{'s' if len(ids) > 1 else ''} "
                   f"{', '.join(map(str, ids))})", err=True)
        store.close()
    return rows


def _interrupted(name: str, rows: list[dict[str, Any]], store: Any, sink: Any, meta: Any,
                 prof: HardwareProfile) -> NoReturn:
    """After Ctrl-C in a replay: the policies that finished, where the cut run is,
    exit 130 (as a shell reports SIGINT)."""
    click.echo(f"\ninterrupted during {name}", err=True)
    if rows:
        click.echo(table(rows, meta, prof))
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
                      max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Any:
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
        return load_trace(trace_file, max_line_bytes)
    if not workload:
        raise TopasError("give a TRACE_FILE (see `topasd trace gen`) or --workload NAME")
    if "max_line_bytes" in given:
        raise TopasError("--max-line-bytes bounds the lines of TRACE_FILE; --workload reads "
                         "no trace (drop it)")
    if rate is None:
        points = load_workload(workload).operating_points
        if not points:
            raise TopasError(f"workload {workload!r} lists no operating points; pass --rate")
        rate = points[len(points) // 2]
    return generated_trace(workload, rate, tasks, seed)


def _policy_names(policies: tuple[str, ...]) -> list[str]:
    names: list[str] = []
    for p in policies:
        for name in (POLICY_NAMES if p == "all" else (p,)):
            if name not in ALL_POLICY_NAMES:
                raise TopasError(f"unknown policy {name!r}; choose from "
                                 f"{', '.join(ALL_POLICY_NAMES)} or 'all'")
            if name not in names:
                names.append(name)
    return names


def _topas_params(names: list[str], params: dict[str, Any]) -> dict[str, Any]:
    """--param values, checked against every TOPAS policy of the replay."""
    topas = [n for n in names if n in TUNABLE_NAMES]
    if not topas:
        raise TopasError("--param sets TOPAS parameters, but no TOPAS policy is selected; "
                         "add -p topas (the baselines take no parameters)")
    taken = [policy_params(build_policy(name, params)) for name in topas]  # names a bad parameter
    # as the policy took them (k=1e5 is 100000, M=6.0 is 6)
    return {canonical_param(k): taken[0][canonical_param(k)] for k in params}


def _run_one(tr: Any, name: str, prof: HardwareProfile,
             tick: Callable[[int, int, float], None], sink: Any = None,
             vllm_opts: dict[str, Any] | None = None,
             params: dict[str, Any] | None = None,
             shared: SGLangBackend | None = None) -> dict[str, Any]:
    """One policy's run (on `shared`, reset afterwards, or a backend of its own)."""
    from backends.sim.engine import SimBackend
    from topasd.runner import Run

    backend: Backend
    if shared is not None:
        backend = shared
    elif vllm_opts is None:
        backend = SimBackend(prof)
    else:
        from backends.vllm import make_backend

        backend = make_backend(**vllm_opts)
    try:
        result = Run(tr, build_policy(name, params or {}), backend, sink=sink,
                     progress=tick).execute()
    finally:
        if shared is None:
            backend.close()
    if shared is not None:
        shared.reset()
    row = result.summary()
    if params:
        row["params"] = dict(params)
    return row


def _vllm_options(backend: str, model: str | None, budget: int | None,
                  clock: str | None = None) -> dict[str, Any] | None:
    """`make_backend` keywords for --backend vllm (None for the simulator)."""
    if backend != "vllm":
        if model is not None:
            raise TopasError("--model needs --backend vllm or sglang (the simulator takes no "
                             "model)")
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


def _sglang_options(backend: str, model: str | None, budget: int | None,
                    clock: str | None) -> SGLangOptions | None:
    """The engine options of --backend sglang (None for another backend):
    `backends.sglang.local_options` (the CPU engine where selected)."""
    if backend != "sglang":
        return None
    if model is None:
        raise TopasError("--backend sglang needs --model-path DIR (a model directory or hub "
                         "name; `topasd model tiny -o DIR` writes a tiny one)")
    if clock is not None:
        raise TopasError("--clock is for --backend vllm; SGLang's engine runs on its own, so "
                         "a replay through it runs in wall-clock time (drop --clock)")
    from backends.sglang import local_options

    return local_options(model, budget)


def _vllm_context(opts: dict[str, Any] | None) -> tuple[int, str] | None:
    """vLLM's max_model_len for --model and --budget, and its fix (None: the sim)."""
    if opts is None:
        return None
    from backends.vllm import read_model_config
    from backends.vllm.sizing import context_fix, context_tokens

    context = context_tokens(read_model_config(opts["model"]), opts["budget_tokens"])
    return context, context_fix(context, opts["budget_tokens"])


def _vllm_profile(opts: dict[str, Any]) -> HardwareProfile:
    """The cost profile a vLLM run reports (the pool as the backend will size it)."""
    from backends.vllm import read_model_config
    from backends.vllm.sizing import cpu_profile, pool_tokens

    budget = pool_tokens(opts["budget_tokens"])
    given = opts.get("profile")
    if given is not None:
        return given.with_overrides(budget_tokens=budget)
    return cpu_profile(budget, 512, read_model_config(opts["model"]))


def _open_store(db_path: str | None, log_candidates: str | None) -> Store | None:
    """The decision log for --db (None without it); checks --log-candidates."""
    from store import CandidateFilter, Store

    if db_path is None:
        if log_candidates is not None:
            raise TopasError("--log-candidates needs --db FILE (the decision log to write)")
        return None
    CandidateFilter.parse(log_candidates or "all")
    return Store(db_path)



COLUMNS = (
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


def table(rows: list[dict[str, Any]], meta: Any, prof: HardwareProfile,
           engine: str | None = None) -> str:
    cells = [[h for h, _, _ in COLUMNS]]
    cells += [[fmt.format(row[k]) for _, k, fmt in COLUMNS] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    known = [f"workload {meta['workload']}" if "workload" in meta else "",
             f"rate {meta['rate']} task/s" if is_number(meta.get("rate")) else ""]
    lines = [", ".join(x for x in (*known, f"{rows[0]['tasks']} tasks", f"profile {prof.name}",
                                   engine or "") if x) + " (times in s)"]
    for r in cells:
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    return "\n".join(lines)





COMMANDS = [replay]
