"""fleetdiag probe end to end through a real OpenSSH sshd on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from click.testing import CliRunner

from fleetdiag.analysis import load_rules
from fleetdiag.cli import main
from fleetdiag.delayproxy import DelayProxy
from fleetdiag.inventory import parse_inventory
from fleetdiag.probe import ProbeSettings, probe_host, spec_for
from fleetdiag.records import FAILED, HEALTHY, NO_LOG, UNREACHABLE
from fleetdiag.remote.funnel import run_local
from fleetdiag.ssh.scheduler import probe_many

from .sshd import free_port

DEMO = Path(__file__).resolve().parent.parent / "fleetdiag" / "data" / "demo"
SEED = (DEMO / "dp_rank.log").read_text()
HEALTHY_LOG = (DEMO / "healthy.log").read_text()


def inventory(sshd, hosts: dict[str, dict]) -> object:
    lines = ["hosts:"]
    for name, h in hosts.items():
        lines.append(f"  {name}:")
        lines.append(f"    address: {h.get('address', '127.0.0.1')}")
        lines.append(f"    port: {h.get('port', sshd.port)}")
        lines.append(f"    user: {sshd.user}")
        lines.append("    logs:")
        lines.append(f"      vllm: {json.dumps(str(h['log']))}")
    return parse_inventory("\n".join(lines) + "\n", "test-inventory.yaml")


def run(coro):
    return asyncio.run(coro)


def probe_all(hosts, settings):
    async def go():
        return [r async for r in probe_many(hosts, settings)]

    results = run(go())
    return {r.host: r for r in results}


def test_seed_failure_decisive_worker_line(sshd, tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    inv = inventory(sshd, {"uk-node": {"log": log}})
    res = run(probe_host(inv.hosts["uk-node"], ProbeSettings(transport=sshd.opts())))
    assert res.verdict == FAILED, res
    d = res.decisive
    assert "AssertionError: DP adjusted local rank 3 is out of bounds" in d.line
    assert d.line.startswith("(Worker pid=7506)")
    assert d.process == "Worker pid=7506"
    assert any("in worker_main" in ln for ln in d.traceback)
    assert any("in init_device" in ln for ln in d.traceback)
    assert d.traceback[-1].endswith("AssertionError: DP adjusted local rank 3 is out of bounds")
    # the wrappers are counted as its cascade, not chosen
    assert "See root cause above" not in d.line
    assert sum(res.secondary.values()) >= 2
    assert res.timing.round_trips == 1


def test_healthy_log_is_healthy(sshd, tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(HEALTHY_LOG)
    inv = inventory(sshd, {"us-node": {"log": log}})
    res = run(probe_host(inv.hosts["us-node"], ProbeSettings(transport=sshd.opts())))
    assert res.verdict == HEALTHY, res
    assert res.decisive is None


def test_each_problem_is_its_own_status_and_others_finish(sshd, tmp_path):
    good = tmp_path / "good.log"
    good.write_text(SEED)
    known = tmp_path / "known_hosts"
    shutil.copy(sshd.known_hosts, known)

    async def go():
        proxy = await DelayProxy("127.0.0.1", sshd.port, 0).start()  # same sshd, a port known_hosts does not vouch for
        try:
            inv = inventory(
                sshd,
                {
                    "good": {"log": good},
                    "nolog": {"log": tmp_path / "absent.log"},
                    "closed": {"log": good, "port": free_port()},
                    "stranger": {"log": good, "port": proxy.port},
                },
            )
            settings = ProbeSettings(transport=sshd.opts(known_hosts=str(known)))
            return [r async for r in probe_many(list(inv.hosts.values()), settings)]
        finally:
            await proxy.stop()

    res = {r.host: r for r in run(go())}
    assert set(res) == {"good", "nolog", "closed", "stranger"}
    assert res["good"].verdict == FAILED
    assert res["nolog"].verdict == NO_LOG and "not found" in res["nolog"].error
    assert res["closed"].verdict == UNREACHABLE and "refused" in res["closed"].error
    assert res["stranger"].verdict == UNREACHABLE and "host key unknown" in res["stranger"].error
    assert "--accept-new" in res["stranger"].error


def test_hostile_log_path_is_read_literally_and_runs_nothing(sshd, tmp_path):
    canary = f"fleetdiag-pwned-{uuid.uuid4().hex}"
    name = f"-x$(touch {canary});`touch {canary}` && touch {canary} 'q\"\nnl.log"
    hostile = tmp_path / name
    hostile.write_text(SEED)
    inv = inventory(sshd, {"h": {"log": hostile}})
    res = run(probe_host(inv.hosts["h"], ProbeSettings(transport=sshd.opts())))
    for where in (Path.home(), tmp_path, Path("/tmp"), Path("/")):
        assert not (where / canary).exists()
    assert res.verdict == FAILED, res
    assert res.log == str(hostile)
    assert "DP adjusted local rank 3" in res.decisive.line


def test_ssh_config_alias_host(sshd, tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    inv = parse_inventory(f"hosts:\n  sshd-alias:\n    logs:\n      vllm: {log}\n", "alias.yaml")
    opts = sshd.opts(known_hosts=None, client_keys=None)
    res = run(probe_host(inv.hosts["sshd-alias"], ProbeSettings(transport=opts)))
    assert res.verdict == FAILED, res.error


def test_probe_costs_one_exec_round_trip(sshd, tmp_path):
    """Through a 200 ms proxy, the funnel's exec costs what a bare `true` exec costs."""
    from fleetdiag.ssh.transport import connect

    log = tmp_path / "vllm.log"
    log.write_text(SEED * 20)
    rtt = 400.0

    async def go():
        proxy = await DelayProxy("127.0.0.1", sshd.port, rtt).start()
        sshd.trust(proxy.port)
        try:
            inv = inventory(sshd, {"far": {"log": log, "port": proxy.port}})
            host = inv.hosts["far"]
            conn = await connect("127.0.0.1", proxy.port, sshd.user, sshd.opts())
            try:
                proxy.reset_counts()
                t0 = time.perf_counter()
                await conn.run("true", 10)
                bare_ms = (time.perf_counter() - t0) * 1000
                bare_exchanges = proxy.exchanges
                proxy.reset_counts()
                t0 = time.perf_counter()
                res = await probe_host(host, ProbeSettings(transport=sshd.opts()), conn=conn)
                probe_ms = (time.perf_counter() - t0) * 1000
                return res, bare_ms, bare_exchanges, probe_ms, proxy.exchanges
            finally:
                conn.close()
        finally:
            await proxy.stop()

    res, bare_ms, bare_x, probe_ms, probe_x = run(go())
    assert res.verdict == FAILED
    # the proxy counts the client speaking again after hearing the server: the funnel's
    # exec needs no more of those than a bare `true` does (channel open + exec request)
    assert probe_x <= bare_x, (probe_x, bare_x)
    # and its wall time is the bare exec plus the script's own run time (measured here on
    # the same machine, so a loaded CI box moves both), less than one more round trip
    t0 = time.perf_counter()
    run_local(spec_for(str(log), load_rules()))
    script_ms = (time.perf_counter() - t0) * 1000
    assert probe_ms < bare_ms + 3 * script_ms + rtt / 2, (probe_ms, bare_ms, script_ms)


def test_cli_probe_json_and_exit_code(sshd, tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        f"hosts:\n  uk-node:\n    address: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n"
        f"    logs:\n      vllm: {log}\n"
    )
    args = [
        "-i",
        str(inv),
        "probe",
        "uk-node",
        "--json",
        *sshd.cli_args(),
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    doc = json.loads(result.output)
    assert doc["version"] == 1
    host = doc["hosts"][0]
    assert host["verdict"] == "failed"
    assert host["decisive"]["process"] == "Worker pid=7506"
    assert "AssertionError: DP adjusted local rank 3 is out of bounds" in host["decisive"]["line"]
    assert host["timing"]["round_trips"] == 1


def test_installed_console_script_runs(sshd, tmp_path):
    exe = str(Path(sys.executable).parent / "fleetdiag")
    log = tmp_path / "vllm.log"
    log.write_text(HEALTHY_LOG)
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        f"hosts:\n  us-node:\n    address: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n"
        f"    logs:\n      vllm: {log}\n"
    )
    out = subprocess.run(
        [
            exe,
            "-i",
            str(inv),
            "probe",
            "us-node",
            *sshd.cli_args(),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "120"},
    )
    assert out.returncode == 0, out.stderr + out.stdout
    assert "HEALTHY" in out.stdout and "us-node" in out.stdout
