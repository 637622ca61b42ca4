"""CLI start-up: a command imports only what it needs (``analyze`` no SSH, ``--version`` no analysis),
and every command is still listed and runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "fleetdiag" / "data" / "demo" / "dp_rank.log"
SHOW = (
    "import sys, atexit; atexit.register(lambda: print('MODULES', ' '.join(sorted(sys.modules)), file=sys.stderr)); "
    "from fleetdiag.cli import main; main()"
)


def cli(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run(
        [sys.executable, "-c", SHOW, *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("MODULES "))
    return p, set(line.split()[1:])


def test_version_imports_no_analysis_ssh_or_inventory():
    p, mods = cli("--version")
    assert p.returncode == 0 and "fleetdiag" in p.stdout
    assert not {"asyncssh", "fleetdiag.analysis", "fleetdiag.inventory", "fleetdiag.ssh.scheduler", "yaml"} & mods


def test_analyze_imports_no_ssh_store_or_inventory():
    p, mods = cli("analyze", str(SEED), "--json")
    assert json.loads(p.stdout)["verdict"] == "failed"
    assert (
        not {
            "asyncssh",
            "fleetdiag.ssh.transport",
            "fleetdiag.ssh.scheduler",
            "fleetdiag.store",
            "fleetdiag.watch",
            "fleetdiag.cli.sweep",
            "fleetdiag.cli.watch",
            "fleetdiag.cli.probe",
        }
        & mods
    )


def test_help_lists_every_command():
    p, _ = cli("--help")
    assert p.returncode == 0
    for name in ("analyze", "check", "demo", "history", "hosts", "preflight", "probe", "sweep", "watch"):
        assert f"  {name} " in p.stdout, name


def test_user_errors_still_exit_2(tmp_path):
    """The CLI no longer imports the inventory to catch its errors: a bad inventory is still exit 2."""
    inv = tmp_path / "inventory.yaml"
    inv.write_text("hosts: [oops\n")
    p, _ = cli("-i", str(inv), "hosts")
    assert p.returncode == 2 and "error:" in p.stderr
    bad = tmp_path / "rules.yaml"
    bad.write_text("keywords: [unclosed\n")
    p, _ = cli("--rules", str(bad), "analyze", str(SEED))
    assert p.returncode == 2 and "not valid YAML" in p.stderr and f"{bad}:" in p.stderr


def test_probe_connects_before_the_rules_are_loaded(sshd, tmp_path):
    """The handshake does not wait for the rules: the proxy sees the connection while they are pending."""
    import asyncio
    import concurrent.futures

    from fleetdiag.analysis import load_rules
    from fleetdiag.delayproxy import DelayProxy
    from fleetdiag.inventory import parse_inventory
    from fleetdiag.probe import ProbeSettings, probe_host
    from fleetdiag.records import FAILED

    log = tmp_path / "vllm.log"
    log.write_bytes(SEED.read_bytes())

    async def go():
        proxy = await DelayProxy("127.0.0.1", sshd.port, 20).start()
        sshd.trust(proxy.port)
        try:
            inv = parse_inventory(
                f"hosts:\n  h:\n    address: 127.0.0.1\n    port: {proxy.port}\n    user: {sshd.user}\n"
                f"    logs:\n      vllm: {json.dumps(str(log))}\n",
                "s.yaml",
            )
            pending: concurrent.futures.Future = concurrent.futures.Future()
            task = asyncio.ensure_future(
                probe_host(inv.hosts["h"], ProbeSettings(transport=sshd.opts(), rules_pending=pending))
            )
            for _ in range(500):
                if proxy.exchanges >= 2 or task.done():  # key exchange, then the login (sshfast)
                    break
                await asyncio.sleep(0.01)
            connected_first = proxy.connections == 1 and proxy.exchanges >= 2 and not task.done()
            pending.set_result(load_rules(user_default=False))
            return connected_first, await task
        finally:
            await proxy.stop()

    connected_first, res = asyncio.run(go())
    assert connected_first
    assert res.verdict == FAILED, res.error


def test_probe_with_bad_rules_exits_2_before_any_output(sshd, tmp_path):
    bad = tmp_path / "rules.yaml"
    bad.write_text("keywords: [unclosed\n")
    log = tmp_path / "vllm.log"
    log.write_bytes(SEED.read_bytes())
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        f"hosts:\n  h:\n    address: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n"
        f"    logs:\n      vllm: {json.dumps(str(log))}\n"
    )
    p, _ = cli(
        "-i",
        str(inv),
        "--rules",
        str(bad),
        "probe",
        "h",
        "--jsonl",
        "--known-hosts",
        str(sshd.known_hosts),
        "--identity",
        str(sshd.client_key),
    )
    assert p.returncode == 2, p.stderr
    assert "not valid YAML" in p.stderr and p.stdout == ""
