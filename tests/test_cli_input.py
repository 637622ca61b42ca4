"""Command input the user controls: a closed stdin is a usage error, never an internal one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_analyze_stdin_closed_is_a_usage_error():
    proc = subprocess.run(
        ["sh", "-c", 'exec "$0" -c "from fleetdiag.cli import main; main()" analyze - <&-', sys.executable],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    assert proc.returncode == 2, proc.stderr
    assert "stdin is closed" in proc.stderr and "internal error" not in proc.stderr
