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

# Status kinds, stable strings used in JSON and tests.
REFUSED = "refused"
DNS = "dns"
TIMEOUT = "timeout"
AUTH = "auth"
HOSTKEY_UNKNOWN = "hostkey-unknown"
HOSTKEY_CHANGED = "hostkey-changed"
CLOSED = "closed"
JUMP = "jump"
NETWORK = "network"
KEY = "client-key"


class HostError(Exception):
    """A host could not be reached or used; ``kind`` is stable, ``str`` is plain words."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass
class TransportOptions:
    """How to reach hosts. Defaults are safe: checked keys, timeouts on."""

    known_hosts: str | None = None  # a file; None: ssh config / ~/.ssh/known_hosts
    accept_new: bool = False
    connect_timeout: float = 10.0
    command_timeout: float = 60.0
    ssh_config: list[str] | None = None  # None: ~/.ssh/config when it exists
    client_keys: list[str] | None = None  # None: agent + default keys + IdentityFile
    passphrase: str | None = None
    keepalive: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def known_hosts_file(self) -> Path:
        return Path(self.known_hosts or Path.home() / ".ssh" / "known_hosts").expanduser()


class _Client(asyncssh.SSHClient):
    """Decides on keys known_hosts does not vouch for: new ones only with accept_new."""

    def __init__(self, opts: TransportOptions):
        self.opts = opts
        self.verdict: str | None = None
        self.new_key: asyncssh.SSHKey | None = None
        self.fingerprint = ""

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.fingerprint = key.get_fingerprint()
        path = self.opts.known_hosts_file()
        known: list[Any] = []
        if path.exists():
            try:
                known = list(asyncssh.match_known_hosts(str(path), host, addr, port)[0])
            except (OSError, ValueError):
                known = []
        if known:
            self.verdict = HOSTKEY_CHANGED
            return False
        self.verdict = HOSTKEY_UNKNOWN
        if self.opts.accept_new:
            self.new_key = key
            return True
        return False


@dataclass
class Connection:
    """One live connection per host, reused for every stage and watch cycle."""

    conn: asyncssh.SSHClientConnection
    connect_ms: float
    tunnel: asyncssh.SSHClientConnection | None = None

    async def run(self, command: str, timeout: float | None) -> tuple[bytes, int | None, float, float]:
        """Run one command; returns (stdout, exit status, open+exec ms, total ms)."""
        t0 = time.perf_counter()
        chunks: list[bytes] = []
        try:
            proc = await asyncio.wait_for(
                self.conn.create_process(command, encoding=None, stdin=asyncssh.DEVNULL, stderr=asyncssh.DEVNULL),
                timeout,
            )
        except asyncio.TimeoutError as exc:
            raise HostError(TIMEOUT, f"no answer to the command within {timeout:g}s") from exc
        except (asyncssh.Error, OSError) as exc:
            raise explain(exc) from exc
        t_open = time.perf_counter()
        left = None if timeout is None else max(0.1, timeout - (t_open - t0))

        async def drain() -> None:
            while True:
                data = await proc.stdout.read(65536)
                if not data:
                    break
                chunks.append(data)
            await proc.wait_closed()

        try:
            await asyncio.wait_for(drain(), left)
        except (asyncio.TimeoutError, TimeoutError):
            proc.close()
            raise PartialOutput(b"".join(chunks), f"command timed out after {timeout:g}s") from None
        except (asyncssh.Error, OSError) as exc:
            raise PartialOutput(b"".join(chunks), str(explain(exc))) from exc
        t1 = time.perf_counter()
        return b"".join(chunks), proc.exit_status, (t_open - t0) * 1000, (t1 - t0) * 1000

    def close(self) -> None:
        self.conn.close()
        if self.tunnel is not None:
            self.tunnel.close()


class PartialOutput(HostError):
    """The command started but its output was cut; what arrived is kept."""

    def __init__(self, data: bytes, message: str):
        super().__init__(CLOSED, message)
        self.data = data



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
    if opts.passphrase:
        kw["passphrase"] = opts.passphrase
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
            tconn = await _open(jt, jp, ju, opts, None)
        except HostError as exc:
            raise HostError(JUMP, f"jump host {jt}: {exc}") from exc
        tunnel = tconn
    conn = await _open(target, port, user, opts, tunnel)
    return Connection(conn, (time.perf_counter() - t0) * 1000, tunnel)


async def _open(
    target: str, port: int | None, user: str | None, opts: TransportOptions, tunnel: Any
) -> asyncssh.SSHClientConnection:
    client = _Client(opts)
    kw = _connect_kwargs(target, port, user, opts)
    if tunnel is not None:
        kw["tunnel"] = tunnel
    try:
        conn = await asyncio.wait_for(
            asyncssh.connect(target, client_factory=lambda: client, **kw),
            opts.connect_timeout * 2 + 1,
        )
    except (asyncio.TimeoutError, TimeoutError) as exc:
        raise HostError(TIMEOUT, f"connect timed out after {opts.connect_timeout:g}s") from exc
    except asyncssh.HostKeyNotVerifiable as exc:
        where = f"{target}:{port or 22}"
        if client.verdict == HOSTKEY_CHANGED:
            raise HostError(
                HOSTKEY_CHANGED,
                f"HOST KEY CHANGED for {where} (now {client.fingerprint}): refused; "
                f"if the host was reinstalled, remove its old line from {opts.known_hosts_file()}",
            ) from exc
        raise HostError(
            HOSTKEY_UNKNOWN,
            f"host key unknown for {where} ({client.fingerprint or 'no fingerprint'}): "
            "run ssh to it once, or pass --accept-new",
        ) from exc
    except (asyncssh.Error, OSError, ValueError) as exc:
        raise explain(exc, target, port) from exc
    if client.new_key is not None:
        _remember(opts, target, port, client.new_key)
    return conn


def _remember(opts: TransportOptions, target: str, port: int | None, key: asyncssh.SSHKey) -> None:
    """Append a newly accepted key (trust on first use), as ssh's accept-new does."""
    path = opts.known_hosts_file()
    name = target if not port or port == 22 else f"[{target}]:{port}"
    line = f"{name} {key.export_public_key('openssh').decode().strip()}\n"
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
        return HostError(KEY, f"cannot load a client key: {_scrub(str(exc))}")
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


def _scrub(text: str) -> str:
    """Never let a passphrase from the environment reach a message."""
    secret = os.environ.get("FLEETDIAG_PASSPHRASE")
    return text.replace(secret, "***") if secret else text
