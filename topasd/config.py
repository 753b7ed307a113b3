"""Typed daemon settings: flag > `TOPAS_*` environment variable > `topasd.toml` > default.

    settings = load_settings({"port": 0})        # flags given on the command line
    print(render(settings))                      # `topasd start --print-config`

Every setting is a field of `Settings`; its environment variable is
`TOPAS_<NAME>` (`TOPAS_PORT`, `TOPAS_SPEED`, `TOPAS_PARAMS`, ...). The TOML
file is `--config PATH`, else `$TOPAS_CONFIG`, else `./topasd.toml` when it
exists; its top-level keys are the field names, policy parameters go in a
`[params]` table. `TOPAS_PARAMS` takes JSON (`{"beta": 5}`) or `beta=5,rho=2`.
A bad value is a `ConfigError` naming the setting, the value and where it came from.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from topasd.model import (
    INT64_MAX,
    MAX_BUDGET,
    TopasError,
    Workflow,
)
from topasd.profiles import DEFAULT_PROFILE, PROFILES
from topasd.scheduler import ALL_POLICY_NAMES, build_policy
from topasd.scheduler.param_specs import canonical_params

ENV_PREFIX = "TOPAS_"
CONFIG_FILE = "topasd.toml"
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(TopasError):
    """A setting is invalid; the message names it, its value and its source."""


def default_runtime_file() -> str:
    """Where a running daemon records its address: `$XDG_RUNTIME_DIR/topasd.json`,
    else `topasd.json` in the private folder `private_runtime_dir()`."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and Path(base).is_dir():
        return str(Path(base) / "topasd.json")
    return str(private_runtime_dir() / "topasd.json")


def private_runtime_dir() -> Path:
    """`<tmp>/topasd-<uid>`: this user's folder for the runtime file and the
    detached log when XDG_RUNTIME_DIR is unset (created 0700 by the daemon, and
    refused when another user owns it or may enter it)."""
    return Path(tempfile.gettempdir()) / f"topasd-{os.geteuid()}"


class Settings(BaseModel):
    """Everything `topasd start` can be told (see `docs/api.md`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["sim", "vllm", "sglang"] = Field(
        default="sim", description="Engine backend [default: sim]: the simulator, vLLM on "
        "this CPU (docs/vllm.md) or SGLang on GPUs (docs/sglang.md).")
    model_path: str | None = Field(
        default=None, description="vllm/sglang: the model (vllm: a directory, `topasd model "
        "tiny -o DIR`).")
    tp_size: int = Field(default=1, ge=1,
                         description="sglang: tensor-parallel ranks [default: 1].")
    dp_size: int = Field(default=1, ge=1, description="sglang: data-parallel replicas, one "
                         "TOPAS each [default: 1].")
    mem_fraction: float | None = Field(
        default=None, gt=0, le=1, description="sglang: mem_fraction_static [default: "
        "SGLang's].")
    hicache: bool = Field(default=False, description="sglang: hierarchical KV cache, so "
                          "prefixes move to host memory [default: off].")
    hicache_size: int | None = Field(default=None, ge=0,
                                     description="sglang: host KV pool per rank, GB.")
    profile: str = Field(default=DEFAULT_PROFILE, description="Hardware profile of the "
                         f"simulator: {', '.join(sorted(PROFILES))} [default: "
                         f"{DEFAULT_PROFILE}].")
    budget: int | None = Field(
        default=None, ge=1, le=MAX_BUDGET, description="Override the profile's KV budget "
        "(tokens); with --backend sglang, at most the pool SGLang reports.")
    policy: str = Field(default="topas", description="Scheduling policy [default: topas].")
    params: dict[str, Any] = Field(
        default_factory=dict, description="A policy parameter, repeatable (beta=10, rho=1, "
        "H_age=30, M=6, K=0, ...).")
    db: str = Field(default="topasd.db", description="SQLite decision log [default: "
                    "topasd.db].")
    log_candidates: str = Field(default="top:8", description="Candidates per decision "
                                "written to the log [default: top:8].")
    host: str = Field(default="127.0.0.1",
                      description="Address to listen on [default: 127.0.0.1].")
    port: int = Field(default=8470, ge=0, le=65535,
                      description="Port [default: 8470]; 0 picks a free one.")
    token: str | None = Field(default=None, description="Bearer token (required off "
                              "loopback, at least 16 characters there); on the command line "
                              "other users see it in `ps`: prefer --token-file or TOPAS_TOKEN.")
    token_file: str | None = Field(default=None, description="Read the bearer token from "
                                   "this file (its first line; keep it 0600).")
    public_reads: bool = Field(default=False, description="Off loopback, let reads (GET "
                               "/v1/..., /metrics) through without the token [default: "
                               "off: every /v1 and /metrics request needs it].")
    speed: float | Literal["max"] = Field(
        default=1.0, description="Sim clock: engine seconds per wall second, or 'max' "
        "(unpaced) [default: 1].")
    workload: str | None = Field(default=None, description="Feed tasks of this workload "
                                 "with the built-in driver.")
    rate: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="Driver arrival rate, task/s "
        "(default: the workload's middle operating point).")
    tasks: int | None = Field(
        default=None, ge=1, description="Stop the driver after this many tasks (default: "
        "unbounded); then it plays the trace `topasd trace gen` writes for the same "
        "workload, rate, seed and count, so `topasd replay` reruns the daemon's work (with "
        "no API clients, decision for decision).")
    seed: int = Field(default=0, ge=0, le=INT64_MAX,
                      description="Sampling seed [default: 0].")
    workflows: list[str] = Field(
        default_factory=list, description="Register a workflow spec file for /v1/tasks and "
        "OpenAI calls, repeatable.")
    max_tokens: int = Field(default=256, ge=1, description="Output tokens of an OpenAI call "
                            "without max_tokens [default: 256].")
    task_timeout: float = Field(
        default=600.0, ge=0, allow_inf_nan=False, description="Drop an application-driven "
        "task after this many seconds without a call [default: 600; 0: never].")
    model: str = Field(default="topasd-sim", description="Model name listed by /v1/models "
                       "[default: topasd-sim; with --model-path, its folder's name].")
    max_tasks: int = Field(
        default=4096, ge=0, description="Admission control: a new task (POST /v1/tasks, a "
        "call that opens one, a driver arrival) while this many are in flight is refused "
        "with 429 and Retry-After [default: 4096; 0: no bound].")
    max_waiting: int = Field(
        default=4096, ge=0, description="Admission control: a new task while this many "
        "requests wait in the engine is refused with 429 [default: 4096; 0: no bound]; "
        "calls of tasks in flight are always taken.")
    stream_keepalive: float = Field(
        default=5.0, gt=0, le=3600, allow_inf_nan=False, description="A streamed call that "
        "waits for admission gets an SSE comment every this many seconds, so a client's "
        "idle-read timeout does not give up on it [default: 5].")
    summary_every: float = Field(
        default=60.0, ge=0, allow_inf_nan=False, description="Log a one-line summary "
        "(tasks, requests, JCT, decisions, preemptions, KV) every this many seconds "
        "[default: 60; 0: never].")
    metrics_agents: int = Field(
        default=64, ge=1, le=100_000, description="/metrics: agents with a series of their "
        "own; the rest fold into agent=\"other\" [default: 64].")
    grace: float = Field(default=30.0, ge=0, allow_inf_nan=False, description="Seconds "
                         "running work may finish after SIGTERM [default: 30].")
    runtime_file: str = Field(
        default_factory=default_runtime_file, description="Where the bound address is "
        "recorded for status/stop/console.")
    log_file: str | None = Field(
        default=None, description="Also log to this file (appended); with --detach, the "
        "daemon's only log [default with --detach: beside the runtime file].")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Log level (logs go to stderr) [default: info].")

    @field_validator("profile")
    @classmethod
    def _profile(cls, v: str) -> str:
        if v not in PROFILES:
            raise ValueError(f"unknown hardware profile; choose one of {sorted(PROFILES)}")
        return v

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v not in ALL_POLICY_NAMES:
            raise ValueError(f"unknown policy; choose one of {', '.join(ALL_POLICY_NAMES)}")
        return v

    @field_validator("params")
    @classmethod
    def _params(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            return canonical_params(v)
        except TopasError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("token")
    @classmethod
    def _token(cls, v: str | None) -> str | None:
        if v is not None and not (v.isascii() and v.isprintable() and " " not in v and v):
            raise ValueError("use printable ASCII without spaces (an HTTP header carries "
                             "it), e.g. the output of: python -c 'import secrets; "
                             "print(secrets.token_urlsafe())'")
        return v

    @field_validator("speed", mode="before")
    @classmethod
    def _speed(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().lower() == "max":
            return "max"
        try:
            speed = float(v)
        except (TypeError, ValueError):
            raise ValueError("expected a number > 0 or 'max' (unpaced)") from None
        if not speed > 0 or speed == float("inf"):
            raise ValueError("expected a number > 0 or 'max' (unpaced)")
        return speed

    @field_validator("log_candidates")
    @classmethod
    def _log_candidates(cls, v: str) -> str:
        from store import CandidateFilter

        try:
            return str(CandidateFilter.parse(v))
        except TopasError:
            raise ValueError("expected all, none or top:N (N >= 1)") from None

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level(cls, v: Any) -> Any:
        return v.lower() if isinstance(v, str) else v

    @property
    def paced(self) -> bool:
        return self.speed != "max"

    @property
    def loopback(self) -> bool:
        """Bound to a loopback address only (no token needed)."""
        return is_loopback(self.host)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


MIN_REMOTE_TOKEN = 16  # characters of a token that guards a daemon bound off loopback


@dataclass(frozen=True)
class Loaded:
    """Merged settings and where each value came from (flag, env NAME, file PATH,
    default), and what the operator should be warned of (e.g. a token on the
    command line)."""

    settings: Settings
    sources: Mapping[str, str]
    warnings: tuple[str, ...] = ()


def load_settings(flags: Mapping[str, Any] | None = None, *, config: str | None = None,
                  environ: Mapping[str, str] | None = None) -> Loaded:
    """Merge defaults < TOML file < `TOPAS_*` env < `flags` (None values are unset)."""
    raw, sources = _merged(flags, config, os.environ if environ is None else environ)
    warnings = _read_token_file(raw, sources)
    try:
        settings = Settings(**raw)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, raw, sources)) from None
    _check_engine(settings, sources)
    if "model" not in raw and settings.model_path:  # /v1/models names the engine's model
        settings = settings.model_copy(update={"model": Path(settings.model_path).name})
    if settings.tasks is not None and settings.workload is None:
        raise ConfigError("setting tasks needs a workload (--workload NAME) to drive")
    if settings.rate is not None and settings.workload is None:
        raise ConfigError("setting rate needs a workload (--workload NAME) to drive")
    try:
        build_policy(settings.policy, settings.params)
    except TopasError as exc:
        raise ConfigError(f"setting params (from {sources.get('params', 'default')}): "
                          f"{exc}") from None
    _check_specs(settings, sources)
    _check_token(settings)
    if sources.get("token") == "flag":
        warnings += ("the bearer token is on the command line, where other users of this "
                     "machine see it (`ps`); give it with --token-file FILE or TOPAS_TOKEN",)
    return Loaded(settings, {k: sources.get(k, "default") for k in Settings.model_fields},
                  warnings)


def _check_token(settings: Settings) -> None:
    """Off loopback the daemon needs a token, and one not guessed in a few tries."""
    if settings.loopback:
        return
    if not settings.token:
        raise ConfigError(f"host {settings.host!r} is not a loopback address: set a bearer "
                          "token (--token-file FILE, TOPAS_TOKEN or token in topasd.toml) so "
                          "that the API is protected")
    if len(settings.token) < MIN_REMOTE_TOKEN:
        raise ConfigError(f"setting token: {len(settings.token)} characters is too short for "
                          f"host {settings.host!r} (off loopback: at least {MIN_REMOTE_TOKEN});"
                          " make one with: python -c 'import secrets; "
                          "print(secrets.token_urlsafe())'")


def _read_token_file(raw: dict[str, Any], sources: dict[str, str]) -> tuple[str, ...]:
    """Put the token of `token_file` (its first line) into `raw`; warnings about
    the file (other users may read it). ConfigError when it is unreadable or
    empty, or a token is given as well."""
    path = raw.get("token_file")
    if path is None:
        return ()
    where = f"setting token_file = {path!r} (from {sources['token_file']})"
    if raw.get("token") is not None:
        raise ConfigError(f"{where}: a token is also given (from {sources['token']}); give "
                          "one of them")
    try:
        with open(path, encoding="utf-8") as fh:
            token = fh.readline().strip()
            mode = os.fstat(fh.fileno()).st_mode
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"{where}: cannot read it ({why})") from None
    if not token:
        raise ConfigError(f"{where}: its first line is empty; write the token there")
    raw["token"], sources["token"] = token, f"token_file {path}"
    if mode & 0o077:
        return (f"the token file {path} may be read by other users (mode "
                f"{mode & 0o777:o}); chmod 600 it",)
    return ()


def _merged(flags: Mapping[str, Any] | None, config: str | None, env: Mapping[str, str]
            ) -> tuple[dict[str, Any], dict[str, str]]:
    """The raw settings (file, then environment, then flags) and each one's source."""
    raw: dict[str, Any] = {}
    sources: dict[str, str] = {}
    path = config or env.get(f"{ENV_PREFIX}CONFIG")
    if path is None and Path(CONFIG_FILE).is_file():
        path = CONFIG_FILE
    if path is not None:
        for key, value in _read_toml(path).items():
            raw[key], sources[key] = value, f"file {path}"
    _check_env_names(env)
    for name in Settings.model_fields:
        var = f"{ENV_PREFIX}{name.upper()}"
        if var in env:
            raw[name], sources[name] = _env_value(name, env[var], var), f"env {var}"
    for key, value in (flags or {}).items():
        if value is None:
            continue
        if key == "params" and isinstance(value, Mapping):
            raw["params"] = {**raw.get("params", {}), **value}
            sources[key] = f"{sources[key]} + flag" if key in sources else "flag"
        else:
            raw[key] = value
            sources[key] = "flag"
    return raw, sources


def _check_engine(settings: Settings, sources: Mapping[str, str]) -> None:
    """The engine settings fit the backend: a real engine has a model and runs in
    real time; the SGLang options are for SGLang."""
    if settings.backend != "sim":
        if not settings.model_path:
            raise ConfigError(f"backend {settings.backend} needs a model: --model-path PATH"
                              + (" (`topasd model tiny -o DIR` writes a tiny one)"
                                 if settings.backend == "vllm" else ""))
        if settings.speed != 1.0:
            raise ConfigError(f"setting speed (from {sources.get('speed', 'default')}): a "
                              f"{settings.backend} engine runs in real time; --speed is for "
                              "the sim backend")
    elif settings.model_path is not None:
        raise ConfigError("setting model_path needs --backend vllm or sglang (the simulator "
                          "takes no model)")
    sglang_only = {"tp_size": settings.tp_size != 1, "dp_size": settings.dp_size != 1,
                   "mem_fraction": settings.mem_fraction is not None,
                   "hicache": settings.hicache, "hicache_size": settings.hicache_size is not None}
    stray = [name for name, given in sglang_only.items() if given]
    if settings.backend != "sglang" and stray:
        raise ConfigError(f"setting {stray[0]} (from {sources.get(stray[0], 'default')}) is "
                          f"for --backend sglang, not {settings.backend}: drop it")


def _check_specs(settings: Settings, sources: Mapping[str, str]) -> None:
    """The workload and workflow spec files load, and no two workflows share a
    name (a bad one stops the start with the setting and where it came from,
    `--print-config` included)."""
    from workflows.builtin import BUILTIN, builtin_workflows, load_workload
    from workflows.spec import load_workflow

    def workload_flows(value: str) -> tuple[Workflow, ...]:
        return tuple(load_workload(value).workflows)

    checks: list[tuple[str, str, Callable[[str], tuple[Workflow, ...]]]] = []
    if settings.workload:
        checks.append(("workload", settings.workload, workload_flows))
    checks += [("workflows", path, lambda v: (load_workflow(v),)) for path in settings.workflows]
    taken = {name: f"the built-in workload {w!r}" for name, (w, _) in builtin_workflows().items()}
    for name, value, load in checks:
        try:
            loaded = load(value)
        except TopasError as exc:
            raise ConfigError(f"setting {name} = {value!r} (from "
                              f"{sources.get(name, 'default')}): {exc}") from None
        if name == "workload" and value in BUILTIN:
            continue  # its names are taken already, by itself
        for wf in loaded:
            if wf.name in taken:
                raise ConfigError(
                    f"setting {name} = {value!r} (from {sources.get(name, 'default')}): "
                    f"its workflow name {wf.name!r} is taken by {taken[wf.name]}; rename "
                    "it (the spec's `name:`) so that every task and call gets the "
                    "workflow it names")
            kind = "workload" if name == "workload" else "workflow spec"
            taken[wf.name] = f"the {kind} {value!r}"


def raw_setting(name: str, flags: Mapping[str, Any] | None = None, *,
                config: str | None = None) -> Any:
    """One setting merged without validating the rest (for `status`/`stop`)."""
    if flags and flags.get(name) is not None:
        return flags[name]
    var = f"{ENV_PREFIX}{name.upper()}"
    if var in os.environ:
        return os.environ[var]
    path = config or os.environ.get(f"{ENV_PREFIX}CONFIG")
    if path is None and Path(CONFIG_FILE).is_file():
        path = CONFIG_FILE
    if path is not None:
        data = _read_toml(path)
        if name in data:
            return data[name]
    field = Settings.model_fields[name]
    return field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]


def client_token(token_file: str | None = None, *, config: str | None = None) -> str | None:
    """The token a client command (`status`, `console`) sends: `token_file`'s
    first line, else the token setting (TOPAS_TOKEN, the TOML file's `token` or
    `token_file`), as `topasd start` would read it; None when none is set."""
    path = token_file or raw_setting("token_file", config=config)
    if path is None:
        token = raw_setting("token", config=config)
        return str(token) if token else None
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.readline().strip() or None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"token file {path}: cannot read it ({why})") from None


def render(loaded: Loaded) -> str:
    """The merged settings as TOML, each line commented with its source (token masked)."""
    data = loaded.settings.model_dump()
    lines: list[str] = []
    for name, value in data.items():
        if name == "params":
            continue
        if name == "token" and value:
            value = "***"
        text = f"# {name} unset" if value is None else f"{name} = {_toml(value)}"
        lines.append(f"{text:<44} # {loaded.sources[name]}")
    lines.append(f"{'[params]':<44} # {loaded.sources['params']}")
    for key, value in sorted(data["params"].items()):
        lines.append(f"{key} = {_toml(value)}")
    return "\n".join(lines)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    unknown = sorted(set(data) - set(Settings.model_fields))
    if unknown:
        raise ConfigError(f"{path}: unknown setting(s) {unknown}; known: "
                          f"{sorted(Settings.model_fields)}")
    return data


def _check_env_names(env: Mapping[str, str]) -> None:
    """A `TOPAS_*` variable that names no setting is an error (a misspelled one
    would otherwise be ignored without a word, as a TOML file's is not)."""
    known = {f"{ENV_PREFIX}{n.upper()}" for n in Settings.model_fields} | {
        f"{ENV_PREFIX}CONFIG"}
    for var in sorted(v for v in env if v.startswith(ENV_PREFIX) and v not in known):
        near = difflib.get_close_matches(var.removeprefix(ENV_PREFIX),
                                         [k.removeprefix(ENV_PREFIX) for k in sorted(known)], n=1)
        hint = f"did you mean {ENV_PREFIX}{near[0]}? " if near else ""
        raise ConfigError(f"environment variable {var} names no setting: {hint}unset it; "
                          f"known: {', '.join(sorted(known))}")


def _env_value(name: str, text: str, var: str) -> Any:
    """An environment string as the field wants it (lists and params parsed)."""
    if name == "params":
        return parse_params(text, var)
    if name == "workflows":
        return [p for p in text.split(os.pathsep) if p]
    if text == "" and Settings.model_fields[name].default is None:
        return None
    return text


def parse_params(text: str, where: str) -> dict[str, Any]:
    """`{"beta": 5}` or `beta=5,rho=2` (values JSON where they parse, else strings)."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a JSON object of parameters")
        return data
    out: dict[str, Any] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{where}: expected NAME=VALUE, got {item!r}")
        out[key.strip()] = parse_value(value.strip())
    return out


def parse_value(text: str) -> Any:
    """A parameter value: JSON number/bool/null where it parses, else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _explain(exc: ValidationError, raw: Mapping[str, Any], sources: Mapping[str, str]) -> str:
    problems = []
    for err in exc.errors():
        name = str(err["loc"][0]) if err["loc"] else "?"
        value = raw.get(name, "?")
        if name == "token":
            value = "***"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown setting; known: {sorted(Settings.model_fields)}"
        problems.append(f"setting {name} = {value!r} (from {sources.get(name, 'default')}): "
                        f"{msg}")
    return "; ".join(problems)
