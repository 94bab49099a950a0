"""Check a leaderboard page in a real headless browser (Debian's ``chromium-headless-shell``, which ``make setup``
installs): every image loads, no script error or console error, no literal Markdown backticks in the rendered text.

    python -m quest_bench.pagecheck results/smoke/leaderboard/index.html
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")

# Runs in the page after it loaded: collects what a reader would see go wrong, into an attribute dump-dom shows.
PROBE = """<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message || e.target && e.target.src)), true);
const consoleError = console.error;
console.error = (...a) => { window.__errors.push(a.join(' ')); consoleError(...a); };
window.addEventListener('load', () => {
  const images = [...document.images];
  const broken = images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt || i.src.slice(0, 80));
  document.documentElement.setAttribute('data-check', JSON.stringify({
    images: images.length, broken: broken, errors: window.__errors,
    backticks: document.body.innerText.includes('`'), links: [...document.links].map(a => a.getAttribute('href'))}));
});
</script>"""


def browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def check_page(page: Path, timeout_s: float = 60) -> list[str]:
    """The problems a headless browser finds in ``page`` (empty: none); an error if no browser is installed."""
    exe = browser()
    if exe is None:
        raise RuntimeError(f"no headless browser found (tried {', '.join(BROWSERS)}); run `make setup` as root, or "
                           "apt-get install chromium-headless-shell")
    page = Path(page).resolve()
    html = page.read_text()
    probed = html.replace("<head>", "<head>" + PROBE, 1)
    with tempfile.TemporaryDirectory() as profile:
        copy = page.with_name(f".pagecheck-{page.name}")  # beside the page: its relative links must resolve
        copy.write_text(probed)
        try:
            proc = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                                   "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000",
                                   "--dump-dom", copy.as_uri()],
                                  capture_output=True, text=True, timeout=timeout_s)
        finally:
            copy.unlink(missing_ok=True)
    found = re.search(r"data-check=\"([^\"]*)\"", proc.stdout)
    if not found:
        return [f"the page did not finish loading in the browser (exit {proc.returncode}): {proc.stderr[-500:]}"]
    report = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    problems = [f"image did not load: {name}" for name in report["broken"]]
    problems += [f"script or console error: {e}" for e in report["errors"]]
    problems += [f"console: {line.strip()}" for line in proc.stderr.splitlines() if ":ERROR:CONSOLE" in line]
    if report["backticks"]:
        problems.append("literal Markdown backticks in the rendered text")
    for href in report["links"]:
        if href and not re.match(r"^[a-z]+:", href) and not (page.parent / href).exists():
            problems.append(f"broken link: {href}")
    return problems


def main(argv: list[str] | None = None) -> int:
    pages = argv if argv is not None else sys.argv[1:]
    if not pages:
        print(__doc__.strip())
        return 2
    failed = False
    for page in pages:
        problems = check_page(Path(page))
        print(f"{page}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
        for problem in problems:
            print(f"  - {problem}")
        failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
