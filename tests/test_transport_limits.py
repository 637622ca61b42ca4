"""Limits that protect the controller from a host: output cap, local fd limit, jump chains, file names.

Each test goes through a real OpenSSH sshd on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import resource
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetdiag.cli import main
from fleetdiag.records import UNREACHABLE
from fleetdiag.ssh.reach import MAX_OUTPUT, OVERSIZE
from fleetdiag.watch import Watch

from .sshd import start_sshd
from .test_reliability import make_host, probe, write_log
from .test_watch import Run, inventory, settings


@pytest.fixture(scope="module")
def spam_sshd(tmp_path_factory: pytest.TempPathFactory):
    """A host whose login prints without end, as ``ForceCommand exec yes spam`` does."""
    server = start_sshd(tmp_path_factory.mktemp("spam"), extra_config="ForceCommand exec yes spam\n")
    yield server
    server.stop()


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_probe_of_a_host_that_prints_without_end_is_capped(spam_sshd, tmp_path):
    log = write_log(tmp_path / "v.log", b"INFO fine\n")
    before = _rss_mib()
    res = probe(make_host(spam_sshd.port, log), spam_sshd.opts(command_timeout=60))
    grown = _rss_mib() - before
    assert res.verdict == UNREACHABLE
    assert res.error_kind == OVERSIZE
    assert "MiB of output" in (res.error or "") and "reading stopped" in (res.error or "")
    assert grown < 8 * MAX_OUTPUT / (1024 * 1024), f"peak RSS grew {grown:.0f} MiB"


def test_watch_reports_a_host_that_prints_without_end_as_unreachable(spam_sshd, tmp_path):
    log = tmp_path / "v.log"
    log.write_text("INFO fine\n")
    inv = inventory(spam_sshd, {"spam": {"log": log}})

    async def go() -> None:
        async with Run(Watch(list(inv.hosts.values()), settings(spam_sshd, grace=60.0))) as run:
            await run.state("spam", UNREACHABLE)
            view = run.watch.views["spam"]
            assert "MiB of output" in view.reason

    before = _rss_mib()
    asyncio.run(go())
    assert _rss_mib() - before < 8 * MAX_OUTPUT / (1024 * 1024)


SECRET = "hunter2-SECRET-PW"


@pytest.mark.parametrize(
    ("content", "unparsable"),
    [
        (f"{SECRET}\n", True),
        (f"@{SECRET} host key\n", True),
        (f"machine example.com login bob password {SECRET}\n", False),
    ],
)
def test_a_wrong_known_hosts_file_is_named_never_quoted(sshd, tmp_path, content, unparsable):
    netrc = tmp_path / "netrc"
    netrc.write_text(content)
    res = probe(make_host(sshd.port, tmp_path / "v.log"), sshd.opts(known_hosts=str(netrc)))
    assert res.verdict == UNREACHABLE
    assert SECRET not in (res.error or "")
    if unparsable:  # else asyncssh skips the lines it cannot use: the key is unknown
        assert str(netrc) in (res.error or "") and "not a valid known_hosts file" in (res.error or "")


def test_a_wrong_known_hosts_file_through_the_cli_prints_no_contents(sshd, tmp_path):
    netrc = tmp_path / "netrc"
    netrc.write_text(f"{SECRET}\n")
    log = write_log(tmp_path / "v.log", b"INFO fine\n")
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        f"hosts:\n  h:\n    address: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n"
        f"    logs:\n      v: {log}\n"
    )
    r = CliRunner().invoke(
        main, ["-i", str(inv), "probe", "h", "--known-hosts", str(netrc), "--identity", str(sshd.client_key)]
    )
    assert SECRET not in r.output, r.output
    assert "not a valid known_hosts file" in r.output


@pytest.mark.parametrize("content", [f"{SECRET}\n", f"-----BEGIN OPENSSH PRIVATE KEY-----\n{SECRET}\n"])
def test_a_wrong_identity_file_is_named_never_quoted(sshd, tmp_path, content):
    netrc = tmp_path / "netrc"
    netrc.write_text(content)
    res = probe(make_host(sshd.port, tmp_path / "v.log"), sshd.opts(client_keys=[str(netrc)]))
    assert res.verdict == UNREACHABLE
    assert SECRET not in (res.error or "")
    assert str(netrc) in (res.error or "") and "not a valid private key file" in (res.error or "")


FD_SCRIPT = r"""
import asyncio, json, resource, socket, sys
from fleetdiag.inventory import Host
from fleetdiag.probe import ProbeSettings
from fleetdiag.ssh.reach import TransportOptions
from fleetdiag.ssh.scheduler import probe_many
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(4096)  # never accepts: each connection holds a socket until the connect timeout
port = srv.getsockname()[1]
hosts = [Host(name=f"h{i}", address="127.0.0.1", port=port, logs={"v": "/tmp/x"}) for i in range(400)]
opts = TransportOptions(known_hosts="/dev/null", client_keys=[], ssh_config=[], connect_timeout=1.5)
async def go():
    return [r async for r in probe_many(hosts, ProbeSettings(transport=opts), fanout=2000, per_address=2000)]
res = asyncio.run(go())
print(json.dumps([[r.host, r.error_kind, r.error] for r in res]))
"""


def test_local_fd_limit_is_never_a_host_status(tmp_path):
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    out = subprocess.run([sys.executable, "-c", FD_SCRIPT], capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(rows) == 400
    blamed = [r for r in rows if "file descriptors" in (r[2] or "") or "Too many open files" in (r[2] or "")]
    assert not blamed, blamed[:3]
    assert {r[1] for r in rows} == {"timeout"}, {r[1] for r in rows}


def test_parse_jump_chain_reads_hops_in_order():
    from fleetdiag.ssh.reach import JumpHop, parse_jump_chain

    assert parse_jump_chain("a,bob@b:2222,[::1]:22,c@[fe80::1]") == [
        JumpHop("a"),
        JumpHop("b", 2222, "bob"),
        JumpHop("::1", 22),
        JumpHop("fe80::1", None, "c"),
    ]
    for bad in ("a,,b", "a:xx", "[::1", "@a", "a:70000", ""):
        with pytest.raises(ValueError):
            parse_jump_chain(bad)


def test_two_hop_jump_chain_connects_and_probes(sshd, tmp_path):
    log = write_log(tmp_path / "v.log", b"INFO fine\n")
    hop = f"{sshd.user}@127.0.0.1:{sshd.port}"
    res = probe(make_host(sshd.port, log, user=sshd.user, jump=f"{hop},{hop}"), sshd.opts())
    assert res.verdict != UNREACHABLE, res.error
    bad = probe(make_host(sshd.port, log, user=sshd.user, jump=f"{hop},127.0.0.1:1"), sshd.opts())
    assert bad.verdict == UNREACHABLE and "127.0.0.1:1" in (bad.error or ""), bad.error
