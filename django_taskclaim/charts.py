"""The dashboard's charts as inline SVG, drawn here: no script, nothing fetched from elsewhere.

Each figure drawn carries its value in the markup (``data-series``, ``data-value`` and a ``<title>``
a pointer shows), so what a chart shows can be read back by a browser test or a screen reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .dashboard import Group

COLOURS = {"succeeded": "#3a8a3a", "failed": "#ba2121", "other": "#9aa5b1", "p50": "#205067", "p95": "#79aec8"}
WIDTH = 720
LABEL_WIDTH = 220
ROW = 22


def _n(value: float, digits: int = 1) -> str:
    """A coordinate as the markup writes it."""
    return f"{value:.{digits}f}"


def _rect(x: float, y: float, w: float, h: float, series: str, value: float, title: str,
          **data: str) -> SafeString:
    extra = format_html_join("", ' data-{}="{}"', data.items())
    return format_html('<rect x="{}" y="{}" width="{}" height="{}" fill="{}" data-series="{}" data-value="{}"{}>'
                       "<title>{}</title></rect>", _n(x), _n(y), _n(max(w, 0)), _n(h), COLOURS[series], series,
                       f"{value:g}", extra, title)


def _text(x: float, y: float, content: str, title: str = "") -> SafeString:
    if title:
        return format_html('<text x="{}" y="{}"><title>{}</title>{}</text>', _n(x), _n(y), title, content)
    return format_html('<text x="{}" y="{}">{}</text>', _n(x), _n(y), content)


def _svg(name: str, height: float, body: list[SafeString], label: str) -> SafeString:
    return format_html('<svg class="taskclaim-chart" data-chart="{}" role="img" aria-label="{}" width="{}" '
                       'height="{}" viewBox="0 0 {} {}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" '
                       'font-size="11">{}</svg>', name, label, WIDTH, _n(height, 0), WIDTH, _n(height, 0),
                       format_html_join("", "{}", ((part,) for part in body)))


def over_time(series: Sequence[tuple[datetime, dict[str, int]]], step: int) -> SafeString:
    """Attempts started per bar of ``step`` seconds, each bar split by how they ended: succeeded,
    failed, and the rest (running, released, taken over)."""
    height, top, bottom = 170.0, 10.0, 24.0
    peak = max([bar["started"] for _, bar in series] + [1])
    width = (WIDTH - 40) / max(len(series), 1)
    body = [_text(0, top + 8, str(peak)), _text(0, height - bottom, "0"),
            format_html('<line x1="36" y1="{}" x2="{}" y2="{}" stroke="#ccc"/>', _n(height - bottom), WIDTH,
                        _n(height - bottom))]
    scale = (height - top - bottom) / peak
    for i, (start, bar) in enumerate(series):
        x, base = 40 + i * width, height - bottom
        other = bar["started"] - bar["succeeded"] - bar["failed"]
        when = start.strftime("%H:%M")
        for name, value in (("succeeded", bar["succeeded"]), ("failed", bar["failed"]), ("other", other)):
            if value <= 0:
                continue
            h = value * scale
            base -= h
            body.append(_rect(x + 1, base, width - 2, h, name, value, f"from {when}: {value} {name}",
                              bar=str(i), start=start.isoformat()))
        if i % max(1, len(series) // 6) == 0:
            body.append(_text(x, height - 8, when))
    return _svg("over-time", height, body, "attempts started over time, by outcome")


def _label(y: float, text: str) -> SafeString:
    return _text(0, y + ROW * 0.65, text if len(text) <= 34 else text[:33] + "…", title=text)


def per_group(groups: Sequence[Group]) -> SafeString:
    """Attempts started per queue and task path, split by how they ended."""
    peak = max([g.started for g in groups] + [1])
    scale = (WIDTH - LABEL_WIDTH - 60) / peak
    body: list[SafeString] = []
    for i, g in enumerate(groups):
        y, x = 4 + i * ROW, float(LABEL_WIDTH)
        body.append(_label(y, g.label))
        other = g.started - g.succeeded - g.failed
        for name, value in (("succeeded", g.succeeded), ("failed", g.failed), ("other", other)):
            if value <= 0:
                continue
            body.append(_rect(x, y + 3, value * scale, ROW - 6, name, value, f"{g.label}: {value} {name}",
                              group=g.label))
            x += value * scale
        body.append(_text(x + 4, y + ROW * 0.65, str(g.started)))
    return _svg("per-group", 8 + max(len(groups), 1) * ROW, body, "attempts per queue and task path")


def quantiles(groups: Sequence[Group], which: str) -> SafeString:
    """The median and 95th percentile of ``which`` (``"wait"``: due to start; ``"run"``: run time)
    per queue and task path, in seconds."""
    found = [(g, getattr(g, which)) for g in groups if getattr(g, which)]
    peak = max([q.get(0.95, 0.0) for _, q in found] + [0.001])
    scale = (WIDTH - LABEL_WIDTH - 210) / peak  # room for the figures written after the bar
    body: list[SafeString] = []
    for i, (g, q) in enumerate(found):
        y = 4 + i * ROW
        body.append(_label(y, g.label))
        for name, key, inset in (("p95", 0.95, 3), ("p50", 0.5, 7)):
            value = q.get(key, 0.0)
            body.append(_rect(LABEL_WIDTH, y + inset, value * scale, ROW - 2 * inset, name, round(value, 6),
                              f"{g.label}: {name} {value:.3f} s", group=g.label))
        body.append(_text(LABEL_WIDTH + q.get(0.95, 0.0) * scale + 4, y + ROW * 0.65,
                          f"p50 {q.get(0.5, 0.0):.3g} s · p95 {q.get(0.95, 0.0):.3g} s"))
    return _svg(which, 8 + max(len(found), 1) * ROW, body, f"{which} time quantiles per queue and task path")


__all__ = ["over_time", "per_group", "quantiles"]
