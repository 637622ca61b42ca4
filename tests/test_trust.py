"""What decides trust in a host: revoked keys on every port and login path, a kept connection's trust,
and paths the user gave relative to the command's directory, through the real CLI and sshd."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import asyncssh
import pytest

from fleetdiag.ssh.transport import KnownHosts

from .cli_env import cli_env
from .conftest import inventory_file
from .procs import pids_with

REPO = Path(__file__).resolve().parent.parent
SEED = (REPO / "fleetdiag" / "data" / "demo" / "dp_rank.log").read_text()
DECISIVE = "AssertionError: DP adjusted local rank 3 is out of bounds"


def inventory(tmp_path: Path, sshd, names: tuple[str, ...] = ("n0",)) -> Path:
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    return inventory_file(tmp_path / "inv.yaml", dict.fromkeys(names, log), sshd)


def cli(rt: Path, *args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    full = cli_env(rt, COLUMNS="200", HOME=str(rt.parent / "home"), **(env or {}))
    argv = [sys.executable, "-c", "from fleetdiag.cli import main; main()", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=150, env=full, cwd=cwd)


def hosts_of(out: subprocess.CompletedProcess) -> dict[str, dict]:
    assert out.stdout.startswith("{"), out.stderr
    return {h["host"]: h for h in json.loads(out.stdout)["hosts"]}


LOGINS = {
    "fast": ({}, "0"),
    "standard": ({"FLEETDIAG_SSH_LOGIN": "standard"}, "0"),
    "keeper": ({}, "5m"),
}


@pytest.mark.parametrize("login", sorted(LOGINS))
def test_revoked_key_on_a_non_22_port_is_refused_on_every_login(sshd, tmp_path, rt, login):
    """``@revoked [127.0.0.1]:PORT KEY`` (the only line for the host, or beside a port-less trusted
    line for the same key): refused as changed, with and without --accept-new, and nothing is appended."""
    env, persist = LOGINS[login]
    inv = inventory(tmp_path, sshd)
    for n, lines in enumerate(
        (
            f"@revoked [127.0.0.1]:{sshd.port} {sshd.host_pub}\n",
            f"127.0.0.1 {sshd.host_pub}\n@revoked [127.0.0.1]:{sshd.port} {sshd.host_pub}\n",
        )
    ):
        known = tmp_path / f"known_hosts{n}"
        known.write_text(lines)
        for accept in ([], ["--accept-new"]):
            out = cli(
                rt,
                *("-i", str(inv), "probe", "n0", "--json", "--persist", persist, "--known-hosts", str(known)),
                *("--identity", str(sshd.client_key), "--ssh-config", "/dev/null", *accept),
                env=env,
            )
            host = hosts_of(out)["n0"]
            assert host["verdict"] == "unreachable", (login, accept, host)
            assert host["facts"]["error_kind"] == "hostkey-changed", host
            assert "REVOKED HOST KEY" in host["error"] and "--accept-new" in host["error"], host["error"]
            assert known.read_text() == lines, "no trust line is ever appended for a revoked key"
    assert not list(rt.glob("*.sock")) or login == "keeper"


def test_known_hosts_lookup_keeps_revoked_keys_on_every_port(sshd):
    """The lookup handed to asyncssh: revoked entries hold with and without the port, and never count as trusted."""
    key = asyncssh.import_public_key(sshd.host_pub)
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    cases = {
        f"@revoked [h]:2222 {sshd.host_pub}\n": (2222, [], [key]),
        f"h {sshd.host_pub}\n@revoked [h]:2222 {sshd.host_pub}\n": (2222, [], [key]),
        f"@revoked h {sshd.host_pub}\n[h]:2222 {sshd.host_pub}\n": (2222, [], [key]),
        f"[h]:2222 {sshd.host_pub}\n@revoked [h]:2223 {sshd.host_pub}\n": (2222, [key], []),
        f"[h]:2222 {other}\n@revoked [h]:2222 {sshd.host_pub}\n": (2222, ["other"], [key]),
        f"@revoked h {sshd.host_pub}\n": (None, [], [key]),
    }
    for i, (text, (port, trusted, revoked)) in enumerate(cases.items()):
        path = Path(sshd.dir) / f"lookup{i}"
        path.write_text(text)
        lookup = KnownHosts([str(path), str(path) + ".missing"])
        got_trusted, _ca, got_revoked = lookup("h", "10.0.0.1", port)
        if trusted == ["other"]:
            assert len(got_trusted) == 1 and got_trusted[0] != key, text
        else:
            assert got_trusted == trusted, text
        assert got_revoked == revoked, text
    assert KnownHosts([])("h", "10.0.0.1", 22) == ([], [], [])  # UserKnownHostsFile none: nothing known


def test_known_hosts_are_parsed_once_until_a_file_changes(sshd, tmp_path, monkeypatch):
    """A fleet's known_hosts holds a line per host: it is parsed once per process, not per
    connection, and parsed again as soon as a file changes (an accepted key, a revocation)."""
    from fleetdiag.ssh import hostkeys

    parses = []
    real = asyncssh.import_known_hosts
    monkeypatch.setattr(hostkeys.asyncssh, "import_known_hosts", lambda text: parses.append(text) or real(text))
    monkeypatch.setattr(hostkeys, "_PARSED", {})
    key = asyncssh.import_public_key(sshd.host_pub)
    path = tmp_path / "known_hosts"
    path.write_text("".join(f"[h]:{2000 + i} {sshd.host_pub}\n" for i in range(500)))
    for port in (2000, 2001, 2499):  # three connections, two lookups objects: one parse
        assert KnownHosts([str(path)])("h", "10.0.0.1", port)[0] == [key]
    assert len(parses) == 1
    assert KnownHosts([str(path)])("h", "10.0.0.1", 2500)[0] == []
    with open(path, "a") as fh:  # the file changes: read again, the new lines hold at once
        fh.write(f"[h]:2500 {sshd.host_pub}\n@revoked [h]:2001 {sshd.host_pub}\n")
    lookup = KnownHosts([str(path)])
    assert lookup("h", "10.0.0.1", 2500)[0] == [key]
    assert lookup("h", "10.0.0.1", 2001)[0] == [] and lookup.revoked == {key}
    assert len(parses) == 3  # the whole file and its revoked lines, once each
    path.unlink()  # gone: nothing known, as ssh treats a missing file
    assert KnownHosts([str(path)])("h", "10.0.0.1", 2500) == ([], [], [])


def test_relative_paths_work_through_the_keeper(sshd, tmp_path, rt):
    """--known-hosts, --identity and --ssh-config relative to the command's directory reach the keeper
    and the worker processes (which run from /) as absolute paths: the kept probe is the direct one's."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "kh").write_text(sshd.known_hosts.read_text())
    (work / "key").write_bytes(sshd.client_key.read_bytes())
    os.chmod(work / "key", 0o600)
    (work / "cfg").write_text("# empty\n")
    inv = inventory(tmp_path, sshd, ("n0", "n1"))
    rel = ["--known-hosts", "kh", "--identity", "key", "--ssh-config", "cfg"]
    for persist in ("0", "5m", "5m"):
        out = cli(rt, "-i", str(inv), "probe", "n0", "--json", "--persist", persist, *rel, cwd=work)
        host = hosts_of(out)["n0"]
        assert DECISIVE in (host.get("decisive") or {}).get("line", ""), (persist, host)
    assert pids_with("fleetdiag.ssh.keeper", str(rt)), "the kept probes went through a keeper"
    listed = json.loads(cli(rt, "connections", "--json").stdout)["connections"]
    assert len(listed) == 1 and listed[0]["uses"] == 2
    spread = cli(rt, "-i", str(inv), "probe", "--workers", "2", "all", "--json", "--persist", "0", *rel, cwd=work)
    for host in hosts_of(spread).values():
        assert DECISIVE in (host.get("decisive") or {}).get("line", ""), host


def test_kept_connection_is_closed_when_what_decided_its_trust_changes(sshd, tmp_path, rt):
    """A known_hosts named by an Include'd ssh config file: revoke the key there while the connection is
    kept and the next probe refuses it as a direct probe does; the kept connection is closed. Then an edit
    of the Include'd file itself (another known_hosts, where the key is unknown) is noticed the same way."""
    kh = tmp_path / "kh"
    kh.write_text(sshd.known_hosts.read_text())
    empty = tmp_path / "kh-empty"
    empty.write_text("")
    inc = tmp_path / "conf.d" / "nodes.conf"
    inc.parent.mkdir()
    inc.write_text(f"Host 127.0.0.1\n  UserKnownHostsFile {kh}\n")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Include {inc.parent}/*.conf\n")
    inv = inventory(tmp_path, sshd)
    ssh = ("--identity", str(sshd.client_key), "--ssh-config", str(cfg))

    def probe(persist: str = "5m") -> dict:
        return hosts_of(cli(rt, "-i", str(inv), "probe", "n0", "--json", "--persist", persist, *ssh))["n0"]

    def kept() -> list:
        return json.loads(cli(rt, "connections", "--json").stdout)["connections"]

    for _ in range(2):
        assert DECISIVE in probe()["decisive"]["line"]
    assert [c["uses"] for c in kept()] == [2], "the second probe reused the kept connection"
    kh.write_text(f"@revoked [127.0.0.1]:{sshd.port} {sshd.host_pub}\n")
    kept_now, direct = probe(), probe("0")
    for host in (kept_now, direct):
        assert host["verdict"] == "unreachable" and host["facts"]["error_kind"] == "hostkey-changed", host
    assert kept_now["error"] == direct["error"]
    assert kept() == [], "the connection opened under the old known_hosts is closed"
    kh.write_text(sshd.known_hosts.read_text())
    assert DECISIVE in probe()["decisive"]["line"]
    inc.write_text(f"Host 127.0.0.1\n  UserKnownHostsFile {empty}\n")
    kept_now, direct = probe(), probe("0")
    for host in (kept_now, direct):
        assert host["facts"]["error_kind"] == "hostkey-unknown", host
    assert kept() == []


def test_trust_of_follows_includes_known_hosts_and_key_files(tmp_path, monkeypatch):
    """What decides a kept connection's trust: a new file in an Include'd directory, an edited known_hosts
    named there, a replaced key file each change it; touching a file without changing it does not."""
    from fleetdiag.ssh.reach import TransportOptions
    from fleetdiag.ssh.transport import trust_of

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "conf.d").mkdir()
    kh, key = tmp_path / "kh", tmp_path / "id"
    kh.write_text("")
    key.write_text("k1")
    cfg = tmp_path / "config"
    cfg.write_text(f"Include {tmp_path}/conf.d/*.conf\nHost n0\n  IdentityFile {key}\n")
    opts = TransportOptions(ssh_config=[str(cfg)])

    def now():
        return trust_of("n0", None, None, opts)

    first = now()
    assert str(key) in first.files and str(tmp_path / "conf.d") in first.files
    os.utime(cfg)  # touched, not changed
    assert now().digest == first.digest
    (tmp_path / "conf.d" / "a.conf").write_text(f"Host n0\n  UserKnownHostsFile {kh}\n")
    assert not first.unchanged()
    second = now()
    assert second.digest != first.digest and str(kh) in second.files
    kh.write_text("n0 ssh-ed25519 AAAA\n")
    assert not second.unchanged() and now().digest != second.digest
    third = now()
    os.unlink(key)
    key.write_text("k2")  # another key file in its place
    assert not third.unchanged() and now().digest != third.digest
