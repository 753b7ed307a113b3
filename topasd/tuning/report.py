"""What `topasd tune` tells and writes: the comparison on the held-out part,
the best parameters as a `topasd.toml` fragment and as a `PATCH /v1/params`
body, and sending that body to a running daemon (`--apply URL`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from topasd.model import TopasError
from topasd.scheduler.param_specs import SPEC_BY_NAME
from topasd.scheduler.params import VARIANTS, TopasParams
from topasd.tuning.search import TuneResult

# the held-out gain over the defaults (a fraction) below which tuning is not worth it
GAIN_THRESHOLD = 0.01


def best_params(result: TuneResult) -> dict[str, Any]:
    """The tuned policy's parameters: the fixed ones (--param) and the best trial's."""
    return {**result.setup.fixed, **result.best.params}


def changed_params(result: TuneResult) -> dict[str, Any]:
    """The best parameters that differ from the policy's defaults."""
    defaults = TopasParams(**VARIANTS[result.setup.policy])
    return {k: v for k, v in best_params(result).items() if getattr(defaults, k) != v}


def gains(result: TuneResult) -> dict[str, float]:
    """Relative objective gains of the tuned parameters (positive: better):
    over the defaults on each part, and over the best baseline held out."""
    obj, held, train = result.setup.objective.of, result.held_out, result.train
    out = {"train_vs_defaults": 1 - result.best.value / obj(train["defaults"]),
           "held_out_vs_defaults": 1 - obj(held["tuned"]) / obj(held["defaults"])}
    base = result.best_baseline
    if base is not None:
        out["held_out_vs_best_baseline"] = 1 - obj(held["tuned"]) / obj(held[base])
    return out


def verdict(result: TuneResult) -> str:
    """Whether the gain is real: it shows on the training tasks the search
    fitted and holds on the held-out tasks it never saw."""
    g = gains(result)
    held, train = (g[k] >= GAIN_THRESHOLD for k in ("held_out_vs_defaults", "train_vs_defaults"))
    if held and train:
        return "the gain holds on the held-out tasks"
    if held:
        return ("the held-out tasks gain more than the training ones the search fitted: "
                "more chance than fit, so expect less on other traces (a longer trace or more "
                "trials tell)")
    if train:
        return ("the training gain does not hold on the held-out tasks (the parameters fit "
                "the training tasks, not the workload): keep the defaults, or tune on a "
                "longer trace")
    return "the search found nothing better than the defaults: keep them"


def report_text(result: TuneResult, trace_name: str, where: str) -> str:
    """The human report: setup, the table, the gains, the verdict, the parameters."""
    s, obj = result.setup, result.setup.objective
    held_meta = next(iter(result.held_out.values()))
    lines = [f"tuned {s.policy} on {trace_name}: {len(result.trials)} trials (TPE, seed "
             f"{s.seed}, {s.batch} at a time, on {where}); objective: {obj.label}",
             f"training part: the first {result.best.row['tasks']} tasks by arrival; held "
             f"out: the last {held_meta['tasks']}", "", _table(result), ""]
    g = gains(result)
    base = result.best_baseline
    vs_base = "" if base is None else \
        f", {_pct(g['held_out_vs_best_baseline'])} vs {base} (the best baseline on training)"
    lines.append(f"held out: tuned {_pct(g['held_out_vs_defaults'])} vs the defaults "
                 f"(training: {_pct(g['train_vs_defaults'])}){vs_base}; {verdict(result)}")
    changed = changed_params(result)
    lines.append(f"best: trial {result.best.number}; changed from the defaults: "
                 + (_assignments(changed) or "none (the defaults won)"))
    return "\n".join(lines)


def _pct(gain: float) -> str:
    """A gain as the objective's change: 0.042 -> "-4.2%" (lower is better)."""
    return f"{round(-100 * gain, 1) + 0.0:+.1f}%"  # + 0.0: "+0.0%", never "-0.0%"


def _table(result: TuneResult) -> str:
    obj = result.setup.objective
    base = result.best_baseline
    head = ["", f"train {obj.label}", f"held-out {obj.label}", "mean", "p50", "p99"]
    labels = [("tuned", f"{result.setup.policy}, tuned"),
              ("defaults", f"{result.setup.policy}, defaults"),
              *((b, b + (" (best baseline)" if b == base else "")) for b in result.setup.baselines)]
    cells = [head]
    for key, label in labels:
        train = result.best.value if key == "tuned" else obj.of(result.train[key])
        held = result.held_out[key]
        cells.append([label, f"{train:.1f}", f"{obj.of(held):.1f}",
                      *(f"{held[k]:.1f}" for k in ("mean_jct_s", "p50_jct_s", "p99_jct_s"))])
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                     for r in cells) + "\n(times in s; mean, p50, p99: JCT on the held-out part)"


def _assignments(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{SPEC_BY_NAME[k].symbol}={_json(v)}" for k, v in params.items())


def _json(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool) or value is None else str(value)


def patch_body(result: TuneResult) -> dict[str, Any]:
    """The `PATCH /v1/params` body: the policy (its parameters reset to its
    defaults) and every tuned and fixed parameter (null: unset)."""
    return {"policy": result.setup.policy, **best_params(result)}


def toml_fragment(result: TuneResult, trace_name: str) -> str:
    """`policy` and a `[params]` table, as `topasd start` reads `topasd.toml`
    (`--config FILE`, or pasted into ./topasd.toml). TOML has no null: an
    unset parameter is a comment saying how to unset it."""
    g = gains(result)
    lines = [f"# topasd tune: {result.setup.policy} on {trace_name}, best of "
             f"{len(result.trials)} trials ({result.setup.objective.label}: held out "
             f"{_pct(g['held_out_vs_defaults'])} vs the defaults)",
             "# use: topasd start --config THIS_FILE (or paste it into ./topasd.toml)",
             f'policy = "{result.setup.policy}"', "", "[params]"]
    defaults = TopasParams(**VARIANTS[result.setup.policy])
    for name, value in best_params(result).items():
        if value is None:
            unset = f"# {name}: unset ({SPEC_BY_NAME[name].unset})"
            lines.append(f"{unset}, the default" if getattr(defaults, name) is None else
                         f"{unset}; TOML has no null: give `topasd start --param {name}=null`")
        elif isinstance(value, str):
            lines.append(f'{name} = "{value}"')
        else:
            lines.append(f"{name} = {_json(value)}")
    return "\n".join(lines) + "\n"


def apply(url: str, body: Mapping[str, Any], token: str | None) -> dict[str, Any]:
    """Send `body` to the daemon at `url` (PATCH /v1/params); its answer."""
    answer: dict[str, Any] = _params_call("PATCH", url, token, body).json()
    return answer


def check_daemon(url: str, token: str | None) -> None:
    """TopasError unless the daemon at `url` answers GET /v1/params with this
    token (before a search whose result --apply would fail to send)."""
    _params_call("GET", url, token)


def _params_call(method: str, url: str, token: str | None,
                 body: Mapping[str, Any] | None = None) -> Any:
    import httpx

    target = url.rstrip("/").removesuffix("/v1/params") + "/v1/params"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        resp = httpx.request(method, target, json=None if body is None else dict(body),
                             headers=headers, timeout=30.0)
    except httpx.HTTPError as exc:
        raise TopasError(f"--apply {url}: cannot reach the daemon ({exc}); is it running "
                         "(topasd status)?") from None
    if resp.status_code >= 400:
        what = "refused the parameters" if body is not None else "refused GET /v1/params"
        raise TopasError(f"--apply {url}: the daemon {what} (HTTP {resp.status_code}): "
                         f"{_message(resp)}")
    return resp


def _message(resp: Any) -> str:
    try:
        return str(resp.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return str(resp.text[:200])
