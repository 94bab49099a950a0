"""Check a leaderboard page in a real headless browser (Debian's ``chromium-headless-shell``, which ``make setup``
installs): every image loads, no script error or console error, no literal Markdown backticks in the rendered text.
With ``interact=True`` (the hostile-values test) it also clicks every link, and fails if anything in the page ran a
script (a hostile value's ``javascript:`` link or ``onerror`` handler would set ``data-pwned`` on the page, the
mark the tests' payloads use) or loaded a resource that is not inlined in the page (a local file).

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
  const report = () => document.documentElement.setAttribute('data-check', JSON.stringify({
    images: images.length, broken: broken, errors: window.__errors,
    backticks: document.body.innerText.includes('`'), links: [...document.links].map(a => a.getAttribute('href')),
    pwned: document.documentElement.hasAttribute('data-pwned'), clicked: window.__clicked || 0,
    resources: [...performance.getEntriesByType('resource').map(e => e.name),
                ...[...document.querySelectorAll('[src]')].map(e => e.src)]}));
  if (window.__interact) {  // follow no link that leaves the page; let a javascript: one run if it can
    document.addEventListener('click', e => { const a = e.target.closest('a');
      if (a && a.protocol !== 'javascript:') e.preventDefault(); }, true);
    window.__clicked = 0;
    for (const a of document.querySelectorAll('a, [onclick]')) { a.click(); window.__clicked++; }
    setTimeout(report, 1000);
  } else {
    report();
  }
});
</script>"""


def browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def check_page(page: Path, timeout_s: float = 60, interact: bool = False, keep_csp: bool = True) -> list[str]:
    """The problems a headless browser finds in ``page`` (empty: none); an error if no browser is installed.
    ``interact``: also click every link and report scripts that ran and resources loaded (see the module's doc).
    ``keep_csp=False`` removes the page's Content-Security-Policy first, to check that escaping alone holds."""
    exe = browser()
    if exe is None:
        raise RuntimeError(f"no headless browser found (tried {', '.join(BROWSERS)}); run `make setup` as root, or "
                           "apt-get install chromium-headless-shell")
    page = Path(page).resolve()
    html = page.read_text()
    if not keep_csp:
        html = re.sub(r"<meta http-equiv=.Content-Security-Policy.[^>]*>", "", html)
    # before the page's own CSP meta, which applies to what follows it only
    probe = PROBE.replace("<script>", "<script>window.__interact = true;", 1) if interact else PROBE
    probed = html.replace("<head>", "<head>" + probe, 1)
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
    if report.get("pwned"):
        problems.append("a script from the page's content ran (data-pwned is set)")
    for name in dict.fromkeys(report.get("resources", [])):
        if not name.startswith("data:"):
            problems.append(f"loads a resource that is not inlined: {name[:120]}")
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
