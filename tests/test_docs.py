"""The README's program output is the program's: regenerate with `cog -r README.md` when this fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_output_is_what_the_program_prints() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "cogapp", "--check", "README.md"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, (
        f"README.md drifted from the program's output; run `cog -r README.md`:\n{res.stdout}{res.stderr}"
    )


def test_a_drifted_example_is_caught(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text("utf-8").replace("│ cause    AssertionError", "│ cause    KeyError", 1)
    (tmp_path / "README.md").write_text(text, "utf-8")
    (tmp_path / "docs").symlink_to(ROOT / "docs")
    res = subprocess.run(
        [sys.executable, "-m", "cogapp", "--check", "README.md"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode != 0


def test_the_readme_screenshot_is_of_the_page_fleetdiag_writes_now() -> None:
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import examples
    finally:
        sys.path.remove(str(ROOT / "docs"))
    png = examples.SCREENSHOT.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and 20_000 < len(png) < 200_000
    assert examples.png_source(png) == examples.page_digest(), (
        "the HTML report changed: redraw the README's picture with `python docs/examples.py --screenshot`"
    )
    assert "docs/img/incident-report.png" in (ROOT / "README.md").read_text("utf-8")
