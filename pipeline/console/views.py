"""The console's HTML: pure functions from an index snapshot and a view state to a page.

The whole view lives in the query string (:class:`ViewState`), so a link or a reload
shows the same page; every value from a topic is escaped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from html import escape
from typing import Any
from urllib.parse import urlencode

import orjson

from pipeline.console.figures import VersionRow
from pipeline.console.index import Version, version_order
from pipeline.console.svg import line_chart, number
from pipeline.events import Sample

DEFAULT_N = 10
SNIPPET_CHARS = 100

# (title, VersionRow field) of each chart, in page order
CHARTS = (
    ("train reward mean (trainer)", "train_reward"),
    ("score mean (samples)", "score_mean"),
    ("held-out accuracy", "heldout_accuracy"),
    ("response length (tokens)", "response_tokens"),
    ("response length (chars)", "response_chars"),
    ("entropy", "entropy"),
    ("KL to the initial policy", "kl"),
    ("vote agreement", "vote_agreement"),
    ("excluded share", "excluded_share"),
    ("judge length bias", "length_bias"),
)
# (header, VersionRow field) of the table's number columns
COLUMNS = (
    ("samples", "samples"),
    ("score mean", "score_mean"),
    ("train reward", "train_reward"),
    ("held-out acc.", "heldout_accuracy"),
    ("resp. tokens", "response_tokens"),
    ("resp. chars", "response_chars"),
    ("entropy", "entropy"),
    ("KL", "kl"),
    ("vote agreement", "vote_agreement"),
    ("excluded", "excluded_share"),
    ("length bias", "length_bias"),
    ("teacher gap", "teacher_gap"),
)


@dataclass(frozen=True)
class ViewState:
    """What the page shows, as its query string says: the version (a number, ``none`` for
    unversioned samples, empty for the newest), how many of its extremes, a session
    searched for and a sample opened."""

    version: str = ""
    n: int = DEFAULT_N
    session: str = ""
    sample: str = ""

    @classmethod
    def from_query(cls, query: Mapping[str, str], max_n: int) -> ViewState:
        try:
            n = int(query.get("n", DEFAULT_N))
        except ValueError:
            n = DEFAULT_N
        return cls(
            version=query.get("version", "").strip(),
            n=min(max(n, 1), max_n),
            session=query.get("session", "").strip(),
            sample=query.get("sample", "").strip(),
        )

    def url(self, **changes: Any) -> str:
        """The page's address with ``changes`` applied (defaults left out)."""
        state = replace(self, **changes)
        pairs = [
            (name, value)
            for name, value in (
                ("version", state.version),
                ("n", "" if state.n == DEFAULT_N else str(state.n)),
                ("session", state.session),
                ("sample", state.sample),
            )
            if value
        ]
        return "/?" + urlencode(pairs) if pairs else "/"


def version_label(version: Version) -> str:
    return "none" if version is None else str(version)


def chosen_version(state: ViewState, versions: Sequence[Version]) -> Version:
    """The version the lists show: the state's, else the newest one seen."""
    if state.version == "none":
        return None
    if state.version.isdigit():
        return int(state.version)
    numbered = [v for v in versions if v is not None]
    return max(numbered) if numbered else None


def fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return number(value)
    return escape(str(value))


def version_table(rows: Sequence[VersionRow], state: ViewState, chosen: Version) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h, _ in COLUMNS)
    body = []
    for row in reversed(rows):  # newest first
        classes = [
            c for c, on in (("diverged", row.divergence), ("chosen", row.version == chosen)) if on
        ]
        link = state.url(version=version_label(row.version), sample="")
        cells = "".join(f"<td>{fmt(getattr(row, field))}</td>" for _, field in COLUMNS)
        flag = f'<td class="flag">{escape(row.divergence)}</td>' if row.divergence else "<td>–</td>"
        body.append(
            f'<tr class="{" ".join(classes)}" data-version="{version_label(row.version)}">'
            f'<td><a href="{escape(link)}">{version_label(row.version)}</a></td>{cells}{flag}</tr>'
        )
    return (
        f'<table id="versions"><thead><tr><th>version</th>{head}<th>divergence</th></tr>'
        f"</thead><tbody>{''.join(body) or _empty_row(len(COLUMNS) + 2)}</tbody></table>"
    )


def _empty_row(span: int) -> str:
    return f'<tr><td colspan="{span}">no samples or policy versions read yet</td></tr>'


def charts(rows: Sequence[VersionRow]) -> str:
    numbered = sorted((r for r in rows if r.version is not None), key=lambda r: r.version or 0)
    marks = [float(r.version or 0) for r in numbered if r.divergence]
    svgs = [
        line_chart(title, [(float(r.version or 0), getattr(r, field)) for r in numbered], marks)
        for title, field in CHARTS
    ]
    return f'<div id="charts">{"".join(svgs)}</div>'


def snippet(sample: Sample) -> str:
    text = sample.response.content or ""
    if not text and sample.response.tool_calls:
        text = orjson.dumps(sample.response.tool_calls).decode()
    return text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1] + "…"


def sample_list(list_id: str, title: str, samples: Sequence[Sample], state: ViewState) -> str:
    items = []
    for s in samples:
        link = state.url(sample=s.sample_id)
        excluded = (
            "" if s.loss_mask else f' <span class="excluded">excluded: {s.exclude_reason}</span>'
        )
        items.append(
            f'<li data-sample-id="{escape(s.sample_id)}"><a class="sample-link" '
            f'href="{escape(link)}"><b>{s.score:+g}</b> {escape(s.sample_id)}</a> '
            f'<span class="session">session {escape(s.session_id)}</span>{excluded}'
            f'<div class="snippet">{escape(snippet(s))}</div></li>'
        )
    body = "".join(items) or "<li>none</li>"
    return f'<div class="list" id="{list_id}"><h3>{escape(title)}</h3><ol>{body}</ol></div>'


def controls(state: ViewState, versions: Sequence[Version], chosen: Version) -> str:
    options = "".join(
        f'<option value="{version_label(v)}"{" selected" if v == chosen else ""}>'
        f"{version_label(v)}</option>"
        for v in sorted(versions, key=version_order, reverse=True)
    )
    return (
        '<form id="controls" method="get" action="/">'
        f'<label>version <select name="version">{options}</select></label> '
        f'<label>N <input name="n" type="number" min="1" value="{state.n}" size="4"></label> '
        f'<label>session id <input name="session" value="{escape(state.session)}"></label> '
        '<button type="submit">show</button></form>'
    )


def session_results(state: ViewState, found: Sequence[Sample], held: int) -> str:
    if not state.session:
        return ""
    title = f"session {state.session}: {len(found)} sample(s) among the {held} held"
    listed = sample_list("session-list", title, found, state)
    return f'<section id="session-results">{listed}</section>'


@dataclass(frozen=True)
class Page:
    """Everything one page shows, gathered from the index and the reader."""

    rows: Sequence[VersionRow]
    versions: Sequence[Version]
    chosen: Version
    highest: Sequence[Sample]
    lowest: Sequence[Sample]
    found: Sequence[Sample]  # the session searched for
    held: int
    status_ok: bool
    status: str
    sample_html: str = ""  # the opened sample's panel (sample_view.sample_panel)
    missing_sample: bool = False  # a sample was asked for and is not held


def render_page(state: ViewState, page: Page) -> str:
    """The console's one page: status, the per-version table and charts, the chosen
    version's highest and lowest scored samples, a session's samples, the opened sample."""
    label = version_label(page.chosen)
    missing = (
        f'<p class="error" id="sample-missing">sample {escape(state.sample)} is not held by '
        "this console (it holds the most recent samples and each version's extremes)</p>"
        if page.missing_sample
        else ""
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>turnstream console — version {label}</title>"
        '<link rel="stylesheet" href="/static/console.css"></head><body>'
        "<header><h1>turnstream console</h1>"
        f'<p id="status" class="{"ok" if page.status_ok else "error"}">{escape(page.status)}</p>'
        "</header>"
        f"<section><h2>policy versions</h2>{version_table(page.rows, state, page.chosen)}"
        f"{charts(page.rows)}</section>"
        f'<section id="trajectories"><h2>trajectories of version {label}</h2>'
        f'{controls(state, page.versions, page.chosen)}<div class="lists">'
        f"{sample_list('highest', f'{len(page.highest)} highest scored', page.highest, state)}"
        f"{sample_list('lowest', f'{len(page.lowest)} lowest scored', page.lowest, state)}"
        "</div></section>"
        f"{session_results(state, page.found, page.held)}{missing}{page.sample_html}"
        "</body></html>"
    )
