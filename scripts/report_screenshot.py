"""Regenerate docs/report.png: `workbench report` of the committed artifacts (raw/, ncu/),
rendered by headless Chromium (the browser tests' helper: no console error, no request leaving
the file, every figure drawn), the top of the page kept and quantised to a palette.

    ./dev python scripts/report_screenshot.py [HEIGHT]
"""

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers import open_in_chromium  # noqa: E402
from PIL import Image  # noqa: E402

from workbench.report.seed_report import write_report  # noqa: E402


def main(height: int = 1750) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        page = write_report([ROOT / "raw", ROOT / "ncu"], Path(tmp) / "report.html")
        seen = open_in_chromium(page, Path(tmp) / "report.png")
        if seen["errors"] or seen["remote"] or seen["figures"] != seen["drawn"]:
            raise SystemExit(f"the page did not render cleanly: {seen['errors'] or seen['remote']}")
        shot = Image.open(Path(tmp) / "report.png").convert("RGB")
        top = shot.crop((0, 0, shot.width, min(height, shot.height)))
        # Octree keeps the small category swatches (median cut folds orange into red).
        top.quantize(256, method=Image.Quantize.FASTOCTREE).save(ROOT / "docs/report.png")
    print(f"docs/report.png from {page.name}: {seen['figures']} figures, {shot.size}")


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
