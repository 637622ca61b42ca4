"""A sweep's files and signals: what a broken history, a planted symlink, a closed terminal or a
``--notify`` command can do to a sweep and to the operator. Real sweeps through a real sshd."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from fleetdiag.cli import main
from fleetdiag.records import FAILED

from .conftest import inventory_file
from .test_fleet import DP_RANK, HEALTHY_LOG, log, ssh_args


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_unusable_history_directory_keeps_the_report_and_says_so(sshd, tmp_path):
    inv = inventory_file(tmp_path / "inventory.yaml", {"gpu01": {"log": log(tmp_path, "f", DP_RANK)}}, sshd)
    not_a_dir = tmp_path / "ro"
    not_a_dir.write_text("a file where the history directory should be\n")  # fails for root too
    report = tmp_path / "report.json"
    res = CliRunner().invoke(
        main,
        [
            "-i",
            str(inv),
            "sweep",
            "gpu01",
            "--db",
            str(not_a_dir / "h.db"),
            "--report",
            str(report),
            "--json",
            *ssh_args(sshd),
        ],
    )
    assert res.exit_code == 1, res.output  # by the host's verdict, not 4
    assert "history not updated" in res.stderr and str(not_a_dir) in res.stderr
    doc = json.loads(report.read_text())
    assert doc["hosts"][0]["verdict"] == FAILED
    assert str(not_a_dir) in doc["sweep"]["history_error"]
    assert str(not_a_dir) in json.loads(res.stdout)["error"]


def test_a_symlinked_lock_file_is_never_followed(sshd, tmp_path):
    inv = inventory_file(tmp_path / "inventory.yaml", {"gpu01": {"log": log(tmp_path, "h", HEALTHY_LOG)}}, sshd)
    victim = tmp_path / "bashrc"
    victim.write_text("export PATH=/usr/bin\n")
    db, report = tmp_path / "h.db", tmp_path / "report.json"
    (tmp_path / "h.db.lock").symlink_to(victim)
    res = CliRunner().invoke(
        main, ["-i", str(inv), "sweep", "gpu01", "--db", str(db), "--report", str(report), *ssh_args(sshd)]
    )
    assert victim.read_text() == "export PATH=/usr/bin\n"
    assert res.exit_code == 0, res.output
    assert "symbolic link" in res.stderr and json.loads(report.read_text())["hosts"][0]["verdict"] == "healthy"
    assert not db.exists()  # no history written without the lock


def test_report_history_and_evidence_are_private(sshd, tmp_path):
    inv = inventory_file(tmp_path / "inventory.yaml", {"gpu01": {"log": log(tmp_path, "f", DP_RANK)}}, sshd)
    old = os.umask(0o022)
    try:
        db, report, saved = tmp_path / "state" / "h.db", tmp_path / "out" / "report.json", tmp_path / "ev" / "x"
        res = CliRunner().invoke(
            main, ["-i", str(inv), "sweep", "gpu01", "--db", str(db), "--report", str(report), *ssh_args(sshd)]
        )
        assert res.exit_code == 1, res.output
        res = CliRunner().invoke(main, ["-i", str(inv), "probe", "gpu01", "--save", str(saved), *ssh_args(sshd)])
        assert res.exit_code == 1, res.output
    finally:
        os.umask(old)
    files = [report, db, db.with_name("h.db.lock"), *saved.iterdir()]
    assert len(files) == 4 and {_mode(f) for f in files} == {0o600}, [(f, oct(_mode(f))) for f in files]
    wal = [p for p in db.parent.iterdir() if p.name.endswith(("-wal", "-shm"))]
    assert all(_mode(p) == 0o600 for p in wal)
    assert {_mode(d) for d in (db.parent, report.parent, saved, saved.parent)} == {0o700}


def test_notify_command_does_not_inherit_the_passphrase(sshd, tmp_path):
    inv = inventory_file(tmp_path / "inventory.yaml", {"gpu01": {"log": log(tmp_path, "f", DP_RANK)}}, sshd)
    seen = tmp_path / "env.txt"
    res = CliRunner().invoke(
        main,
        [
            "-i",
            str(inv),
            "sweep",
            "gpu01",
            "--db",
            str(tmp_path / "h.db"),
            "--report",
            str(tmp_path / "r.json"),
            "--notify",
            f"env > {seen}",
            *ssh_args(sshd),
        ],
        env={"FLEETDIAG_PASSPHRASE": "hunter2-secret", "FLEETDIAG_API_TOKEN": "tok-secret"},
    )
    assert res.exit_code == 1, res.output
    env = seen.read_text()
    assert "FLEETDIAG_REPORT=" in env and "PATH=" in env  # the rest of the environment is kept
    assert "hunter2-secret" not in env and "tok-secret" not in env


def test_sighup_keeps_the_report_and_history(sshd, tmp_path):
    """A closed terminal (SIGHUP) ends a sweep like SIGTERM: what was found so far is kept."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts TCP in the backlog, never says a word: that host hangs
    try:
        inv = inventory_file(
            tmp_path / "inventory.yaml",
            {
                "gpu01": {"log": log(tmp_path, "f", DP_RANK)},
                "gpu02": {"log": log(tmp_path, "f", DP_RANK), "port": silent.getsockname()[1]},
            },
            sshd,
        )
        db, report = tmp_path / "h.db", tmp_path / "report.json"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from fleetdiag.cli import main; main()",
                "-i",
                str(inv),
                "sweep",
                "all",
                "--db",
                str(db),
                "--report",
                str(report),
                "--connect-timeout",
                "60",
                *ssh_args(sshd),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        )
        try:
            deadline = time.monotonic() + 30
            while not db.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(3)  # gpu01 answers; gpu02 waits for a banner
            proc.send_signal(signal.SIGHUP)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        silent.close()
    assert proc.returncode in (1, 3), (proc.returncode, err)
    assert "interrupted" in err
    doc = json.loads(report.read_text())
    assert doc["sweep"]["interrupted"] is True
    assert [h["verdict"] for h in doc["hosts"]][0] == FAILED
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT count(*) FROM sweeps").fetchone()[0] == 1
