"""`topasd tune` on a MetaGPT-TL trace (issue 32): do tuned parameters beat
the defaults on tasks the search never saw?

    python bench/tune_metagpt.py [--workload metagpt-tl] [--rate 0.0175]
        [--tasks 200] [--seed 0] [--trials 30] [--write]

Samples the trace with `topasd trace gen`, runs `topasd tune` on it (the
first half of the tasks by arrival to train on, the second half held out),
and prints its report; `--write` puts the commands and the report in the
`tune_metagpt` section of docs/RESULTS.md. The search and the replays are
seeded: the numbers are the same on any machine and any number of cores.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import at_least, update_section  # bench/_results.py


def topasd(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "topasd.cli", *args], capture_output=True,
                          text=True)
    if done.returncode != 0:
        sys.exit(f"topasd {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="metagpt-tl")
    ap.add_argument("--rate", type=float, default=0.0175, help="task/s (the heavy point)")
    ap.add_argument("--tasks", type=at_least(2), default=200)
    ap.add_argument("--seed", type=at_least(0), default=0)
    ap.add_argument("--trials", type=at_least(1), default=30)
    ap.add_argument("--write", action="store_true", help="update docs/RESULTS.md")
    args = ap.parse_args()
    name = f"{args.workload}-{args.tasks}.jsonl"
    gen = (f"topasd trace gen -w {args.workload} -r {args.rate} -n {args.tasks} "
           f"-s {args.seed} -o {name}")
    tune = f"topasd tune {name} --trials {args.trials}"
    with tempfile.TemporaryDirectory() as tmp:
        topasd(*gen.split()[1:-1], str(Path(tmp) / name))
        start = time.perf_counter()
        report = topasd("tune", str(Path(tmp) / name), "--trials", str(args.trials), "-q",
                        "--toml", str(Path(tmp) / "t.toml"), "--patch",
                        str(Path(tmp) / "t.json"))
        took = time.perf_counter() - start
    report = report.replace(str(Path(tmp) / name), name)
    text = "\n".join([
        "## Tuning TOPAS for a trace (`bench/tune_metagpt.py`)", "",
        f"`python bench/tune_metagpt.py --rate {args.rate} --tasks {args.tasks} --trials "
        f"{args.trials} --write`, which runs:", "", "```bash", gen, tune, "```", "",
        "```", report.rstrip(), "```", "",
        f"The search took {took:.0f} s on this machine (2 cores, shared); its numbers do not "
        "depend on the machine."])
    print(text)
    if args.write:
        print(f"wrote {update_section('tune_metagpt', text)}")


if __name__ == "__main__":
    main()
