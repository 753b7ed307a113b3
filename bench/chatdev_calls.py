"""A call log (docs/trace-format.md, "Importing a call log") from a table of
ChatDev's logged LLM calls, for `bench/generalization.py --calls`.

    python bench/chatdev_calls.py CALLS.csv -o chatdev.jsonl [--prefix min|none]

CALLS.csv holds one row per call of ChatDev's WareHouse runs, with the
columns `project` (the run: one task), `seq` (the call's place in its run),
`speaker` (the role; empty for the calls ChatDev makes outside a role, which
become the agent `unattributed`), `prompt_tokens` and `completion_tokens`
(other columns are ignored). A run's calls form a chain in `seq` order, as
ChatDev's chat chain makes them one after another. With `--prefix min`
(the default) each role's prefix is the shortest prompt it sent: every
prompt of a role starts with its system message, so that much of it is
shared, and no more can be. `--prefix none` gives no role a prefix.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

COLUMNS = ("project", "seq", "speaker", "prompt_tokens", "completion_tokens")
UNATTRIBUTED = "unattributed"


class ChatDevError(ValueError):
    """The table is not one of ChatDev's calls; the message names the row."""


def read_rows(lines: Iterable[str], name: str) -> list[dict[str, str | int]]:
    """The calls of the table: (project, seq, agent, prompt, completion), checked."""
    reader = csv.DictReader(lines)
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise ChatDevError(f"{name}: no column {', '.join(missing)}; a ChatDev call table "
                           f"has the columns {', '.join(COLUMNS)}")
    rows: list[dict[str, str | int]] = []
    for line, row in enumerate(reader, start=2):
        try:
            seq, prompt, completion = (int(row[c]) for c in COLUMNS[1:2] + COLUMNS[3:])
        except (TypeError, ValueError):
            raise ChatDevError(f"{name}:{line}: seq, prompt_tokens and completion_tokens must "
                               "be whole numbers") from None
        if not row["project"]:
            raise ChatDevError(f"{name}:{line}: the project (the run) is empty")
        agent = (row["speaker"] or UNATTRIBUTED).strip().replace(" ", "_")
        rows.append({"task": row["project"], "call": str(seq), "agent": agent, "order": seq,
                     "prompt_tokens": prompt, "completion_tokens": max(1, completion)})
    return rows


def with_prefixes(rows: list[dict[str, str | int]], rule: str) -> list[dict[str, str | int]]:
    """Each call with its role's prefix: the role's shortest prompt (`min`), or none."""
    if rule == "none":
        return rows
    shortest: dict[str, int] = {}
    for r in rows:
        a, p = str(r["agent"]), int(r["prompt_tokens"])
        shortest[a] = min(shortest.get(a, p), p)
    return [{**r, "prefix_tokens": shortest[str(r["agent"])]} for r in rows]


def call_lines(rows: list[dict[str, str | int]]) -> Iterator[str]:
    for r in rows:
        yield json.dumps(r) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("table", type=Path, help="ChatDev's calls, one CSV row per call")
    ap.add_argument("-o", "--output", type=Path, required=True, help="the call log (.jsonl)")
    ap.add_argument("--prefix", choices=("min", "none"), default="min",
                    help="each role's prefix: its shortest prompt, or none (min)")
    args = ap.parse_args(argv)
    try:
        with args.table.open(newline="") as f:
            rows = with_prefixes(read_rows(f, str(args.table)), args.prefix)
    except (OSError, ChatDevError) as exc:
        ap.error(str(exc))
    with args.output.open("w") as out:
        out.writelines(call_lines(rows))
    runs = len({r["task"] for r in rows})
    print(f"wrote {len(rows)} calls of {runs} runs to {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
