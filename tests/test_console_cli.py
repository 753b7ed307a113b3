"""`topasd console` on the command line: bad input is one line and exit 2; and
the form's validation, without a terminal."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from console.params import FIELDS, text_of, validate
from console.widgets.format import split_cells
from tests.console_fixture import FIXTURE
from topasd.cli import main


def console(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["console", *args])
    return res.exit_code, res.output


@pytest.mark.parametrize(("args", "expect"), [
    (["--runtime-file", "{tmp}/none.json"], "no daemon running (no live runtime file at"),
    (["--db", "{tmp}/missing.db"], "--db {tmp}/missing.db: no such file"),
    (["--db", "{tmp}/run.db", "--run", "9"], "no run 9 in the decision log; runs: 1 (topas)"),
    (["--db", "{tmp}/notes.db"], "cannot open as a decision log"),
    (["--url", "127.0.0.1:8470"], "--url: expected http://HOST:PORT"),
    (["--url", "http://127.0.0.1:1", "--db", "{tmp}/run.db"], "not both"),
    (["--at", "3"], "--run and --at need --db FILE"),
    (["--db", "{tmp}/run.db", "--keymap", "{tmp}/keys.toml"], "unknown binding id(s) ['nope']"),
    # a key taken twice made one binding unreachable, without a word
    (["--db", "{tmp}/run.db", "--keymap", "{tmp}/clash.toml"],
     "console.params and console.sort_tasks are both on 'p'"),
])
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], expect: str) -> None:
    shutil.copy(FIXTURE, tmp_path / "run.db")
    (tmp_path / "notes.db").write_text("not a database, just notes\n" * 50)
    (tmp_path / "keys.toml").write_text('nope = "x"\n')
    (tmp_path / "clash.toml").write_text('"console.sort_tasks" = "p"\n')
    code, out = console(*(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert code == 2
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert expect.replace("{tmp}", str(tmp_path)) in lines[0]
    assert "Traceback" not in out


def test_form_sends_only_valid_changes() -> None:
    ranges = {"beta": (0.0, 1000.0), "m": (0.0, 16.0), "h_age": (1e-3, 1e7)}
    current = {"beta": 20.0, "rho": 1.0, "h_age": None, "m": 6, "reuse": True,
               "reservation": "optimistic"}
    text = {"beta": "20", "rho": "1", "h_age": "", "m": "6", "reuse": True,
            "reservation": "optimistic"}
    policies = ["fcfs", "topas", "topas-base"]
    tunable = ["topas", "topas-base"]
    assert validate("topas", text, "topas", current, ranges, policies, tunable) == ({}, {})
    changes, errors = validate("topas", {**text, "beta": "5", "h_age": "30", "reuse": False},
                               "topas", current, ranges, policies, tunable)
    assert (changes, errors) == ({"beta": 5.0, "h_age": 30.0, "reuse": False}, {})
    changes, errors = validate("topas", {**text, "beta": "5000", "m": "2.5", "rho": "x"},
                               "topas", current, ranges, policies, tunable)
    assert changes == {}
    assert errors == {"beta": "beta: in [0, 1000]", "m": "M: an integer",
                      "rho": "rho: a number"}
    _, errors = validate("topas", {**text, "seed": "-1"}, "topas", {**current, "seed": 0},
                         {**ranges, "seed": (0, 2**31 - 1)}, policies, tunable)
    assert errors == {"seed": "seed: in [0, 2147483647]"}  # not 2.14748e+09
    assert validate("topas-base", text, "topas", current, ranges, policies, tunable) == (
        {"policy": "topas-base"}, {})
    assert validate("fcfs", {**text, "beta": "1"}, "topas", current, ranges, policies,
                    tunable) == ({"policy": "fcfs"}, {})  # baselines take no parameters
    assert validate("nope", text, "topas", current, ranges, policies, tunable)[1] == {
        "policy": "policy: one of fcfs, topas, topas-base"}
    assert validate("topas", {"beta": ""}, "fcfs", {}, ranges, policies,
                    tunable) == ({"policy": "topas"}, {})
    assert {f.name for f in FIELDS} >= set(current)
    # exactly: the form sends back what it shows (12345678901 as 1.23457e+10 rounded it)
    assert [text_of(x) for x in (None, 20.0, 0.5, 7, 2.5e10, 12345678901.0, 1234567.0,
                                 "full")] == [
        "", "20", "0.5", "7", "25000000000", "12345678901", "1234567", "full"]


def test_the_kv_bar_splits_cells_in_proportion() -> None:
    assert split_cells(10, [5, 5]) == [5, 5]
    assert split_cells(10, [1, 0, 999]) == [1, 0, 9]  # a sliver still shows
    assert split_cells(7, [1, 1, 1]) == [3, 2, 2]
    assert split_cells(0, [1, 2]) == [0, 0]
    for parts in ([3, 7, 0, 11], [1] * 30, [18000, 1, 1]):
        assert sum(split_cells(20, parts)) == 20
