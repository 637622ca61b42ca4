"""Command input the user controls: a closed stdin is a usage error, never an internal one."""

from __future__ import annotations

import json
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


def test_analyze_reads_a_pipe_given_by_path(tmp_path):
    """``analyze <(kubectl logs pod)`` and a named FIFO are the log, read as stdin is (the funnel refuses a
    file that is not regular: on a host it could block); they said no-log."""
    log = Path(__file__).resolve().parent.parent / "fleetdiag" / "data" / "demo" / "dp_rank.log"
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
        "FLEETDIAG_RUNTIME_DIR": str(tmp_path),
    }
    docs = []
    for target in ("subst", "fifo"):
        if target == "subst":
            cmd = ["bash", "-c", 'exec "$0" -c "from fleetdiag.cli import run; run()" analyze --json <(cat "$1")']
        else:
            cmd = [
                "bash",
                "-c",
                'cat "$1" > "$2" & exec "$0" -c "from fleetdiag.cli import run; run()" analyze --json "$2"',
            ]
        proc = subprocess.run(
            [*cmd, sys.executable, str(log), str(fifo)], capture_output=True, text=True, timeout=60, env=env
        )
        assert proc.returncode == 1, (target, proc.stdout, proc.stderr)
        docs.append(json.loads(proc.stdout))
    for doc in docs:
        assert doc["verdict"] == "failed" and "DP adjusted local rank 3" in doc["decisive"]["line"], doc
