"""The one report writer: every block kind in Markdown and HTML, the number formats, and the
figure saver's byte-identical, metadata-free PNGs (all by hand)."""

from __future__ import annotations

import pytest

from es_llm.report import (Bullets, Figure, Heading, Paragraph, Table, bracket, count,
                           difference, fixed, in_points, interval, number, pct, pyplot,
                           save_figure, share, signed, signed_points, to_html, to_markdown,
                           write_report)


@pytest.mark.parametrize("block, markdown, html", [
    (Heading(2, "pass@k & more"), "## pass@k & more\n", "<h2>pass@k &amp; more</h2>"),
    (Paragraph("**es** ahead <by> 3"), "**es** ahead <by> 3\n",
     "<p><b>es</b> ahead &lt;by&gt; 3</p>"),
    (Table(["a", "b"], [["x|y", "**1**"]]),
     "| a | b |\n|---|---|\n| x\\|y | **1** |\n",
     "<table><thead><tr><th>a</th><th>b</th></tr></thead>"
     "<tbody><tr><td>x|y</td><td><b>1</b></td></tr></tbody></table>"),
    (Table(["m", "n"], [["x", "2"]], align="lr"),
     "| m | n |\n|---|---:|\n| x | 2 |\n",
     '<table><thead><tr><th>m</th><th style="text-align:right">n</th></tr></thead>'
     '<tbody><tr><td>x</td><td style="text-align:right">2</td></tr></tbody></table>'),
    (Figure("passk.png", "pass@k <bands>"),
     "![pass@k <bands>](figures/passk.png)\n\n*pass@k <bands>*\n",
     '<figure><img src="figures/passk.png" alt="pass@k &lt;bands&gt;">'
     "<figcaption>pass@k &lt;bands&gt;</figcaption></figure>"),
    (Bullets(["one", "**two**"]), "- one\n- **two**\n",
     "<ul><li>one</li><li><b>two</b></li></ul>"),
    (Bullets([]), "", ""),
])
def test_every_block_kind_in_markdown_and_html(block, markdown, html):
    assert to_markdown([block]) == markdown
    assert html in to_html([block])


def test_a_page_is_titled_by_its_first_level_one_heading(tmp_path):
    blocks = [Heading(2, "not this"), Heading(1, "Run <1>"), Paragraph("text")]
    page = to_html(blocks)
    assert page.startswith("<!DOCTYPE html>") and "<title>Run &lt;1&gt;</title>" in page
    text = write_report(tmp_path, blocks)
    assert text == "## not this\n\n# Run <1>\n\ntext\n"
    assert (tmp_path / "report.md").read_text() == text
    assert (tmp_path / "report.html").read_text() == page


def test_number_formats_by_hand():
    assert (pct(0.1234), pct(None), pct(1.0)) == ("12.3%", "-", "100.0%")
    assert (in_points(0.1234), signed_points(0.012), signed_points(-0.0049)) == (
        "12.3", "+1.2 pts", "-0.5 pts")
    assert (number(0.12345), number(1234.5), number(None), number(2.0, 2)) == (
        "0.123", "1.23e+03", "-", "2.00")
    assert (fixed(0.12345, 2), signed(0.012, 1, 100), signed(-0.5, 3)) == (
        "0.12", "+1.2", "-0.500")
    assert (count(3.0), count(2.5), count(None)) == ("3", "2.5", "-")
    assert (share(3, 12), share(0, 0)) == ("3 (25.0%)", "-")
    assert interval(0.5, [0.3, 0.7], pct) == "50.0% [30.0%, 70.0%]"
    assert interval(0.5, None, pct) == interval(0.5, [None, None], pct) == "50.0%"
    assert interval(None, [0.1, 0.2], pct) == "-"
    assert bracket([-0.01, 0.02], lambda x: signed(x, 1, 100)) == "[-1.0, +2.0]"
    assert bracket(None, pct) == "-"
    # The sign on the difference only; the bounds as they are.
    assert difference(0.05, [-0.01, 0.1], in_points) == "+5.0 [-1.0, 10.0]"
    assert difference(-0.05, [-0.1, 0.01], in_points) == "-5.0 [-10.0, 1.0]"


def test_the_same_figure_saves_to_the_same_bytes_without_metadata(tmp_path):
    def draw(path):
        fig, ax = pyplot().subplots(figsize=(3, 2))
        ax.plot([0, 1, 2], [1, 0, 2], label="a line")
        ax.legend()
        return save_figure(fig, path)

    assert draw(tmp_path / "a" / "one.png") == "one.png"
    draw(tmp_path / "two.png")
    png = (tmp_path / "a" / "one.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert png == (tmp_path / "two.png").read_bytes()
    # No text chunk at all: matplotlib's version would otherwise be written as "Software".
    assert b"tEXt" not in png and b"matplotlib" not in png
