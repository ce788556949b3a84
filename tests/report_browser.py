"""Open a run's report.html in headless Chromium (Selenium + chromedriver) and read what a
reader sees: the rendered text, where the summary sits, the ledger cells, every image.

Chromium and chromedriver come from Debian (``apt-get install chromium chromium-driver``; the
Makefile's setup and ``.ci/run`` install them). A missing browser is a test failure that names
that command, never a skip.
"""

from __future__ import annotations

import base64
import re
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


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = browser_paths()
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for f in FLAGS:
        opts.add_argument(f)
    opts.add_argument(f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}")
    return webdriver.Chrome(service=Service(driver), options=opts)


def render(report: Path, screenshot: Path) -> dict:
    """Render ``report`` at :data:`VIEWPORT`, save a screenshot of the first screen, return the
    probe (see :data:`PROBE`)."""
    browser = _browser()
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


# --- print ----------------------------------------------------------------------------------
A4_MM = (210.0, 297.0)
PX_PER_MM = 96 / 25.4  # CSS pixels: Chromium lays a printed page out at 96 px per inch

# what overflows the page's content box once the page is laid out as printed (print media, the
# viewport as wide as the content box): every table's right edge and its container's, the cells
# whose content is wider than they are, the page's own scroll width, and each ledger row's height
# (a row taller than a page is split, whatever the CSS asks)
PRINT_PROBE = """
const q = (s) => Array.from(document.querySelectorAll(s));
const name = (e) => (e.closest('[id]') || {}).id || e.className || e.tagName;
return {
  content_width: document.documentElement.clientWidth,
  scroll_width: document.documentElement.scrollWidth,
  print_media: window.matchMedia('print').matches,
  tables: q('table').map(t => ({where: name(t), cls: t.className,
      right: t.getBoundingClientRect().right, width: t.getBoundingClientRect().width,
      box_right: t.parentElement.getBoundingClientRect().right})),
  overflowing_cells: q('table td, table th').filter(c => c.scrollWidth > c.clientWidth + 1)
      .map(c => name(c) + ': ' + c.innerText.slice(0, 60)),
  ledger_rows: q('table.ledger > tbody > tr').map(tr => ({id: tr.id,
      height: tr.getBoundingClientRect().height,
      lead: tr.querySelector('.lead') ? tr.querySelector('.lead').innerText : ''})),
};
"""


def pdf_pages(pdf: bytes) -> int:
    """Number of pages of a PDF that Chromium wrote (its page objects are not compressed)."""
    return len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", pdf))


def print_a4(report: Path, pdf: Path, margin_mm: float) -> dict:
    """Print ``report`` to ``pdf`` as Chromium's print-to-PDF does (A4, the page's own
    ``@page`` size and ``margin_mm`` margins), then lay it out again with print media emulated
    at the content box's width and return :data:`PRINT_PROBE`'s answer, plus ``pages`` and
    ``page_height`` (the content box's height, CSS px)."""
    w_mm, h_mm = A4_MM
    inch = margin_mm / 25.4
    browser = _browser()
    try:
        browser.set_page_load_timeout(120)
        browser.get(report.resolve().as_uri())
        browser.execute_script("return document.fonts.ready")
        out = browser.execute_cdp_cmd("Page.printToPDF", {
            "paperWidth": w_mm / 25.4, "paperHeight": h_mm / 25.4, "marginTop": inch,
            "marginBottom": inch, "marginLeft": inch, "marginRight": inch,
            "preferCSSPageSize": True, "printBackground": True})
        data = base64.b64decode(out["data"])
        pdf.write_bytes(data)
        width = round((w_mm - 2 * margin_mm) * PX_PER_MM)
        height = round((h_mm - 2 * margin_mm) * PX_PER_MM)
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": "print"})
        browser.execute_cdp_cmd("Emulation.setScrollbarsHidden", {"hidden": True})  # paper has none
        browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        seen = browser.execute_script(PRINT_PROBE)
        return {**seen, "pages": pdf_pages(data), "page_height": height}
    finally:
        browser.quit()
