"""Headless Chromium for the tests of the pages the planner writes: what the browser laid out
(read back by a probe script) and what it painted (a screenshot).

The browser is Debian's ``chromium`` (``apt-get install -y chromium``; CI installs it). Without
it the tests that need it skip, saying so.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.image import imread

CHROMIUM = shutil.which("chromium")
WINDOW = (1000, 1400)
"""The window's width and height in CSS pixels, one screen pixel each: a page of a chart and
a small table fits whole, so that every element can be hit and photographed."""

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (apt-get install -y chromium): the page is not rendered",
)


def _chromium(profile: Path, *args: str) -> str:
    """Chromium's stdout for ``args``, in a window of :data:`WINDOW`."""
    assert CHROMIUM is not None
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        # A profile of its own: a browser started on the default profile hands its page to
        # one already running there (another test, another worker) and prints nothing.
        f"--user-data-dir={profile}", "--no-first-run",
        f"--window-size={WINDOW[0]},{WINDOW[1]}", "--force-device-scale-factor=1", *args,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def laid_out(page: Path, probe: str) -> Any:
    """What the JavaScript expression ``probe`` evaluates to (JSON) once Chromium has parsed
    and laid out ``page``: a copy of the page with a script appended is opened, the script
    writes its result on ``<body>``, and the DOM Chromium dumps carries it back."""
    script = ("<script>try{document.body.setAttribute('data-probe',JSON.stringify("
              f"{probe}))}}catch(e){{document.body.setAttribute('data-probe-error',String(e))}}"
              "</script>")  # fmt: skip
    text = page.read_text()
    assert text.count("</body>") == 1, f"{page} has no single </body>"
    with tempfile.TemporaryDirectory() as scratch:
        probed = Path(scratch) / page.name
        probed.write_text(text.replace("</body>", f"{script}</body>"))
        dom = _chromium(Path(scratch) / "profile", "--dump-dom", probed.as_uri())
    failed = re.search(r'data-probe-error="([^"]*)"', dom)
    assert failed is None, f"the probe failed: {html.unescape(failed.group(1))}"
    found = re.search(r'data-probe="([^"]*)"', dom)
    assert found is not None, f"the probe did not run; Chromium dumped:\n{dom[:2000]}"
    return json.loads(html.unescape(found.group(1)))


def screenshot(page: Path) -> np.ndarray:
    """``page`` as Chromium paints it: (height, width, 3) colours 0-255, one pixel per CSS
    pixel, the same layout as :func:`laid_out` reads."""
    with tempfile.TemporaryDirectory() as scratch:
        shot = Path(scratch) / "page.png"
        _chromium(Path(scratch) / "profile", f"--screenshot={shot}", page.as_uri())
        pixels = imread(shot)
    return np.rint(pixels[..., :3] * 255).astype(int)


def css_colour(text: str) -> tuple[int, int, int]:
    """``rgb(196, 78, 82)``, as computed styles give a colour, as a tuple.

    >>> css_colour("rgb(196, 78, 82)")
    (196, 78, 82)
    """
    found = re.fullmatch(r"rgb\((\d+), (\d+), (\d+)\)", text)
    assert found is not None, text
    r, g, b = (int(v) for v in found.groups())
    return r, g, b
