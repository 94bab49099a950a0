"""Untrusted text is data, never markup: hostile values in overrides, metric names, the environment and file names of
a run folder reach the leaderboard's README.md and index.html only as text. The page is opened in the real headless
browser (``quest_bench.pagecheck``), every link clicked, with and without its Content-Security-Policy: no script
runs, nothing outside the page is loaded, and no file outside the folder is read into it."""

import base64
import html
import html.parser
import json
import re

import pytest

from quest_bench.leaderboard import FIGURE, SAFE_TARGET, write_leaderboard
from quest_bench.pagecheck import browser, check_page
from quest_bench.result import RunResult
from quest_bench.spec import RunSpec
from quest_bench.store import Store

MARK = "document.documentElement.setAttribute('data-pwned','1')"  # what pagecheck looks for
SECRET = "TOP-SECRET-7f3a9c"  # in a file outside the leaderboard folder


def hostile_values(secret_path: str) -> dict[str, str]:
    return {
        "space-javascript": f"[click me]( javascript:{MARK})",
        "tab-javascript": f"[click me](\tjavascript:{MARK})",
        "case-javascript": f"[click me](JaVaScRiPt:{MARK})",
        "entity-javascript": f"[click me](&#106;avascript:{MARK})",
        "newline-entity": f"[x](java&#x0A;script:{MARK})",
        "autolink": f"<javascript:{MARK}>",
        "data-uri": "[d](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
        "image-absolute": f"x\n![secret]({secret_path})\n",
        "image-relative": "x\n![secret](../../../secret.png)",
        "heading-and-table": "x\n## Injected heading\n| injected | table |\n|---|---|\n| 1 | 2 |",
        "img-onerror": f'<img src=x onerror="{MARK}">',
        "script-tag": f"<script>{MARK}</script>",
        "svg-onload": f"<svg onload=\"{MARK}\"></svg>",
        "entities": "&lt;script&gt;&amp;&#x3C;b&#x3E;",
        "markdown-markup": "`code` **bold** _it_ ~~strike~~ \\| pipe | pipe",
        "control": "bell\x07 esc\x1b[31m red nul\x00 del\x7f line\u2028sep",
        "long": "A" * 5000,
        "quote-breakout": f"\"'><a href=\"javascript:{MARK}\">x</a>",
    }


class Elements(html.parser.HTMLParser):
    """Every tag and its attributes."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


@pytest.fixture(scope="module")
def hostile_board(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    secret = root / "secret.png"  # a PNG a page could embed, holding a secret
    secret.write_bytes(b"\x89PNG\r\n\x1a\n" + SECRET.encode())
    (root / "results").mkdir()
    store = Store(root / "results" / "evil")
    values = hostile_values(str(secret))
    keys = list(values)
    for variant in ("softmax", "quest"):
        for seed, key in enumerate(keys):
            overrides = {"dataset": values[key], f"{key}<b>|": 1}
            spec = RunSpec("spurious", variant, "tiny", seed, overrides, "x")
            extra = f"evil_{key}: [m]( javascript:{MARK}) <img src=x onerror=\"{MARK}\">"
            result = RunResult(
                run_id=spec.run_id, task="spurious", task_version="1", variant=variant, preset="tiny", seed=seed,
                overrides=overrides, status="ok", primary_metric="robust_success",
                metrics={"robust_success": 0.5 + 0.01 * seed + (variant == "quest") * 0.1, extra: 1.0},
                metric_directions={extra: True},
                env={"host": values[key], "git_sha": values["script-tag"], "device": "cpu",
                     "packages": {values["img-onerror"]: values["space-javascript"]}},
                finished_at=values["heading-and-table"])
            store.write(spec, result)
            (store.run_dir(spec.run_id) / f"[x]( javascript:{MARK.replace('/', '')}).png").write_bytes(
                b"\x89PNG\r\n\x1a\n")  # a per-run figure with a hostile file name
    folder = write_leaderboard(store, "evil")
    return folder, secret, values


def all_text(folder) -> str:
    return "\n".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file()
                     and p.suffix in (".md", ".html", ".csv", ".json"))


def test_no_file_outside_the_folder_is_read_into_the_page(hostile_board):
    folder, secret, _ = hostile_board
    text = all_text(folder)
    assert SECRET not in text
    assert base64.b64encode(secret.read_bytes()).decode()[:24] not in text
    page = (folder / "index.html").read_text()
    figures = {p.name for p in folder.glob("*.png")}
    images = [a for tag, a in elements(page) if tag == "img"]
    assert images and len(images) <= len(figures)  # only the leaderboard's own figures are embedded
    assert all(img["src"].startswith("data:image/png;base64,") and img["alt"] in figures for img in images)


def elements(page: str) -> list[tuple[str, dict]]:
    parser = Elements()
    parser.feed(page)
    return parser.tags


def test_the_page_has_no_script_no_handler_and_only_relative_links(hostile_board):
    folder, _, values = hostile_board
    page = (folder / "index.html").read_text()
    tags = elements(page)
    assert not [t for t, _ in tags if t in ("script", "svg", "iframe", "object", "embed", "form", "base")]
    assert not [(t, k) for t, a in tags for k in a if k.lower().startswith("on")]
    hrefs = [a.get("href") for t, a in tags if t == "a"]
    assert hrefs and all(SAFE_TARGET.fullmatch(h) and (folder / h).exists() for h in hrefs), hrefs
    assert not re.search(r"<h2>Injected heading", page)
    assert "Content-Security-Policy" in page
    text = html.unescape(re.sub(r"<[^>]+>", "", page))  # the values are there, as text
    assert "[click me]( javascript:" in text and '<img src=x onerror="' in text and "**bold**" in text


def test_the_markdown_has_no_link_image_heading_or_html_from_a_value(hostile_board):
    folder, _, _ = hostile_board
    markdown_it = pytest.importorskip("markdown_it")
    readme = (folder / "README.md").read_text()
    figures = {p.name for p in folder.glob("*.png")}
    for line in readme.splitlines():
        assert not line.startswith("![") or (FIGURE.fullmatch(line) and FIGURE.fullmatch(line).group(2) in figures)
        assert not line.startswith("## Injected") and not line.startswith("| injected")
    # rendered by a CommonMark renderer with raw HTML allowed (the most a Markdown viewer could do with it)
    rendered = markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table").render(readme)
    tags = elements(rendered)
    assert not [t for t, _ in tags if t in ("script", "svg")]
    assert not [(t, k) for t, a in tags for k in a if k.lower().startswith("on")]
    assert all(SAFE_TARGET.fullmatch(a["href"]) for t, a in tags if t == "a")
    assert all(a["src"] in figures for t, a in tags if t == "img")


def test_the_tables_keep_the_values_as_plain_text(hostile_board):
    folder, _, values = hostile_board
    rows = [json.loads(p.read_text()) for p in (folder / "tables").glob("*.json")]
    cells = {v for table in rows for row in table for v in [*row.values(), *row.keys()]}
    assert any(isinstance(c, str) and "[click me]( javascript:" in c for c in cells)


needs_browser = pytest.mark.skipif(browser() is None, reason="no headless browser (make setup installs one)")


@needs_browser
@pytest.mark.parametrize("keep_csp", [True, False], ids=["with-csp", "escaping-alone"])
def test_no_script_runs_in_the_browser_when_every_link_is_clicked(hostile_board, keep_csp):
    folder, _, _ = hostile_board
    problems = check_page(folder / "index.html", timeout_s=180, interact=True, keep_csp=keep_csp)
    # the values hold backticks, which the page must show as they are
    assert [p for p in problems if p != "literal Markdown backticks in the rendered text"] == []


@needs_browser
def test_the_browser_check_sees_a_script_that_runs_and_a_file_that_loads(tmp_path):
    """The check above can fail: the page the old renderer made (a link target with a leading space, an image read
    from a path in the text) is caught."""
    (tmp_path / "outside.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    page = tmp_path / "board" / "index.html"
    page.parent.mkdir()
    page.write_text(f"<!doctype html><html><head><title>x</title></head><body><a href=\" javascript:{MARK}\">"
                    f"click me</a><img alt='x' src='{(tmp_path / 'outside.png').as_uri()}'></body></html>")
    problems = check_page(page, timeout_s=180, interact=True)
    assert "a script from the page's content ran (data-pwned is set)" in problems
    assert any(p.startswith("loads a resource that is not inlined: file://") for p in problems)
