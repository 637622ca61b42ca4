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
