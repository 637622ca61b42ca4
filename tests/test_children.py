"""fleetdiag's own child processes (the keeper, the workers) import nothing from the working directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fleetdiag import child

from .cli_env import cli_env
from .procs import pids_with

REPO = Path(__file__).resolve().parent.parent
SEED = (REPO / "fleetdiag" / "data" / "demo" / "dp_rank.log").read_text()
DECISIVE = "AssertionError: DP adjusted local rank 3 is out of bounds"


def plant(directory: Path, canaries: Path) -> None:
    """A ``hashlib.py`` and a ``fleetdiag`` package that leave a file behind when imported."""
    directory.mkdir(parents=True, exist_ok=True)
    code = f"import os\nopen(os.path.join({str(canaries)!r}, '{{}}-{{}}'.format(__name__, os.getpid())), 'w').close()\n"
    (directory / "hashlib.py").write_text(code)
    (directory / "fleetdiag").mkdir(exist_ok=True)
    (directory / "fleetdiag" / "__init__.py").write_text(code)
    for sub in ("ssh", "ssh/keeper"):
        (directory / "fleetdiag" / sub).mkdir(parents=True, exist_ok=True)
        (directory / "fleetdiag" / sub / "__init__.py").write_text(code)
    (directory / "fleetdiag" / "ssh" / "spread.py").write_text(code)
    (directory / "fleetdiag" / "ssh" / "keeper" / "start.py").write_text(code)


def run_cli(cwd: Path, rt: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI started as its console script is: its own directory on the path, not the cwd."""
    boot = f"import sys; sys.path.append({str(REPO)!r}); from fleetdiag.cli import main; main()"
    env = cli_env(rt)  # PYTHONPATH: a child that honoured it would still not find the planted files
    return subprocess.run(
        [sys.executable, "-I", "-c", boot, *args], cwd=cwd, capture_output=True, text=True, timeout=150, env=env
    )


def test_planted_modules_in_the_cwd_never_run_in_the_keeper_or_the_workers(sshd, tmp_path, rt):
    canaries = tmp_path / "canaries"
    canaries.mkdir()
    cwd = tmp_path / "shared-tmp"
    plant(cwd, canaries)
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        "hosts:\n"
        + "".join(
            f"  n{i}:\n    address: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n"
            f"    logs:\n      vllm: {log}\n"
            for i in range(2)
        )
    )
    ssh = ["--known-hosts", str(sshd.known_hosts), "--identity", str(sshd.client_key), "--ssh-config", "/dev/null"]
    kept = run_cli(cwd, rt, "-i", str(inv), "probe", "n0", "--json", *ssh)
    assert pids_with("fleetdiag.ssh.keeper", str(rt)), "the default --persist started a keeper"
    spread = run_cli(cwd, rt, "-i", str(inv), "probe", "--workers", "2", "all", "--json", "--persist", "0", *ssh)
    for out in (kept, spread):
        assert out.returncode == 1, out.stderr
        for host in json.loads(out.stdout)["hosts"]:
            assert DECISIVE in host["decisive"]["line"], host
    assert sorted(os.listdir(canaries)) == []


def test_child_import_path_drops_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", ".", str(tmp_path), "rel/dir", "/usr/lib/python3", "__hook__"])
    (tmp_path / "rel" / "dir").mkdir(parents=True)
    path = child.import_path()
    assert path[:2] == ["/usr/lib/python3", "__hook__"]  # a hook marker that is no file stays
    assert path[-1] == child.PACKAGE_PARENT and len(path) == 3
    argv = child.python_argv("pass", "fleetdiag.x")
    assert argv[1] == "-I" and argv[-1] == "fleetdiag.x"
    assert argv[3].startswith("import os, sys; os.chdir('/')")
