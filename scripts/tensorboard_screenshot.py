"""Screenshot TensorBoard's Custom Scalars tab for a log folder, in a headless Chromium (docs/img/tensorboard_demo.png).

    torchssvm demo --logdir /tmp/tb-demo
    python3 scripts/tensorboard_screenshot.py --logdir /tmp/tb-demo --out docs/img/tensorboard_demo.png

Starts ``tensorboard --logdir LOGDIR`` on a free local port, opens the Custom Scalars tab (the layout written by
`torchssvm.logging.add_certificate_layout`: primal, dual and gap, exact and estimated, on one chart) with the
Playwright driver in the given Chromium (``pip install playwright``; no browser download: the system's Chromium
is used), waits until the charts have drawn their curves, and writes a PNG. Not run by the tests.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, seconds: float) -> None:
    """Poll ``url`` until it answers (TensorBoard takes a few seconds to load the event files)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"TensorBoard did not answer at {url} within {seconds:.0f} s")
        time.sleep(0.5)


def screenshot(url: str, out: str, chromium: str, width: int, height: int, settle: float,
               expand: bool = True) -> None:
    """Open ``url`` in ``chromium`` (headless, a new empty profile) and save a PNG of the page once the custom
    scalar charts show lines."""
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="tb-chromium-")
    try:
        with sync_playwright() as p:
            # a persistent context is how Playwright takes --user-data-dir (a new, empty profile)
            browser = p.chromium.launch_persistent_context(profile, executable_path=chromium, headless=True,
                                                           args=CHROMIUM_ARGS,
                                                           viewport={"width": width, "height": height})
            page = browser.new_page()
            page.goto(url, wait_until="networkidle")
            # the charts are inside shadow roots, which Playwright's CSS selectors pierce: wait for drawn lines
            page.wait_for_selector("tf-custom-scalar-dashboard", timeout=30_000)
            page.wait_for_selector("tf-custom-scalar-multi-line-chart-card", timeout=30_000)
            page.wait_for_function(
                """() => {
                    const found = [];
                    const walk = (root) => {
                        for (const el of root.querySelectorAll('*')) {
                            if (el.tagName === 'path' && el.classList.contains('line')
                                && (el.getAttribute('d') || '').length > 20) found.push(el);
                            if (el.shadowRoot) walk(el.shadowRoot);
                        }
                    };
                    walk(document);
                    return found.length >= 3;
                }""", timeout=60_000)
            # the y-axis over all the points (the first pass's primal is far above the rest; TensorBoard's default
            # clips such outliers, and its URL setting for it is not read by this tab)
            outliers = page.get_by_role("checkbox", name=re.compile("Ignore outliers"))
            if outliers.count() and outliers.first.is_checked():
                outliers.first.click()
            if expand:  # the legends: which tag each line is
                for card in page.locator("tf-custom-scalar-multi-line-chart-card").all():
                    toggle = card.locator("#matches-list-title paper-icon-button, #matches-list-title iron-icon")
                    (toggle if toggle.count() else card.locator("#matches-list-title")).first.click()
            time.sleep(settle)  # the charts' transitions
            page.screenshot(path=out, full_page=False)
            browser.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logdir", required=True, help="the TensorBoard log folder (e.g. of `torchssvm demo`)")
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--chromium", default="/usr/bin/chromium", help="the Chromium executable")
    ap.add_argument("--tab", default="custom_scalars", help="TensorBoard tab (custom_scalars, scalars, hparams)")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=1000)
    ap.add_argument("--settle", type=float, default=2.0, help="seconds to wait after the curves appear")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.logdir):
        ap.error(f"--logdir {args.logdir!r} is not a folder")
    if not os.access(args.chromium, os.X_OK):
        ap.error(f"--chromium {args.chromium!r} is not an executable")
    port = free_port()
    tb = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", args.logdir, "--port", str(port),
                           "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(f"{base}/data/plugins_listing", 60)
        # no smoothing and no outlier clipping: the curves as logged (TensorBoard's dashboard settings in the URL)
        url = f"{base}/#{args.tab}&_smoothingWeight=0"
        screenshot(url, args.out, args.chromium, args.width, args.height, args.settle)
    finally:
        tb.terminate()
        tb.wait(timeout=10)
    print(f"wrote {args.out} ({os.path.getsize(args.out) / 1024:.0f} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
