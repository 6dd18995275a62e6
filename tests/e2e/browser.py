"""Open a page in headless Chromium and look at what it drew: the test a person would do.

Chromium comes from Debian (`apt-get install chromium-headless-shell`, done by .ci/run). Without
it the browser tests skip, unless QM_REQUIRE_BROWSER=1 (as in CI) makes that a failure."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

BROWSERS = ("chromium-headless-shell", "chromium", "google-chrome")


def browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    message = "no headless Chromium: apt-get install chromium-headless-shell"
    if os.environ.get("QM_REQUIRE_BROWSER"):
        pytest.fail(message)
    pytest.skip(message)


def screenshot(page: Path, png: Path, width: int = 1100, height: int = 2400) -> Path:
    """Render a local page the way a person's browser would and save what it drew."""
    result = subprocess.run(
        [browser(), "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={width},{height}",
         f"--screenshot={png}", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0 and png.exists(), result.stderr[-2000:]
    return png


def pixels_near(png: Path, rgb: tuple[int, int, int], tolerance: int = 40) -> int:
    """How many pixels of the screenshot are close to a colour (anti-aliasing blurs edges)."""
    from PIL import Image

    with Image.open(png) as image:
        raw = image.convert("RGB").tobytes()
    red, green, blue = raw[0::3], raw[1::3], raw[2::3]
    return sum(1 for r, g, b in zip(red, green, blue, strict=True)
               if abs(r - rgb[0]) <= tolerance and abs(g - rgb[1]) <= tolerance and abs(b - rgb[2]) <= tolerance)
