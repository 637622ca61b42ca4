"""The tests see only what they made (#24 item 7): discovery on the tests' sshd (this machine) finds only
the processes this test session started, and the CLI reads no user's own ~/.config.

Through ``fleetdiag probe --json`` over a real sshd; the stray job is a stand-in ``vllm`` orphaned to init,
as another user's job on a shared machine is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from fleetdiag.cli import main

FAILURE = "AssertionError: DP adjusted local rank 3 is out of bounds"


def _stray_job(work: Path) -> int:
    """A ``vllm serve`` writing a failure to its stdout file, not a descendant of this session."""
    exe = work / "vllm"
    exe.write_text(f"#!{sys.executable}\nimport sys, time\nprint({FAILURE!r}, flush=True)\ntime.sleep(120)\n")
    exe.chmod(0o755)
    pidfile = work / "pid"
    subprocess.run(  # the subshell's parent exits at once: the job is adopted by init
        ["sh", "-c", f"cd '{work}' && (./vllm serve x > stray.log 2>&1 & echo $! > '{pidfile}')"], check=True
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (work / "stray.log").read_text():
        time.sleep(0.05)
    return int(pidfile.read_text())


def _probe(inv: Path, sshd) -> dict:
    r = CliRunner().invoke(main, ["-i", str(inv), "probe", "all", "--json", *sshd.cli_args()])
    (host,) = json.loads(r.output)["hosts"]
    return host


def test_a_missing_log_does_not_read_a_stray_job_of_this_machine(sshd, tmp_path, write_inventory, monkeypatch):
    pid = _stray_job(tmp_path)
    try:
        inv = write_inventory({"gpu01": str(tmp_path / "gone.log")})
        host = _probe(inv, sshd)
        assert host["verdict"] == "no-log" and "log not found" in host["error"], host  # not the stray's log
        monkeypatch.setenv("FLEETDIAG_DISCOVER_UNDER", str(pid))  # the root that holds it: found
        host = _probe(inv, sshd)
        assert host["verdict"] == "failed" and FAILURE in host["decisive"]["line"], host
        assert f"pid {pid}" in host["log_source"]["found_by"]
    finally:
        os.kill(pid, 9)


def test_the_cli_reads_no_users_own_rules(tmp_path, write_inventory):
    """The session's config home is empty: a user's ~/.config/fleetdiag/rules.yaml is never loaded."""
    from fleetdiag.analysis import load_rules
    from fleetdiag.analysis.rules import user_rules_path

    path = Path(user_rules_path())
    assert str(path).startswith(os.environ["XDG_CONFIG_HOME"]) and not path.exists()
    assert load_rules().run_start == load_rules(user_default=False).run_start


def test_the_session_has_its_own_home_and_no_agent(sshd, tmp_path, write_inventory):
    """~/.ssh (config, known_hosts, default keys) is the session's empty one and no agent is offered: a
    probe that names none of them cannot log in, whatever this user's own ~/.ssh and agent would allow."""
    home = Path.home()
    assert str(home).startswith(os.environ["XDG_CONFIG_HOME"].rsplit("/", 1)[0]) and not any((home / ".ssh").iterdir())
    assert "SSH_AUTH_SOCK" not in os.environ
    inv = write_inventory({"gpu01": str(tmp_path / "train.log")})
    r = CliRunner().invoke(main, ["-i", str(inv), "probe", "all", "--json"])
    (host,) = json.loads(r.output)["hosts"]
    assert host["verdict"] == "unreachable" and host["facts"]["error_kind"] == "hostkey-unknown", host
