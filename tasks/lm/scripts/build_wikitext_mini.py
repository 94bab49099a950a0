"""Build WikiText-mini: a real English Wikipedia excerpt in the WikiText-103 format and token conventions.

Source: the Wikipedia dump excerpt that ships inside gensim's PyPI wheel as a test file
(gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2; Wikipedia, CC BY-SA).
gensim is needed only here, never at run time. From the repository root:

    .tools/bin/uv run --no-project --with gensim==4.4.0 python tasks/lm/scripts/build_wikitext_mini.py

What it does, following Merity et al. (2016), "Pointer Sentinel Mixture Models" (the WikiText paper):
  - one article = a ` = Title = ` line, then its paragraphs and ` = = Section = = ` headings, one per line,
    with blank lines around the headings; lists, tables, templates and reference-like sections are dropped;
  - Moses-style tokens: punctuation split off, `n't` and `'s`-style clitics separated, `@-@`, `@,@` and `@.@` for
    hyphens inside words and separators inside numbers; case kept;
  - words seen fewer than 3 times in the whole excerpt become `<unk>` (as in WikiText-103);
  - articles split deterministically (by a hash of the title) into train / valid / test, about 86 / 7 / 7 %.
Writes src/quest_lm/data/wiki.{train,valid,test}.tokens.xz.
"""

from __future__ import annotations

import bz2
import collections
import hashlib
import lzma
import re
from pathlib import Path

import gensim
from gensim.corpora.wikicorpus import extract_pages, filter_wiki

SOURCE = (Path(gensim.__file__).parent / "test" / "test_data"
          / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")
OUT = Path(__file__).resolve().parents[1] / "src" / "quest_lm" / "data"
SKIP_SECTIONS = {"references", "external links", "see also", "further reading", "notes", "bibliography",
                 "sources", "footnotes", "citations", "notes and references"}
MIN_COUNT = 3
TOKEN = re.compile(r"@[-,.]@|n't\b|'(?:s|re|ve|ll|d|m)\b|\w+|[^\w\s]")
HEADING = re.compile(r"^(=+)\s*(.*?)\s*\1\s*$")


def tokenize(text: str) -> list[str]:
    text = text.replace("'''", "").replace("''", "").replace("&nbsp;", " ").replace("–", "-").replace("—", " - ")
    text = re.sub(r"(\d),(?=\d)", r"\1 @,@ ", text)
    text = re.sub(r"(\d)\.(?=\d)", r"\1 @.@ ", text)
    text = re.sub(r"(\w)-(?=\w)", r"\1 @-@ ", text)
    text = re.sub(r"(\w)(n't)\b", r"\1 \2", text)
    text = re.sub(r"(\w)('(?:s|re|ve|ll|d|m))\b", r"\1 \2", text)
    return TOKEN.findall(text)


def article_lines(title: str, wiki_text: str) -> list[list[str]]:
    """The article as WikiText lines: a list of tokens per heading or paragraph."""
    lines, skipping = [["="] + tokenize(title) + ["="]], False
    for raw in filter_wiki(wiki_text).splitlines():
        raw = raw.strip()
        heading = HEADING.match(raw)
        if heading:
            level, name = len(heading.group(1)), heading.group(2)
            skipping = name.lower() in SKIP_SECTIONS
            if not skipping and tokenize(name):
                lines.append(["="] * level + tokenize(name) + ["="] * level)
            continue
        if skipping or not raw or raw[0] in "*#:;|{!<" or len(raw.split()) < 5:
            continue  # lists, tables, leftovers of templates, captions
        tokens = tokenize(raw)
        if tokens:
            lines.append(tokens)
    while lines and lines[-1][0] == "=":  # a trailing heading with no paragraph
        lines.pop()
    return lines


def split_of(title: str) -> str:
    bucket = int(hashlib.sha256(title.encode()).hexdigest(), 16) % 100
    return "valid" if bucket < 7 else "test" if bucket < 14 else "train"


def main() -> None:
    articles = []
    for title, text, _ in extract_pages(bz2.open(SOURCE), filter_namespaces=("0",)):
        if text.lstrip().lower().startswith("#redirect"):
            continue
        lines = article_lines(title, text)
        if len(lines) > 1:
            articles.append((title, lines))
    counts = collections.Counter(t for _, lines in articles for line in lines for t in line)
    splits: dict[str, list[str]] = {"train": [], "valid": [], "test": []}
    for title, lines in articles:
        out = splits[split_of(title)]
        for line in lines:
            words = [t if counts[t] >= MIN_COUNT or t == "=" else "<unk>" for t in line]
            # WikiText layout: headings sit between blank lines, paragraphs follow each other; every line starts
            # and ends with a space
            text = " " + " ".join(words) + " "
            out += [" ", text, " "] if line[0] == "=" else [text]
    OUT.mkdir(parents=True, exist_ok=True)
    for name, lines in splits.items():
        text = "\n".join(lines) + "\n"
        path = OUT / f"wiki.{name}.tokens.xz"
        path.write_bytes(lzma.compress(text.encode(), preset=9 | lzma.PRESET_EXTREME))
        words = sum(len(line.split()) for line in lines)
        n_articles = sum(1 for line in lines if re.match(r"^ = [^=]", line))
        print(f"{path.name}: {n_articles} articles, {words:,} tokens, {path.stat().st_size / 1e6:.2f} MB")
    vocab = {t for t, c in counts.items() if c >= MIN_COUNT}
    unk = sum(c for t, c in counts.items() if c < MIN_COUNT)
    print(f"vocabulary {len(vocab) + 1:,} words; {unk / sum(counts.values()):.1%} of tokens are <unk>")


if __name__ == "__main__":
    main()
