"""Open a run's report.html in headless Chromium (Selenium + chromedriver) and read what a
reader sees: the rendered text, where the summary sits, the ledger cells, every image.

Chromium and chromedriver come from Debian (``apt-get install chromium chromium-driver``; the
Makefile's setup and ``.ci/run`` install them). A missing browser is a test failure that names
that command, never a skip.
"""

from __future__ import annotations

import shutil
from pathlib import Path

INSTALL = "apt-get install -y chromium chromium-driver"
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]
VIEWPORT = (1366, 768)  # a common laptop screen

# one JS call returns everything the checks need (innerText is the rendered text: a closed
# <details> element's content is not part of it)
PROBE = """
const q = (s) => Array.from(document.querySelectorAll(s));
const summary = document.querySelector('#summary');
const r = summary ? summary.getBoundingClientRect() : null;
return {
  text: document.body.innerText,
  summary_top: r ? r.top + window.scrollY : null,
  summary_text: summary ? summary.innerText : '',
  fold_text: q('#summary .facts, #summary p.counts, #summary ul.headlines > li')
      .filter(e => e.getBoundingClientRect().top + window.scrollY < window.innerHeight)
      .map(e => e.innerText).join('\\n'),
  value_cells: q('table.ledger > tbody > tr').map(tr => ({
      id: tr.id, cells: Array.from(tr.children).map(td => td.innerText)})),
  images: q('img').map(i => ({complete: i.complete, width: i.naturalWidth, alt: i.alt,
      caption: (i.closest('figure') && i.closest('figure').querySelector('figcaption'))
               ? i.closest('figure').querySelector('figcaption').innerText : ''})),
  index_headers: q('table th.blank, table th.row_heading, table th.index_name').length,
  viewport: [window.innerWidth, window.innerHeight],
};
"""


def browser_paths() -> tuple[str, str]:
    """``(chromium, chromedriver)`` paths.

    Raises:
        AssertionError: either is missing (with the install command).
    """
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    assert chromium and driver, f"headless Chromium is needed for the report test: {INSTALL}"
    return chromium, driver


def render(report: Path, screenshot: Path) -> dict:
    """Render ``report`` at :data:`VIEWPORT`, save a screenshot of the first screen, return the
    probe (see :data:`PROBE`)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = browser_paths()
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for f in FLAGS:
        opts.add_argument(f)
    opts.add_argument(f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}")
    browser = webdriver.Chrome(service=Service(driver), options=opts)
    try:
        browser.set_page_load_timeout(120)
        # the viewport itself (a window size would include the browser's own bars)
        browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1, "mobile": False})
        browser.get(report.resolve().as_uri())
        browser.execute_script("return document.fonts.ready")
        browser.save_screenshot(str(screenshot))
        return browser.execute_script(PROBE)
    finally:
        browser.quit()
