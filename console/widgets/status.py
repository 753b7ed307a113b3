"""The status line (connection or replay file) and the replay time cursor."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from console.snapshot import Snapshot
from console.widgets.format import secs
from console.widgets.phrases import Phrases


class StatusLine(Phrases):
    """Live: connected or not (and retrying), engine time, speed, counts.
    Replay: the file and run."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.connected: bool | None = None
        self.error: str | None = None
        self.attempt = 0
        self.url = ""
        self.paused = False
        self.replay_label: str | None = None
        self.snapshot: Snapshot | None = None

    def set_connection(self, connected: bool, error: str | None, attempt: int, url: str) -> None:
        self.connected, self.error, self.attempt, self.url = connected, error, attempt, url
        self.set_class(not connected, "-disconnected")
        self.refresh_text()

    def set_snapshot(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.refresh_text()

    def refresh_text(self) -> None:
        text = Text()
        if self.paused:  # first: a narrow terminal wraps the rest, never hides this
            text.append("❚❚ paused (space resumes)   ", style="bold yellow")
        if self.replay_label is not None:
            text.append("▶ replay ", style="bold")
            text.append(self.replay_label)
        elif self.connected is None:
            text.append("… connecting to ", style="bold")
            text.append(self.url)
        elif self.connected:
            text.append("● connected ", style="bold green")
            text.append(self.url)
        else:  # short: the last state's numbers follow, the error's detail comes last
            text.append("○ disconnected ", style="bold red")
            text.append("· retrying" + (f" (attempt {self.attempt})" if self.attempt > 1 else ""))
            if self.snapshot is not None:  # never connected: no state to show
                text.append(" · the last state:", style="italic")
        phrases = [text]
        s = self.snapshot
        if s is not None:
            phrases.append(Text(f"   t={s.t:.1f}s", style="bold"))
            if s.speed:
                phrases.append(Text(f" · speed {s.speed}"))
            version = "" if s.params_version is None else f" v{s.params_version}"
            phrases.append(Text(f" · policy {s.policy}{version}"))
            phrases += [Text(f" · {s.tasks_in_flight} tasks"),
                        Text(f" · {s.requests_running} running"),
                        Text(f" · {s.requests_waiting} waiting"),
                        Text(f" · {s.decisions} decisions")]
            if s.requests_withdrawn:
                phrases.append(Text(f" · {s.requests_withdrawn} withdrawn"))
            if s.draining:
                phrases.append(Text(" · draining", style="yellow"))
        if self.connected is False:  # the cut, on a short terminal, if any
            phrases.append(Text(f"   {self.url}: {self.error or 'no answer'}", style="red"))
        self.set_phrases(phrases)


class CursorBar(Static):
    """Replay: where the cursor is in the run, as a track and numbers."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.position: tuple[float, float, float, int | None, int] | None = None

    def set_cursor(self, t: float, t0: float, t1: float, seq: int | None, n: int) -> None:
        self.position = (t, t0, t1, seq, n)
        self.update(self._text())

    def on_resize(self) -> None:
        if self.position is not None:
            self.update(self._text())

    def _text(self) -> Text:
        assert self.position is not None
        t, t0, t1, seq, n = self.position
        label = (f" t={secs(t, 2)} of {secs(t1, 2)} · decision "
                 f"{seq if seq is not None else '—'}/{n} ")
        width = max(10, (self.content_size.width or 80) - len(label) - 2)
        frac = 0.0 if t1 <= t0 else (t - t0) / (t1 - t0)
        pos = min(width - 1, max(0, round(frac * (width - 1))))
        text = Text("━" * pos, style="green")
        text.append("●", style="bold yellow")
        text.append("─" * (width - pos - 1), style="grey42")
        text.append(label, style="bold")
        return text
