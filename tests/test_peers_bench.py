"""bench/peers.py's table: each cell averages a workload's operating points,
and "best other" is the lowest of every policy but TOPAS, peers and
baselines alike."""

from __future__ import annotations

import argparse

from tests.benchkit import load_bench


def test_the_best_other_is_the_lowest_average_of_peers_and_baselines() -> None:
    bench = load_bench("peers")
    rows = []
    for name in bench.WORKLOADS:
        for i, policy in enumerate(("topas", *bench.OTHERS)):
            for rate, extra in ((1.0, 0.0), (2.0, 10.0)):  # averages 105 + i
                value = 100.0 + i + extra
                if policy == "kairos":
                    value -= 20.0  # every workload's best other, on the mean and the p99
                rows.append({"workload": name, "rate": rate, "policy": policy,
                             "mean_jct_s": value, "p99_jct_s": value})
    text = bench.render(rows, argparse.Namespace(tasks=3, seed=1), 60.0)
    line = next(x for x in text.splitlines() if x.startswith("| chain3 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1] == "105.0"  # topas: (100 + 110) / 2
    assert cells[-2] == "kairos"
    kairos = 105.0 + 1 + bench.OTHERS.index("kairos") - 20.0
    assert cells[-1] == f"{100 * (105.0 / kairos - 1):+.1f}%"
