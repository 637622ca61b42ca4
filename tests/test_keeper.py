"""Kept connections (fleetdiag/ssh/keeper/) through a real OpenSSH sshd whose log shows every login."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from fleetdiag.delayproxy import DelayProxy
from fleetdiag.ssh import keeper as keeper_mod
from fleetdiag.ssh import sshfast
from fleetdiag.ssh.keeper import client as keeper_client
from fleetdiag.ssh.keeper import wire as keeper_wire

from .cli_env import cli_env
from .conftest import inventory_file
from .procs import pids_with
from .sshd import SSHD, start_sshd

REPO = Path(__file__).resolve().parent.parent
SEED = (REPO / "fleetdiag" / "data" / "demo" / "dp_rank.log").read_text()
DECISIVE = "AssertionError: DP adjusted local rank 3 is out of bounds"


@pytest.fixture(scope="module")
def loud_sshd(tmp_path_factory):
    """The test sshd, restarted with LogLevel INFO so each login is an ``Accepted publickey`` line."""
    server = start_sshd(tmp_path_factory.mktemp("sshd-keeper"))
    server.stop()
    log = server.dir / "sshd.log"
    # a copy of authorized_keys (public keys) that another user's login can read: a changed `user` logs in
    shared = Path(tempfile.mkdtemp(prefix="fleetdiag-keeper-ak-"))
    os.chmod(shared, 0o755)
    (shared / "authorized_keys").write_text((server.dir / "authorized_keys").read_text())
    os.chmod(shared / "authorized_keys", 0o644)
    server.proc = subprocess.Popen(
        [
            SSHD,
            "-D",
            "-e",
            "-f",
            str(server.dir / "sshd_config"),
            "-o",
            "LogLevel=INFO",
            "-o",
            f"AuthorizedKeysFile={shared / 'authorized_keys'}",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.05)
    yield server
    server.stop()
    shutil.rmtree(shared, ignore_errors=True)


def logins(server, user: str | None = None) -> int:
    text = (server.dir / "sshd.log").read_text(errors="replace")
    return sum(1 for ln in text.splitlines() if "Accepted publickey" in ln and (user is None or f" for {user} " in ln))


def keeper_pids(directory: Path) -> list[int]:
    """Keeper processes serving ``directory`` (found by their command line)."""
    return pids_with("fleetdiag.ssh.keeper", str(directory))


def wait_gone(directory: Path, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not keeper_pids(directory):
            return True
        time.sleep(0.05)
    return False


def write_inv(
    tmp_path: Path,
    server,
    port: int | None = None,
    user: str | None = None,
    name: str = "uk-node",
    persist: str | None = None,
    jump: str | None = None,
) -> Path:
    log = tmp_path / "vllm.log"
    if not log.exists():
        log.write_text(SEED)
    host = {"log": log, "port": port or server.port, "user": user or server.user, **({"jump": jump} if jump else {})}
    top = {"defaults": {"persist": persist}} if persist else {}
    return inventory_file(tmp_path / "inventory.yaml", {name: host}, server, **top)


def cli(
    server, rt: Path, inv: Path | None, *args: str, timeout: float = 150, env_extra: dict | None = None
) -> subprocess.CompletedProcess:
    # generous: a loaded test machine; still well under the 5 min a keeper holding our pipes would cost
    """The real CLI in its own process; capture_output waits for EOF, so a keeper holding our pipes would hang it."""
    argv = [sys.executable, "-c", "from fleetdiag.cli import main; main()"]
    if inv is not None:
        argv += ["-i", str(inv)]
    argv += list(args)
    env = cli_env(rt, COLUMNS="160", **(env_extra or {}))  # login counts must not depend on the machine's load
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def probe(server, rt: Path, inv: Path, *extra: str, env_extra: dict | None = None) -> dict:
    out = cli(
        server,
        rt,
        inv,
        "probe",
        "uk-node",
        "--json",
        *server.cli_args(),
        *extra,
        env_extra=env_extra,
    )
    assert out.returncode in (0, 1, 3), out.stderr + out.stdout
    return json.loads(out.stdout)["hosts"][0]


def decisive(host: dict) -> str:
    return (host.get("decisive") or {}).get("line") or ""


def test_second_probe_reuses_kept_connection(loud_sshd, rt, tmp_path):
    inv = write_inv(tmp_path, loud_sshd)
    before = logins(loud_sshd)
    # returns (cli's timeout is well under 5 min): the keeper, alive for 5 min, holds none of its pipes
    first = probe(loud_sshd, rt, inv, "--persist", "5m")
    assert keeper_pids(rt), "the first command started a keeper"
    second = probe(loud_sshd, rt, inv, "--persist", "5m")
    assert logins(loud_sshd) - before == 1, "two probes, one login"
    assert first["verdict"] == second["verdict"] == "failed"
    assert DECISIVE in decisive(first) and DECISIVE in decisive(second)
    # the socket and its directory are private
    assert stat.S_IMODE(os.stat(rt).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(rt / "keeper.sock").st_mode) == 0o600
    listed = cli(loud_sshd, rt, None, "connections", "--json")
    doc = json.loads(listed.stdout)
    assert [c["host"] for c in doc["connections"]] == ["uk-node"]
    assert doc["connections"][0]["uses"] == 2 and doc["connections"][0]["rtt_ms"] is not None
    table = cli(loud_sshd, rt, None, "connections")
    assert "uk-node" in table.stdout and "127.0.0.1:" in table.stdout


def test_concurrent_commands_share_one_keeper_and_one_login(loud_sshd, rt, tmp_path):
    inv = write_inv(tmp_path, loud_sshd)
    before = logins(loud_sshd)
    env = cli_env(rt)
    argv = [
        sys.executable,
        "-c",
        "from fleetdiag.cli import main; main()",
        "-i",
        str(inv),
        "probe",
        "uk-node",
        "--json",
        "--persist",
        "1m",
        *loud_sshd.cli_args(),
    ]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(3)
    ]
    outs = [p.communicate(timeout=150) for p in procs]
    for out, err in outs:
        assert DECISIVE in decisive(json.loads(out)["hosts"][0]), err
    assert len(keeper_pids(rt)) == 1
    assert logins(loud_sshd) - before == 1


def test_persist_zero_leaves_nothing_running(loud_sshd, rt, tmp_path):
    inv = write_inv(tmp_path, loud_sshd)
    before = logins(loud_sshd)
    first = probe(loud_sshd, rt, inv, "--persist", "0")
    second = probe(loud_sshd, rt, inv, "--persist", "0")
    assert DECISIVE in decisive(first) and DECISIVE in decisive(second)
    assert logins(loud_sshd) - before == 2
    assert keeper_pids(rt) == []
    assert not (rt / "keeper.sock").exists()


def test_inventory_persist_then_keeper_exits_when_idle(loud_sshd, rt, tmp_path):
    """defaults.persist applies without --persist; past it the connection closes and the keeper exits."""
    inv = write_inv(tmp_path, loud_sshd, persist="1s")
    res = probe(loud_sshd, rt, inv)
    assert DECISIVE in decisive(res)
    assert keeper_pids(rt), "defaults.persist kept the connection"
    assert wait_gone(rt, timeout=15), "idle past persist: the keeper exits"
    assert not (rt / "keeper.sock").exists()


def test_env_persist_zero_beats_the_inventory(loud_sshd, rt, tmp_path):
    inv = write_inv(tmp_path, loud_sshd, persist="10m")
    res = probe(loud_sshd, rt, inv, env_extra={"FLEETDIAG_PERSIST": "0"})
    assert DECISIVE in decisive(res)
    assert keeper_pids(rt) == []


def test_connections_close_ends_keeper(loud_sshd, rt, tmp_path):
    inv = write_inv(tmp_path, loud_sshd)
    probe(loud_sshd, rt, inv, "--persist", "1m")
    pids = keeper_pids(rt)
    assert len(pids) == 1
    out = cli(loud_sshd, rt, None, "connections", "--close")
    assert out.returncode == 0 and "closed 1 connection" in out.stdout, out.stdout + out.stderr
    assert wait_gone(rt)
    assert not (rt / "keeper.sock").exists()
    again = cli(loud_sshd, rt, None, "connections")
    assert "no keeper running" in again.stdout


def test_killed_keeper_falls_back_with_same_result(loud_sshd, rt, tmp_path):
    inv = write_inv(tmp_path, loud_sshd)
    first = probe(loud_sshd, rt, inv, "--persist", "1m")
    (pid,) = keeper_pids(rt)
    os.kill(pid, signal.SIGKILL)
    assert wait_gone(rt)
    assert (rt / "keeper.sock").exists()  # left behind: a stale socket
    before = logins(loud_sshd)
    second = probe(loud_sshd, rt, inv, "--persist", "1m")
    assert logins(loud_sshd) - before == 1  # a new login: nothing was reused from the dead keeper
    assert second["verdict"] == first["verdict"] and decisive(second) == decisive(first)


def test_stale_socket_file_falls_back_with_same_result(loud_sshd, rt, tmp_path):
    inv = write_inv(tmp_path, loud_sshd)
    rt.mkdir(mode=0o700)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(rt / "keeper.sock"))  # bound, never listening, then closed: connect is refused
    s.close()
    os.chmod(rt / "keeper.sock", 0o600)
    res = probe(loud_sshd, rt, inv, "--persist", "1m")
    assert DECISIVE in decisive(res)


def test_wedged_keeper_means_a_direct_connection(loud_sshd, rt, tmp_path):
    """A keeper that accepts but never says hello costs at most its 200 ms: the probe goes direct."""
    inv = write_inv(tmp_path, loud_sshd)
    rt.mkdir(mode=0o700)
    lock = os.open(rt / "keeper.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # as a live keeper holds it
    wedged = socket.socket(socket.AF_UNIX)
    wedged.bind(str(rt / "keeper.sock"))
    os.chmod(rt / "keeper.sock", 0o600)
    wedged.listen(16)  # never accepts, never answers
    try:
        before = logins(loud_sshd)
        t0 = time.monotonic()
        res = probe(loud_sshd, rt, inv, "--persist", "1m", env_extra={"FLEETDIAG_KEEPER_HELLO": ""})
        took = time.monotonic() - t0
        assert DECISIVE in decisive(res)
        assert logins(loud_sshd) - before == 1
        assert took < 120, took  # the wedged keeper costs its 200 ms, not the command's whole timeout
        assert keeper_pids(rt) == []  # none started: the wedged one still holds the directory
    finally:
        wedged.close()
        os.close(lock)


def test_socket_dir_reachable_by_other_users_is_refused(loud_sshd, rt, tmp_path):
    inv = write_inv(tmp_path, loud_sshd)
    rt.mkdir(mode=0o755)
    os.chmod(rt, 0o755)
    res = probe(loud_sshd, rt, inv, "--persist", "1m")
    assert DECISIVE in decisive(res)  # a direct connection, same result
    assert keeper_pids(rt) == [] and not (rt / "keeper.sock").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another uid")
def test_keeper_refuses_a_peer_of_another_uid(loud_sshd, tmp_path):
    base = Path(tempfile.mkdtemp(prefix="fleetdiag-keeper-uid-"))  # outside pytest's 0700 tree: nobody can reach it
    rt = base / "rt"
    try:
        inv = write_inv(tmp_path, loud_sshd)
        probe(loud_sshd, rt, inv, "--persist", "1m")
        sock = rt / "keeper.sock"
        os.chmod(base, 0o711)
        os.chmod(rt, 0o711)  # open the way on purpose: the uid check must still hold
        os.chmod(sock, 0o666)
        code = (
            "import socket,sys\n"
            "s=socket.socket(socket.AF_UNIX); s.settimeout(3); s.connect(sys.argv[1])\n"
            "data=b''\n"
            "try:\n"
            '    s.sendall(b\'\\x00\\x00\\x00\\x0e{"op": "list"}\')\n'
            "    while True:\n"
            "        b=s.recv(4096)\n"
            "        if not b: break\n"
            "        data+=b\n"
            "except OSError as e: print('error', e)\n"
            "print('got', len(data))\n"
        )
        import pwd

        nobody = pwd.getpwnam("nobody")

        def demote() -> None:
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)

        out = subprocess.run(
            ["/usr/bin/python3", "-I", "-c", code, str(sock)],
            capture_output=True,
            text=True,
            timeout=20,
            preexec_fn=demote,
            cwd="/",
        )
        assert out.returncode == 0, out.stderr
        assert "got 0" in out.stdout, out.stdout  # connected, then closed at once: no hello, no listing
        # our own user still gets an answer, but a client refuses a socket others can reach
        os.chmod(rt, 0o700)
        with pytest.raises(keeper_mod.KeeperUnavailable):
            asyncio.run(keeper_client._ask(rt, {"op": "list"}, 5.0))
        os.chmod(sock, 0o600)
        assert keeper_mod.list_kept(rt) is not None
    finally:
        for pid in keeper_pids(rt):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)


def _proxy_in_thread(target_port: int):
    loop = asyncio.new_event_loop()
    proxy = DelayProxy("127.0.0.1", target_port, 0)
    ready = threading.Event()

    def runner() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(proxy.start())
        ready.set()
        loop.run_forever()

    t = threading.Thread(target=runner, daemon=True)
    t.start()
    ready.wait(5)

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(proxy.stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        t.join(5)

    return proxy, loop, stop


def test_changed_inventory_entry_gets_a_new_connection(loud_sshd, rt, tmp_path):
    proxy, loop, stop = _proxy_in_thread(loud_sshd.port)
    try:
        loud_sshd.trust(proxy.port)
        before = logins(loud_sshd)
        probe(loud_sshd, rt, write_inv(tmp_path, loud_sshd), "--persist", "1m")
        probe(loud_sshd, rt, write_inv(tmp_path, loud_sshd, port=proxy.port), "--persist", "1m")  # port changed
        assert logins(loud_sshd) - before == 2
        probe(loud_sshd, rt, write_inv(tmp_path, loud_sshd, user="nobody"), "--persist", "1m")  # user changed
        assert logins(loud_sshd, "nobody") >= 1 and logins(loud_sshd) - before == 3
        probe(loud_sshd, rt, write_inv(tmp_path, loud_sshd, port=proxy.port), "--persist", "1m")  # back: kept
        assert logins(loud_sshd) - before == 3
        kept = keeper_mod.list_kept(rt)
        assert kept is not None and len(kept) == 3
    finally:
        stop()


def test_added_jump_host_gets_a_new_connection_then_keeps_it(loud_sshd, rt, tmp_path):
    before = logins(loud_sshd)
    direct = probe(loud_sshd, rt, write_inv(tmp_path, loud_sshd), "--persist", "1m")
    assert logins(loud_sshd) - before == 1
    jump = f"{loud_sshd.user}@127.0.0.1:{loud_sshd.port}"  # the same sshd as the bastion
    via = probe(loud_sshd, rt, write_inv(tmp_path, loud_sshd, jump=jump), "--persist", "1m")
    assert logins(loud_sshd) - before == 3  # the jump host's login and the target's
    again = probe(loud_sshd, rt, write_inv(tmp_path, loud_sshd, jump=jump), "--persist", "1m")
    assert logins(loud_sshd) - before == 3  # kept, the jump included
    assert decisive(direct) == decisive(via) == decisive(again) and DECISIVE in decisive(via), (via, again)


def test_dead_connection_is_redialled_once(loud_sshd, rt, tmp_path):
    proxy, loop, stop = _proxy_in_thread(loud_sshd.port)
    try:
        loud_sshd.trust(proxy.port)
        inv = write_inv(tmp_path, loud_sshd, port=proxy.port)
        before = logins(loud_sshd)
        first = probe(loud_sshd, rt, inv, "--persist", "1m")
        loop.call_soon_threadsafe(proxy.drop_all)  # the kept connection dies under the keeper
        time.sleep(0.3)
        second = probe(loud_sshd, rt, inv, "--persist", "1m")
        assert decisive(second) == decisive(first) and DECISIVE in decisive(first)
        assert logins(loud_sshd) - before == 2
    finally:
        stop()


def test_connection_key_follows_what_decides_the_connection(tmp_path):
    from fleetdiag.ssh.reach import TransportOptions

    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host a\n  Port 22\n")
    known = tmp_path / "known_hosts"
    known.write_text("")
    opts = TransportOptions(ssh_config=[str(cfg)], known_hosts=str(known), client_keys=[str(tmp_path / "k")])

    def key(**kw) -> str:
        base = dict(target="h", port=22, user="u", opts=opts, jump=None)
        base.update(kw)
        return keeper_mod.connection_key(keeper_mod.connect_params(**base))

    k0 = key()
    assert key() == k0
    assert (
        len(
            {
                k0,
                key(port=2222),
                key(user="v"),
                key(target="h2"),
                key(jump=("bastion", 22, "u")),
                key(jump=[("b1", None, None), ("b2", None, None)]),
            }
        )
        == 6
    )
    cfg.write_text("Host a\n  Port 2200\n")  # an edited ssh config
    assert key() != k0
    k1 = key()
    known.write_text("[h]:22 ssh-ed25519 AAAA\n")  # an edited known_hosts
    assert key() != k1
    params = keeper_mod.connect_params("h", 22, "u", opts, None)
    assert "passphrase" not in json.dumps(params)


def test_kept_connection_runs_like_a_connection_and_keeps_the_cap(loud_sshd, rt, monkeypatch):
    """Through the keeper: stdout, stderr and exit status come back as Connection.run gives them; output past
    the cap stops reading and is the host's error (oversize), as on a direct connection."""
    from fleetdiag.ssh.reach import OVERSIZE, HostError

    monkeypatch.setenv("FLEETDIAG_KEEPER_HELLO", "3")

    async def go():
        opts = loud_sshd.opts()
        conn = await keeper_mod.open_kept("127.0.0.1", loud_sshd.port, loud_sshd.user, opts, None, "h", 60.0, rt)
        out, status, open_ms, total_ms = await conn.run("printf 'hi\\n'; echo oops >&2; exit 3", 20)
        assert (out, status, conn.last_status, conn.last_stderr) == (b"hi\n", 3, 3, b"oops\n")
        assert 0 < open_ms <= total_ms
        conn.cap = 100_000
        with pytest.raises(HostError) as cut:
            await conn.run("head -c 300000 /dev/zero", 20)
        assert cut.value.kind == OVERSIZE and "reading stopped" in str(cut.value)
        out, status, _o, _t = await conn.run("head -c 50000 /dev/zero", 20)  # the same connection, still good
        assert len(out) == 50_000 and status == 0
        return conn

    before = logins(loud_sshd)
    asyncio.run(go())
    assert logins(loud_sshd) - before == 1
    assert keeper_mod.close_kept(rt) == 1
    assert wait_gone(rt)


def test_the_keeper_runs_commands_on_spare_channels(loud_sshd, rt, monkeypatch):
    """Through the keeper: every command after the login starts on a spare channel."""
    sshd = loud_sshd
    monkeypatch.setenv("FLEETDIAG_KEEPER_HELLO", "3")

    async def go() -> None:
        for i in range(3):
            conn = await keeper_mod.open_kept("127.0.0.1", sshd.port, sshd.user, sshd.opts(), None, "h", 60.0, rt)
            await asyncio.sleep(0.2)
            out, status, _, _ = await conn.run(f"echo run{i}", 20)
            assert (out, status) == (f"run{i}\n".encode(), 0)

    try:
        asyncio.run(go())
        listed = keeper_mod.list_kept(rt)
    finally:
        keeper_mod.close_kept(rt)
    # asyncssh's own channels on a release the shortcuts were not tested on (fleetdiag.ssh.sshfast.TESTED)
    assert [(c["uses"], c["spare_uses"]) for c in listed] == [(3, 3 if sshfast.enabled() else 0)]


def test_a_busy_keeper_gets_longer_for_a_later_run_than_for_a_first(tmp_path, monkeypatch):
    """A keeper that answered a connection's first request (its open too) is alive: a later run waits past
    the 200 ms hello for it (hundreds of hosts' commands in one process), where a first would go direct."""
    monkeypatch.delenv("FLEETDIAG_KEEPER_HELLO", raising=False)
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)

    async def go() -> tuple[bytes, int | None, bool]:
        async def serve(reader, writer):
            await asyncio.sleep(0.6)  # busy: the hello comes late
            await keeper_wire.send(writer, json.dumps({"hello": 1, "pid": os.getpid()}).encode())
            req = json.loads(await keeper_wire.recv(reader))
            if req["op"] == "run":
                await keeper_wire.send(writer, b"Ook\n")
                end = {"status": 0, "open_ms": 1.0, "total_ms": 2.0, "rtt_ms": 1.0, "reused": True}
                await keeper_wire.send(writer, b"X" + json.dumps(end).encode())
            writer.close()

        server = await asyncio.start_unix_server(serve, str(rt / "keeper.sock"))
        os.chmod(rt / "keeper.sock", 0o600)
        try:
            with pytest.raises(keeper_mod.KeeperUnavailable):  # a first request: 200 ms, then direct
                await keeper_client._request(rt, {"op": "run"})
            conn = keeper_mod.KeptConnection(rt, "k", {"target": "h", "port": 22}, "h", 60.0, 1.0, True)
            out, status, _o, _t = await conn.run("true", 10)
            return out, status, True
        finally:
            server.close()

    assert asyncio.run(go()) == (b"ok\n", 0, True)


def test_a_command_is_one_request_and_holds_the_handshake_slot_only_while_dialling(loud_sshd, rt, monkeypatch):
    """A kept connection's first command is its open too: one request to the keeper, warm or cold (where
    it is sent again only while the keeper it started comes up). The host's handshake slot (the
    scheduler's gate) is held while that request may dial, and given back when the keeper says the
    connection is ready, before the command ends."""
    monkeypatch.setenv("FLEETDIAG_KEEPER_HELLO", "3")
    sent: list[tuple[str, bool]] = []
    real = keeper_client._request

    async def counting(directory, req, hello=None):
        sent.append((req.get("op"), bool(req.get(keeper_wire.CONNECTED_KEY))))
        return await real(directory, req, hello)

    monkeypatch.setattr(keeper_client, "_request", counting)
    spans: list[tuple[float, float]] = []

    @contextlib.asynccontextmanager
    async def gate():
        t0 = time.monotonic()
        try:
            yield
        finally:
            spans.append((t0, time.monotonic()))

    async def one() -> float:
        opts = loud_sshd.opts()
        conn = await keeper_mod.open_kept("127.0.0.1", loud_sshd.port, loud_sshd.user, opts, None, "h", 60.0, rt, gate)
        out, status, _o, _t = await conn.run("sleep 1; echo done", 20)
        assert (out, status) == (b"done\n", 0)
        return time.monotonic()

    before = logins(loud_sshd)
    try:
        ends = [asyncio.run(one())]
        cold = len(sent)
        ends.append(asyncio.run(one()))
        warm = sent[cold:]
    finally:
        keeper_mod.close_kept(rt)
    assert logins(loud_sshd) - before == 1
    assert warm == [("run", True)], sent  # warm: one request
    assert set(sent[:cold]) == {("run", True)}, sent
    assert len(spans) == 2, spans
    for (_t0, given), end in zip(spans, ends):
        assert end - given > 0.8, (spans, ends)  # the slot went back as the command started
