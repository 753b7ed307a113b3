"""Options more than one command takes, as decorators, and the `start` flags
derived from the settings model (`topasd.config.Settings`)."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import click

from topasd.config import Settings, parse_value
from topasd.model import INT64_MAX, TopasError

F = TypeVar("F", bound=Callable[..., Any])

# workflows.builtin.BUILTIN, spelled out so that `--help` does not import the
# workload loader (tests/test_cli.py checks they agree)
BUILTIN_NAMES = "table1, chain3, dag4, dag10wide, metagpt-sop, metagpt-tl"


def _stack(*options: Callable[[F], F]) -> Callable[[F], F]:
    """One decorator applying `options` in the order listed (top first in --help)."""
    def apply(fn: F) -> F:
        for option in reversed(options):
            fn = option(fn)
        return fn
    return apply


def workload_option(help: str, required: bool = False) -> Callable[[F], F]:
    return click.option("--workload", "-w", required=required, metavar="NAME|SPEC", help=help)


def sampling_options(tasks_help: str, seed_help: str) -> Callable[[F], F]:
    """--tasks and --seed of a sampled trace."""
    return _stack(
        click.option("--tasks", "-n", type=click.IntRange(min=1), default=200,
                     show_default=True, help=tasks_help),
        click.option("--seed", "-s", type=click.IntRange(0, INT64_MAX), default=0,
                     show_default=True, help=seed_help))


def daemon_lookup_options(config_help: str = "TOML settings file naming runtime_file."
                          ) -> Callable[[F], F]:
    """--runtime-file and --config: how a command finds the running daemon."""
    return _stack(
        click.option("--runtime-file", default=None, metavar="FILE",
                     help="The daemon's runtime file (default: as `topasd start`)."),
        click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
                     help=config_help))


def token_file_option(fn: F) -> F:
    """--token-file: where a client command reads the daemon's bearer token."""
    return click.option(
        "--token-file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
        help="Read the daemon's bearer token from this file (default: TOPAS_TOKEN, else "
             "the settings file's token or token_file).")(fn)


def param_flags(items: tuple[str, ...]) -> dict[str, Any]:
    """`--param NAME=VALUE` flags as a mapping (values JSON where they parse)."""
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


# How a setting is spelt as a flag where its field name is not enough; every
# other setting is `--<field-name>` with the field's description as its help.
_SPELLING: dict[str, dict[str, Any]] = {
    "backend": {"short": "-b"},
    "model_path": {"metavar": "PATH"},
    "profile": {"metavar": "NAME"},
    "policy": {"short": "-p", "metavar": "NAME"},
    "params": {"flag": "--param", "metavar": "NAME=VALUE"},
    "db": {"metavar": "FILE"},
    "log_candidates": {"metavar": "all|top:N|none"},
    "speed": {"metavar": "X|max"},
    "workload": {"short": "-w", "metavar": "NAME|SPEC"},
    "rate": {"short": "-r"},
    "tasks": {"short": "-n"},
    "seed": {"short": "-s"},
    "workflows": {"flag": "--workflow", "metavar": "SPEC"},
    "runtime_file": {"metavar": "FILE"},
    "token_file": {"metavar": "FILE"},
    "log_file": {"metavar": "FILE"},
}


def _click_type(name: str) -> dict[str, Any]:
    """The click type (and flag shape) of setting `name`, from its field."""
    field = Settings.model_fields[name]
    hint = field.annotation
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    if name == "params" or hint == list[str]:
        return {"multiple": True}
    if args == [bool]:
        return {"switch": True}  # a --x/--no-x pair
    if typing.get_origin(hint) is Literal:
        return {"type": click.Choice(typing.get_args(hint))}
    if args == [int]:  # its bounds: pydantic's Ge/Le metadata
        lo = next((m.ge for m in field.metadata if hasattr(m, "ge")), None)
        hi = next((m.le for m in field.metadata if hasattr(m, "le")), None)
        return {"type": click.IntRange(min=lo, max=hi)}
    if args == [float]:
        return {"type": float}
    return {}


def settings_options(fn: F) -> F:
    """One option per setting (default None: unset, so that the environment, the
    TOML file and the defaults fill it in `load_settings`), in field order."""
    for name in reversed(list(Settings.model_fields)):
        spelling = _SPELLING.get(name, {})
        flag = spelling.get("flag", "--" + name.replace("_", "-"))
        kind = _click_type(name)
        if kind.pop("switch", False):
            flag = f"{flag}/--no-{flag[2:]}"
        decls = [flag, *([spelling["short"]] if "short" in spelling else []), name]
        fn = click.option(*decls, default=None, metavar=spelling.get("metavar"),
                          help=Settings.model_fields[name].description, **kind)(fn)
    return fn


def settings_flags(values: dict[str, Any]) -> dict[str, Any]:
    """The settings the command line gave (None: not given), as `load_settings` takes them."""
    flags = dict(values)
    flags["params"] = param_flags(flags["params"]) if flags.get("params") else None
    flags["workflows"] = list(flags["workflows"]) or None
    return flags
