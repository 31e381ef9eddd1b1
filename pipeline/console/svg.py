"""Server-rendered SVG charts (no script, no chart library): a pure function per chart."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from html import escape

WIDTH, HEIGHT = 300, 150
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 46, 10, 22, 22

Point = tuple[float, float | None]  # (x, y); y None: no value there (the line breaks)


def number(value: float) -> str:
    """A short label for an axis or a tooltip."""
    if value != 0 and (abs(value) >= 10_000 or abs(value) < 0.001):
        return f"{value:.2e}"
    return f"{value:.3g}"


def _scale(lo: float, hi: float, out_lo: float, out_hi: float) -> tuple[float, float]:
    """(a, b) with out = a + b * value mapping [lo, hi] onto [out_lo, out_hi]; a constant
    series sits in the middle."""
    if hi == lo:
        return (out_lo + out_hi) / 2, 0.0
    b = (out_hi - out_lo) / (hi - lo)
    return out_lo - b * lo, b


def segments(points: Sequence[Point]) -> list[list[tuple[float, float]]]:
    """The runs of points with a value, in order: each is drawn as one line."""
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if y is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append((x, y))
    return [run for run in runs if run]


def line_chart(
    title: str,
    points: Sequence[Point],
    marks: Collection[float] = (),
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """A line chart of ``points`` (x: the policy version) with a dot per value, a tooltip
    on each, the y range labelled, and a red rule at each x in ``marks`` (a divergence)."""
    known = [(x, y) for x, y in points if y is not None]
    head = (
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}"><text class="title" x="{PAD_LEFT}" y="14">'
        f"{escape(title)}</text>"
    )
    if not known:
        return head + f'<text class="empty" x="{width / 2}" y="{height / 2}">no data</text></svg>'
    xs, ys = [x for x, _ in points], [y for _, y in known]
    ax, bx = _scale(min(xs), max(xs), PAD_LEFT, width - PAD_RIGHT)
    ay, by = _scale(min(ys), max(ys), height - PAD_BOTTOM, PAD_TOP)
    parts = [head, _axes(min(xs), max(xs), min(ys), max(ys), width, height)]
    for x in marks:
        px = ax + bx * x
        parts.append(
            f'<line class="mark" x1="{px:.1f}" y1="{PAD_TOP}" x2="{px:.1f}" '
            f'y2="{height - PAD_BOTTOM}"/>'
        )
    for run in segments(points):
        coords = " ".join(f"{ax + bx * x:.1f},{ay + by * y:.1f}" for x, y in run)
        parts.append(f'<polyline class="line" fill="none" stroke="#0969da" points="{coords}"/>')
    for x, y in known:
        parts.append(
            f'<circle class="dot" cx="{ax + bx * x:.1f}" cy="{ay + by * y:.1f}" r="2.5">'
            f"<title>v{number(x)}: {number(y)}</title></circle>"
        )
    return "".join(parts) + "</svg>"


def _axes(x_lo: float, x_hi: float, y_lo: float, y_hi: float, width: int, height: int) -> str:
    bottom, right = height - PAD_BOTTOM, width - PAD_RIGHT
    return (
        f'<line class="axis" x1="{PAD_LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}"/>'
        f'<line class="axis" x1="{PAD_LEFT}" y1="{PAD_TOP}" x2="{PAD_LEFT}" y2="{bottom}"/>'
        f'<text class="tick" x="{PAD_LEFT - 4}" y="{PAD_TOP + 4}" text-anchor="end">'
        f"{number(y_hi)}</text>"
        f'<text class="tick" x="{PAD_LEFT - 4}" y="{bottom}" text-anchor="end">'
        f"{number(y_lo)}</text>"
        f'<text class="tick" x="{PAD_LEFT}" y="{height - 6}">v{number(x_lo)}</text>'
        f'<text class="tick" x="{right}" y="{height - 6}" text-anchor="end">v{number(x_hi)}</text>'
    )
