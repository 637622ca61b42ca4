"""docs/systemd: the service + timer pair for ``fleetdiag sweep`` is valid for systemd and runs a
command line fleetdiag accepts."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetdiag.cli import main

UNITS = Path(__file__).resolve().parent.parent / "docs" / "systemd"
SERVICE, TIMER = UNITS / "fleetdiag-sweep.service", UNITS / "fleetdiag-sweep.timer"
INSTALLED = "/opt/fleetdiag/bin/fleetdiag"  # where the unit expects the venv; the installer's one path to edit


def exec_start(text: str) -> list[str]:
    """The ExecStart command line, continuation lines joined, as systemd splits it."""
    joined = text.replace("\\\n", " ")
    line = next(ln for ln in joined.splitlines() if ln.startswith("ExecStart="))
    return shlex.split(line.partition("=")[2])


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed (scripts/test installs the systemd package)",
)
def test_service_and_timer_pass_systemd_analyze_verify(tmp_path):
    # verify checks that ExecStart's program exists: point it at this checkout's fleetdiag, as an install would
    fleetdiag = Path(sys.executable).parent / "fleetdiag"
    assert fleetdiag.exists()
    (tmp_path / SERVICE.name).write_text(SERVICE.read_text().replace(INSTALLED, str(fleetdiag)))
    shutil.copy(TIMER, tmp_path / TIMER.name)
    out = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / SERVICE.name), str(tmp_path / TIMER.name)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # an unknown or misspelt key is only a warning (exit 0): no output at all is the pass
    assert out.returncode == 0 and out.stderr.strip() == "" and out.stdout.strip() == "", (out.stdout, out.stderr)


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed (scripts/test installs the systemd package)",
)
def test_verify_catches_a_broken_unit(tmp_path):
    """The check above can fail: a misspelt key and a missing program are both reported."""
    bad = tmp_path / "fleetdiag-sweep.service"
    bad.write_text(SERVICE.read_text().replace("ExecStart=", "ExecStrat=", 1) + "ExecStart=/nonexistent/fleetdiag\n")
    out = subprocess.run(
        ["systemd-analyze", "verify", str(bad)], capture_output=True, text=True, timeout=60, check=False
    )
    assert "ExecStrat" in out.stderr and "/nonexistent/fleetdiag" in out.stderr


def test_the_units_command_line_is_one_fleetdiag_accepts():
    argv = exec_start(SERVICE.read_text())
    assert argv[0] == INSTALLED and "sweep" in argv and "--prometheus" in argv
    # every option parsed for real (an unknown one is exit 2 before --help is honoured)
    res = CliRunner().invoke(main, [*argv[1:], "--help"])
    assert res.exit_code == 0, res.output
    assert "--prometheus" in res.output
    bad = CliRunner().invoke(main, [*argv[1:], "--no-such-option", "--help"])
    assert bad.exit_code == 2


def test_the_timer_starts_the_service_every_15_minutes_like_the_cron_line():
    timer = TIMER.read_text()
    assert "OnCalendar=*:0/15" in timer and "WantedBy=timers.target" in timer
    readme = (UNITS.parent.parent / "README.md").read_text()
    assert "*/15 * * * *" in readme and "docs/systemd/fleetdiag-sweep.timer" in readme
