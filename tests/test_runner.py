"""One command runner, two implementations (direct, kept): the same outcome, the same errors, through real sshd."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fleetdiag.inventory import parse_inventory
from fleetdiag.probe import ProbeSettings, probe_host
from fleetdiag.records import FAILED
from fleetdiag.ssh import keeper as keeper_mod

from .cli_env import cli_env
from .procs import pids_with
from .sshd import start_sshd

REPO = Path(__file__).resolve().parent.parent
SEED = (REPO / "fleetdiag" / "data" / "demo" / "dp_rank.log").read_text()
DECISIVE = "AssertionError: DP adjusted local rank 3 is out of bounds"
SECRET = "hunter2-correct-horse"


def env_for(rt: Path, **extra: str) -> dict[str, str]:
    return cli_env(rt, HOME=str(rt.parent / "home"), **extra)


def argv(inv: Path, server, *args: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        "from fleetdiag.cli import main; main()",
        *("-i", str(inv), "probe", "n0", "--json", "--known-hosts", str(server.known_hosts)),
        *("--identity", str(server.client_key), "--ssh-config", "/dev/null", *args),
    ]


def inventory(tmp_path: Path, server, log: str) -> Path:
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"hosts:\n  n0:\n    address: 127.0.0.1\n    port: {server.port}\n    user: {server.user}\n{log}")
    return inv


def test_keeper_killed_mid_command_is_the_hosts_error_never_healthy(sshd, tmp_path, rt):
    """The funnel has begun (its first lines arrived) when the keeper dies: never a verdict from that."""
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    source = json.dumps(f"sleep 7.31; cat {log}")
    inv = inventory(tmp_path, sshd, f"    logs:\n      vllm: {{command: {source}}}\n")
    proc = subprocess.Popen(
        argv(inv, sshd, "--persist", "5m", "--timeout", "40"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_for(rt),
    )
    deadline = time.monotonic() + 60
    while not pids_with("sleep", "7.31") and time.monotonic() < deadline:
        time.sleep(0.05)
    keepers = pids_with("fleetdiag.ssh.keeper", str(rt))
    assert keepers and pids_with("sleep", "7.31"), "the funnel runs through the keeper"
    time.sleep(0.3)  # the funnel's first lines are on their way
    for pid in keepers:
        os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    host = json.loads(out)["hosts"][0]
    assert host["verdict"] == "unreachable", host
    assert host["facts"]["error_kind"] == "internal", host
    assert "connection keeper" in host["error"] and "stopped answering" in host["error"], host["error"]
    assert proc.returncode != 0


def test_keeper_gone_before_the_command_runs_it_once_elsewhere(sshd, tmp_path, rt, monkeypatch):
    """A keeper gone before a command's request never got the command. A connection's first command is
    its open too: it starts a new keeper and runs there, once, with the same result. A later command on
    a connection whose keeper has gone since: never started (the caller may run it elsewhere)."""
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    inv = parse_inventory(
        f"hosts:\n  n0:\n    address: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n"
        f"    logs:\n      vllm: {log}\n",
        "inv.yaml",
    )
    monkeypatch.setenv("FLEETDIAG_KEEPER_HELLO", "3")
    settings = ProbeSettings(transport=sshd.opts(), persist=60.0, keeper_dir=rt)
    assert asyncio.run(probe_host(inv.hosts["n0"], settings)).verdict == FAILED
    (old,) = pids_with("fleetdiag.ssh.keeper", str(rt))

    def kill_keepers() -> None:
        for pid in pids_with("fleetdiag.ssh.keeper", str(rt)):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while pids_with("fleetdiag.ssh.keeper", str(rt)) and time.monotonic() < deadline:
            time.sleep(0.02)

    real = keeper_mod.KeptConnection.execute
    runs: list[bool] = []

    async def kill_first(self, command, timeout, cap=None):
        kill_keepers()
        res = await real(self, command, timeout, cap)
        runs.append(res.started)
        return res

    monkeypatch.setattr(keeper_mod.KeptConnection, "execute", kill_first)
    res = asyncio.run(probe_host(inv.hosts["n0"], settings))
    assert runs == [True], "the first command ran, once"
    assert res.verdict == FAILED and DECISIVE in res.decisive.line, res
    assert pids_with("fleetdiag.ssh.keeper", str(rt)) not in ([], [old]), "on a keeper it started"
    monkeypatch.setattr(keeper_mod.KeptConnection, "execute", real)

    async def later() -> tuple[bool, bool]:
        conn = await keeper_mod.open_kept("127.0.0.1", sshd.port, sshd.user, sshd.opts(), None, "n0", 60.0, rt)
        first = await conn.execute("true", 10)
        kill_keepers()
        second = await conn.execute("true", 10)
        return first.started and first.error is None, second.started

    try:
        assert asyncio.run(later()) == (True, False)
    finally:
        kill_keepers()


def test_passphrase_is_scrubbed_from_remote_stderr_on_both_runners(tmp_path, rt):
    """A host whose shell fails and echoes the passphrase on stderr: direct and kept runs show the same
    reason, with the passphrase as ***."""
    script = tmp_path / "shell.sh"
    script.write_text(f"#!/bin/sh\necho 'login failed for {SECRET} here' >&2\nexit 127\n")
    script.chmod(0o755)
    server = start_sshd(tmp_path / "sshd", f"ForceCommand {script}\n")
    try:
        inv = inventory(tmp_path, server, f"    logs:\n      vllm: {tmp_path / 'x.log'}\n")
        env = env_for(rt, FLEETDIAG_PASSPHRASE=SECRET)
        got = []
        for persist in ("0", "5m"):
            out = subprocess.run(
                argv(inv, server, "--persist", persist), capture_output=True, text=True, timeout=120, env=env
            )
            assert SECRET not in out.stdout + out.stderr, persist
            got.append(json.loads(out.stdout)["hosts"][0])
        assert pids_with("fleetdiag.ssh.keeper", str(rt)), "the second probe ran through the keeper"
    finally:
        server.stop()
    for host in got:
        assert "login failed for *** here" in host["error"] and "exit status 127" in host["error"], host
    assert got[0]["error"] == got[1]["error"]


def test_newline_in_a_found_file_name_never_starts_a_card_row(sshd, tmp_path, rt):
    """A log the host's glob found, named ``job\\nERROR injected.log``: the card shows ``\\n``, no new row."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "job\nERROR injected.log").write_text(SEED)
    inv = inventory(tmp_path, sshd, f"    logs:\n      vllm: {json.dumps(str(logs) + '/*.log')}\n")
    env = env_for(rt, COLUMNS="300")
    args = [a for a in argv(inv, sshd, "--persist", "0") if a != "--json"]
    text = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    assert DECISIVE in text.stdout, text.stderr
    assert "job\\nERROR injected.log" in text.stdout
    assert not any(line.lstrip().startswith("ERROR injected") for line in text.stdout.splitlines()), text.stdout
    doc = json.loads(subprocess.run(argv(inv, sshd, "--persist", "0"), capture_output=True, text=True, env=env).stdout)
    assert doc["hosts"][0]["log"] == str(logs / "job\nERROR injected.log")  # JSON keeps the real name


def test_redact_connections_hides_kept_host_names(sshd, tmp_path, rt):
    """``--redact connections`` (table and --json) shows placeholders, never the kept hosts' real names."""
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        f"hosts:\n  n0:\n    address: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n"
        f"    logs:\n      vllm: {log}\n"
    )
    env = env_for(rt, COLUMNS="200")
    out = subprocess.run(argv(inv, sshd, "--persist", "5m"), capture_output=True, text=True, timeout=120, env=env)
    assert DECISIVE in out.stdout, out.stderr
    base = [sys.executable, "-c", "from fleetdiag.cli import main; main()"]
    plain = subprocess.run([*base, "connections"], capture_output=True, text=True, timeout=60, env=env).stdout
    assert "n0" in plain  # the control: unredacted, the name is there
    for extra in ([], ["--json"]):
        shown = subprocess.run(
            [*base, "--redact", "connections", *extra], capture_output=True, text=True, timeout=60, env=env
        ).stdout
        assert "host-1" in shown, shown
        assert " n0 " not in shown and '"n0"' not in shown, shown
