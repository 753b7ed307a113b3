"""`wrap_phrases`: a narrow terminal wraps the status line and the decision
summary between phrases, never inside one."""

from __future__ import annotations

from rich.text import Text

from console.widgets.phrases import wrap_phrases

STATUS = [Text("▶ replay run.db"), Text("   t=40.8s"), Text(" · policy topas"),
          Text(" · 11 tasks"), Text(" · 11 running"), Text(" · 4 waiting")]


def test_lines_break_between_phrases_and_drop_the_separator() -> None:
    lines = wrap_phrases(STATUS, 40).plain.split("\n")
    assert lines == ["▶ replay run.db   t=40.8s · policy topas",
                     "11 tasks · 11 running · 4 waiting"]
    assert all(len(line) <= 40 for line in lines)


def test_a_wide_line_or_an_unknown_width_keeps_one_line() -> None:
    one = "▶ replay run.db   t=40.8s · policy topas · 11 tasks · 11 running · 4 waiting"
    assert wrap_phrases(STATUS, 200).plain == one
    assert wrap_phrases(STATUS, 0).plain == one  # before layout: Rich wraps it


def test_a_phrase_ending_in_a_newline_ends_its_line() -> None:
    phrases = [Text("#20 at t=1.0s"), Text(" · 3 logged\n"), Text("admitted 1 2"),
               Text("  preempted 3 4 5"), Text("  loaded D")]
    assert wrap_phrases(phrases, 30).plain.split("\n") == [
        "#20 at t=1.0s · 3 logged", "admitted 1 2  preempted 3 4 5", "loaded D"]


def test_styles_survive_the_wrapping() -> None:
    phrases = [Text("aaaa"), Text(" · bbbb", style="bold")]
    out = wrap_phrases(phrases, 6)
    assert out.plain == "aaaa\nbbbb"
    assert any(span.style == "bold" and out.plain[span.start:span.end] == "bbbb"
               for span in out.spans)
