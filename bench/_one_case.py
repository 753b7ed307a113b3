"""One generated case of `bench/generalization.py` replayed through several
policies, each with its parameters: the command line, the replay loop and the
recorded section shared by the benches that diagnose a case (retractions.py,
prefix_room.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from _results import command_line, publish  # bench/_results.py
from generalization import CACHE, Cache, capacities, parse_params

from workflows.generator import FAMILIES, HOLDOUT, LOADS

# replay(family, draw, load, policy, params, tasks, capacity) -> the policy's row
Replay = Callable[[str, int, str, str, dict[str, Any], int, float], dict[str, Any]]
Table = Callable[[list[dict[str, Any]]], list[str]]


@dataclass(frozen=True)
class CaseBench:
    """A bench that replays one case: its defaults, its replay and table, and
    the docs/RESULTS.md section it records (`--write`)."""

    script: str  # bench/<script>
    title: str  # the section's heading
    note: str  # what the section measures, after the case is named
    section: str  # update_section's name
    draw: int  # the default --draw
    load: str  # the default --load
    replay: Replay
    table: Table

    def main(self, doc: str, argv: list[str] | None = None) -> None:
        args = self.parser(doc.split("\n\n")[0]).parse_args(argv)
        policies = [(words[0], dict(parse_params(words[1:])))
                    for words in (p.split() for p in args.policy or ["topas", "lpm"])]
        caps = capacities([(args.family, args.draw, args.load)], args.tasks, Cache(CACHE), 2)
        cap = caps[(args.family, args.draw)]
        rows = [{**self.replay(args.family, args.draw, args.load, p, params, args.tasks, cap),
                 "policy": " ".join([p, *(f"{k}={v}" for k, v in params.items())])}
                for p, params in policies]
        publish(self.section, self.title,
                f"Command: `{command_line(self.script, argv)}`. Case `{args.family}` "
                f"#{args.draw}, {args.load} load, {args.tasks} tasks ({cap:.4f} task/s "
                f"capacity), as `bench/generalization.py` replays it. {self.note}",
                self.table(rows), args.write)

    def parser(self, description: str) -> argparse.ArgumentParser:
        """--family, --draw, --load, -p 'POLICY [NAME=VALUE]...', --tasks, --write."""
        ap = argparse.ArgumentParser(description=description)
        ap.add_argument("--family", choices=(*FAMILIES, *HOLDOUT), default="fork_join",
                        help="a generated family, the fixed list's or --holdout's (fork_join)")
        ap.add_argument("--draw", type=int, default=self.draw,
                        help=f"the family's draw seed ({self.draw})")
        ap.add_argument("--load", choices=LOADS, default=self.load)
        ap.add_argument("--policy", "-p", action="append", metavar="'POLICY [NAME=VALUE]...'",
                        help="a policy replayed, with its parameters (default: topas and lpm)")
        ap.add_argument("--tasks", type=int, default=100)
        ap.add_argument("--write", action="store_true", help="record in docs/RESULTS.md")
        return ap
