"""A call log (docs/trace-format.md, "Importing a call log") from another
tool's record of LLM calls, for `bench/generalization.py --calls`.

    python bench/external_calls.py chatdev CALLS.csv -o chatdev.jsonl [--prefix min|none]
    python bench/external_calls.py parrot-metagpt USAGE.json -o metagpt.jsonl

`chatdev`: a CSV table of ChatDev's WareHouse runs, one row per call, with
the columns `project` (the run: one task), `seq` (the call's place in its
run), `speaker` (the role; empty for the calls ChatDev makes outside a
role, which become the agent `unattributed`), `prompt_tokens` and
`completion_tokens` (other columns are ignored). A run's calls form a chain
in `seq` order, as ChatDev's chat chain makes them one after another.

`parrot-metagpt`: ParrotServe's MetaGPT token usage, a JSON list of calls
with `file` (the run), `round` (`r0`, `r1`, ...), `role` and the two token
counts. Round 0's call (role `noname`) is the architect's; every later
round writes each source file once, all in parallel, by one engineer agent
(the `role` names the file), after the whole round before.

With `--prefix min` (the default) each agent's prefix is the shortest
prompt it sent (none if it made one call): every prompt of an agent starts
with its system message, so that much of it is shared, and no more can be.
`--prefix none` gives no agent a prefix.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

CHATDEV_COLUMNS = ("project", "seq", "speaker", "prompt_tokens", "completion_tokens")
PARROT_FIELDS = ("file", "round", "role", "prompt_tokens", "completion_tokens")
UNATTRIBUTED = "unattributed"
Call = dict[str, str | int]


class SourceError(ValueError):
    """The input is not the format named; the message names the place."""


def _whole(row: dict[str, Any], fields: Iterable[str], where: str) -> list[int]:
    try:
        return [int(row[f]) for f in fields]
    except (TypeError, ValueError):
        raise SourceError(f"{where}: {', '.join(fields)} must be whole numbers") from None


def chatdev_calls(text: str, name: str) -> list[Call]:
    """ChatDev's calls: each run a chain in `seq` order."""
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in CHATDEV_COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise SourceError(f"{name}: no column {', '.join(missing)}; a ChatDev call table has "
                          f"the columns {', '.join(CHATDEV_COLUMNS)}")
    calls: list[Call] = []
    for line, row in enumerate(reader, start=2):
        seq, prompt, completion = _whole(row, ("seq", "prompt_tokens", "completion_tokens"),
                                         f"{name}:{line}")
        if not row["project"]:
            raise SourceError(f"{name}:{line}: the project (the run) is empty")
        agent = (row["speaker"] or UNATTRIBUTED).strip().replace(" ", "_")
        calls.append({"task": row["project"], "call": str(seq), "agent": agent, "order": seq,
                      "prompt_tokens": prompt, "completion_tokens": max(1, completion)})
    return calls


def parrot_metagpt_calls(text: str, name: str) -> list[Call]:
    """ParrotServe's MetaGPT calls: the architect, then rounds of parallel files."""
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{name}:{exc.lineno}: not JSON ({exc.msg})") from None
    if not isinstance(items, list):
        raise SourceError(f"{name}: a JSON list of calls is expected, not {type(items).__name__}")
    calls: list[Call] = []
    for k, item in enumerate(items):
        where = f"{name}: call {k}"
        if not isinstance(item, dict) or any(f not in item for f in PARROT_FIELDS):
            raise SourceError(f"{where}: give each call {', '.join(PARROT_FIELDS)}")
        rnd = str(item["round"])
        if not (rnd.startswith("r") and rnd[1:].isdigit()):
            raise SourceError(f"{where}: round {rnd!r} is not r0, r1, ...")
        prompt, completion = _whole(item, ("prompt_tokens", "completion_tokens"), where)
        agent = "Architect" if rnd == "r0" else "Engineer"
        calls.append({"task": str(item["file"]), "call": f"{rnd}:{item['role']}",
                      "agent": agent, "order": int(rnd[1:]), "prompt_tokens": prompt,
                      "completion_tokens": max(1, completion)})
    return calls


FORMATS: dict[str, Callable[[str, str], list[Call]]] = {
    "chatdev": chatdev_calls, "parrot-metagpt": parrot_metagpt_calls}


def with_prefixes(calls: list[Call], rule: str) -> list[Call]:
    """Each call with its agent's prefix (`min`: the agent's shortest prompt if it
    made more than one call, as a prefix is what an agent's calls share), or none."""
    if rule == "none":
        return calls
    prompts: dict[str, list[int]] = {}
    for c in calls:
        prompts.setdefault(str(c["agent"]), []).append(int(c["prompt_tokens"]))
    prefix = {a: min(ps) if len(ps) > 1 else 0 for a, ps in prompts.items()}
    return [{**c, "prefix_tokens": prefix[str(c["agent"])]} for c in calls]


def call_lines(calls: list[Call]) -> Iterator[str]:
    for c in calls:
        yield json.dumps(c) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("format", choices=sorted(FORMATS), help="what SOURCE holds")
    ap.add_argument("source", type=Path, help="the tool's record of its calls")
    ap.add_argument("-o", "--output", type=Path, required=True, help="the call log (.jsonl)")
    ap.add_argument("--prefix", choices=("min", "none"), default="min",
                    help="each agent's prefix: its shortest prompt, or none (min)")
    args = ap.parse_args(argv)
    try:
        text = args.source.read_text()
        calls = with_prefixes(FORMATS[args.format](text, str(args.source)), args.prefix)
    except (OSError, UnicodeDecodeError, SourceError) as exc:
        ap.error(str(exc))
    with args.output.open("w") as out:
        out.writelines(call_lines(calls))
    runs = len({c["task"] for c in calls})
    print(f"wrote {len(calls)} calls of {runs} runs to {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
