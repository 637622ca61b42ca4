"""What reaching a host means, without the SSH library: options and errors.

Kept apart from ``transport.py`` so that commands which never open a
connection (``analyze``, ``hosts``, ``check``) start without importing asyncssh.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .records import ErrorKind

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

    def __init__(self, data: bytes, message: str):
        super().__init__(CLOSED, message)
        self.data = data


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
