"""The leaderboard's tables as data, and the one renderer that writes them as Markdown, HTML, CSV and JSON.

A section of the report returns a ``Table``: column headers and rows of typed cells. A cell is

- ``int`` / ``float`` / ``None``: a number (``None`` and non-finite floats are missing: "—", empty, null);
- ``Num``: a number with the text the page shows for it (the data files keep the number);
- ``str``: untrusted text read from a run (a variant, a metric name, an override): shown as exactly that text;
- ``Text``: text the report composes (a template filled with values, e.g. "0.59 ± 0.03" or "lr=0.1 (edge of
  lr)"): its template is trusted, its arguments are untrusted text, escaped for each format. A composed cell of
  numbers carries them in ``data`` (e.g. ``{"mean": 0.59, "std": 0.03}``).

In the CSV and JSON, a column with ``data`` in any of its cells keeps its text column and gains one numeric column
per key, named ``"<header>: <key>"`` (e.g. "Δ [interval]: mean", "Δ [interval]: low", "Δ [interval]: high"),
right after it; a cell without that key leaves it empty (null).

The page (``Page``) is a list of blocks: Markdown prose lines (the report writes them with untrusted values already
escaped) and tables. ``markdown``, ``html_page`` and ``write_data`` render the same blocks, so the CSV and JSON beside
the page hold the values of its tables, never text parsed back from the Markdown.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ue000]")  # line breaks, escapes; \ue000: inline's marker
MD_SPECIAL = re.compile(r"([\\`*\[\]<>&|!#~])")
MD_ESCAPED = re.compile(r"\\([\\`*\[\]<>&|!#~])")
MAX_TEXT = 200  # characters of one untrusted value shown (the run data keep it whole)
LINK = re.compile(r"\[([^\]]+)\]\(([^)]+)\)")  # Markdown links, for the HTML page
SAFE_TARGET = re.compile(r"[A-Za-z0-9._-][A-Za-z0-9._/-]*")  # relative paths only: no scheme, host or query
FIGURE = re.compile(r"!\[([^\]]*)\]\(([A-Za-z0-9._-]+\.png)\)")  # a generated figure, alone on its line
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"  # no script, no file or network loads
MISSING = "—"


# ---- untrusted text -----------------------------------------------------------------------------------------

def clean(value, limit: int = MAX_TEXT) -> str:
    """Untrusted text on one line: control characters (newlines included) become spaces, at most ``limit``
    characters."""
    text = CONTROL.sub(" ", str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def md(value, limit: int = MAX_TEXT) -> str:
    """Untrusted text as Markdown that renders as exactly that text (no link, image, markup, HTML or entity)."""
    return MD_SPECIAL.sub(r"\\\1", clean(value, limit))


def md_code(value, limit: int = MAX_TEXT) -> str:
    """Untrusted text inside a Markdown `code span` (where backslashes are literal): no backtick can end it, no
    pipe can split a table cell."""
    return clean(value, limit).replace("`", "'").replace("|", "\\|")


# ---- cells --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Num:
    """A number and the text the page shows for it (e.g. 0.5333 shown as "0.533")."""

    value: float | int | None
    text: str


@dataclass(frozen=True, init=False)
class Text:
    """Composed text: ``template`` (trusted, ``str.format`` fields ``{}``) filled with ``args`` (untrusted values,
    escaped for the format written)."""

    template: str
    args: tuple
    data: dict

    def __init__(self, template: str, *args, data: dict | None = None):
        object.__setattr__(self, "template", template)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "data", dict(data or {}))

    def render(self, escape) -> str:
        return self.template.format(*(escape(a) for a in self.args)) if self.args else self.template


Cell = int | float | str | Num | Text | None


def number(value):
    """A number for the data files: None for a missing or non-finite one."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value


def number_text(value) -> str:
    if number(value) is None:
        return MISSING
    return str(value) if isinstance(value, int) else f"{value:g}"


def cell_markdown(cell: Cell) -> str:
    if isinstance(cell, Text):
        return cell.render(md)
    if isinstance(cell, Num):
        return cell.text
    if isinstance(cell, str):
        return md(cell)
    return number_text(cell)


def cell_html(cell: Cell) -> str:
    if isinstance(cell, Text):
        return Text(html.escape(cell.template), *cell.args).render(lambda a: html.escape(clean(a)))
    if isinstance(cell, Num):
        return html.escape(cell.text)
    if isinstance(cell, str):
        return html.escape(clean(cell))
    return html.escape(number_text(cell))


def cell_data(cell: Cell):
    """A cell's value in CSV and JSON: the number of a numeric cell (None when missing), the plain text of any
    other."""
    if isinstance(cell, Text):
        return cell.render(clean)
    if isinstance(cell, Num):
        return number(cell.value)
    if isinstance(cell, str):
        return clean(cell)
    return number(cell)


# ---- tables and the page ------------------------------------------------------------------------------------

@dataclass
class Table:
    """One table of the report: column headers, rows of cells (``Cell``), and where the data files name it.

    ``caption``: what the table is, where a section holds several (its data files are then named
    ``NN-<section>-<caption>``); ``section``: the heading it appears under, set by the page."""

    columns: list[Cell]
    rows: list[list[Cell]] = field(default_factory=list)
    caption: str = ""
    section: str = ""

    def __post_init__(self):
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"a table row has {len(row)} cells for {len(self.columns)} columns: {row!r}")

    def markdown(self) -> list[str]:
        line = lambda cells: "| " + " | ".join(map(cell_markdown, cells)) + " |"  # noqa: E731
        return [line(self.columns), "|" + "---|" * len(self.columns), *map(line, self.rows)]

    def html(self) -> str:
        head = "<tr>" + "".join(f"<th>{cell_html(c)}</th>" for c in self.columns) + "</tr>"
        body = "".join("<tr>" + "".join(f"<td>{cell_html(c)}</td>" for c in row) + "</tr>" for row in self.rows)
        return f"<table>{head}{body}</table>"

    def data_keys(self) -> list[list[str]]:
        """Per column, the keys of its cells' ``data`` in first-seen order (empty for a column without)."""
        keys: list[list[str]] = [[] for _ in self.columns]
        for row in self.rows:
            for i, cell in enumerate(row):
                if isinstance(cell, Text):
                    keys[i] += [k for k in cell.data if k not in keys[i]]
        return keys

    def header(self) -> list[str]:
        """The data files' column names: each column's text, then ``"<text>: <key>"`` per key of its data."""
        names = [str(cell_data(c)) for c in self.columns]
        return [h for name, keys in zip(names, self.data_keys()) for h in (name, *(f"{name}: {k}" for k in keys))]

    def values(self, row: list[Cell]) -> list:
        """One row's values in the order of ``header``: each cell's value, then its numbers by data key."""
        out = []
        for cell, keys in zip(row, self.data_keys()):
            out.append(cell_data(cell))
            data = cell.data if isinstance(cell, Text) else {}
            out += [number(data.get(k)) for k in keys]
        return out

    def records(self) -> list[dict]:
        """The rows as objects by column header (JSON)."""
        return [dict(zip(self.header(), self.values(row))) for row in self.rows]


Block = str | Table  # a Markdown line (untrusted values already escaped) or a table


class Page:
    """The report as blocks, in order; each ``## `` line starts a section that names the tables under it."""

    def __init__(self, blocks: list[Block] | None = None):
        self.blocks: list[Block] = []
        self.extend(blocks or [])

    def extend(self, blocks: list[Block]) -> None:
        section = next((b[3:] for b in reversed(self.blocks) if isinstance(b, str) and b.startswith("## ")),
                       "leaderboard")
        for block in blocks:
            if isinstance(block, str) and block.startswith("## "):
                section = block[3:]
            elif isinstance(block, Table):
                block.section = MD_ESCAPED.sub(r"\1", section.replace("`", ""))
            self.blocks.append(block)

    def __iadd__(self, blocks: list[Block]) -> "Page":
        self.extend(blocks)
        return self

    @property
    def tables(self) -> list[Table]:
        return [b for b in self.blocks if isinstance(b, Table)]

    def markdown(self) -> str:
        return "\n".join(line for b in self.blocks for line in (b.markdown() if isinstance(b, Table) else [b]))


def write_data(tables: list[Table], folder: Path, slug) -> list[str]:
    """Each table as ``NN-<section>[-<caption>].csv`` and ``.json`` (a list of row objects) in ``folder``, numbered
    in page order; returns the file names."""
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for i, table in enumerate(tables, 1):
        name = f"{i:02d}-{slug(table.section)[:60]}" + (f"-{slug(table.caption)}" if table.caption else "")
        with open(folder / f"{name}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(table.header())
            writer.writerows([["" if v is None else v for v in table.values(row)] for row in table.rows])
        (folder / f"{name}.json").write_text(json.dumps(table.records(), indent=1))
        names += [f"{name}.csv", f"{name}.json"]
    return names


# ---- HTML -------------------------------------------------------------------------------------------------------

def link_target(target: str) -> str | None:
    """The target of a Markdown link if it may become a link, else None: after normalising it as a browser does
    (entities decoded, whitespace and control characters dropped), only a relative path of letters, digits, '.',
    '_', '-' and '/' (no scheme such as javascript:, no host, no absolute path, no query)."""
    plain = re.sub(r"[\s\x00-\x1f\x7f]+", "", html.unescape(html.unescape(target)))
    if not SAFE_TARGET.fullmatch(plain) or "//" in plain:
        return None
    return plain


def safe_link(match: re.Match) -> str:
    """An HTML link for a Markdown link whose target passes ``link_target``; any other (javascript:, http:, an
    absolute path) is shown as plain text. ``match`` is of ``LINK`` on HTML-escaped text."""
    text, target = match.group(1), match.group(2)
    plain = link_target(target)
    if plain is None:
        return f"{text} ({target})"
    return f'<a href="{html.escape(plain, quote=True)}">{text}</a>'


def inline(text: str) -> str:
    """One line of Markdown prose as HTML: escaped, backslash escapes kept literal, `code` spans as <code>,
    **bold**, relative links as links (``safe_link``)."""
    literal: list[str] = []

    def keep(m: re.Match) -> str:  # an escaped character: set aside so that no rule below can see it
        literal.append(m.group(1))
        return f"\ue000{len(literal) - 1}\ue000"

    text = MD_ESCAPED.sub(keep, CONTROL.sub(" ", text.lstrip("> ")))
    text = html.escape(text)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", text)
    text = LINK.sub(safe_link, text)
    return re.sub("\ue000(\\d+)\ue000", lambda m: html.escape(literal[int(m.group(1))]), text)


def html_page(title: str, page: Page, folder: Path, figures: set[str] = frozenset()) -> str:
    """A self-contained page: tables rendered from their cells, prose lines from their Markdown, the figures this
    report wrote (names in ``figures``, files in ``folder``) inlined as base64; any other image line is shown as
    text and reads nothing. A Content-Security-Policy forbids every script and every load other than those inlined
    images."""
    out = []
    for block in page.blocks:
        if isinstance(block, Table):
            out.append(block.html())
            continue
        for line in block.splitlines() or [""]:
            figure = FIGURE.fullmatch(line)
            if figure and figure.group(2) in figures:
                name = figure.group(2)
                data = base64.b64encode((Path(folder) / name).read_bytes()).decode()
                out.append(f'<p><img alt="{html.escape(name)}" src="data:image/png;base64,{data}"></p>')
            elif line.startswith("## "):
                out.append(f"<h2>{inline(line[3:])}</h2>")
            elif line.startswith("# "):
                out.append(f"<h1>{inline(line[2:])}</h1>")
            elif line:
                out.append(f"<p>{inline(line)}</p>")
    style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px}"
             "th{background:#f3f3f3}img{max-width:100%}code{background:#f3f3f3;padding:0 2px}")
    return (f"<!doctype html><html><head><meta charset='utf-8'>"
            f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">"
            f"<title>QUEST Bench: {html.escape(clean(title))}</title>"
            f"<style>{style}</style></head><body>{''.join(out)}</body></html>")
