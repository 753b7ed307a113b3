"""The sweep's chart: mean and p99 JCT against arrival rate, one line per
policy, each policy's saturation point marked; an offline HTML page (plotly.js
inline, nothing fetched)."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from topasd.tuning.replays import Row
from topasd.tuning.sweep import SATURATION_FACTOR

PANELS = (("mean_jct_s", "mean JCT (s)"), ("p99_jct_s", "p99 JCT (s)"))
COLOURS = tuple(qualitative.Plotly) + tuple(qualitative.D3)


def sweep_figure(points: Sequence[Row], sat: Mapping[str, float | None],
                 title: str) -> go.Figure:
    """Two panels (mean, p99 JCT against rate); a policy is one legend entry,
    its line in each panel and an X at its saturation rate."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=[label for _, label in PANELS],
                        horizontal_spacing=0.08)
    for i, policy in enumerate(dict.fromkeys(pt["policy"] for pt in points)):
        mine = [pt for pt in points if pt["policy"] == policy]
        colour = COLOURS[i % len(COLOURS)]
        for col, (key, label) in enumerate(PANELS, start=1):
            fig.add_trace(_line(policy, mine, key, label, colour, first=col == 1), 1, col)
            at = sat.get(policy)
            if at is not None:
                fig.add_trace(_mark(policy, next(pt for pt in mine if pt["rate"] == at), key,
                                    colour), 1, col)
    fig.update_xaxes(title_text="arrival rate (task/s)")
    fig.update_layout(
        title=html.escape(title, quote=False), template="plotly_white", height=520,
        legend_title_text=f"policy (X: saturated, mean JCT {SATURATION_FACTOR:g}x the "
                          "lightest rate's)",
        hovermode="closest")
    return fig


def _line(policy: str, mine: Sequence[Row], key: str, label: str, colour: str,
          first: bool) -> go.Scatter:
    name = html.escape(policy, quote=False)
    return go.Scatter(
        x=[pt["rate"] for pt in mine], y=[pt[key] for pt in mine], mode="lines+markers",
        name=name, legendgroup=policy, showlegend=first, line={"color": colour},
        hovertemplate=f"{name}<br>%{{x:g}} task/s<br>{label}: %{{y:.1f}}<extra></extra>")


def _mark(policy: str, point: Row, key: str, colour: str) -> go.Scatter:
    name = html.escape(policy, quote=False)
    return go.Scatter(
        x=[point["rate"]], y=[point[key]], mode="markers", name=f"{name} saturates",
        legendgroup=policy, showlegend=False,
        marker={"symbol": "x", "size": 14, "color": colour, "line": {"width": 1}},
        hovertemplate=f"{name} saturates at %{{x:g}} task/s<extra></extra>")


def write_html(fig: go.Figure, path: str | Path, title: str) -> Path:
    """The chart as one self-contained HTML file (plotly.js inline)."""
    out = Path(path)
    page = fig.to_html(include_plotlyjs=True, full_html=True, div_id="sweep",
                       config={"displaylogo": False})
    page = page.replace("<head>", f"<head><title>{html.escape(title)}</title>", 1)
    out.write_text(page, encoding="utf-8")
    return out
