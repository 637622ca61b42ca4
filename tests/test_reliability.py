"""The fault matrix (docs/reliability.md): every fault a fleet throws, one test each.

Each test drives the real code path: the real OpenSSH sshd fixture where
sshd can produce the fault, the in-process asyncssh fault server
(tests/faults.py) where it cannot, and the real remote funnel script on
every log fault. Each asserts what the user sees: the host's verdict, a
plain-words reason, and that a result exists for every host.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetdiag.analysis import load_rules
from fleetdiag.cli import main
from fleetdiag.inventory import Host
from fleetdiag.probe import ProbeSettings, probe_host
from fleetdiag.records import FAILED, NO_LOG, UNREACHABLE, HostResult
from fleetdiag.ssh.scheduler import probe_many
from fleetdiag.ssh.transport import (
    AUTH,
    DNS,
    HOSTKEY_CHANGED,
    HOSTKEY_UNKNOWN,
    JUMP,
    KEY,
    REFUSED,
    TIMEOUT,
    HostError,
    connect,
)

from .faults import Behaviour, FaultServer, FreezeProxy, MuteServer, SilentPort
from .slack import slack
from .sshd import free_port, keygen, start_sshd

DEMO = Path(__file__).resolve().parent.parent / "fleetdiag" / "data" / "demo"
SEED = (DEMO / "dp_rank.log").read_bytes()
HEALTHY_LOG = (DEMO / "healthy.log").read_bytes()
DECISIVE = "AssertionError: DP adjusted local rank 3 is out of bounds"
RULES = load_rules(user_default=False)
BUSYBOX = shutil.which("busybox")


# ----------------------------------------------------------------------------- helpers


def make_host(port: int, log: str | Path, name: str = "h", user: str | None = None, **kw) -> Host:
    return Host(name=name, address="127.0.0.1", port=port, user=user, logs={"vllm": str(log)}, **kw)


def probe(host: Host, opts, **kw) -> HostResult:
    return asyncio.run(probe_host(host, ProbeSettings(transport=opts, rules=RULES, **kw)))


def write_log(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def probe_via_fault(
    tmp: Path, log: Path | str, behaviour: Behaviour | None = None, authorize: bool = True, **opts
) -> tuple[HostResult, float]:
    async def go() -> tuple[HostResult, float]:
        async with FaultServer(tmp / "srv", behaviour or Behaviour(), authorize_client=authorize) as srv:
            t0 = time.monotonic()
            res = await probe_host(make_host(srv.port, log), ProbeSettings(transport=srv.opts(**opts), rules=RULES))
            return res, time.monotonic() - t0

    return asyncio.run(go())


def toolbox(where: Path, omit: set[str] = frozenset(), shims: dict[str, str] | None = None) -> Path:
    """A PATH directory with this machine's tools, less ``omit``, plus shell-script ``shims``."""
    where.mkdir(parents=True, exist_ok=True)
    for d in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            target = where / name
            if name in omit or target.exists() or target.is_symlink():
                continue
            full = os.path.join(d, name)
            if os.access(full, os.X_OK) and not os.path.isdir(full):
                target.symlink_to(full)
    for name, body in (shims or {}).items():
        target = where / name
        if target.is_symlink() or target.exists():
            target.unlink()
        target.write_text("#!/bin/sh\n" + body)
        target.chmod(0o755)
    return where


def busybox_box(where: Path) -> Path:
    """A PATH directory where every tool, sh included, is a busybox applet (an Alpine-like node)."""
    assert BUSYBOX
    where.mkdir(parents=True, exist_ok=True)
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for a in applets:
        (where / a).symlink_to(BUSYBOX)
    return where


def world_dir() -> Path:
    """A directory an unprivileged user can enter (pytest's tmp dirs are 0700)."""
    d = Path(tempfile.mkdtemp(prefix="fleetdiag-rel-", dir="/tmp"))
    d.chmod(0o755)
    return d


AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/bin/sh", "-c"]
needs_busybox = pytest.mark.skipif(BUSYBOX is None, reason="busybox not installed (scripts/test installs it)")


# ============================================================================ network


def test_connection_refused(sshd, tmp_path):
    res = probe(make_host(free_port(), tmp_path / "x.log"), sshd.opts())
    assert res.verdict == UNREACHABLE
    assert res.error_kind == REFUSED
    assert "connection refused" in res.error and "is sshd listening" in res.error


def test_name_does_not_resolve(sshd, tmp_path, monkeypatch):
    # This sandbox (and CI) must send no DNS traffic: answer as the resolver does for an
    # unknown name, and refuse any name at all so no query can leave.
    real = socket.getaddrinfo

    def resolver(host, *a, **kw):
        if host in ("127.0.0.1", "::1", "localhost", None):
            return real(host, *a, **kw)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    h = Host(name="ghost", address="gpu-ghost.invalid", port=22, logs={"vllm": "/x.log"})
    res = probe(h, sshd.opts())
    assert res.verdict == UNREACHABLE
    assert res.error_kind == DNS
    assert "'gpu-ghost.invalid' does not resolve" in res.error and "Name or service not known" in res.error


def test_connect_timeout_port_that_accepts_nothing(sshd, tmp_path):
    port = SilentPort()
    try:
        t0 = time.monotonic()
        res = probe(make_host(port.port, tmp_path / "x.log"), sshd.opts(connect_timeout=1))
        took = time.monotonic() - t0
    finally:
        port.close()
    assert res.verdict == UNREACHABLE and res.error_kind == TIMEOUT
    assert "timed out after 1s" in res.error
    assert took < 6, took


def test_connect_timeout_tcp_open_but_no_ssh_banner(sshd, tmp_path):
    mute = MuteServer()
    try:
        t0 = time.monotonic()
        res = probe(make_host(mute.port, tmp_path / "x.log"), sshd.opts(connect_timeout=1))
        took = time.monotonic() - t0
    finally:
        mute.close()
    assert res.verdict == UNREACHABLE and res.error_kind == TIMEOUT
    assert took < 6, took


def test_host_hangs_after_auth(sshd, tmp_path):
    """Logged in over real sshd, then the host freezes: nothing comes back, the TCP stays open."""
    log = write_log(tmp_path / "vllm.log", SEED)

    async def go():
        proxy = await FreezeProxy(sshd.port).start()
        sshd.trust(proxy.port)
        opts = sshd.opts(command_timeout=1.5)
        try:
            conn = await connect("127.0.0.1", proxy.port, sshd.user, opts)
            proxy.freeze()
            t0 = time.monotonic()
            res = await probe_host(make_host(proxy.port, log), ProbeSettings(transport=opts, rules=RULES), conn=conn)
            conn.close()
            return res, time.monotonic() - t0
        finally:
            await proxy.stop()

    res, took = asyncio.run(go())
    assert res.verdict == UNREACHABLE
    assert res.error_kind == TIMEOUT
    assert "no answer within 1.5s" in res.error and "stopped answering" in res.error
    assert took < 6, took


def test_host_hangs_after_the_command_started(tmp_path):
    res, took = probe_via_fault(tmp_path, "/x.log", Behaviour(hang=True), command_timeout=1.5)
    assert res.verdict == UNREACHABLE
    assert res.error == "no output within 1.5s: the command started, then the host went silent"
    assert res.markers == []
    assert took < 6, took


def test_connection_dropped_mid_output_is_the_hosts_error_not_a_verdict(tmp_path):
    log = write_log(tmp_path / "vllm.log", SEED)
    res, _ = probe_via_fault(tmp_path, log, Behaviour(drop_after=3000))
    # the first 3 KB held the decisive worker's lines, but the funnel never reached its end marker:
    # half a log is never a verdict (the part that never came may hold the error); what it showed is a note
    assert res.verdict == UNREACHABLE and res.decisive is None
    assert res.error_kind == "closed"
    assert "lost after 2.9 KB of output" in res.error, res.error
    assert any(m.startswith("before the cut the log showed: ") and DECISIVE in m for m in res.markers), res.markers


def test_connection_dropped_before_any_output(tmp_path):
    log = write_log(tmp_path / "vllm.log", SEED)
    res, _ = probe_via_fault(tmp_path, log, Behaviour(drop_after=0))
    assert res.verdict == UNREACHABLE
    assert "lost after 0 B of output" in res.error


def test_slow_output_within_the_timeout_is_complete(tmp_path):
    log = write_log(tmp_path / "vllm.log", SEED)
    res, took = probe_via_fault(tmp_path, log, Behaviour(chunk=2048, chunk_delay=0.05), command_timeout=10)
    assert res.verdict == FAILED and DECISIVE in res.decisive.line
    assert not any("ended early" in m or "timed out" in m for m in res.markers), res.markers
    assert took > 0.2  # it really trickled


def test_slow_output_past_the_timeout_is_the_hosts_error(tmp_path):
    log = write_log(tmp_path / "vllm.log", SEED)
    res, took = probe_via_fault(tmp_path, log, Behaviour(chunk=1024, chunk_delay=0.25), command_timeout=1.5)
    assert took < 6
    assert res.verdict == UNREACHABLE  # whatever arrived is not a verdict, and it says why
    assert res.error.startswith("command timed out after 1.5s; output stopped after"), res.error


def test_jump_host_down(sshd, tmp_path):
    log = write_log(tmp_path / "vllm.log", SEED)
    dead = free_port()
    res = probe(make_host(sshd.port, log, user=sshd.user, jump=f"{sshd.user}@127.0.0.1:{dead}"), sshd.opts())
    assert res.verdict == UNREACHABLE and res.error_kind == JUMP
    assert res.error.startswith(f"jump host 127.0.0.1:{dead}: connection refused")


def test_jump_host_up_but_target_refused(sshd, tmp_path):
    log = write_log(tmp_path / "vllm.log", SEED)
    dead = free_port()
    res = probe(make_host(dead, log, user=sshd.user, jump=f"{sshd.user}@127.0.0.1:{sshd.port}"), sshd.opts())
    assert res.verdict == UNREACHABLE and res.error_kind == REFUSED
    assert f"jump host 127.0.0.1:{sshd.port} could not reach 127.0.0.1:{dead}" in res.error


def test_jump_host_works(sshd, tmp_path):
    """Control for the two above: the same sshd as its own bastion."""
    log = write_log(tmp_path / "vllm.log", SEED)
    res = probe(make_host(sshd.port, log, user=sshd.user, jump=f"{sshd.user}@127.0.0.1:{sshd.port}"), sshd.opts())
    assert res.verdict == FAILED and DECISIVE in res.decisive.line


# ============================================================================ auth and trust


def test_key_refused(sshd, tmp_path):
    stranger = keygen(tmp_path / "stranger_ed25519")
    res = probe(make_host(sshd.port, tmp_path / "x.log", user=sshd.user), sshd.opts(client_keys=[str(stranger)]))
    assert res.verdict == UNREACHABLE and res.error_kind == AUTH
    assert "authentication refused" in res.error and str(stranger) in res.error


def test_host_key_unknown_is_a_status_and_accept_new_trusts_it(sshd, tmp_path):
    log = write_log(tmp_path / "vllm.log", SEED)
    known = tmp_path / "known_hosts"
    known.write_text("")
    h = make_host(sshd.port, log, user=sshd.user)
    res = probe(h, sshd.opts(known_hosts=str(known)))
    assert res.verdict == UNREACHABLE and res.error_kind == HOSTKEY_UNKNOWN
    assert "host key unknown" in res.error and "--accept-new" in res.error and "SHA256:" in res.error
    assert known.read_text() == ""  # nothing trusted behind the user's back
    res = probe(h, sshd.opts(known_hosts=str(known), accept_new=True))
    assert res.verdict == FAILED
    assert known.read_text().startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")
    res = probe(h, sshd.opts(known_hosts=str(known)))  # remembered: no flag needed any more
    assert res.verdict == FAILED


def _other_key_line(tmp_path: Path, port: int) -> str:
    other = keygen(tmp_path / "other_host_ed25519")
    kind, blob = Path(str(other) + ".pub").read_text().split()[:2]
    return f"[127.0.0.1]:{port} {kind} {blob}\n"


def test_host_key_changed_is_refused_loudly_even_with_accept_new(sshd, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text(_other_key_line(tmp_path, sshd.port))
    before = known.read_bytes()
    for accept_new in (False, True):
        res = probe(
            make_host(sshd.port, tmp_path / "x.log", user=sshd.user),
            sshd.opts(known_hosts=str(known), accept_new=accept_new),
        )
        assert res.verdict == UNREACHABLE and res.error_kind == HOSTKEY_CHANGED
        assert res.error.startswith("HOST KEY CHANGED for 127.0.0.1:")
        assert "never accepted" in res.error and str(known) in res.error
    assert known.read_bytes() == before


def test_host_key_changed_in_ssh_config_known_hosts_file(sshd, tmp_path, monkeypatch):
    """The known_hosts named by ~/.ssh/config's UserKnownHostsFile counts too: a changed key
    there is refused even with --accept-new, and nothing is written anywhere."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    known = tmp_path / "config_known_hosts"
    known.write_text(_other_key_line(tmp_path, sshd.port))
    before = known.read_bytes()
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Host gpu-alias\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.client_key}\n  UserKnownHostsFile {known}\n"
    )
    opts = sshd.opts(known_hosts=None, client_keys=None, ssh_config=[str(cfg)], accept_new=True)
    with pytest.raises(HostError) as err:
        asyncio.run(connect("gpu-alias", opts=opts))
    assert err.value.kind == HOSTKEY_CHANGED and str(known) in str(err.value)
    assert known.read_bytes() == before
    assert not (tmp_path / "home" / ".ssh" / "known_hosts").exists()
    # unknown there (empty file) + --accept-new: trusted into that same file, as ssh does
    known.write_text("")

    async def twice():
        c = await connect("gpu-alias", opts=opts)
        c.close()
        c = await connect("gpu-alias", opts=sshd.opts(known_hosts=None, client_keys=None, ssh_config=[str(cfg)]))
        c.close()

    asyncio.run(twice())
    assert known.read_text().startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")


def test_agent_missing_says_so(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "empty-home"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    h = make_host(sshd.port, tmp_path / "x.log", user=sshd.user)
    res = probe(h, sshd.opts(client_keys=None, ssh_config=[]))
    assert res.verdict == UNREACHABLE and res.error_kind == AUTH
    assert "no ssh-agent (SSH_AUTH_SOCK is not set)" in res.error
    assert "no default key" in res.error and "--identity KEYFILE" in res.error
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "gone.sock"))
    res = probe(h, sshd.opts(client_keys=None, ssh_config=[]))
    assert res.verdict == UNREACHABLE and res.error_kind == AUTH
    assert f"SSH_AUTH_SOCK={tmp_path / 'gone.sock'} does not exist" in res.error


def test_agent_present_is_used(sshd, tmp_path, monkeypatch):
    """Control for the one above: the same setup with a running agent holding the key."""
    if not shutil.which("ssh-agent"):
        pytest.skip("no ssh-agent")
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.02)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", str(sshd.client_key)], env=env, check=True, capture_output=True)
        monkeypatch.setenv("HOME", str(tmp_path / "empty-home"))
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        log = write_log(tmp_path / "vllm.log", SEED)
        res = probe(make_host(sshd.port, log, user=sshd.user), sshd.opts(client_keys=None, ssh_config=[]))
        assert res.verdict == FAILED, res.error
    finally:
        agent.terminate()
        agent.wait(5)


def test_encrypted_key_without_passphrase(sshd, tmp_path):
    key = tmp_path / "locked_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "s3cret-phrase", "-f", str(key)], check=True)
    res = probe(make_host(sshd.port, tmp_path / "x.log", user=sshd.user), sshd.opts(client_keys=[str(key)]))
    assert res.verdict == UNREACHABLE and res.error_kind == KEY
    assert "cannot load a client key" in res.error and "FLEETDIAG_PASSPHRASE" in res.error


# ============================================================================ the log


def test_log_missing(sshd, tmp_path):
    missing = tmp_path / "nope" / "vllm.log"
    res = probe(make_host(sshd.port, missing, user=sshd.user), sshd.opts())
    assert res.verdict == NO_LOG and res.error == f"log not found: {missing}"


@pytest.mark.skipif(shutil.which("setpriv") is None and os.geteuid() == 0, reason="needs setpriv to drop root")
def test_log_unreadable_permissions(tmp_path):
    """Root reads everything, so the remote user here is `nobody` (setpriv in the fault server)."""
    d = world_dir()
    try:
        log = write_log(d / "vllm.log", SEED)
        log.chmod(0o600)
        if os.geteuid() != 0:
            log.chmod(0o000)
        b = Behaviour(argv=AS_NOBODY if os.geteuid() == 0 else ["/bin/sh", "-c"], cwd="/", env={"HOME": "/nonexistent"})
        res, _ = probe_via_fault(tmp_path, log, b)
        assert res.verdict == NO_LOG
        assert res.error == f"log unreadable: {log} (permission denied)"
        # a directory the user may not enter: said as such, not "not found"
        inner = d / "private"
        inner.mkdir()
        write_log(inner / "vllm.log", SEED)
        inner.chmod(0o700 if os.geteuid() == 0 else 0o000)
        res, _ = probe_via_fault(tmp_path, inner / "vllm.log", b)
        assert res.verdict == NO_LOG
        assert f"permission denied: cannot enter {inner}" in res.error
    finally:
        for p in d.rglob("*"):
            p.chmod(0o700)
        shutil.rmtree(d)


def test_log_empty(sshd, tmp_path):
    log = write_log(tmp_path / "vllm.log", b"")
    res = probe(make_host(sshd.port, log, user=sshd.user), sshd.opts())
    assert res.verdict == NO_LOG and res.error == f"log is empty: {log}"


def test_log_binary(sshd, tmp_path):
    import gzip

    for name, data in (("vllm.log", bytes(range(256)) * 64), ("vllm.log.1.gz", gzip.compress(SEED * 4))):
        log = write_log(tmp_path / name, data)
        res = probe(make_host(sshd.port, log, user=sshd.user), sshd.opts())
        assert res.verdict == NO_LOG and res.error.startswith(f"log looks binary: {log} ("), res.error
        assert "control bytes in the last" in res.error
    # NUL padding after a crash (preallocated blocks) does not make a text log binary
    log = write_log(tmp_path / "padded.log", SEED + b"\0" * 4096)
    res = probe(make_host(sshd.port, log, user=sshd.user), sshd.opts())
    assert res.verdict == FAILED and DECISIVE in res.decisive.line


def test_log_with_non_utf8_bytes(sshd, tmp_path):
    data = SEED.replace(b"out of bounds", b"out of b\xe9\xff\xfeunds").replace(
        b"non-default args", b"non-default args \xc3\x28"
    )
    log = write_log(tmp_path / "vllm.log", data)
    res = probe(make_host(sshd.port, log, user=sshd.user), sshd.opts())
    assert res.verdict == FAILED
    assert "AssertionError: DP adjusted local rank 3 is out of b\ufffd\ufffd\ufffdunds" in res.decisive.line
    json.dumps(res.to_json())  # every output format can carry it


def test_log_single_1mb_line_keeps_both_ends(sshd, tmp_path):
    huge = b"RuntimeError: shape mismatch: " + b"1234567890" * 100_000 + b" END-OF-THE-LINE"
    data = (
        b"INFO 05-09 15:14:00 [api_server.py:1] vLLM API server version 0.9.0\n"
        b"Traceback (most recent call last):\n"
        b'  File "/app/serve.py", line 3, in <module>\n' + huge + b"\n"
    )
    log = write_log(tmp_path / "vllm.log", data)
    res = probe(make_host(sshd.port, log, user=sshd.user), sshd.opts())
    assert res.verdict == FAILED
    line = res.decisive.line
    assert line.startswith("RuntimeError: shape mismatch: 1234567890")
    assert line.endswith("END-OF-THE-LINE")
    assert "...[fleetdiag: " in line and " bytes cut]..." in line
    assert res.timing.bytes < 64 * 1024  # the 1 MB line did not travel


def test_log_whose_last_line_outruns_the_tail_window_is_read_not_empty(sshd, tmp_path, write_inventory):
    """A log whose last 32 KiB hold no line break (one JSON record of 1 MB ends it): the end of that line is
    read and the card says so, instead of a healthy 'no log lines to analyse'."""
    log = write_log(tmp_path / "app.log", b"starting\n" + b'{"msg": "' + b"x" * 1_000_000 + b' END-OF-THE-LINE"}\n')
    inv = write_inventory({"gpu01": str(log)})
    r = CliRunner().invoke(main, ["-i", str(inv), "probe", "gpu01", "--json", *sshd.cli_args()])
    (host,) = json.loads(r.output)["hosts"]
    assert host["summary"] != "no log lines to analyse", host
    assert host["summary"].endswith("(1 lines read)"), host
    assert any("hold no line break: the end of one longer line is shown" in m for m in host["markers"]), host
    assert host["timing"]["bytes"] < 64 * 1024  # the 1 MB line did not travel
    card = CliRunner().invoke(main, ["-i", str(inv), "probe", "gpu01", *sshd.cli_args()], env={"COLUMNS": "200"})
    assert "hold no line break" in card.output, card.output


def _sparse_10g(path: Path, tail: bytes) -> int:
    size = 10 * 1024**3
    with open(path, "wb") as fh:
        fh.truncate(size)
        fh.seek(size - len(tail))
        fh.write(tail)
    return size


def test_log_10gb_bounded_time_and_payload(sshd, tmp_path):
    log = tmp_path / "vllm.log"
    size = _sparse_10g(log, SEED)
    t0 = time.monotonic()
    res = probe(make_host(sshd.port, log, user=sshd.user), sshd.opts())
    took = time.monotonic() - t0
    assert res.verdict == FAILED and DECISIVE in res.decisive.line
    offset = SEED.index(DECISIVE.encode())
    assert res.decisive.pos == size - len(SEED) + SEED.rindex(b"\n", 0, offset) + 1  # exact, past 2**32
    assert res.decisive.lineno is None  # the window did not reach the file's start: no line numbers claimed
    assert res.timing.bytes < 256 * 1024, res.timing.bytes
    assert took < 5, took


def _rotating_tail(log: Path, action: str, state: Path) -> dict[str, str]:
    """A `tail` that changes the log under the funnel once, just before the tail pass
    (after the keyword pass; the binary sample is `tail -c 8192`, the context reads `tail -c +N`).
    Only a tail of the log itself counts (the pinned /dev/fd/3 or its path): the kernel part, which
    runs beside the funnel, tails its own streams."""
    change = {
        "rotate": f'mv "{log}" "{log}.1"; printf "fresh run\\n" > "{log}"',
        "truncate": f': > "{log}"',
    }[action]
    real = shutil.which("tail")
    return {
        "tail": f"""for last in "$@"; do :; done
case $last in /dev/fd/3|"{log}") ;; *) exec {real} "$@" ;; esac
case $2 in 8192|+*) ;; *) if ! [ -e "{state}" ]; then : > "{state}"; {change}; fi ;; esac
exec {real} "$@"
"""
    }


def test_log_rotated_while_being_read(tmp_path):
    log = write_log(tmp_path / "vllm.log", SEED)
    box = toolbox(tmp_path / "box", shims=_rotating_tail(log, "rotate", tmp_path / "tail.count"))
    res, _ = probe_via_fault(tmp_path, log, Behaviour(env={"PATH": str(box)}))
    assert (tmp_path / "vllm.log.1").exists() and log.read_bytes() == b"fresh run\n"  # it really rotated
    # every pass read the file as it was opened: the answer is whole, and the note says why
    assert res.verdict == FAILED and DECISIVE in res.decisive.line
    assert any(DECISIVE in ln for ln in res.decisive.traceback)
    assert any("rotated while it was read: shown as it was when opened" in m for m in res.markers), res.markers


def test_log_truncated_while_being_read(tmp_path):
    log = write_log(tmp_path / "vllm.log", SEED)
    box = toolbox(tmp_path / "box", shims=_rotating_tail(log, "truncate", tmp_path / "tail.count"))
    res, _ = probe_via_fault(tmp_path, log, Behaviour(env={"PATH": str(box)}))
    assert log.stat().st_size == 0
    assert any(f"truncated while it was read ({len(SEED)} -> 0 bytes)" in m for m in res.markers), res.markers
    assert res.verdict == FAILED and DECISIVE in res.decisive.line  # the keyword pass had it already


def test_log_glob_matching_nothing(sshd, tmp_path):
    pattern = f"{tmp_path}/logs/vllm-*.log"
    (tmp_path / "logs").mkdir()
    res = probe(make_host(sshd.port, pattern, user=sshd.user), sshd.opts())
    assert res.verdict == NO_LOG and res.error == f"no file matches the log pattern {pattern}"


def test_log_glob_picks_the_newest_match(sshd, tmp_path):
    (tmp_path / "logs").mkdir()
    old = write_log(tmp_path / "logs" / "vllm-1.log", HEALTHY_LOG)
    new = write_log(tmp_path / "logs" / "vllm-2.log", SEED)
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    res = probe(make_host(sshd.port, f"{tmp_path}/logs/vllm-*.log", user=sshd.user), sshd.opts())
    assert res.log == str(new) and res.verdict == FAILED


def test_log_is_a_fifo_or_directory_is_not_read(sshd, tmp_path):
    fifo = tmp_path / "vllm.log"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    res = probe(make_host(sshd.port, fifo, user=sshd.user), sshd.opts(command_timeout=30))
    assert time.monotonic() - t0 < 10  # reading a FIFO would block until the 30 s timeout
    assert res.verdict == NO_LOG and "not a regular file" in res.error
    res = probe(make_host(sshd.port, tmp_path, user=sshd.user), sshd.opts())
    assert res.verdict == NO_LOG and "is a directory" in res.error


# ============================================================================ the remote host


def _gnu_lines(log: Path) -> list[tuple[int, str]]:
    from fleetdiag.probe import spec_for
    from fleetdiag.remote.funnel import run_local

    fr = run_local(spec_for(str(log), RULES))
    return [(ln.pos, ln.text) for ln in fr.lines()]


@needs_busybox
def test_busybox_node_no_gnu_grep(tmp_path):
    """Every tool a busybox applet (sh, grep without -b, awk, tail, stat …), like an Alpine node."""
    log = write_log(tmp_path / "vllm.log", SEED)
    box = busybox_box(tmp_path / "bb")
    b = Behaviour(argv=[str(box / "sh"), "-c"], env={"PATH": str(box)})
    res, _ = probe_via_fault(tmp_path, log, b)
    assert res.verdict == FAILED and DECISIVE in res.decisive.line
    assert "no GNU grep: awk scan" in res.markers
    assert res.decisive.pos == next(p for p, t in _gnu_lines(log) if DECISIVE in t)


@needs_busybox
def test_busybox_node_10gb_log(tmp_path):
    """busybox tail takes no offset past 2 GiB and its awk splits on NUL: both handled."""
    log = tmp_path / "vllm.log"
    size = _sparse_10g(log, SEED)
    box = busybox_box(tmp_path / "bb")
    t0 = time.monotonic()
    res, _ = probe_via_fault(tmp_path, log, Behaviour(argv=[str(box / "sh"), "-c"], env={"PATH": str(box)}))
    assert res.verdict == FAILED and DECISIVE in res.decisive.line
    assert res.decisive.pos > size - len(SEED)
    assert time.monotonic() - t0 < 8


def test_grep_without_byte_offsets_falls_back_to_awk(tmp_path):
    """Without busybox: GNU tools, but a grep that rejects -b. Same lines, same positions."""
    log = write_log(tmp_path / "vllm.log", SEED)
    grep = shutil.which("grep")
    box = toolbox(
        tmp_path / "box",
        shims={
            "grep": f"""for a in "$@"; do [ "$a" = -b ] && {{ echo "grep: invalid option -- 'b'" >&2; exit 2; }}; done
exec {grep} "$@"
"""
        },
    )
    res, _ = probe_via_fault(tmp_path, log, Behaviour(env={"PATH": str(box)}))
    assert res.verdict == FAILED and DECISIVE in res.decisive.line
    assert "no GNU grep: awk scan" in res.markers
    assert res.decisive.pos == next(p for p, t in _gnu_lines(log) if DECISIVE in t)


@pytest.mark.parametrize("missing", ["ionice", "timeout", "renice"])
def test_node_without_tool(tmp_path, missing):
    from fleetdiag.probe import spec_for
    from fleetdiag.remote import funnel as funnel_mod

    log = write_log(tmp_path / "vllm.log", SEED)
    box = toolbox(tmp_path / "box", omit={missing})

    async def go():
        async with FaultServer(tmp_path / "srv", Behaviour(env={"PATH": str(box)})) as srv:
            res = await probe_host(make_host(srv.port, log), ProbeSettings(transport=srv.opts(), rules=RULES))
            conn = await connect("127.0.0.1", srv.port, None, srv.opts())
            try:
                mark = funnel_mod.new_mark()
                out, *_ = await conn.run(
                    funnel_mod.remote_command(funnel_mod.build_script(spec_for(str(log), RULES), mark)), 30
                )
            finally:
                conn.close()
            return res, funnel_mod.parse_output(out.decode(), mark)

    res, fr = asyncio.run(go())
    assert res.verdict == FAILED and DECISIVE in res.decisive.line
    assert res.markers == []
    tools = fr.facts["remote"]["tools"].split()
    assert missing not in tools  # really absent on this "node"
    if missing == "renice":
        assert fr.facts["remote"]["nice"] == str(os.nice(0))  # ran, just not niced further


def test_login_shell_prints_banner_and_junk(tmp_path):
    log = write_log(tmp_path / "vllm.log", SEED)
    junk = (
        b"Welcome to gpu-node-17!\n*** maintenance tonight ***\n"
        b"M\tstatus\tmissing\nL\t0\t1\tTraceback (most recent call last):\n"
        b"@@FD:000000000000 begin 1\nno newline at the end"
    )
    res, _ = probe_via_fault(tmp_path, log, Behaviour(prefix=junk, suffix=b"L\t1\t1\tRuntimeError: logout junk\nbye\n"))
    assert res.verdict == FAILED and DECISIVE in res.decisive.line
    assert "logout junk" not in json.dumps(res.to_json())
    assert res.markers == []


@pytest.fixture(scope="module")
def chatty_sshd(tmp_path_factory):
    """Real sshd + the real bash login shell with a $HOME/.bashrc that echoes, and a pre-auth Banner."""
    d = tmp_path_factory.mktemp("chatty")
    home = d / "home"
    home.mkdir()
    (home / ".bashrc").write_text(
        'echo "Welcome (from .bashrc)"\nprintf "M\\tstatus\\tmissing\\n"\nprintf "half a line without newline"\n'
    )
    (d / "banner").write_text("Authorized use only. All activity is logged.\n")
    server = start_sshd(d / "sshd", f"SetEnv HOME={home}\nBanner {d / 'banner'}\n")
    yield server
    server.stop()


@pytest.mark.skipif(not os.path.exists("/bin/bash"), reason="needs bash as the login shell")
def test_bashrc_that_echoes(chatty_sshd, tmp_path):
    import pwd

    if not pwd.getpwnam(chatty_sshd.user).pw_shell.endswith("bash"):
        pytest.skip("the login shell of this user is not bash")
    log = write_log(tmp_path / "vllm.log", SEED)
    res = probe(make_host(chatty_sshd.port, log, user=chatty_sshd.user), chatty_sshd.opts())

    async def raw():
        c = await connect("127.0.0.1", chatty_sshd.port, chatty_sshd.user, chatty_sshd.opts())
        try:
            return (await c.run("true", 10))[0]
        finally:
            c.close()

    assert b"Welcome (from .bashrc)" in asyncio.run(raw())  # the fault is real: bash ran the .bashrc
    assert res.verdict == FAILED and DECISIVE in res.decisive.line
    assert res.markers == []


def test_pattern_the_remote_grep_rejects_is_flagged_not_silently_healthy(tmp_path):
    """A keyword or run_start ERE this host's grep cannot parse would make every pass come back empty."""
    from fleetdiag.probe import spec_for
    from fleetdiag.remote.funnel import run_local

    log = write_log(tmp_path / "vllm.log", SEED)
    spec = spec_for(str(log), RULES)
    spec.keywords, spec.run_start = "Error|(unbalanced", "[z-a]"
    fr = run_local(spec)
    assert "the remote grep rejected the keyword pattern: error lines may be missing" in fr.markers
    assert "the remote grep rejected the run_start pattern: the latest run may not be found" in fr.markers


def test_login_shell_that_is_not_posix(tmp_path):
    """A csh-style login shell rejects the quoted multi-line command: said in plain words."""
    fake_csh = ["/bin/sh", "-c", 'echo "Unmatched \'." >&2; exit 1', "csh"]
    res, _ = probe_via_fault(tmp_path, "/x.log", Behaviour(argv=fake_csh))
    assert res.verdict == NO_LOG
    assert "exit status 1: Unmatched '." in res.error


# ============================================================================ the contract


def test_every_host_is_reported_with_a_plain_reason_and_the_exit_code(sshd, tmp_path):
    good = write_log(tmp_path / "good.log", SEED)
    healthy = write_log(tmp_path / "healthy.log", HEALTHY_LOG)
    inv = tmp_path / "inventory.yaml"

    def write(hosts: dict[str, tuple[int, Path]]) -> None:
        lines = ["hosts:"]
        for name, (port, log) in hosts.items():
            lines += [
                f"  {name}:",
                "    address: 127.0.0.1",
                f"    port: {port}",
                f"    user: {sshd.user}",
                "    logs:",
                f"      vllm: {log}",
            ]
        inv.write_text("\n".join(lines) + "\n")

    args = [
        "-i",
        str(inv),
        "probe",
        "all",
        "--json",
        *sshd.cli_args(),
        "--connect-timeout",
        "3",
    ]
    dead = free_port()
    write(
        {
            "ok": (sshd.port, healthy),
            "bad": (sshd.port, good),
            "down": (dead, good),
            "nolog": (sshd.port, tmp_path / "absent.log"),
        }
    )
    r = CliRunner().invoke(main, args)
    doc = json.loads(r.output)
    got = {h["host"]: h for h in doc["hosts"]}
    assert set(got) == {"ok", "bad", "down", "nolog"}
    assert r.exit_code == 1  # a failure found wins
    assert got["down"]["verdict"] == UNREACHABLE and "connection refused" in got["down"]["error"]
    assert got["nolog"]["verdict"] == NO_LOG and "log not found" in got["nolog"]["error"]
    write({"ok": (sshd.port, healthy), "down": (dead, good), "nolog": (sshd.port, tmp_path / "absent.log")})
    assert CliRunner().invoke(main, args).exit_code == 3  # nothing failed, some host unreachable
    write({"ok": (sshd.port, healthy)})
    assert CliRunner().invoke(main, args).exit_code == 0


def test_many_faults_at_once_all_reported(sshd, tmp_path):
    """One of each network fault in the same run: every host gets its own answer, none waits on another."""
    good = write_log(tmp_path / "good.log", SEED)
    silent = SilentPort()
    k = slack()  # this machine's load: every budget below scales with it, the faults stay the same

    async def go():
        async with FaultServer(tmp_path / "hang", Behaviour(hang=True)) as hanger:
            known = tmp_path / "known_hosts"  # the session sshd's file stays as it was
            known.write_text(sshd.known_hosts.read_text() + hanger.known_line())
            hosts = [
                make_host(sshd.port, good, "good", user=sshd.user),
                make_host(free_port(), good, "refused"),
                make_host(silent.port, good, "silent"),
                Host(name="hang", address="127.0.0.1", port=hanger.port, user="root", logs={"vllm": str(good)}),
            ]
            keys = [str(sshd.client_key), str(hanger.client_key_path)]
            settings = ProbeSettings(  # the good host's funnel must end within the command timeout, even here
                transport=sshd.opts(
                    connect_timeout=1 * k, command_timeout=1.5 * k, client_keys=keys, known_hosts=str(known)
                ),
                rules=RULES,
            )
            t0 = time.monotonic()
            out = [r async for r in probe_many(hosts, settings, deadline=10 * k)]
            return out, time.monotonic() - t0

    try:
        results, took = asyncio.run(go())
    finally:
        silent.close()
    got = {r.host: r for r in results}
    assert set(got) == {"good", "refused", "silent", "hang"}
    assert got["good"].verdict == FAILED
    assert {got[h].verdict for h in ("refused", "silent", "hang")} == {UNREACHABLE}
    assert all(got[h].error for h in ("refused", "silent", "hang"))
    assert took < 8 * k, (took, k)


# ============================================================================ the controller
# Ctrl-C during a sweep, two sweeps at once and a corrupted history database are
# covered through the real CLI in tests/test_fleet.py (see docs/reliability.md);
# here: a locked history and a full disk, end to end.


def _sweep_setup(sshd, tmp_path: Path) -> tuple[Path, list[str]]:
    log = write_log(tmp_path / "vllm.log", SEED)
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        f"hosts:\n  gpu01:\n    address: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n"
        f"    logs: {{vllm: {log}}}\n  gpu02:\n    address: 127.0.0.1\n    port: {free_port()}\n"
        f"    logs: {{vllm: {log}}}\n"
    )
    ssh = [
        *sshd.cli_args(),
    ]
    return inv, ssh


def _sweep(inv: Path, db: Path, report: Path, ssh: list[str]):
    return CliRunner().invoke(main, ["-i", str(inv), "sweep", "all", "--db", str(db), "--report", str(report), *ssh])


def test_sweep_with_a_locked_history_keeps_the_new_results(sshd, tmp_path, monkeypatch):
    import functools
    import sqlite3

    from fleetdiag import sweep as sweep_core
    from fleetdiag.store import Store

    inv, ssh = _sweep_setup(sshd, tmp_path)
    db, report = tmp_path / "history.db", tmp_path / "report.json"
    Store(db).close()
    monkeypatch.setattr(sweep_core, "Store", functools.partial(Store, timeout=0.3))  # production waits 10 s
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # e.g. someone's sqlite3 shell, or a backup job
    try:
        r = _sweep(inv, db, report, ssh)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert r.exit_code == 1, r.output  # the contract: a failure was found
    assert "history not updated" in r.stderr and "locked by another process" in r.stderr
    assert str(report) in r.stderr  # ... and where the results are
    hosts = {h["host"]: h for h in json.loads(report.read_text())["hosts"]}
    assert hosts["gpu01"]["verdict"] == FAILED and hosts["gpu02"]["verdict"] == UNREACHABLE


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs, filled: a real ENOSPC (needs mount privileges: root here and in CI)."""
    where = tmp_path / "full"
    where.mkdir()
    if (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True).returncode
        != 0
    ):
        pytest.skip("cannot mount a tmpfs here (not root); test_report_write_fails_with_enospc_simulated covers it")
    try:
        fd = os.open(where / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_disk_full_while_writing_the_report(sshd, tmp_path, full_disk):
    inv, ssh = _sweep_setup(sshd, tmp_path)
    db, report = tmp_path / "history.db", full_disk / "report.json"
    r = _sweep(inv, db, report, ssh)
    assert r.exit_code == 1, r.output
    assert f"cannot write the report {report}: No space left on device" in r.stderr
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]  # no half-written report, no temp file
    from fleetdiag.store import Store

    with Store(db, readonly=True) as st:  # the results were not lost: the history has them
        assert set(st.open_incidents()) == {"gpu01", "gpu02"}
    assert "gpu01" in r.stdout  # and the news was printed


def test_disk_full_for_the_history_database(sshd, tmp_path, full_disk):
    inv, ssh = _sweep_setup(sshd, tmp_path)
    db, report = full_disk / "history.db", tmp_path / "report.json"
    r = _sweep(inv, db, report, ssh)
    assert r.exit_code == 1, r.output
    assert "history not updated" in r.stderr and str(report) in r.stderr
    assert {h["host"] for h in json.loads(report.read_text())["hosts"]} == {"gpu01", "gpu02"}


def test_report_write_fails_with_enospc_simulated(sshd, tmp_path, monkeypatch):
    """The same fault without mount privileges: the report's write raises ENOSPC."""
    import errno

    from fleetdiag.store import files as store_mod  # write_atomic opens the temp file

    real_open = open
    report = tmp_path / "out" / "report.json"

    def full_open(path, *a, **kw):
        if str(path).startswith(str(report.parent)) and ("w" in (a[0] if a else kw.get("mode", "r"))):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr(store_mod, "open", full_open, raising=False)
    inv, ssh = _sweep_setup(sshd, tmp_path)
    r = _sweep(inv, tmp_path / "history.db", report, ssh)
    assert r.exit_code == 1, r.output
    assert "cannot write the report" in r.stderr and "No space left on device" in r.stderr
    assert not report.exists()
