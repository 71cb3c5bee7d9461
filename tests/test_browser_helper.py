"""The headless-browser helper tells a loaded image from a missing one, and takes screenshots;
report tests rely on both, so it must not pass a broken image as loaded (or the reverse)."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from browser import find_chromium, image_report, screenshot


@pytest.fixture(autouse=True)
def _browser():
    # Fail rather than skip: scripts/run_tests.sh installs chromium for exactly these tests.
    assert find_chromium(), "chromium not found; scripts/run_tests.sh installs it"

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def page(tmp_path):
    fig, ax = plt.subplots(figsize=(3, 2), dpi=100)
    ax.plot([0, 1, 2], [1, 0, 2])
    (tmp_path / "figs").mkdir()
    fig.savefig(tmp_path / "figs" / "curve.png")
    plt.close(fig)
    path = tmp_path / "report.html"
    path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>Run report &amp; ü</title>"
        "</head><body><h1>Report</h1>"
        "<img src='figs/curve.png' alt='curve'>"
        "<img src='figs/missing.png' alt='missing'>"
        "</body></html>", encoding="utf-8")
    return path


def test_image_report_tells_loaded_from_missing(page):
    report = image_report(page)
    assert report["title"] == "Run report & ü"
    sizes = {im["src"]: (im["width"], im["height"]) for im in report["images"]}
    assert sizes == {"figs/curve.png": (300, 200), "figs/missing.png": (0, 0)}
    # The probe copy beside the page is cleaned up.
    assert sorted(p.name for p in page.parent.iterdir()) == ["figs", "report.html"]


def test_image_report_without_body_tag(tmp_path):
    path = tmp_path / "bare.html"
    path.write_text("<img src='nothing-here.png'>")
    assert image_report(path) == {"title": "", "images": [{"src": "nothing-here.png",
                                                            "width": 0, "height": 0}]}


def test_screenshot_writes_a_png(page, tmp_path):
    png = tmp_path / "shot.png"
    screenshot(page, png, width=800, height=600)
    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 2000
    assert plt.imread(png).shape[:2] == (600, 800)
