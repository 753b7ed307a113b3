"""bench/retractions.py's accounting: a dooming admission is one whose state's
decode peak exceeds the pool, so with `decode_peak="always"` TOPAS makes none
and the engine retracts nothing, while the default's retractions each follow
one (outputs are known to the simulator: nothing finishes early)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _bench() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("retractions_bench",
                                                      BENCH / "retractions.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_every_retraction_follows_a_dooming_admission_and_always_dooms_none() -> None:
    bench = _bench()
    capacity = 0.0131  # fork_join #4's, about (the bench measures it)
    default = bench.replay("fork_join", 4, "light", "topas", {}, 30, capacity)
    always = bench.replay("fork_join", 4, "light", "topas", {"decode_peak": "always"}, 30,
                          capacity)
    lpm = bench.replay("fork_join", 4, "light", "lpm", {}, 30, capacity)
    for row in (default, lpm):
        assert row["retractions"] > 0 and row["dooming"] >= row["retractions"]
    assert always["dooming"] == 0 and always["retractions"] == 0
    assert always["again"] < default["again"]
