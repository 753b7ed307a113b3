"""bench/_results.py's update_section: benches run side by side (a real
process each) keep each other's sections of one results file."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from tests.benchkit import load_bench


def _writer(path: str, name: str, rounds: int) -> None:
    update_section = load_bench("_results").update_section
    for i in range(rounds):
        update_section(name, f"## {name}\n\nround {i}", Path(path))


def test_side_by_side_benches_keep_each_others_sections(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n")
    ctx = multiprocessing.get_context("spawn")
    names = [f"section-{k}" for k in range(4)]
    writers = [ctx.Process(target=_writer, args=(str(results), n, 150)) for n in names]
    for w in writers:
        w.start()
    for w in writers:
        w.join(timeout=300)
        assert w.exitcode == 0
    text = results.read_text()
    for n in names:
        assert text.count(f"<!-- bench:{n} -->") == 1
        assert f"## {n}\n\nround 149\n<!-- /bench:{n} -->" in text, n
