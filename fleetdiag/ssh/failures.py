"""A failure to connect in plain words: an exception as a HostError, keys and known_hosts named but never
quoted, no passphrase in any message."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from pathlib import Path

import asyncssh

from .reach import (
    AUTH,
    CLOSED,
    DEFAULT_KEY_FILES,
    DNS,
    KEY,
    LOCAL,
    NETWORK,
    PASSPHRASE_ENV,
    REFUSED,
    TIMEOUT,
    HostError,
    TransportOptions,
    scrub,
)


def known_hosts_reason(opts: TransportOptions) -> str:
    """A known_hosts file that does not parse, named but never quoted (it may not be a known_hosts file at all)."""
    name = opts.known_hosts or "the known_hosts file of your ssh config"
    return f"{name} is not a valid known_hosts file (its contents are not shown); pass the right file to --known-hosts"


def key_reason(opts: TransportOptions, exc: BaseException) -> str:
    """A client key that does not load, named but never quoted (the file may hold anything)."""
    files = ", ".join(opts.client_keys) if opts.client_keys else "a key from the agent, ~/.ssh or IdentityFile"
    locked = isinstance(exc, asyncssh.KeyEncryptionError) or "passphrase" in str(exc).lower()
    if locked:
        return (
            f"cannot load a client key ({files}): it is encrypted and the passphrase is missing or wrong "
            f"(put it in ${PASSPHRASE_ENV}, or use an ssh-agent)"
        )
    return (
        f"cannot load a client key ({files}): not a valid private key file (its contents are not shown); "
        f"an encrypted key needs its passphrase in ${PASSPHRASE_ENV}, or an ssh-agent"
    )


def auth_reason(where: str, opts: TransportOptions) -> str:
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
    has_keys = any((ssh_dir / n).exists() for n in DEFAULT_KEY_FILES)
    if agent and not has_keys:
        return (
            f"{text}: {agent} and no default key in {ssh_dir}; start ssh-agent and ssh-add, or pass --identity KEYFILE"
        )
    if agent:
        return f"{text} was accepted: {agent}; tried the default keys in {ssh_dir}"
    return f"{text} or agent identity was accepted"


def explain(exc: BaseException, target: str = "", port: int | None = None, where: str | None = None) -> HostError:
    """Map a connection exception to a HostError with a plain-words reason (``where``: the address and
    port dialled, when known; else ``target:port``)."""
    where = where or (f"{target}:{port or 22}" if target else "host")
    if isinstance(exc, HostError):
        return exc
    if isinstance(exc, ConnectionRefusedError):
        return HostError(REFUSED, f"connection refused by {where} (is sshd listening on that port?)")
    if isinstance(exc, socket.gaierror):
        return HostError(DNS, f"name '{target}' does not resolve ({exc.strerror or exc})")
    if isinstance(exc, asyncssh.PermissionDenied):
        return HostError(AUTH, f"authentication refused by {where}: no offered key or agent identity was accepted")
    if isinstance(exc, (asyncssh.KeyImportError, asyncssh.KeyEncryptionError)):
        return HostError(KEY, key_reason(TransportOptions(), exc))
    if isinstance(exc, asyncssh.ConnectionLost):
        return HostError(CLOSED, f"connection to {where} lost: {exc}")
    if isinstance(exc, asyncssh.DisconnectError):
        return HostError(CLOSED, f"{where} closed the connection: {exc.reason or exc}")
    if isinstance(exc, asyncssh.ChannelOpenError):
        return HostError(CLOSED, f"{where} refused a session channel: {exc.reason or exc}")
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return HostError(TIMEOUT, f"{where} timed out")
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return HostError(
            LOCAL,
            f"this machine ran out of file descriptors ({exc.strerror}); "
            "not the host's fault: raise `ulimit -n` or lower --fanout",
        )
    if isinstance(exc, OSError):
        return HostError(NETWORK, f"{where}: {exc.strerror or exc}")
    return HostError(NETWORK, f"{where}: {type(exc).__name__}: {scrub_secret(str(exc))}")


def scrub_secret(text: str, opts: TransportOptions | None = None) -> str:
    """Never let a passphrase (option or environment) reach a message."""
    return scrub(text, opts.passphrase if opts else None)
