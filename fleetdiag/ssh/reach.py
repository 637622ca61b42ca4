"""What reaching a host means, without the SSH library: options and errors.

Kept apart from ``transport.py`` so that commands which never open a
connection (``analyze``, ``hosts``, ``check``) start without importing asyncssh.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from ..records import ErrorKind
from ..units import size

# Status kinds: the one list is records.ErrorKind (stable strings in JSON); the short names here are its members.
REFUSED = ErrorKind.REFUSED
DNS = ErrorKind.DNS
TIMEOUT = ErrorKind.TIMEOUT
AUTH = ErrorKind.AUTH
HOSTKEY_UNKNOWN = ErrorKind.HOSTKEY_UNKNOWN
HOSTKEY_CHANGED = ErrorKind.HOSTKEY_CHANGED
CLOSED = ErrorKind.CLOSED
JUMP = ErrorKind.JUMP
NETWORK = ErrorKind.NETWORK
KEY = ErrorKind.KEY
LOCAL = ErrorKind.LOCAL
OVERSIZE = ErrorKind.OVERSIZE

# The most fleetdiag reads from one host for one command (the funnel's own
# output is tens of KB by design). A host that prints without end (a login
# banner loop, ``exec yes`` as ForceCommand) is cut here, never buffered whole.
MAX_OUTPUT = 8 * 1024 * 1024

PASSPHRASE_ENV = "FLEETDIAG_PASSPHRASE"  # unlocks encrypted key files; never printed


class HostError(Exception):
    """A host could not be reached or used; ``kind`` is stable, ``str`` is plain words."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# The key files asyncssh (like ssh) tries from ~/.ssh when no key is named, in its order: the one list
# (the keeper keys a kept connection by them, the auth message says whether any exists).
DEFAULT_KEY_FILES = ("id_ed25519_sk", "id_ecdsa_sk", "id_ed448", "id_ed25519", "id_ecdsa", "id_rsa", "id_dsa")

# The defaults, written once: seconds to connect and log in, and for the remote command.
CONNECT_TIMEOUT = 10.0
COMMAND_TIMEOUT = 60.0


@dataclass
class TransportOptions:
    """How to reach hosts. Defaults are safe: checked keys, timeouts on.

    ``passphrase`` (else ``$FLEETDIAG_PASSPHRASE``) unlocks encrypted key
    files; it is kept out of ``repr`` and scrubbed from every message.
    """

    known_hosts: str | None = None  # a file; None: ssh config / ~/.ssh/known_hosts
    accept_new: bool = False
    connect_timeout: float = CONNECT_TIMEOUT
    command_timeout: float = COMMAND_TIMEOUT
    ssh_config: list[str] | None = None  # None: ~/.ssh/config when it exists
    client_keys: list[str] | None = None  # None: agent + default keys + IdentityFile
    passphrase: str | None = field(default=None, repr=False)
    keepalive: float | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def known_hosts_file(self) -> Path:
        return Path(self.known_hosts or Path.home() / ".ssh" / "known_hosts").expanduser()

    def secret(self) -> str | None:
        return self.passphrase or os.environ.get(PASSPHRASE_ENV) or None


class PartialOutput(HostError):
    """The command started but its output was cut; what arrived is kept."""

    def __init__(self, data: bytes, message: str, kind: str = CLOSED):
        super().__init__(kind, message)
        self.data = data


# --------------------------------------------------------------------------- one command, two runners

STDERR_KEEP = 4096  # the start of a command's stderr that is kept: the only words when the shell failed

# How a command ended (CommandEnd.ended)
DONE = "done"
CUT_TIMEOUT = "timeout"  # the command timeout passed while output was still coming (or none came)
CUT_LOST = "lost"  # the connection dropped mid-output
CUT_OVERSIZE = "oversize"  # more than the cap: reading stopped, what arrived is dropped
NOT_RUN = "error"  # the command could not start (``kind``, ``reason``)
KEEPER_LOST = "keeper-lost"  # the keeper stopped answering mid-command (killed, crashed)


@dataclass
class CommandEnd:
    """How one command ended, in plain values: made by the direct runner and by the keeper (which sends
    it to its client as JSON), turned into a :class:`RunOutcome` by :func:`outcome`, the one mapping."""

    ended: str = DONE
    status: int | None = None
    open_ms: float | None = None
    total_ms: float | None = None
    trips: int = 2  # round trips the start took: channel open + exec, or exec alone on a spare
    got: int = 0  # stdout bytes read
    kind: str | None = None  # NOT_RUN: the HostError kind
    reason: str = ""  # NOT_RUN: the HostError text; CUT_LOST: the transport's words
    reused: bool | None = None  # kept: whether the keeper's connection was reused for this command
    connect_ms: float = 0.0  # kept: what the keeper's dial cost when it had to dial again

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> CommandEnd:
        """From the keeper's JSON end record (unknown keys ignored: a keeper of another version)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in plain.items() if k in names})


@dataclass
class RunOutcome:
    """What one command came to, whichever runner ran it: the one record a probe reads.

    ``error``: None when the command ran to its end; a :class:`PartialOutput` (what arrived is
    ``stdout``) when its output was cut; another HostError when it never produced output.
    ``started``: False only when the command provably never reached the host (a kept
    connection's keeper was gone before the request): the caller may run it again elsewhere."""

    stdout: bytes = b""
    status: int | None = None
    stderr: bytes = b""  # the start of stderr, bounded, with the passphrase scrubbed
    open_ms: float | None = None
    total_ms: float | None = None
    rtt_ms: float | None = None
    error: HostError | None = None
    started: bool = True

    def result(self) -> tuple[bytes, int | None, float, float]:
        """``Runner.run``'s answer: (stdout, exit status, open+exec ms, total ms), or the error raised."""
        if self.error is not None:
            raise self.error
        return self.stdout, self.status, float(self.open_ms or 0.0), float(self.total_ms or 0.0)


class Runner(Protocol):
    """One connection to one host that runs commands: ``transport.Connection`` (direct) and
    ``keeper.KeptConnection`` (on the keeper's connection) are its two implementations."""

    connect_ms: float
    where: str

    async def execute(self, command: str, timeout: float | None, cap: int = MAX_OUTPUT) -> RunOutcome: ...

    async def run(self, command: str, timeout: float | None) -> tuple[bytes, int | None, float, float]: ...

    def close(self) -> None: ...


def scrub(text: str, secret: str | None = None) -> str:
    """Never let a passphrase (``secret`` or the environment's) reach a message."""
    for s in {os.environ.get(PASSPHRASE_ENV), secret}:
        if s:
            text = text.replace(s, "***")
    return text


def scrub_bytes(data: bytes) -> bytes:
    secret = os.environ.get(PASSPHRASE_ENV)
    return data.replace(secret.encode(), b"***") if secret and data else data


def too_much(cap: int, where: str) -> str:
    """The status of a host that sent more than ``cap`` bytes."""
    return (
        f"{where} sent more than {cap // (1024 * 1024) or 1} MiB of output: reading stopped "
        "(does its login print without end? check the shell's startup files or a ForceCommand)"
    )


def outcome(
    end: CommandEnd, stdout: bytes, stderr: bytes, where: str, timeout: float | None, cap: int = MAX_OUTPUT
) -> RunOutcome:
    """The one mapping from how a command ended to what a probe sees (and the HostError it raises)."""
    rtt = None if end.open_ms is None else end.open_ms / max(1, end.trips)
    res = RunOutcome(stdout, end.status, scrub_bytes(stderr[:STDERR_KEEP]), end.open_ms, end.total_ms, rtt)
    t = f"{timeout:g}s" if timeout is not None else "the timeout"
    if end.ended == NOT_RUN:
        res.stdout, res.open_ms, res.rtt_ms = b"", None, None
        res.error = HostError(end.kind or CLOSED, scrub(end.reason))
    elif end.ended == CUT_OVERSIZE:
        res.stdout = b""
        res.error = HostError(OVERSIZE, too_much(cap, where))
    elif end.ended == CUT_TIMEOUT:
        why = (
            f"command timed out after {t}; output stopped after {size(len(stdout))}"
            if stdout
            else f"no output within {t}: the command started, then the host went silent"
        )
        res.error = PartialOutput(stdout, why)
    elif end.ended == CUT_LOST:
        res.error = PartialOutput(
            stdout, f"connection to {where} lost after {size(len(stdout))} of output ({scrub(end.reason)})"
        )
    elif end.ended == KEEPER_LOST:
        res.error = PartialOutput(
            stdout,
            f"connection keeper for {where} stopped answering after {size(len(stdout))} of output "
            f"({scrub(end.reason)}): the command's output is incomplete",
            ErrorKind.INTERNAL,
        )
    return res


@dataclass(frozen=True)
class JumpHop:
    """One ProxyJump hop: ``[user@]host[:port]`` (IPv6 in brackets)."""

    host: str
    port: int | None = None
    user: str | None = None


def parse_jump_chain(text: str) -> list[JumpHop]:
    """The one ProxyJump parser: a comma-separated chain of hops, first hop first.

    Used for inventory ``jump:`` values, the transport and ssh config ProxyJump.
    Raises ValueError with a plain-words message for an empty or malformed hop.
    """
    hops = []
    for part in text.split(","):
        item = part.strip()
        if not item:
            raise ValueError(f"jump '{text}': an empty hop (a stray comma?)")
        user = None
        if "@" in item:
            user, item = item.rsplit("@", 1)
            if not user:
                raise ValueError(f"jump '{text}': empty user name before '@'")
        port: int | None = None
        if item.startswith("["):
            addr, close, rest = item[1:].partition("]")
            if not close or not addr:
                raise ValueError(f"jump '{text}': unclosed '[' in '{item}'")
            if rest:
                if not rest.startswith(":") or not rest[1:].isdigit():
                    raise ValueError(f"jump '{text}': bad port after ']' in '{item}'")
                port = int(rest[1:])
        elif item.count(":") == 1:
            addr, _, p = item.partition(":")
            if not p.isdigit():
                raise ValueError(f"jump '{text}': port '{p}' is not a number")
            port = int(p)
        else:
            addr = item
        if not addr:
            raise ValueError(f"jump '{text}': a hop has no host")
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"jump '{text}': port {port} out of range")
        hops.append(JumpHop(addr, port, user))
    return hops
