"""Open HTML pages in a real headless Chromium, for tests that must see what a reader sees:
whether every <img> on a report page actually loaded, and what the page looks like."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

_MARK = "es-llm-image-report"
# Runs after the load event (which waits for every image), so naturalWidth is final;
# a broken or missing image reports 0. The summary goes into the DOM for --dump-dom to carry.
_SCRIPT = f"""<script>(function () {{
  function report() {{
    var pre = document.createElement("pre");
    pre.id = "{_MARK}";
    pre.textContent = JSON.stringify({{title: document.title, images:
      Array.from(document.images, function (im) {{
        return {{src: im.getAttribute("src") || im.currentSrc,
                 width: im.naturalWidth, height: im.naturalHeight}}; }})}});
    document.body.appendChild(pre);
  }}
  if (document.readyState === "complete") report(); else window.addEventListener("load", report);
}})();</script>"""
_SUMMARY = re.compile(rf'<pre id="{_MARK}">(.*?)</pre>', re.DOTALL)


def find_chromium() -> str | None:
    """The first Chromium-family browser on PATH (Debian calls it `chromium`)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


def _run(args: list[str], timeout_s: float) -> str:
    """Run headless Chromium with a throwaway profile; return its stdout.

    Its own session, so a timeout kills the renderer and GPU children too, not just the
    launcher. The fresh --user-data-dir keeps parallel runs from locking one profile."""
    exe = find_chromium()
    if exe is None:
        raise RuntimeError("no chromium found on PATH")
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-dev-shm-usage", "--allow-file-access-from-files",
               f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, errors="replace", start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise RuntimeError(f"chromium timed out after {timeout_s}s:\n{err[-3000:]}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"chromium exited with {proc.returncode}:\n{err[-3000:]}")
    return out


def image_report(html_path: Path, timeout_s: float = 60) -> dict:
    """The page's title and each <img>'s src and natural size once the page has loaded.

    The page needs no script of its own: a copy with a reporting script is written beside
    it (so relative image paths resolve the same way) and removed afterwards."""
    html_path = Path(html_path).resolve()
    page = html_path.read_bytes()
    script = _SCRIPT.encode()
    cut = page.lower().rfind(b"</body>")
    page = page[:cut] + script + page[cut:] if cut >= 0 else page + script
    fd, probe = tempfile.mkstemp(prefix=".image-report-", suffix=".html", dir=html_path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(page)
        dom = _run(["--dump-dom", Path(probe).as_uri()], timeout_s)
    finally:
        os.unlink(probe)
    match = _SUMMARY.search(dom)
    if match is None:
        raise RuntimeError(f"no image summary in the page (did it load?):\n{dom[-2000:]}")
    return json.loads(html.unescape(match.group(1)))


def screenshot(html_path: Path, png_path: Path, width: int = 1200, height: int = 2400,
               timeout_s: float = 60) -> None:
    """Save a PNG of the page's first width x height pixels, as a reader's window shows it."""
    png_path = Path(png_path).resolve()
    _run([f"--screenshot={png_path}", f"--window-size={width},{height}",
          "--hide-scrollbars", Path(html_path).resolve().as_uri()], timeout_s)
    if not png_path.is_file():
        raise RuntimeError(f"chromium wrote no screenshot at {png_path}")
