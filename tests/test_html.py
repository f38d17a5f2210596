"""`--html`: pages rendered by a real browser (Debian's headless chromium) and the screenshot
checked: not blank, the invariant ID in the DOM and its red banner in the pixels."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from pcpcheck.api import check
from pcpcheck.faces.cli import main
from pcpcheck.render.html import BANNER, write_html
from pcpcheck_spec.names import REPLICA, SHARD, SHARDED

ZOO = Path(__file__).parent / "zoo"
WIDTH, HEIGHT = 1200, 900


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing under CI: .ci/run installs Debian's chromium")
        pytest.skip("chromium is not installed (apt-get install chromium); CI installs it")
    return found


def _browse(page: Path, tmp_path: Path, *mode: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
         f"--window-size={WIDTH},{HEIGHT}", *mode, page.as_uri()],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB bytes) of an 8-bit RGB or RGBA PNG, without Pillow."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, idat, header = 8, b"", None
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        chunk = data[position + 8:position + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        position += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    channels = 4 if colour == 6 else 3
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up = previous[x]
            corner = previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 255
            elif kind == 2:
                line[x] = (line[x] + up) & 255
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 255
            elif kind == 4:
                guess = left + up - corner
                pa, pb, pc = abs(guess - left), abs(guess - up), abs(guess - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        previous = line
        rgb = bytes(line) if channels == 3 else bytes(b for i, b in enumerate(line) if i % 4 != 3)
        rows.append(rgb)
    return width, height, rows


@pytest.fixture(scope="module")
def pages(tmp_path_factory, threads_backend) -> Path:
    result = check(ZOO / "bug04_truncated_slots.py", regimes=(SHARDED,), max_examples=150,
                   runner=threads_backend)
    assert [c.invariant for c in result.counterexamples] == [REPLICA]
    directory = tmp_path_factory.mktemp("html")
    write_html(str(directory), result)
    return directory


def test_counterexample_page_renders_with_its_invariant_visible(pages, tmp_path):
    page = next(pages.glob("counterexample-1-*.html"))
    text = page.read_text()
    assert not re.search(r"(src|href)=\"?(https?:)?//|@import|<script|<link", text), \
        "the page must be self-contained"
    dom = _browse(page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    banner = re.search(r'<div class="banner" id="invariant">([A-Z_]+)', dom.stdout)
    assert banner and banner.group(1) == REPLICA
    assert "expected, not written" in dom.stdout and "rank 1 cache" in dom.stdout

    shot = _browse(page, tmp_path, f"--screenshot={tmp_path / 'page.png'}")
    assert shot.returncode == 0, shot.stderr[-2000:]
    width, height, rows = decode_png((tmp_path / "page.png").read_bytes())
    assert (width, height) == (WIDTH, HEIGHT)
    pixels = [row[i:i + 3] for row in rows[::4] for i in range(0, len(row), 12)]
    levels = [sum(p) / 3 for p in pixels]
    mean = sum(levels) / len(levels)
    assert sum((v - mean) ** 2 for v in levels) / len(levels) > 100, "a blank page"
    red = bytes(int(BANNER[i:i + 2], 16) for i in (1, 3, 5))
    top = [row[i:i + 3] for row in rows[:120] for i in range(0, len(row), 3)]
    assert sum(p == red for p in top) > 0.4 * len(top), "the invariant's banner is not drawn"


def test_index_links_every_counterexample_page(pages):
    index = (pages / "index.html").read_text()
    links = re.findall(r'href="([^#"][^"]*)"', index)  # "#note-1": a footnote of the table
    assert links == [p.name for p in sorted(pages.glob("counterexample-*.html"))]
    assert f">{REPLICA}</a>" in index


def test_html_dir_that_cannot_be_made_is_refused_before_the_run(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = main(["check", str(ZOO / "correct.py"), "--html", str(blocker / "pages")])
    assert code == 2
    assert "--html" in capsys.readouterr().err


def test_html_given_a_page_name_writes_that_page_with_the_others_beside_it(
        tmp_path, pcpcheck_check, capsys):
    """`--html out.html` is the index page (never a directory of that name); its pages sit in
    its folder, named after it, and the links resolve. A name without .html stays a directory."""
    index = tmp_path / "out.html"
    assert pcpcheck_check([ZOO / "bug04_truncated_slots.py", "--regime", SHARDED,
                           "--max-examples", "150", "--html", index]) == 1
    assert index.is_file()
    assert f"--html: wrote 2 page(s), start at {index}" in capsys.readouterr().out
    links = re.findall(r'href="([^#"][^"]*)"', index.read_text())
    assert links == ["out-counterexample-1-REPLICA-sharded.html"] and (tmp_path / links[0]).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [links[0], "out.html"]
    # a page name whose folder is missing is refused before the run, as --json's is
    assert main(["check", str(ZOO / "correct.py"), "--html", str(tmp_path / "no" / "x.html")]) == 2
    assert "--html" in capsys.readouterr().err and not (tmp_path / "no").exists()


def test_index_marks_a_fail_cell_so_it_draws_the_eye(pages):
    """A FAIL cell is bold on the banner's red, an n/a grey with a link to its reason, an ok cell
    plain; each keeps the terminal's text."""
    index = (pages / "index.html").read_text()
    assert re.search(rf'<tr><th>{REPLICA}</th><td class="fail"[^>]*>\d+/\d+ FAIL</td></tr>', index)
    assert re.search(rf'<tr><th>{SHARD}</th><td class="na">n/a <a href="#note-1">\[1\]</a></td>',
                     index)
    assert re.search(r"<tr><th>RETURNS</th><td>\d+ ok</td></tr>", index)
    fail, na = (re.search(rf"table\.verdict td\.{name}\b[^{{]*\{{([^}}]*)\}}", index).group(1)
                for name in ("fail", "na"))
    assert f"background: {BANNER}" in fail and "font-weight: bold" in fail
    assert "color: #999" in na


def test_index_shows_coverage_with_its_zeros(pages):
    """What the regime's cases exercised, 0 where none did: sharded never interleaves."""
    index = (pages / "index.html").read_text()
    assert "<h2>Coverage (cases)</h2>" in index
    assert "<tr><th>interleave 2</th><td>0</td></tr>" in index
    assert re.search(r"<tr><th>branch B</th><td>[1-9]\d*</td></tr>", index)
