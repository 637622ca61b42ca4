"""SSH connections on asyncssh, with every failure turned into a host status.

The user's normal ssh setup applies: ``~/.ssh/config`` (Host aliases,
HostName, Port, User, IdentityFile, ProxyJump, UserKnownHostsFile), the agent
and the default keys. Host keys are checked against known_hosts; an unknown
or changed key is a status, never a prompt. ``accept_new`` is explicit
trust-on-first-use and never applies to a key that changed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import asyncssh

from . import sshfast
from .failures import auth_reason, explain, key_reason, known_hosts_reason, scrub_secret  # noqa: F401  (re-exported)
from .hostkeys import HOSTKEY_REVOKED, HostKeyClient, KnownHosts, remember_key  # noqa: F401  (re-exported)
from .reach import (  # noqa: F401  (re-exported: the options and errors live without asyncssh)
    AUTH,
    CLOSED,
    CUT_LOST,
    CUT_OVERSIZE,
    CUT_TIMEOUT,
    DEFAULT_KEY_FILES,
    DNS,
    DONE,
    HOSTKEY_CHANGED,
    HOSTKEY_UNKNOWN,
    JUMP,
    KEY,
    LOCAL,
    MAX_OUTPUT,
    NETWORK,
    NOT_RUN,
    OVERSIZE,
    PASSPHRASE_ENV,
    REFUSED,
    STDERR_KEEP,
    TIMEOUT,
    CommandEnd,
    HostError,
    JumpHop,
    PartialOutput,
    RunOutcome,
    TransportOptions,
    outcome,
    parse_jump_chain,
    scrub,
    too_much,
)
from .sshconfig import (  # noqa: F401  (re-exported)
    UNREAD,
    Resolved,
    config_for,
    config_jump,
    dialled,
    jump_of,
    known_hosts_files,
    resolve,
)
from .trust import Trust, trust_of  # noqa: F401  (re-exported)


@dataclass
class Connection:
    """One live connection per host, reused for every stage and watch cycle.

    After ``run``, ``last_stderr`` holds the start of what the command wrote
    to stderr (bounded) and ``last_status`` its exit status: when the remote
    shell could not run the funnel at all, that is the only explanation.
    """

    conn: asyncssh.SSHClientConnection
    connect_ms: float
    tunnel: asyncssh.SSHClientConnection | None = None
    where: str = "host"
    last_stderr: bytes = field(default=b"", init=False, repr=False)
    last_status: int | None = field(default=None, init=False)
    hops: list[Any] = field(default_factory=list, init=False, repr=False)  # every jump connection, first hop first
    spare: sshfast.Spare | None = field(default=None, init=False, repr=False)  # kept connections: see keep_spare
    open_trips: int = field(default=2, init=False)  # round trips the last command took to start: open + exec, or exec
    last_rtt_ms: float | None = field(default=None, init=False)  # from the last command's start

    def keep_spare(self) -> None:
        """From now on keep one session channel open ahead of need: each command costs its exec only.

        For connections that serve many commands (the keeper's); a one-command probe does not need it.
        The next spare's open leaves with each command's exec (``Spare.create_process``): by the time
        that command's answer is back (one round trip at least), the next one's channel is open. Opened
        when a command ended instead, a request that came within a round trip of the end waited for it
        (a warm probe right after another, at 240 ms: 0.16 s of its 0.59 s exec)."""
        if self.spare is None:
            self.spare = sshfast.Spare(self.conn)
        self.spare.prime()

    async def create_process(self, command: str, **redirect: Any) -> Any:
        """asyncssh's ``create_process`` (bytes, no encoding), on the spare channel when one is open."""
        self.open_trips = 2
        if self.spare is None:
            return await self.conn.create_process(command, encoding=None, **redirect)
        used = self.spare.used
        try:
            return await self.spare.create_process(command, **redirect)
        finally:
            self.open_trips = 1 if self.spare.used > used else 2

    def command_done(self) -> None:
        """A command ended: open the next spare now when spares are kept and none is open or on its way
        (its start opened one; that one failed or was taken by another command meanwhile)."""
        if self.spare is not None:
            self.spare.prime()

    async def execute(self, command: str, timeout: float | None, cap: int = MAX_OUTPUT) -> RunOutcome:
        """Run one command (``reach.Runner``): its outcome, never raised; a cut output keeps what arrived."""
        out: list[bytes] = []
        err: list[bytes] = []
        end = await run_on(self, command, timeout, cap, out.append, err.append)
        res = outcome(end, b"".join(out), b"".join(err), self.where, timeout, cap)
        self.last_stderr, self.last_status, self.last_rtt_ms = res.stderr, res.status, res.rtt_ms
        return res

    async def run(
        self, command: str, timeout: float | None, cap: int = MAX_OUTPUT
    ) -> tuple[bytes, int | None, float, float]:
        """Run one command; returns (stdout, exit status, open+exec ms, total ms).

        Raises HostError when the command could not start or its output
        passed ``cap`` bytes (reading stops there), PartialOutput
        (with what arrived) when its output was cut by the timeout or a
        dropped connection.
        """
        return (await self.execute(command, timeout, cap)).result()

    @asynccontextmanager
    async def stream(self, command: str, cap: int | None = MAX_OUTPUT) -> AsyncIterator[LineStream]:
        """Start a long-running command and read its stdout line by line (watch's follower).

        Stderr is discarded. The command is closed when the block ends.
        Raises HostError when the command could not start.
        """
        try:
            proc = await self.create_process(command, stdin=asyncssh.DEVNULL, stderr=asyncssh.DEVNULL)
        except (asyncssh.Error, OSError) as exc:
            raise explain(exc) from exc
        ls = LineStream(proc, self.where, cap)
        try:
            yield ls
        finally:
            proc.close()
            self.command_done()

    def close(self) -> None:
        self.conn.close()
        for t in reversed(self.hops or ([self.tunnel] if self.tunnel is not None else [])):
            t.close()


async def run_on(
    conn: Connection,
    command: str,
    timeout: float | None,
    cap: int,
    on_stdout: Callable[[bytes], Any],
    on_stderr: Callable[[bytes], Any],
) -> CommandEnd:
    """Start ``command`` on ``conn`` and read it to its end: the one command semantics, for the direct
    runner and the keeper alike (which passes callbacks that send frames to its client).

    stdout goes to ``on_stdout`` until ``cap`` bytes (then the command is closed: oversize); the
    start of stderr (``STDERR_KEEP``) to ``on_stderr``; the callbacks may be coroutines. Never raises
    for the host's doing: how it ended is in the returned :class:`CommandEnd`.
    """
    t0 = time.perf_counter()
    try:
        proc = await asyncio.wait_for(conn.create_process(command, stdin=asyncssh.DEVNULL), timeout)
    except (asyncio.TimeoutError, TimeoutError):
        return CommandEnd(
            NOT_RUN,
            kind=TIMEOUT,
            reason=f"no answer within {timeout:g}s to the command: logged in, then the host stopped answering",
        )
    except (asyncssh.Error, OSError) as exc:
        he = explain(exc, where=conn.where)  # the address and port dialled, as the connection names them
        return CommandEnd(NOT_RUN, kind=he.kind, reason=str(he))
    trips = conn.open_trips  # read now: another command may start on this connection meanwhile
    end = CommandEnd(open_ms=(time.perf_counter() - t0) * 1000, trips=trips)
    left = None if timeout is None else max(0.1, timeout - end.open_ms / 1000)

    async def give(fn: Callable[[bytes], Any], data: bytes) -> None:
        r = fn(data)
        if asyncio.iscoroutine(r):
            await r

    async def drain_err() -> None:
        kept = 0
        while True:
            data = await proc.stderr.read(65536)
            if not data:
                return
            if kept < STDERR_KEEP:
                piece = data[: STDERR_KEEP - kept]
                kept += len(piece)
                await give(on_stderr, piece)

    async def drain() -> None:
        err_task = asyncio.ensure_future(drain_err())
        try:
            while True:
                data = await proc.stdout.read(65536)
                if not data:
                    break
                end.got += len(data)
                if end.got > cap:
                    end.ended = CUT_OVERSIZE
                    proc.close()
                    return
                await give(on_stdout, data)
            await err_task
        finally:
            err_task.cancel()
        await proc.wait_closed()

    try:
        await asyncio.wait_for(drain(), left)
    except (asyncio.TimeoutError, TimeoutError):
        proc.close()
        end.ended = CUT_TIMEOUT
    except (asyncssh.Error, OSError) as exc:
        end.ended = CUT_LOST
        end.reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
    except BaseException:  # the caller went away (deadline, Ctrl-C, the keeper's client): stop the command
        proc.close()
        raise
    finally:
        conn.command_done()
    if end.ended == DONE:
        end.status = proc.exit_status
    end.total_ms = (time.perf_counter() - t0) * 1000
    return end


class LineStream:
    """Lines from a running remote command, with a bound on what is held.

    ``cap`` bounds the bytes read while it is set (the snapshot phase) and,
    always, the length of one line: a host that prints without a newline or
    without end raises HostError(OVERSIZE) instead of filling memory.
    Set ``cap = None`` after the bounded phase to read records for hours.
    """

    CHUNK = 65536

    def __init__(self, proc: Any, where: str, cap: int | None = MAX_OUTPUT):
        self.proc = proc
        self.where = where
        self.cap = cap
        self.read_bytes = 0
        self._buf = bytearray()
        self._eof = False

    @property
    def exit_status(self) -> int | None:
        return self.proc.exit_status

    async def readline(self) -> bytes:
        """The next line with its newline; the unfinished tail at the end; b"" at EOF."""
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[: nl + 1])
                del self._buf[: nl + 1]
                return line
            if len(self._buf) > MAX_OUTPUT:
                self.proc.close()
                raise HostError(OVERSIZE, too_much(MAX_OUTPUT, self.where))
            if self._eof:
                line = bytes(self._buf)
                self._buf.clear()
                return line
            try:
                data = await self.proc.stdout.read(self.CHUNK)
            except (asyncssh.Error, OSError) as exc:
                raise explain(exc) from exc
            if not data:
                self._eof = True
                continue
            self.read_bytes += len(data)
            if self.cap is not None and self.read_bytes > self.cap:
                self.proc.close()
                raise HostError(OVERSIZE, too_much(self.cap, self.where))
            self._buf += data


def _connect_kwargs(
    target: str, port: int | None, user: str | None, opts: TransportOptions, config: Any = UNREAD
) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "connect_timeout": opts.connect_timeout,
        "login_timeout": opts.connect_timeout,
        "keepalive_interval": opts.keepalive or 0,
    }
    if port:
        kw["port"] = port
    if user:
        kw["username"] = user
    if opts.ssh_config is not None:
        kw["config"] = opts.ssh_config
    if opts.client_keys is not None:
        kw["client_keys"] = opts.client_keys
        kw["agent_path"] = None
    secret = opts.secret()
    if secret:
        kw["passphrase"] = secret
    if config is UNREAD:
        config = config_for(target, port, user, opts)
    kw["known_hosts"] = KnownHosts(known_hosts_files(opts, config))
    if config is None or config.get("Ciphers") is None:  # else the user chose, and asyncssh applies it
        kw["encryption_algs"] = _ciphers()
    kw.update(opts.extra)
    return kw


class Dropped(HostError):
    """The server closed a connection it had accepted before its SSH greeting (MaxStartups)."""

    def __init__(self, message: str) -> None:
        super().__init__(CLOSED, message)


DROP_RETRY_S = (0.5, 1.5)  # the back-off before the retry of a dropped handshake: uniform in this range
DROP_RETRIES = 1  # retries of a dropped handshake (once: a burst has passed by then; a full sshd stays full)


async def connect(
    target: str,
    port: int | None = None,
    user: str | None = None,
    opts: TransportOptions | None = None,
    jump: tuple[str, int | None, str | None] | list[tuple[str, int | None, str | None]] | None = None,
) -> Connection:
    """Open and authenticate a connection, or raise HostError with plain words.

    ``jump`` is one hop or a chain of hops (ProxyJump ``a,b``), connected through in order.
    Without one, the ssh config's ProxyJump for the target is read here (through the one
    parser, ``reach.parse_jump_chain``) and connected through the same way, so every hop
    gets fleetdiag's options (keys, known_hosts, timeouts) and a failing hop is named.
    """
    opts = opts or TransportOptions()
    config = config_for(target, port, user, opts)  # read once: the jump chain and the ciphers
    if jump is None:
        try:
            jump = [(h.host, h.port, h.user) for h in jump_of(config)]
        except ValueError as exc:
            raise HostError(JUMP, f"ProxyJump in ssh config for {target}: {exc}") from None
    hops = [jump] if isinstance(jump, tuple) else list(jump or [])
    tunnel = None
    opened: list[Any] = []
    t0 = time.perf_counter()
    via = None
    try:
        for jt, jp, ju in hops:
            hop_config = config_for(jt, jp, ju, opts)
            hop = dialled(jt, jp, hop_config)  # the port the hop's ssh config gives it, not 22
            try:
                tunnel = await _open(jt, jp, ju, opts, tunnel, via=via, config=hop_config)
            except HostError as exc:
                raise HostError(JUMP, f"jump host {hop}: {exc}") from exc
            opened.append(tunnel)
            via = hop
        for attempt in range(DROP_RETRIES + 1):
            try:
                conn = await _open(target, port, user, opts, tunnel, via=via, config=config)
                break
            except Dropped as exc:  # after a back-off: the burst that filled sshd's MaxStartups has passed
                if attempt == DROP_RETRIES:
                    if attempt:
                        raise Dropped(f"{exc} (dropped again: retried once after a back-off)") from exc
                    raise
                import random

                await asyncio.sleep(random.uniform(*DROP_RETRY_S))
    except BaseException:
        for t in reversed(opened):
            t.close()
        raise
    c = Connection(conn, (time.perf_counter() - t0) * 1000, tunnel, where=dialled(target, port, config))
    c.hops = opened
    return c


# Ciphers, AES-GCM first: as strong as ChaCha20-Poly1305 (OpenSSH's first choice), hardware-accelerated
# on server CPUs, and in asyncssh about a third less of the client's CPU per host (it builds a new
# ChaCha20 context in Python for every packet). The rest of asyncssh's list follows, in its order.
GCM_FIRST = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def _ciphers() -> list[str]:
    from asyncssh.encryption import get_default_encryption_algs

    rest = [a.decode() for a in get_default_encryption_algs()]
    return [c for c in GCM_FIRST if c in rest] + [c for c in rest if c not in GCM_FIRST]


async def _open(
    target: str,
    port: int | None,
    user: str | None,
    opts: TransportOptions,
    tunnel: Any,
    via: str | None = None,
    config: Any = UNREAD,
) -> asyncssh.SSHClientConnection:
    if config is UNREAD:
        config = config_for(target, port, user, opts)
    kw = _connect_kwargs(target, port, user, opts, config)
    client = HostKeyClient(opts, kw["known_hosts"])
    if tunnel is not None:
        kw["tunnel"] = tunnel
    where = dialled(target, port, config)  # the address and port the ssh config made of it, as dialled
    try:
        conn = await asyncio.wait_for(
            asyncssh.connect(target, client_factory=lambda: client, **kw),
            opts.connect_timeout * 2 + 1,
        )
    except (asyncio.TimeoutError, TimeoutError) as exc:
        raise HostError(
            TIMEOUT,
            f"connect to {where} timed out after {opts.connect_timeout:g}s"
            f"{' (through jump host ' + via + ')' if via else ''}: no answer from the host",
        ) from exc
    except asyncssh.HostKeyNotVerifiable as exc:
        if client.verdict == HOSTKEY_REVOKED or (client.verdict is None and client.known and client.known.revoked):
            raise HostError(
                HOSTKEY_CHANGED,
                f"REVOKED HOST KEY for {where}: {client.known_path} marks this host's key @revoked; refused, "
                "never accepted (not even with --accept-new); this may be an attack",
            ) from exc
        if client.verdict == HOSTKEY_CHANGED:
            raise HostError(
                HOSTKEY_CHANGED,
                f"HOST KEY CHANGED for {where} (now {client.fingerprint}): refused, never accepted "
                f"(not even with --accept-new); this may be an attack. If the host was reinstalled, "
                f"remove its old line from {client.known_path} and check the new key",
            ) from exc
        if client.verdict == HOSTKEY_UNKNOWN:
            raise HostError(
                HOSTKEY_UNKNOWN,
                f"host key unknown for {where} ({client.fingerprint or 'no fingerprint'}): "
                "run ssh to it once, or pass --accept-new",
            ) from exc
        raise HostError(HOSTKEY_CHANGED, f"host key of {where} refused: {exc.reason or exc}") from exc
    except asyncssh.ChannelOpenError as exc:
        if via:  # the jump host could not open the forward to the target
            raise HostError(
                REFUSED if "refused" in str(exc.reason).lower() else NETWORK,
                f"jump host {via} could not reach {where}: {exc.reason or exc}",
            ) from exc
        raise explain(exc, target, port, where) from exc
    except asyncssh.PermissionDenied as exc:
        raise HostError(AUTH, auth_reason(where, opts)) from exc
    except (asyncssh.KeyImportError, asyncssh.KeyEncryptionError) as exc:
        raise HostError(KEY, key_reason(opts, exc)) from exc
    except ValueError as exc:
        if "known hosts" in str(exc).lower():  # asyncssh quotes the offending line: never show it
            raise HostError(HOSTKEY_UNKNOWN, known_hosts_reason(opts)) from exc
        he = explain(exc, target, port, where)
        raise HostError(he.kind, scrub_secret(str(he), opts)) from exc
    except (asyncssh.Error, OSError) as exc:
        proxied = config is not None and config is not UNREAD and bool(config.get("ProxyCommand"))
        if client.conn is not None and not client.conn.get_extra_info("server_version") and not proxied:
            # TCP accepted, then closed before sshd said a word: what sshd does to a handshake past MaxStartups
            raise Dropped(
                f"{where} closed the connection before the SSH greeting ({type(exc).__name__}: {exc}); "
                "sshd drops handshakes past its MaxStartups limit: lower --per-address"
            ) from exc
        he = explain(exc, target, port, where)
        raise HostError(he.kind, scrub_secret(str(he), opts)) from exc
    if client.new_key is not None:
        remember_key(client, target, port)
    return conn
