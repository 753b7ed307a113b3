"""One generated case of `bench/generalization.py` replayed through several
policies, each with its parameters: the command line and the loop shared by
the benches that diagnose a case (retractions.py, prefix_room.py)."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from typing import Any

from generalization import CACHE, Cache, capacities, parse_params

from workflows.generator import FAMILIES, LOADS

# replay(family, draw, load, policy, params, tasks, capacity) -> the policy's row
Replay = Callable[[str, int, str, str, dict[str, Any], int, float], dict[str, Any]]


def case_parser(description: str, draw: int, load: str) -> argparse.ArgumentParser:
    """--family, --draw, --load, -p 'POLICY [NAME=VALUE]...', --tasks, --write."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--family", choices=FAMILIES, default="fork_join")
    ap.add_argument("--draw", type=int, default=draw, help=f"the family's draw seed ({draw})")
    ap.add_argument("--load", choices=LOADS, default=load)
    ap.add_argument("--policy", "-p", action="append", metavar="'POLICY [NAME=VALUE]...'",
                    help="a policy replayed, with its parameters (default: topas and lpm)")
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
    return ap


def replay_policies(args: argparse.Namespace, replay: Replay, script: str,
                    argv: list[str] | None) -> tuple[float, list[dict[str, Any]], str]:
    """The case's capacity (from the generalization cache), each policy's row,
    and the command that reproduces them (without --write)."""
    policies = [(words[0], dict(parse_params(words[1:])))
                for words in (p.split() for p in args.policy or ["topas", "lpm"])]
    caps = capacities([(args.family, args.draw, args.load)], args.tasks, Cache(CACHE), 2)
    cap = caps[(args.family, args.draw)]
    rows = [replay(args.family, args.draw, args.load, p, params, args.tasks, cap)
            for p, params in policies]
    command = f"python bench/{script} " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]) if a != "--write")
    return cap, rows, command.strip()


def case_heading(title: str, command: str, args: argparse.Namespace, cap: float) -> str:
    """The section's title and the first sentences naming the command and the case."""
    return (f"## {title}\n\nCommand: `{command}`. Case `{args.family}` #{args.draw}, "
            f"{args.load} load, {args.tasks} tasks ({cap:.4f} task/s capacity), as "
            "`bench/generalization.py` replays it.")
