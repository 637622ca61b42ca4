"""Round trips of a fresh probe, counted by the delay proxy: how often the client spoke again after
hearing the server (``DelayProxy.exchanges``). The number is pinned: a change that adds a round trip
to the login or the exec fails here, whatever the timing."""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import subprocess
import time

import asyncssh

from fleetdiag.delayproxy import DelayProxy
from fleetdiag.inventory import parse_inventory
from fleetdiag.probe import ProbeSettings, probe_host
from fleetdiag.records import FAILED, UNREACHABLE
from fleetdiag.ssh import sshfast
from fleetdiag.ssh.transport import AUTH, TransportOptions, connect

from .slack import slack
from .sshd import keygen, ssh_argv

SEED = (
    __import__("pathlib").Path(__file__).resolve().parent.parent / "fleetdiag" / "data" / "demo" / "dp_rank.log"
).read_text()
# A fresh probe: version + KEXINIT, ECDH + NEWKEYS, the ssh-userauth service request with the signed
# publickey request in the same flight (fleetdiag.ssh.sshfast), channel open, exec (its output follows the
# reply), and the channel close. asyncssh's own login, like OpenSSH's `ssh host true`, spends three more:
# the service accept, auth `none`, and the publickey query (PK_OK).
STANDARD_EXCHANGES = 9
# On an asyncssh release outside fleetdiag.ssh.sshfast.TESTED (CI's oldest), the login is asyncssh's own.
SHORT = sshfast.enabled()
PROBE_EXCHANGES = 6 if SHORT else STANDARD_EXCHANGES


# A stall of the client's own flight past the round trip can only add exchanges, never remove one: a count is
# measured up to this many times, each at a longer round trip, and the fewest stands (a real added round trip
# shows in every attempt).
ATTEMPTS = 3


def _rtt_ms(attempt: int = 0) -> float:
    """A round trip long enough that every reply is heard only after the client's whole flight: the
    count is the protocol's. 40 ms on an idle machine; under load the client's own flight can take
    longer to leave (a stall past the RTT splits it and counts one exchange more), so it scales, up to
    100 ms: OpenSSH's own client answers some messages by a timer rather than on hearing the server,
    and at a 240 ms round trip its `ssh host true` counts 8 exchanges instead of 9."""
    return 40.0 * slack(cap=2.5) * (1 + attempt)


def _inventory(sshd, port: int, log) -> object:
    return parse_inventory(
        f"hosts:\n  far:\n    address: 127.0.0.1\n    port: {port}\n    user: {sshd.user}\n"
        f"    logs:\n      vllm: {json.dumps(str(log))}\n",
        "rt.yaml",
    )


def test_fresh_probe_round_trips(sshd, tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(SEED)

    async def go(attempt: int):
        proxy = await DelayProxy("127.0.0.1", sshd.port, _rtt_ms(attempt)).start()
        sshd.trust(proxy.port)
        try:
            host = _inventory(sshd, proxy.port, log).hosts["far"]
            counts = []
            for _ in range(2):
                proxy.reset_counts()
                res = await probe_host(host, ProbeSettings(transport=sshd.opts()))
                assert res.verdict == FAILED, res.error
                counts.append(proxy.exchanges)
            proxy.reset_counts()
            ssh = await asyncio.create_subprocess_exec(
                *ssh_argv(sshd, proxy.port), "true", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            _, err = await ssh.communicate()
            assert ssh.returncode == 0, err
            return counts, proxy.exchanges, proxy.connections
        finally:
            await proxy.stop()

    for attempt in range(ATTEMPTS):
        counts, ssh_true, conns = asyncio.run(go(attempt))
        print("exchanges: probe", counts, "ssh true", ssh_true)
        if counts == [PROBE_EXCHANGES, PROBE_EXCHANGES]:
            break
    assert conns == 3  # two fresh probes and one ssh: nothing reused
    assert counts == [PROBE_EXCHANGES, PROBE_EXCHANGES], counts
    # the probe's login + exec costs three round trips fewer than OpenSSH's `ssh host true`
    assert PROBE_EXCHANGES + (3 if SHORT else 0) <= ssh_true, (PROBE_EXCHANGES, ssh_true)


async def _count(sshd, log, opts, env_login: str | None = None, attempt: int = 0) -> tuple[int, object]:
    """One fresh probe through a 40 ms proxy (longer on a later attempt): (exchanges, result)."""
    proxy = await DelayProxy("127.0.0.1", sshd.port, _rtt_ms(attempt)).start()
    sshd.trust(proxy.port)
    try:
        host = _inventory(sshd, proxy.port, log).hosts["far"]
        res = await probe_host(host, ProbeSettings(transport=opts))
        return proxy.exchanges, res
    finally:
        await proxy.stop()


def _fewest(sshd, log, opts, want: int) -> tuple[int, object]:
    """The fewest exchanges of up to ATTEMPTS fresh probes (it stops at ``want``), with the last result."""
    best = None
    for attempt in range(ATTEMPTS):
        n, res = asyncio.run(_count(sshd, log, opts, attempt=attempt))
        best = n if best is None else min(best, n)
        if best <= want:
            break
    return best, res


def test_standard_login_is_asyncssh_own(sshd, tmp_path, monkeypatch):
    """FLEETDIAG_SSH_LOGIN=standard turns the short login off: the same probe, three round trips more."""
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    monkeypatch.setenv("FLEETDIAG_SSH_LOGIN", "standard")
    n, res = _fewest(sshd, log, sshd.opts(), STANDARD_EXCHANGES)
    assert res.verdict == FAILED, res.error
    assert n == STANDARD_EXCHANGES


def test_refused_key_then_the_right_one(sshd, tmp_path):
    """A key the server refuses is signed and refused; the next key still logs in (one round trip more)."""
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    stranger = keygen(tmp_path / "stranger")
    n, res = _fewest(sshd, log, sshd.opts(client_keys=[str(stranger), str(sshd.client_key)]), PROBE_EXCHANGES + 1)
    assert res.verdict == FAILED, res.error
    assert n == PROBE_EXCHANGES + 1


def test_only_refused_keys_is_an_auth_status(sshd, tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    stranger = keygen(tmp_path / "stranger")
    _, res = asyncio.run(_count(sshd, log, sshd.opts(client_keys=[str(stranger)])))
    assert res.verdict == UNREACHABLE
    assert res.error_kind == AUTH, res.error


def test_rsa_key_logs_in_with_a_sha2_signature(sshd, tmp_path):
    """An RSA key needs the server's signature algorithms (rsa-sha2-*, never SHA-1 ssh-rsa)."""
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    rsa = keygen(tmp_path / "client_rsa", "rsa")
    with open(sshd.dir / "authorized_keys", "a") as fh:
        fh.write((tmp_path / "client_rsa.pub").read_text())
    n, res = asyncio.run(_count(sshd, log, sshd.opts(client_keys=[str(rsa)])))
    assert res.verdict == FAILED, res.error
    assert n <= PROBE_EXCHANGES + 1


def test_agent_key_is_queried_before_signing(sshd, tmp_path, monkeypatch):
    """An agent key may need a confirmation or a touch: it is asked about first, as ssh does."""
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.02)
        env = dict(os.environ, SSH_AUTH_SOCK=str(sock))
        subprocess.run(["ssh-add", "-q", str(sshd.client_key)], env=env, check=True)
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        n, res = asyncio.run(_count(sshd, log, sshd.opts(client_keys=None)))
    finally:
        agent.terminate()
        agent.wait(5)
    assert res.verdict == FAILED, res.error
    assert n == (PROBE_EXCHANGES + 1 if SHORT else STANDARD_EXCHANGES)  # the PK_OK query (asyncssh asks anyway)


def test_a_server_that_is_not_openssh_gets_no_pipelined_auth(tmp_path, monkeypatch):
    """Auth rides behind the service request only for OpenSSH; another server (asyncssh's) gets it after
    the accept: two round trips saved there (``none`` and the query), three with OpenSSH's sshd."""
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = keygen(tmp_path / "client")
    known = tmp_path / "known_hosts"

    def process(proc) -> None:
        proc.stdout.write("ok\n")
        proc.exit(0)

    async def go() -> tuple[int, bytes]:
        server = await asyncssh.create_server(
            asyncssh.SSHServer,
            "127.0.0.1",
            0,
            server_host_keys=[host_key],
            authorized_client_keys=asyncssh.import_authorized_keys((tmp_path / "client.pub").read_text()),
            process_factory=process,
        )
        port = server.sockets[0].getsockname()[1]
        proxy = await DelayProxy("127.0.0.1", port, _rtt_ms()).start()
        known.write_text(f"[127.0.0.1]:{proxy.port} {host_key.export_public_key().decode()}")
        try:
            opts = TransportOptions(known_hosts=str(known), client_keys=[str(client_key)], ssh_config=[])
            conn = await connect("127.0.0.1", proxy.port, getpass.getuser(), opts)
            try:
                out, status, _, _ = await conn.run("anything", 10)
            finally:
                conn.close()
            assert status == 0
            return proxy.exchanges, out
        finally:
            await proxy.stop()
            server.close()

    short, out = asyncio.run(go())
    assert out == b"ok\n"
    monkeypatch.setenv("FLEETDIAG_SSH_LOGIN", "standard")
    standard, out = asyncio.run(go())
    assert out == b"ok\n"
    assert short == (standard - 2 if SHORT else standard), (short, standard)


def _runs(sshd, spare_after: int, n: int = 4, gap: float = 0.3, work: float = 0.0) -> tuple[list[int], int]:
    """``n`` commands on one connection through a 40 ms proxy, a spare channel from command
    ``spare_after`` on, each ``gap`` seconds after the previous one ended and ``work`` seconds long on
    the host: (exchanges until each command had started, commands that ran on a spare)."""
    import asyncssh

    from fleetdiag.ssh.transport import connect

    async def go() -> tuple[list[int], int]:
        proxy = await DelayProxy("127.0.0.1", sshd.port, _rtt_ms()).start()
        sshd.trust(proxy.port)
        try:
            conn = await connect("127.0.0.1", proxy.port, sshd.user, sshd.opts())
            counts = []
            for i in range(n):
                if i == spare_after:
                    conn.keep_spare()
                await asyncio.sleep(gap)  # the user's own work between two commands
                proxy.reset_counts(turn=True)
                command = f"sleep {work:g}; echo run{i}" if work else f"echo run{i}"
                proc = await conn.create_process(command, stdin=asyncssh.DEVNULL)
                counts.append(proxy.exchanges)  # what the command waited for before it ran
                out = await proc.stdout.read()
                await proc.wait_closed()
                conn.command_done()
                assert out == f"run{i}\n".encode()
            used = conn.spare.used if conn.spare else 0
            conn.close()
            return counts, used
        finally:
            await proxy.stop()

    return asyncio.run(go())


def test_a_spare_channel_saves_the_open_round_trip(sshd):
    """A kept connection opens the next session channel ahead of need: a command then waits for its
    exec alone (one round trip), not for a channel open and an exec (two)."""
    counts, used = _runs(sshd, spare_after=2)
    assert counts == ([2, 2, 1, 1] if SHORT else [2, 2, 2, 2]), counts
    assert used == (2 if SHORT else 0)


def test_a_command_right_after_another_ends_finds_its_spare_open(sshd):
    """The next spare's open leaves with each command's exec, so a command sent the moment the previous
    one ended (a warm probe right after another) starts in one round trip too: opened when the
    previous command ended, its open would still be on the way and the command would wait for it."""
    counts, used = _runs(sshd, spare_after=1, n=4, gap=0.0, work=0.3)  # a command's remote work, a probe's
    # command 1 may wait for the first spare (asked for right before it); 2 and 3 came right after a command
    assert counts[2:] == ([1, 1] if SHORT else [2, 2]), counts
    assert used == (3 if SHORT else 0)


def test_spare_channel_off_with_the_standard_login(sshd, monkeypatch):
    """FLEETDIAG_SSH_LOGIN=standard: no spare channel, a command costs its open and its exec."""
    monkeypatch.setenv("FLEETDIAG_SSH_LOGIN", "standard")

    counts, used = _runs(sshd, spare_after=2)
    assert counts == [2, 2, 2, 2], counts
    assert used == 0


def test_a_spare_closed_by_the_server_falls_back_to_a_new_channel(sshd, tmp_path):
    """If the spare channel died (the server closed it), the command opens its own: same output."""
    from fleetdiag.ssh.transport import connect

    async def go() -> tuple[bytes, int]:
        conn = await connect("127.0.0.1", sshd.port, sshd.user, sshd.opts())
        try:
            conn.keep_spare()
            await asyncio.sleep(0.3)
            if conn.spare._chan is not None:  # none with asyncssh's own channels
                conn.spare._chan.close()  # as a server-side close would leave it
            await asyncio.sleep(0.1)
            out, status, _, _ = await conn.run("echo fallback", 20)
            assert status == 0
            out2, _, _, _ = await conn.run("echo again", 20)  # and the next one has a fresh spare
            return out + out2, conn.spare.used
        finally:
            conn.close()

    out, used = asyncio.run(go())
    assert out == b"fallback\nagain\n"
    assert used == (1 if SHORT else 0)


def test_an_untested_asyncssh_release_gets_its_own_login_and_channels(sshd, tmp_path, monkeypatch):
    """On a release outside sshfast.TESTED (2.23, say) nothing is
    patched: the same probe verdict, asyncssh's own round trips, no spare channel."""
    log = tmp_path / "vllm.log"
    log.write_text(SEED)
    assert sshfast.tested((2, 24, 1)) and not sshfast.tested((2, 23, 0)) and not sshfast.tested((2, 25))
    assert sshfast._release("2.25.0rc1") == (2, 25)
    monkeypatch.setattr(sshfast, "ASYNCSSH_VERSION", (2, 23, 0))
    assert not sshfast.enabled()
    n, res = asyncio.run(_count(sshd, log, sshd.opts()))
    assert res.verdict == FAILED, res.error
    assert n == STANDARD_EXCHANGES
    counts, used = _runs(sshd, spare_after=0, n=2)
    assert (counts, used) == ([2, 2], 0)


def test_a_spare_channel_sends_the_ssh_config_environment(tmp_path, monkeypatch):
    """SetEnv and SendEnv from the ssh config reach a command that starts on a spare channel, as they
    reach one on a channel of its own (sshd accepts them with AcceptEnv)."""
    from .sshd import start_sshd

    server = start_sshd(tmp_path / "envd", "AcceptEnv FLEETDIAG_T_*\n")
    try:
        config = tmp_path / "ssh_config"
        config.write_text("Host 127.0.0.1\n    SetEnv FLEETDIAG_T_SET=fixed\n    SendEnv FLEETDIAG_T_SENT\n")
        monkeypatch.setenv("FLEETDIAG_T_SENT", "from-here")
        show = 'echo "${FLEETDIAG_T_SET:-unset} ${FLEETDIAG_T_SENT:-unset}"'

        async def go() -> tuple[list[bytes], int]:
            conn = await connect("127.0.0.1", server.port, server.user, server.opts(ssh_config=[str(config)]))
            try:
                outs = [(await conn.run(show, 20))[0]]  # a channel of its own
                conn.keep_spare()
                for _ in range(2):
                    await asyncio.sleep(0.2)
                    outs.append((await conn.run(show, 20))[0])
                return outs, conn.spare.used
            finally:
                conn.close()

        outs, used = asyncio.run(go())
    finally:
        server.stop()
    assert outs == [b"fixed from-here\n"] * 3, outs
    assert used == (2 if SHORT else 0)


def test_ciphers_prefer_aes_gcm_unless_the_ssh_config_chooses(sshd, tmp_path):
    """AES-GCM first (cheaper for the client per packet than asyncssh's ChaCha20); a user's
    ``Ciphers`` line in the ssh config still decides."""

    async def cipher(opts) -> str:
        conn = await connect("127.0.0.1", sshd.port, sshd.user, opts)
        try:
            return conn.conn.get_extra_info("send_cipher")
        finally:
            conn.close()

    assert asyncio.run(cipher(sshd.opts())) == "aes128-gcm@openssh.com"
    config = tmp_path / "ssh_config"
    config.write_text("Host 127.0.0.1\n    Ciphers chacha20-poly1305@openssh.com\n")
    assert asyncio.run(cipher(sshd.opts(ssh_config=[str(config)]))) == "chacha20-poly1305@openssh.com"


def test_packet_log_lines_are_built_only_when_asyncssh_logs_them(sshd, caplog, monkeypatch):
    """asyncssh logs packets at debug level 3 only: below it their log lines are no longer built (a
    probe's answer is ~30 packets); at level 3 the lines are asyncssh's own, as before."""
    sshfast.install()  # as the first shortened connection does
    built: list[int] = []
    original = sshfast._LOG_PACKET

    def noting(handler, msg, pkttype, *rest):
        built.append(pkttype)
        return original(handler, msg, pkttype, *rest)

    monkeypatch.setattr(sshfast, "_LOG_PACKET", noting)

    async def go() -> bytes:
        conn = await connect("127.0.0.1", sshd.port, sshd.user, sshd.opts())
        try:
            return (await conn.run("echo hi", 20))[0]
        finally:
            conn.close()

    assert asyncio.run(go()) == b"hi\n"  # asyncssh's default debug level, 1
    assert built == [] if SHORT else True
    caplog.set_level("DEBUG", logger="asyncssh")
    asyncssh.set_debug_level(3)
    try:
        assert asyncio.run(go()) == b"hi\n"
    finally:
        asyncssh.set_debug_level(1)
    if SHORT:
        assert 94 in built, built  # MSG_CHANNEL_DATA: the answer's packets went to asyncssh's logger
    assert any("Received MSG_CHANNEL_DATA (94)" in r.getMessage() for r in caplog.records)
