"""The small contracts of #25, each through the CLI: messages name the port and address dialled,
``hosts --ssh``, one message one line off a terminal, Ansible INI JSON values, a cron sweep keeps
no connection, plurals, ``did you mean`` for a command, and the README's demo count."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from fleetdiag.cli import main
from fleetdiag.demo import default_nodes
from fleetdiag.store import Store

from .conftest import inventory_file
from .sshd import free_port
from .test_fleet import HEALTHY_LOG, log, ssh_args
from .test_preflight import checks, raw

ROOT = Path(__file__).resolve().parent.parent
EXE = str(Path(sys.executable).parent / "fleetdiag")


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real program, stdout and stderr pipes (not a terminal), 80 columns."""
    full = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1", "FLEETDIAG_PERSIST": "0", **(env or {})}
    full.pop("FLEETDIAG_INVENTORY", None)
    return subprocess.run([EXE, *args], env=full, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def _ssh_config(tmp: Path, sshd, closed: int, closed_jump: int) -> Path:
    cfg = tmp / "ssh_config"
    cfg.write_text(
        f"""Host gpu-alias
    HostName 127.0.0.1
    Port {sshd.port}
    User {sshd.user}
    IdentityFile {sshd.client_key}
    UserKnownHostsFile {sshd.known_hosts}
Host gpu-down
    HostName 127.0.0.3
    Port {closed}
Host bastion
    HostName 127.0.0.4
    Port {closed_jump}
"""
    )
    return cfg


def test_messages_and_hosts_ssh_name_the_port_and_address_dialled(sshd, tmp_path):
    closed, closed_jump = free_port(), free_port()
    cfg = _ssh_config(tmp_path, sshd, closed, closed_jump)
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        "hosts:\n  gpu-alias: {}\n  gpu-down: {}\n"
        f"  behind:\n    address: 127.0.0.1\n    port: {sshd.port}\n    jump: bastion\n"
    )
    keys = ["--ssh-config", str(cfg), "--identity", str(sshd.client_key), "--known-hosts", str(sshd.known_hosts)]
    res = cli("-i", str(inv), "probe", "gpu-down,behind", "--json", *keys, "--connect-timeout", "20")
    hosts = {h["host"]: h for h in json.loads(res.stdout)["hosts"]}
    assert f"connection refused by gpu-down (127.0.0.3:{closed})" in hosts["gpu-down"]["error"]  # not gpu-down:22
    assert f"jump host bastion (127.0.0.4:{closed_jump})" in hosts["behind"]["error"]  # not bastion:22
    ssh = cli("-i", str(inv), "hosts", "--ssh", "--json", "--ssh-config", str(cfg))
    got = {h["host"]: h for h in json.loads(ssh.stdout)["hosts"]}
    alias = got["gpu-alias"]
    assert (alias["hostname"], alias["port"], alias["user"]) == ("127.0.0.1", sshd.port, sshd.user)
    assert alias["identity_files"] == [str(sshd.client_key)] and alias["known_hosts"] == [str(sshd.known_hosts)]
    assert got["behind"]["jump"][0].endswith(f"bastion (127.0.0.4:{closed_jump})")
    assert got["behind"]["jump_from"] == "inventory" and got["gpu-down"]["jump"] == []
    text = cli("-i", str(inv), "hosts", "gpu-alias", "--ssh", "--ssh-config", str(cfg)).stdout
    assert re.search(rf"^  port +{sshd.port}$", text, re.M) and re.search(r"^  hostname +127.0.0.1$", text, re.M)
    assert text.startswith("1 host from ")


def test_a_kept_connection_is_listed_at_the_port_dialled_and_sweep_keeps_none(sshd, tmp_path):
    """``connections`` names the port the ssh config gave (not :22); a sweep with no --persist leaves no
    keeper (cron); a probe does (10 minutes by default), and is closed here."""
    cfg = _ssh_config(tmp_path, sshd, free_port(), free_port())
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        f"hosts:\n  gpu-alias:\n    logs:\n      train: {json.dumps(str(log(tmp_path, 'h', HEALTHY_LOG)))}\n"
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    env = {"FLEETDIAG_RUNTIME_DIR": str(run_dir)}
    env_default = {**env, "FLEETDIAG_PERSIST": ""}  # as cron runs it: no --persist, no environment
    keys = ["--ssh-config", str(cfg)]
    db, report = str(tmp_path / "h.db"), str(tmp_path / "r.json")
    full = {**os.environ, "COLUMNS": "80", **env_default}
    full.pop("FLEETDIAG_PERSIST")
    res = subprocess.run(
        [EXE, "-i", str(inv), "sweep", "all", "--db", db, "--report", report, *keys],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert not (run_dir / "keeper.sock").exists() and not list(run_dir.glob("*.sock")), list(run_dir.iterdir())
    try:
        res = cli("-i", str(inv), "probe", "all", "--persist", "1m", *keys, env=env)
        assert res.returncode == 0, res.stderr
        listed = json.loads(cli("connections", "--json", env=env).stdout)
        assert [c["where"] for c in listed["connections"]] == [f"gpu-alias (127.0.0.1:{sshd.port})"]
    finally:
        cli("connections", "--close", env=env)


def test_off_a_terminal_one_message_is_one_line(tmp_path):
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        "hosts:\n  gpu01:\n    adress: 10.0.0.1\n    logs: {train: /data/runs/a-rather-long-directory-name/train.log}\n"
    )
    res = cli("-i", str(inv), "check")
    assert res.returncode == 2
    line = next(ln for ln in res.stderr.splitlines() if "adress" in ln)
    assert line.startswith("error: ") and "(did you mean 'address'?)" in line, res.stderr  # not cut at 80 columns
    assert len(line) > 80


INI = """\
[gpus]
gpu01 ansible_host=10.0.0.1 fleetdiag_logs='{"train": "/data/train.log", "serve": "/var/log/vllm.log"}' foo=1
gpu02 ansible_host=10.0.0.2 fleetdiag_logs=/data/plain.log bar=2
"""


def test_ansible_ini_json_valued_logs_and_warnings_said_once(tmp_path):
    inv = tmp_path / "hosts.ini"
    inv.write_text(INI)
    res = cli("-i", str(inv), "hosts", "--json")
    assert res.returncode == 0, res.stderr
    logs = {h["host"]: h["logs"] for h in json.loads(res.stdout)["hosts"]}
    assert logs["gpu01"] == {"train": "/data/train.log", "serve": "/var/log/vllm.log"}  # a mapping, not a path
    assert list(logs["gpu02"].values()) == ["/data/plain.log"]
    assert res.stderr.count("ignored vars") == 1
    db = tmp_path / "h.db"
    Store(db).close()
    hist = cli("-i", str(inv), "--redact", "history", "gpu01", "--db", str(db))
    assert hist.returncode == 0, hist.stderr
    assert hist.stderr.count("ignored vars") == 1, hist.stderr  # the inventory is read twice here: said once


def test_small_words(sshd, tmp_path):
    one = inventory_file(tmp_path / "inventory.yaml", {"gpu01": {"log": log(tmp_path, "h", HEALTHY_LOG)}}, sshd)
    res = CliRunner().invoke(main, ["-i", str(one), "check"])
    assert "1 host, 0 groups" in res.stdout
    assert CliRunner().invoke(main, ["-i", str(one), "hosts"]).stdout.startswith("1 host from")
    res = cli("prob", "all")
    assert res.returncode == 2 and "No such command 'prob' (did you mean 'probe'?)" in res.stderr
    helptext = CliRunner().invoke(main, ["analyze", "--help"]).stdout
    assert "per host" not in helptext and "--jsonl" in helptext
    c = checks(["vllm", "serve", "m"], {"CUDA_VISIBLE_DEVICES": "0"}, raw("nvidia-smi-query-busy.csv"))
    assert c["gpu-ids"].detail.endswith("GPU 0 exists")
    c = checks(["vllm", "serve", "m", "-tp", "2"], {"CUDA_VISIBLE_DEVICES": "0,1"}, raw("nvidia-smi-query-busy.csv"))
    assert c["gpu-ids"].detail.endswith("GPUs 0,1 exist") or c["gpu-ids"].detail.endswith("exist")
    res = CliRunner().invoke(main, ["-i", str(one), "probe", "gpu01", *ssh_args(sshd)])
    assert res.exit_code == 0 and "1 hosts" not in res.output


def test_readme_counts_the_demo_nodes():
    words = {5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten", 11: "eleven", 12: "twelve"}
    readme = (ROOT / "README.md").read_text()
    n = len(default_nodes())
    assert f"playing {words[n]} simulated GPU nodes" in readme, n


def test_a_hint_names_each_process_once():
    """The rank's OOM is logged three times (the error, its re-raise, the launcher's summary): one process."""
    res = CliRunner().invoke(
        main, ["analyze", str(ROOT / "tests" / "corpus" / "torch_qwen3coder_174_rank3_oom.log"), "--json"]
    )
    hint = json.loads(res.stdout)["decisive"]["hint"]
    assert hint.count("process 387746 holds 78.9 GiB") == 1, hint


def test_stacks_without_a_log_holder_list_only_job_processes(tmp_path):
    """With no process holding the stalled log, the stacks trip falls back to the host's Python processes:
    fleetdiag itself (the CLI, its keeper), pytest and pip are nobody's job and are left out."""
    sleep = "import time; time.sleep(60)"
    spawn = {
        "job": [sys.executable, "-c", sleep, "train.py", "--nproc"],
        "keeper": [sys.executable, "-c", sleep + "  # from fleetdiag.ssh.keeper import _detach_main"],
        "pytest": [sys.executable, "-c", sleep, "-m", "pytest", "tests/"],
    }
    procs = {k: subprocess.Popen(v) for k, v in spawn.items()}
    try:
        script = tmp_path / "find.sh"
        script.write_text(f". {ROOT / 'fleetdiag' / 'remote' / 'stacks.sh'}\nfd_stacks_find\n")
        out = subprocess.run(
            ["sh", str(script)],
            env={**os.environ, "FD_STACKS_MAX": "100000"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        found = {int(p) for p in out.stdout.split()}
        assert procs["job"].pid in found, out
        assert procs["keeper"].pid not in found and procs["pytest"].pid not in found
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_a_handshake_dropped_past_maxstartups_is_retried_once_and_named(sshd, tmp_path):
    """sshd past MaxStartups accepts, says "Exceeded MaxStartups" (OpenSSH 9) and closes before its greeting.
    Once: retried after a back-off, the host is healthy (the proxy in front of the real sshd dropped only the
    first handshake). Every time: unreachable, and the message says what to do (--per-address)."""
    import asyncio

    from .test_fleet import Background

    bg = Background()
    accepted: list[float] = []

    async def drop(writer: asyncio.StreamWriter) -> None:
        writer.write(b"Exceeded MaxStartups\r\n")  # what OpenSSH 9 sends before it closes
        await writer.drain()
        writer.close()

    async def drop_first(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(time.monotonic())
        if len(accepted) == 1:
            await drop(writer)
            return
        up_r, up_w = await asyncio.open_connection("127.0.0.1", sshd.port)

        async def pump(src, dst):
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_w), pump(up_r, writer))

    async def always(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await drop(writer)

    once = bg.run(asyncio.start_server(drop_first, "127.0.0.1", 0))
    full = bg.run(asyncio.start_server(always, "127.0.0.1", 0))
    ports = {"once": once.sockets[0].getsockname()[1], "always": full.sockets[0].getsockname()[1]}
    sshd.trust(ports["once"])
    try:
        inv = inventory_file(
            tmp_path / "inventory.yaml",
            {name: {"log": log(tmp_path, name, HEALTHY_LOG), "port": port} for name, port in ports.items()},
            sshd,
        )
        res = CliRunner().invoke(main, ["-i", str(inv), "probe", "all", "--json", *ssh_args(sshd)])
        hosts = {h["host"]: h for h in json.loads(res.stdout)["hosts"]}
        assert hosts["once"]["verdict"] == "healthy", hosts["once"]
        assert len(accepted) == 2 and accepted[1] - accepted[0] >= 0.45  # one retry, after a back-off
        err = hosts["always"]["error"]
        assert hosts["always"]["verdict"] == "unreachable"
        assert "before the SSH greeting" in err and "MaxStartups" in err and "--per-address" in err, err
        assert "retried once" in err
    finally:
        bg.run(_close(once))
        bg.run(_close(full))
        bg.close()


async def _close(server) -> None:
    server.close()
    await server.wait_closed()


def test_history_lemons_recur_or_survive_a_reboot(tmp_path):
    """gpu07's Xid 79 comes and goes three times; gpu12's ECC error is there before and after a reboot;
    gpu20 is failed in every sweep but never went away (one episode, one boot): not a lemon."""
    from fleetdiag.records import Decisive, HostResult

    def failed(host: str, fp: str, boot: float | None = None) -> HostResult:
        res = HostResult(host=host, verdict="failed", decisive=Decisive(line=fp, message=fp, fingerprint=fp))
        if boot is not None:
            res.facts["kernel_log"] = {"kernel_log": "read", "boot": boot}
        return res

    db = tmp_path / "history.sqlite3"
    t0 = time.time() - 6 * 3600
    with Store(db) as store:
        for n in range(6):
            rs = [
                failed("gpu07", "xid79", 1000.0) if n % 2 == 0 else HostResult(host="gpu07", verdict="healthy"),
                failed("gpu12", "xid48", 1000.0 if n < 3 else 90_000.0),
                failed("gpu20", "oom", 1000.0),
            ]
            store.record_sweep(rs, started=t0 + n * 3600, finished=t0 + n * 3600 + 10)
    res = CliRunner().invoke(main, ["history", "--db", str(db), "--lemons", "--json"])
    assert res.exit_code == 0, res.output
    got = {r["host"]: r for r in json.loads(res.stdout)["lemons"]}
    assert set(got) == {"gpu07", "gpu12"}
    assert got["gpu07"]["episodes"] == 3 and "back 3 times" in got["gpu07"]["why"]
    assert got["gpu12"]["boots"] == 2 and "after a reboot" in got["gpu12"]["why"]
    res = CliRunner().invoke(main, ["history", "--db", str(db), "--lemons", "--recur", "4", "--json"])
    assert {r["host"] for r in json.loads(res.stdout)["lemons"]} == {"gpu12"}
    res = CliRunner().invoke(main, ["history", "--db", str(db), "--lemons", "--since", "2h", "--json"])
    assert json.loads(res.stdout)["lemons"] == []  # the last two sweeps alone show no recurrence
    text = CliRunner().invoke(main, ["history", "--db", str(db), "--lemons"]).stdout
    assert text.startswith("2 recurring: gpu[07,12]") and "gpu20" not in text


def test_sweep_summary_and_probe_only_json(sshd, tmp_path):
    from .test_fleet import DP_RANK

    inv = inventory_file(
        tmp_path / "inventory.yaml",
        {"gpu01": {"log": log(tmp_path, "f", DP_RANK)}, "gpu02": {"log": log(tmp_path, "h", HEALTHY_LOG)}},
        sshd,
    )
    args = ["--db", str(tmp_path / "h.db"), "--report", str(tmp_path / "r.json"), *ssh_args(sshd)]
    res = CliRunner().invoke(main, ["-i", str(inv), "sweep", "all", "--summary", "--hide", "healthy", *args])
    assert res.exit_code == 1, res.output
    out = res.stdout
    assert out.startswith("NEW") and "2 hosts: 1 failed · 1 healthy" in out  # the news, then the table
    assert "gpu01" in out and "│ gpu02" not in out and "1 host of 2 not shown (--hide healthy)" in out
    res = CliRunner().invoke(main, ["-i", str(inv), "sweep", "all", "--format", "csv", *args])
    assert res.exit_code == 1 and res.stdout.splitlines()[0].startswith("hosts,n,verdict,category,action,reason")
    assert {ln.split(",")[0] for ln in res.stdout.splitlines()[1:]} == {"gpu01", "gpu02"}
    md = CliRunner().invoke(main, ["history", "--db", str(tmp_path / "h.db"), "--format", "md"]).stdout
    assert md.startswith("# fleetdiag history") and "## gpu01 — failed" in md and "| gpu01 | failed |" in md
    res = CliRunner().invoke(main, ["-i", str(inv), "probe", "all", "--only", "failed", "--json", *ssh_args(sshd)])
    assert res.exit_code == 1 and [h["host"] for h in json.loads(res.stdout)["hosts"]] == ["gpu01"]
    res = CliRunner().invoke(main, ["-i", str(inv), "probe", "all", "--json", "--format", "md", *ssh_args(sshd)])
    assert res.exit_code == 2 and "--json and --md are exclusive" in res.output


def test_action_class_routes_a_job_victim_to_its_root():
    from fleetdiag.records import Decisive, HostResult, JobRole
    from fleetdiag.store import action_class, category_of

    victim = HostResult(host="node0", verdict="failed", decisive=Decisive(line="x", message="x", category="nccl"))
    assert action_class(victim) == "network" and category_of(victim) == "nccl"
    victim.job_role = JobRole("consequence", root="node1")
    assert action_class(victim) == "consequence"  # not a page for the network team: node1 broke the job
    gone = HostResult(host="n", verdict="unreachable", error="refused")
    assert (action_class(gone), category_of(gone)) == ("access", "unreachable")
