"""The parameter form: the policy and TOPAS's parameters, validated against the
daemon's ranges before `PATCH /v1/params`; the daemon's answer is shown."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Header, Input, Label, Select, Static, Switch

from console import keys
from console.params import BY_NAME, FIELDS, parse, text_of, validate
from console.sources import ApiError, ConnectionLost
from console.widgets.footer import SteadyFooter
from topasd.scheduler import TUNABLE_NAMES

if TYPE_CHECKING:
    from console.app import ConsoleApp

REPLAY_CHANGES = 8  # the read-only form lists the last this many live changes


class ParamsScreen(Screen[None]):
    """Live: edit and apply. Replay: the parameters in force at the cursor."""

    CSS_PATH = "../params.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [*keys.PARAMS]

    def __init__(self, replay_t: float | None = None) -> None:
        super().__init__(id="params")
        self.replay_t = replay_t
        self.info: dict[str, Any] | None = None
        self._policies: list[str] = []
        self.fills = 0  # answers shown (the console bench times the form by it)
        self._helps: dict[str, Text] = {}  # each help label's text as shown
        self._answer: tuple[Any, ...] | None = None  # the answer as shown
        self._styled_at: int | None = None  # the app's CSS generation the styles are of

    @property
    def console(self) -> ConsoleApp:
        return self.app  # type: ignore[return-value]

    @property
    def read_only(self) -> bool:
        return self.replay_t is not None

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with VerticalScroll(id="params-form"):
            with Horizontal(classes="param-row"):
                yield Label("policy", classes="param-label")
                # no blank entry: "(loading)" is replaced by the daemon's policies
                yield Select[str]([("(loading)", "")], id="policy", allow_blank=False)
                yield Label("switching resets the parameters to the policy's defaults",
                            classes="param-help", id="help-policy")
            for f in FIELDS:
                with Horizontal(classes="param-row", id=f"row-{f.name}"):
                    yield Label(f.symbol, classes="param-label")
                    if f.kind == "bool":
                        yield Switch(id=f"param-{f.name}")
                    elif f.kind == "choice":
                        yield Select[str]([(c, c) for c in f.choices], id=f"param-{f.name}",
                                          allow_blank=False)
                    else:
                        yield Input(id=f"param-{f.name}", classes="param-input",
                                    placeholder=f.unset or "")
                    yield Label(Text(f.help), classes="param-help", id=f"help-{f.name}")
            with Horizontal(id="params-buttons"):
                yield Button(f"Apply ({self._key('params.apply')})", id="apply",
                             variant="primary")
                yield Button(f"Reload ({self._key('params.reload')})", id="reload")
            yield Static("", id="answer")
        yield SteadyFooter()

    def on_mount(self) -> None:
        form = self.query_one("#params-form")
        form.border_title = ("Parameters at the replay cursor (read-only)" if self.read_only
                             else "Parameters · PATCH /v1/params")
        if self.read_only:
            for w in self.query("Input, Switch, Select"):
                w.disabled = True
            self.query_one("#params-buttons").display = False

    def on_screen_resume(self, event: events.ScreenResume) -> None:
        """Shown (first, or again: the live form is kept): the values now. The
        styles of a form shown again are computed again only if the app's CSS
        changed meanwhile (a new theme): for its ~140 widgets that is most of what
        showing it costs."""
        styled_at = getattr(self.app, "_css_update_count", None)  # Textual's count
        if styled_at is not None and styled_at == self._styled_at:
            event.refresh_styles = False
        self._styled_at = styled_at
        self.action_reload()

    # -------------------------------------------------------------- data

    def action_reload(self) -> None:
        if self.read_only:
            assert self.replay_t is not None and self.console.replay is not None
            policy, params = self.console.replay.params(self.replay_t)
            changes = self.console.replay.param_changes(self.replay_t)
            newer = _newer_than_the_log(params)
            self.fill({"policy": policy, "params": {**newer, **params}, "ranges": {},
                       "policies": [policy], "version": len(changes)})
            shown = changes[-REPLAY_CHANGES:]
            older = len(changes) - len(shown)
            self.answer(Text(f"{len(changes)} live change(s) up to t={self.replay_t:.2f}s"
                             + (f"; the last {len(shown)}, {older} before them" if older else "")
                             + "".join(f"\n  t={c['t']:.2f}s {_label(c['name'])}: "
                                       f"{text_of(c['old']) or '∅'} → "
                                       f"{text_of(c['new']) or '∅'} ({c['source']})"
                                       for c in shown)
                             + (f"\n{', '.join(map(_label, newer))}: not in this log (an older "
                                "topasd wrote it), shown at the defaults it ran with"
                                if newer else "")))
            return
        self.run_worker(self._load(), exclusive=True, group="params-load")

    async def _load(self) -> None:
        client = self.console.client
        assert client is not None
        try:
            info = await client.params()
        except (ConnectionLost, ApiError) as exc:
            self.answer(Text(f"cannot read the parameters: {exc}", style="bold red"), "error")
            return
        self.fill(info)

    def fill(self, info: dict[str, Any]) -> None:
        """Show the daemon's policy and parameters (an earlier answer is stale).
        Only what differs from what is shown is set: each change of a widget
        costs the screen style updates and a layout (a form reopened with the
        same values is filled at once)."""
        self.info = info
        self.fills += 1
        self.answer(Text(""))
        select = self.query_one("#policy", Select)
        if self._policies != info["policies"]:
            self._policies = list(info["policies"])
            select.set_options([(p, p) for p in info["policies"]])
        if select.value != info["policy"]:
            select.value = info["policy"]
        params = info["params"]
        for f in FIELDS:
            self._fill_field(f, params)
        if not params:
            self.answer(Text(f"policy {info['policy']} takes no parameters; switch to a "
                             "topas policy to tune it"))

    # -------------------------------------------------------------- form

    def _fill_field(self, f: Any, params: dict[str, Any]) -> None:
        widget = self.query_one(f"#param-{f.name}")
        has = f.name in params
        self.query_one(f"#row-{f.name}").set_class(not has, "-absent")
        value = params.get(f.name)
        disabled = self.read_only or not has  # edit after the switch
        if widget.disabled != disabled:
            widget.disabled = disabled
        if isinstance(widget, Switch):
            if widget.value != bool(value):
                widget.value = bool(value)
        elif isinstance(widget, Select):
            if value in f.choices and widget.value != value:
                widget.value = value
        elif isinstance(widget, Input) and widget.value != text_of(value):
            widget.value = text_of(value)
        self._mark(f.name, None)

    def form_values(self) -> tuple[str, dict[str, Any]]:
        policy = self.query_one("#policy", Select).value
        values: dict[str, Any] = {}
        for f in FIELDS:
            widget = self.query_one(f"#param-{f.name}")
            if isinstance(widget, (Switch, Select, Input)):
                values[f.name] = widget.value
        return (str(policy) if isinstance(policy, str) else "", values)

    def _validated(self, info: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """(changes, errors) of the form against the daemon's `info`."""
        policy, values = self.form_values()
        return validate(policy, values, info["policy"], info["params"], _ranges(info),
                        info["policies"], info.get("tunable", TUNABLE_NAMES))

    @on(Input.Changed, ".param-input")
    def _check(self, event: Input.Changed) -> None:
        if self.info is None or event.input.id is None:
            return
        name = event.input.id.removeprefix("param-")
        if name not in self.info["params"]:  # the policy has no such parameter (a baseline)
            self._mark(name, None)
            return
        try:
            parse(BY_NAME[name], event.value, _ranges(self.info))
        except ValueError as exc:
            self._mark(name, str(exc))
        else:
            self._mark(name, None)

    def _mark(self, name: str, error: str | None) -> None:
        f = BY_NAME[name]
        label = self.query_one(f"#help-{name}", Label)
        row = self.query_one(f"#row-{name}")
        row.set_class(error is not None, "-invalid")
        if error is not None:
            text = Text(f"✗ {f.symbol}: {error}", style="bold red")
        elif self.info is not None and name in _ranges(self.info):
            lo, hi = _ranges(self.info)[name]
            text = Text(f"{f.help} · [{lo:g}, {hi:g}]")
        else:
            text = Text(f.help)
        if self._helps.get(name) != text:  # as shown: no update, no layout
            self._helps[name] = text
            label.update(text)

    def answer(self, text: Text, severity: str | None = None) -> None:
        """Show the outcome under the form (scrolled into view); with a
        `severity`, also as a notification, which no scrolling hides."""
        answer = self.query_one("#answer", Static)
        shown = (text.plain, str(text.style), tuple(text.spans))
        if shown != self._answer:  # as shown: no update, no new layout of the form
            self._answer = shown
            answer.update(text)
        if severity is not None:  # once laid out: a longer answer takes more lines
            self.call_after_refresh(answer.scroll_visible, animate=False)
            self.console.notify(text.plain, severity=severity,  # type: ignore[arg-type]
                                timeout=4 if severity == "information" else 8)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """A replay's form is read-only: no Apply key in the footer."""
        return not (action == "apply" and self.read_only)

    @on(Button.Pressed, "#apply")
    def _apply_button(self) -> None:
        self.action_apply()

    @on(Button.Pressed, "#reload")
    def _reload_button(self) -> None:
        self.action_reload()

    def action_apply(self) -> None:
        if self.read_only:
            return
        if self.info is None:
            self.answer(Text("not sent: the parameters were not loaded from the daemon; "
                             f"{self._key('params.reload')} to retry", style="bold red"),
                        "warning")
            return
        changes, errors = self._validated(self.info)
        for f in FIELDS:
            self._mark(f.name, errors.get(f.name, "").partition(": ")[2] or None)
        if errors:
            self.answer(Text("not sent: " + "; ".join(errors.values()), style="bold red"),
                        "error")
            return
        if not changes:
            self.answer(Text("nothing to change"))
            return
        self.answer(Text(f"sending {changes} …"))
        self.run_worker(self._patch(changes), exclusive=True, group="params-patch")

    def _key(self, binding_id: str) -> str:
        """The key of a binding as the keymap has it (for labels)."""
        default = next(b.key for b in keys.PARAMS if b.id == binding_id)
        return str(getattr(self.app, "keymap", {}).get(binding_id, default)).split(",")[0]

    async def _patch(self, changes: dict[str, Any]) -> None:
        client = self.console.client
        assert client is not None
        try:
            result = await client.patch_params(changes)
        except ApiError as exc:
            hint = (" — start the console with --token TOKEN (or TOPAS_TOKEN), the "
                    "daemon's token" if exc.status in (401, 403) else "")
            self.answer(Text(f"the daemon refused ({exc.status}): {exc.message}{hint}",
                             style="bold red"), "error")
            return
        except ConnectionLost as exc:
            self.answer(Text(f"not applied: {exc}", style="bold red"), "error")
            return
        old = self.info["params"] if self.info else {}
        changed = result.get("changed", [])
        parts = [f"{_label(k)} {text_of(old.get(k)) or '∅'} → "
                 f"{text_of(result['params'].get(k)) or '∅'}" for k in changed
                 if k != "policy"]  # said first, below
        if "policy" in changes:
            parts.insert(0, f"policy → {result['policy']}")
        self.fill(result)  # first: a baseline's form says it takes no parameters
        self.answer(Text(
            f"applied at t={result['t']:.2f}s, effective from decision "
            f"{result['effective_from_decision']} (params v{result['version']}): "
            + (", ".join(parts) or "no change"), style="bold green"), "information")

    def action_close(self) -> None:
        if not self.read_only and self.info is not None:
            changes, errors = self._validated(self.info)
            edited = sorted({*changes, *errors})
            if edited:
                self.console.notify("left without applying: "
                                    + ", ".join(_label(k) for k in edited) + " not sent",
                                    severity="warning", timeout=6)
        self.app.pop_screen()


def _newer_than_the_log(params: dict[str, Any]) -> dict[str, Any]:
    """The TOPAS parameters a TOPAS run's log lacks (it was written before they
    existed, and ran as their defaults, off for every extension), at those
    defaults; none for a baseline (no parameters)."""
    if not params:
        return {}
    from topasd.scheduler.params import PAPER, TopasParams  # only the defaults

    defaults = TopasParams(**PAPER)  # every extension off, as before it existed
    return {f.name: getattr(defaults, f.name) for f in FIELDS if f.name not in params}


def _label(name: str) -> str:
    """A parameter by the form's (the paper's) name."""
    return BY_NAME[name].symbol if name in BY_NAME else name


def _ranges(info: dict[str, Any]) -> dict[str, tuple[float, float]]:
    return {k: (float(v[0]), float(v[1])) for k, v in info.get("ranges", {}).items()}
