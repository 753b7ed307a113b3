"""Key bindings, each with an id so a keymap file can rebind it.

    topasd console --keymap keys.toml      # e.g.  "console.params" = "ctrl+e"

The footer shows the bindings of the focused screen; `?` lists them all.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path

from textual.binding import Binding

from topasd.model import TopasError

APP: list[Binding] = [
    Binding("question_mark,f1", "help", "Help", id="console.help"),
    Binding("q", "quit", "Quit", id="console.quit"),
]
DASHBOARD: list[Binding] = [
    Binding("p", "params", "Params", id="console.params"),
    Binding("t", "focus_panel('tasks')", "Tasks", show=False, id="console.focus_tasks"),
    Binding("d", "focus_panel('decisions')", "Decisions", show=False, id="console.focus_decisions"),
    Binding("c", "focus_panel('candidates')", "Candidates", show=False,
            id="console.focus_candidates"),
    Binding("s", "sort_tasks", "Sort", id="console.sort_tasks"),
    Binding("slash", "filter_tasks", "Filter", id="console.filter_tasks"),
    Binding("n", "toggle_noop", "No-ops", id="console.toggle_noop"),
]
LIVE: list[Binding] = [
    Binding("space", "pause", "Pause", id="console.pause"),
    Binding("f", "follow", "Follow", id="console.follow"),
]
REPLAY: list[Binding] = [
    Binding("full_stop", "step(1)", "Next", id="console.step_next"),
    Binding("comma", "step(-1)", "Prev", id="console.step_prev"),
    Binding("right_square_bracket", "jump(10)", "+10s", id="console.jump_fwd"),
    Binding("left_square_bracket", "jump(-10)", "-10s", id="console.jump_back"),
    Binding("right_curly_bracket", "jump(60)", "+60s", show=False, id="console.jump_fwd_more"),
    Binding("left_curly_bracket", "jump(-60)", "-60s", show=False, id="console.jump_back_more"),
    Binding("0", "to_start", "Start", show=False, id="console.to_start"),
    Binding("dollar_sign", "to_end", "End", show=False, id="console.to_end"),
    Binding("g", "goto", "Go to", id="console.goto"),
]
PARAMS: list[Binding] = [
    Binding("ctrl+s", "apply", "Apply", id="params.apply", priority=True),
    Binding("ctrl+r", "reload", "Reload", id="params.reload", priority=True),
    Binding("escape", "close", "Back", id="params.close"),
]
ALL = APP + DASHBOARD + LIVE + REPLAY + PARAMS


class KeymapError(TopasError):
    """A keymap file is unreadable or names unknown bindings."""


def load_keymap(path: str | Path) -> dict[str, str]:
    """A TOML keymap: binding id -> key(s), e.g. `"console.params" = "ctrl+e"`."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except OSError as exc:
        raise KeymapError(f"--keymap {p}: cannot read ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise KeymapError(f"--keymap {p}: not valid TOML ({exc})") from None
    flat = _flatten(data)
    known = {b.id for b in ALL}
    unknown = sorted(set(flat) - known)
    if unknown:
        raise KeymapError(f"--keymap {p}: unknown binding id(s) {unknown}; known: "
                          f"{', '.join(sorted(k for k in known if k))}")
    bad = sorted(k for k, v in flat.items() if not isinstance(v, str) or not v.strip())
    if bad:
        raise KeymapError(f"--keymap {p}: give each of {bad} a key as a string, e.g. \"ctrl+e\"")
    keymap = {k: str(v) for k, v in flat.items()}
    clash = _clash(keymap)
    if clash:
        raise KeymapError(f"--keymap {p}: {clash}; give each binding a key of its own")
    return keymap


def _clash(keymap: Mapping[str, str]) -> str | None:
    """Two bindings of one screen on one key (as `keymap` rebinds them), if any."""
    for scope in (APP + DASHBOARD + LIVE + REPLAY, APP + PARAMS):
        owner: dict[str, str] = {}
        for b in scope:
            for key in keymap.get(b.id or "", b.key).split(","):
                key = key.strip()
                if owner.setdefault(key, b.id or "") != b.id:
                    return f"{owner[key]} and {b.id} are both on {_keys(key)!r}"
    return None


def _flatten(data: dict[str, object], prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def help_rows(keymap: Mapping[str, str] | None = None) -> list[tuple[str, str, str]]:
    """(section, keys, what) of every binding (as `keymap` rebinds them)."""
    keymap = keymap or {}
    rows: list[tuple[str, str, str]] = []
    for section, group in (("everywhere", APP), ("dashboard", DASHBOARD), ("live", LIVE),
                           ("replay", REPLAY), ("parameters", PARAMS)):
        for b in group:
            rows.append((section, _keys(keymap.get(b.id or "", b.key)), _what(b)))
    rows.append(("everywhere", "ctrl+p", "Command palette"))
    rows.append(("dashboard", "tab / shift+tab", "Next / previous panel"))
    rows.append(("dashboard", "enter", "Decisions: show the candidates of the row; "
                 "Tasks: open the task (its stages, requests, decisions)"))
    rows.append(("dashboard", "j / k", "Tasks: down / up"))
    return rows


_NAMES = {"question_mark": "?", "full_stop": ".", "comma": ",", "right_square_bracket": "]",
          "left_square_bracket": "[", "right_curly_bracket": "}", "left_curly_bracket": "{",
          "dollar_sign": "$", "space": "space", "slash": "/"}


def _keys(key: str) -> str:
    return " / ".join(_NAMES.get(k, k) for k in key.split(","))


def _what(b: Binding) -> str:
    extra = {"console.jump_fwd_more": "Jump +60 s", "console.jump_back_more": "Jump -60 s",
             "console.to_start": "Go to the start", "console.to_end": "Go to the end",
             "console.focus_candidates": "Focus the candidates",
             "console.goto": "Go to a time, or #N: decision N"}
    return extra.get(b.id or "", b.description)
