"""Every relative link in README.md and docs/**/*.md points at a file or folder that exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK_RE = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE_RE = re.compile(r"^```.*?^```", re.M | re.S)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def relative_targets(text: str) -> list[str]:
    """Relative link targets of a Markdown text, outside fenced code, without their #fragment."""
    targets = []
    for target in LINK_RE.findall(FENCE_RE.sub("", text)):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def test_relative_targets_finds_links_and_skips_urls_and_code():
    text = "[a](docs/x.md#sec) ![f](figures/y.png) [u](https://e.org) [h](#top)\n```\n[c](nope.md)\n```\n"
    assert relative_targets(text) == ["docs/x.md", "figures/y.png"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    missing = [t for t in relative_targets(page.read_text(encoding="utf-8")) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to paths that do not exist: {missing}"
