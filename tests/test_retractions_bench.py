"""bench/retractions.py's accounting: a dooming admission is one whose state's
decode peak exceeds the pool, so with `decode_peak="always"` TOPAS makes none
and the engine retracts nothing, while the default's retractions each follow
one (outputs are known to the simulator: nothing finishes early)."""

from __future__ import annotations

from tests.benchkit import load_bench


def test_every_retraction_follows_a_dooming_admission_and_always_dooms_none() -> None:
    bench = load_bench("retractions")
    capacity = 0.0131  # fork_join #4's, about (the bench measures it)
    default = bench.replay("fork_join", 4, "light", "topas", {}, 30, capacity)
    always = bench.replay("fork_join", 4, "light", "topas", {"decode_peak": "always"}, 30,
                          capacity)
    lpm = bench.replay("fork_join", 4, "light", "lpm", {}, 30, capacity)
    for row in (default, lpm):
        assert row["retractions"] > 0 and row["dooming"] >= row["retractions"]
    assert always["dooming"] == 0 and always["retractions"] == 0
    assert always["again"] < default["again"]
