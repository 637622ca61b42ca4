"""SSH connections on asyncssh, with every failure turned into a host status.

The user's normal ssh setup applies: ``~/.ssh/config`` (Host aliases,
HostName, Port, User, IdentityFile, ProxyJump, UserKnownHostsFile), the agent
and the default keys. Host keys are checked against known_hosts; an unknown
or changed key is a status, never a prompt. ``accept_new`` is explicit
trust-on-first-use and never applies to a key that changed.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh

from .reach import (  # noqa: F401  (re-exported: the options and errors live without asyncssh)
    AUTH,
    CLOSED,
    DNS,
    HOSTKEY_CHANGED,
    HOSTKEY_UNKNOWN,
    JUMP,
    KEY,
    NETWORK,
    PASSPHRASE_ENV,
    REFUSED,
    TIMEOUT,
    HostError,
    PartialOutput,
    TransportOptions,
)


class _Client(asyncssh.SSHClient):
    """Decides on keys known_hosts does not vouch for: new ones only with accept_new.

    asyncssh asks only about a key it does not trust. If known_hosts vouches
    for *other* keys of this host, the key changed: refused, always. Only a
    host with no known key at all may be trusted on first use.
    """

    def __init__(self, opts: TransportOptions):
        self.opts = opts
        self.verdict: str | None = None
        self.new_key: asyncssh.SSHKey | None = None
        self.fingerprint = ""
        self.conn: Any = None
        self.known_path: Path = opts.known_hosts_file()
        self.key_host: str | None = None  # the name known_hosts knows the host by (HostKeyAlias or target)
        self.key_port: int | None = None

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        self.conn = conn

    def _effective_known_hosts(self) -> Any:
        """The known_hosts asyncssh checked: our option, ssh config's UserKnownHostsFile, or the default."""
        value = getattr(self.conn, "_known_hosts", None)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
            return list(value)
        return str(self.opts.known_hosts_file())

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.fingerprint = key.get_fingerprint()
        self.key_host, self.key_port = host, port
        effective = self._effective_known_hosts()
        first = effective[0] if isinstance(effective, list) else effective
        self.known_path = Path(first).expanduser()
        trusted = getattr(self.conn, "_trusted_host_keys", None)
        if trusted is None:  # not the asyncssh we know: look the host up ourselves
            try:
                trusted = list(asyncssh.match_known_hosts(effective, host, addr, port)[0])
            except (OSError, ValueError):
                trusted = []
        if trusted:
            self.verdict = HOSTKEY_CHANGED
            return False
        self.verdict = HOSTKEY_UNKNOWN
        if self.opts.accept_new:
            self.new_key = key
            return True
        return False


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

    STDERR_KEEP = 4096

    async def run(self, command: str, timeout: float | None) -> tuple[bytes, int | None, float, float]:
        """Run one command; returns (stdout, exit status, open+exec ms, total ms).

        Raises HostError when the command could not start, PartialOutput
        (with what arrived) when its output was cut by the timeout or a
        dropped connection.
        """
        t0 = time.perf_counter()
        chunks: list[bytes] = []
        err: list[bytes] = []
        self.last_stderr, self.last_status = b"", None
        try:
            proc = await asyncio.wait_for(
                self.conn.create_process(command, encoding=None, stdin=asyncssh.DEVNULL),
                timeout,
            )
        except (asyncio.TimeoutError, TimeoutError) as exc:
            raise HostError(
                TIMEOUT, f"no answer within {timeout:g}s to the command: logged in, then the host stopped answering"
            ) from exc
        except (asyncssh.Error, OSError) as exc:
            raise explain(exc) from exc
        t_open = time.perf_counter()
        left = None if timeout is None else max(0.1, timeout - (t_open - t0))

        async def drain_err() -> None:
            kept = 0
            while True:
                data = await proc.stderr.read(65536)
                if not data:
                    break
                if kept < self.STDERR_KEEP:
                    err.append(data[: self.STDERR_KEEP - kept])
                    kept += len(err[-1])

        async def drain() -> None:
            err_task = asyncio.ensure_future(drain_err())
            try:
                while True:
                    data = await proc.stdout.read(65536)
                    if not data:
                        break
                    chunks.append(data)
                await err_task
            finally:
                err_task.cancel()
            await proc.wait_closed()

        try:
            await asyncio.wait_for(drain(), left)
        except (asyncio.TimeoutError, TimeoutError):
            proc.close()
            got = sum(map(len, chunks))
            self.last_stderr = b"".join(err)
            if got:
                why = f"command timed out after {timeout:g}s; output stopped after {_size(got)}"
            else:
                why = f"no output within {timeout:g}s: the command started, then the host went silent"
            raise PartialOutput(b"".join(chunks), why) from None
        except (asyncssh.Error, OSError) as exc:
            got = sum(map(len, chunks))
            self.last_stderr = b"".join(err)
            reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
            raise PartialOutput(
                b"".join(chunks), f"connection to {self.where} lost after {_size(got)} of output ({_scrub(reason)})"
            ) from exc
        t1 = time.perf_counter()
        self.last_stderr = b"".join(err)
        self.last_status = proc.exit_status
        return b"".join(chunks), proc.exit_status, (t_open - t0) * 1000, (t1 - t0) * 1000

    def close(self) -> None:
        self.conn.close()
        if self.tunnel is not None:
            self.tunnel.close()


def _size(n: int) -> str:
    return f"{n} bytes" if n < 1024 else f"{n / 1024:.1f} KB"


def _connect_kwargs(target: str, port: int | None, user: str | None, opts: TransportOptions) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "connect_timeout": opts.connect_timeout,
        "login_timeout": opts.connect_timeout,
        "keepalive_interval": opts.keepalive or 0,
    }
    if port:
        kw["port"] = port
    if user:
        kw["username"] = user
    if opts.known_hosts:
        kw["known_hosts"] = str(Path(opts.known_hosts).expanduser())
    if opts.ssh_config is not None:
        kw["config"] = opts.ssh_config
    if opts.client_keys is not None:
        kw["client_keys"] = opts.client_keys
        kw["agent_path"] = None
    secret = opts.secret()
    if secret:
        kw["passphrase"] = secret
    kw.update(opts.extra)
    return kw


async def connect(
    target: str,
    port: int | None = None,
    user: str | None = None,
    opts: TransportOptions | None = None,
    jump: tuple[str, int | None, str | None] | None = None,
) -> Connection:
    """Open and authenticate a connection, or raise HostError with plain words."""
    opts = opts or TransportOptions()
    tunnel = None
    t0 = time.perf_counter()
    if jump is not None:
        jt, jp, ju = jump
        try:
            tunnel = await _open(jt, jp, ju, opts, None)
        except HostError as exc:
            raise HostError(JUMP, f"jump host {jt}:{jp or 22}: {exc}") from exc
    try:
        conn = await _open(target, port, user, opts, tunnel, via=f"{jump[0]}:{jump[1] or 22}" if jump else None)
    except BaseException:
        if tunnel is not None:
            tunnel.close()
        raise
    return Connection(conn, (time.perf_counter() - t0) * 1000, tunnel, where=f"{target}:{port or 22}")


async def _open(
    target: str, port: int | None, user: str | None, opts: TransportOptions, tunnel: Any, via: str | None = None
) -> asyncssh.SSHClientConnection:
    client = _Client(opts)
    kw = _connect_kwargs(target, port, user, opts)
    if tunnel is not None:
        kw["tunnel"] = tunnel
    where = f"{target}:{port or 22}"
    try:
        conn = await asyncio.wait_for(
            asyncssh.connect(target, client_factory=lambda: client, **kw),
            opts.connect_timeout * 2 + 1,
        )
    except (asyncio.TimeoutError, TimeoutError) as exc:
        raise HostError(TIMEOUT, f"connect to {where} timed out after {opts.connect_timeout:g}s"
                        f"{' (through jump host ' + via + ')' if via else ''}: no answer from the host") from exc
    except asyncssh.HostKeyNotVerifiable as exc:
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
            raise HostError(REFUSED if "refused" in str(exc.reason).lower() else NETWORK,
                            f"jump host {via} could not reach {where}: {exc.reason or exc}") from exc
        raise explain(exc, target, port) from exc
    except asyncssh.PermissionDenied as exc:
        raise HostError(AUTH, _auth_reason(where, opts)) from exc
    except (asyncssh.Error, OSError, ValueError) as exc:
        he = explain(exc, target, port)
        raise HostError(he.kind, _scrub(str(he), opts)) from exc
    if client.new_key is not None:
        _remember(client, target, port)
    return conn


def _auth_reason(where: str, opts: TransportOptions) -> str:
    """Key refused, in plain words; says when there was nothing to offer (no agent, no key)."""
    text = f"authentication refused by {where}: no offered key"
    if opts.client_keys is not None:
        return f"{text} was accepted ({', '.join(opts.client_keys)})"
    sock = os.environ.get("SSH_AUTH_SOCK")
    if not sock:
        agent = "no ssh-agent (SSH_AUTH_SOCK is not set)"
    elif not os.path.exists(sock):
        agent = f"no ssh-agent (SSH_AUTH_SOCK={sock} does not exist)"
    else:
        agent = None
    ssh_dir = Path.home() / ".ssh"
    has_keys = any((ssh_dir / n).exists() for n in ("id_ed25519", "id_ecdsa", "id_rsa", "id_ed25519_sk", "id_ecdsa_sk", "id_dsa"))
    if agent and not has_keys:
        return (f"{text}: {agent} and no default key in {ssh_dir}; start ssh-agent and ssh-add, "
                "or pass --identity KEYFILE")
    if agent:
        return f"{text} was accepted: {agent}; tried the default keys in {ssh_dir}"
    return f"{text} or agent identity was accepted"


def _remember(client: _Client, target: str, port: int | None) -> None:
    """Append a newly accepted key (trust on first use) to the known_hosts asyncssh reads, as ssh's accept-new does."""
    assert client.new_key is not None
    path = client.known_path
    host = client.key_host or target
    kport = client.key_port if client.key_port is not None else port
    name = host if not kport or kport == 22 else f"[{host}]:{kport}"
    line = f"{name} {client.new_key.export_public_key('openssh').decode().strip()}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)


def explain(exc: BaseException, target: str = "", port: int | None = None) -> HostError:
    """Map a connection exception to a HostError with a plain-words reason."""
    where = f"{target}:{port or 22}" if target else "host"
    if isinstance(exc, HostError):
        return exc
    if isinstance(exc, ConnectionRefusedError):
        return HostError(REFUSED, f"connection refused by {where} (is sshd listening on that port?)")
    if isinstance(exc, socket.gaierror):
        return HostError(DNS, f"name '{target}' does not resolve ({exc.strerror or exc})")
    if isinstance(exc, asyncssh.PermissionDenied):
        return HostError(AUTH, f"authentication refused by {where}: no offered key or agent identity was accepted")
    if isinstance(exc, (asyncssh.KeyImportError, asyncssh.KeyEncryptionError)):
        return HostError(KEY, f"cannot load a client key: {_scrub(str(exc))} "
                              f"(an encrypted key needs its passphrase in ${PASSPHRASE_ENV}, or an ssh-agent)")
    if isinstance(exc, asyncssh.ConnectionLost):
        return HostError(CLOSED, f"connection to {where} lost: {exc}")
    if isinstance(exc, asyncssh.DisconnectError):
        return HostError(CLOSED, f"{where} closed the connection: {exc.reason or exc}")
    if isinstance(exc, asyncssh.ChannelOpenError):
        return HostError(CLOSED, f"{where} refused a session channel: {exc.reason or exc}")
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return HostError(TIMEOUT, f"{where} timed out")
    if isinstance(exc, OSError):
        return HostError(NETWORK, f"{where}: {exc.strerror or exc}")
    return HostError(NETWORK, f"{where}: {type(exc).__name__}: {_scrub(str(exc))}")


def _scrub(text: str, opts: TransportOptions | None = None) -> str:
    """Never let a passphrase (option or environment) reach a message."""
    for secret in {os.environ.get(PASSPHRASE_ENV), opts.passphrase if opts else None}:
        if secret:
            text = text.replace(secret, "***")
    return text
