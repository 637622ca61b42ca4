"""What the ssh config makes of a host: the config asyncssh applies, the address and port dialled, the jump
chain, the known_hosts files checked, and all of it as ``ssh -G`` would print it (``resolve``)."""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh
from asyncssh.config import SSHClientConfig

from .reach import JumpHop, TransportOptions, parse_jump_chain

UNREAD: Any = object()  # not given: the function reads the ssh config itself


def known_hosts_files(opts: TransportOptions, config: Any) -> list[str]:
    """The known_hosts files that decide a host's key, as asyncssh picks them: ``--known-hosts``,
    else the ssh config's UserKnownHostsFile and GlobalKnownHostsFile, else ``~/.ssh/known_hosts``."""
    if opts.known_hosts:
        return [str(Path(opts.known_hosts).expanduser())]
    user = config.get("UserKnownHostsFile") if config is not None else None
    if user is not None:
        glob = config.get("GlobalKnownHostsFile") or []
        return [str(Path(f).expanduser()) for f in [*user, *glob]]
    return [str(opts.known_hosts_file())]


def config_for(target: str, port: int | None, user: str | None, opts: TransportOptions) -> Any:
    """The ssh config asyncssh will apply to ``target`` (``opts.ssh_config``, else ``~/.ssh/config``
    when readable), or None when there is none or it cannot be read (asyncssh reports that itself)."""
    paths: list[str] | None = opts.ssh_config
    if paths is None:
        default = Path("~", ".ssh", "config").expanduser()
        paths = [str(default)] if os.access(default, os.R_OK) else []
    if not paths:
        return None
    args = (getpass.getuser(), user or (), target, port or ())
    try:
        try:
            return SSHClientConfig.load(None, paths, False, False, False, *args)  # canonical, final: asyncssh >= 2.19
        except TypeError:
            return SSHClientConfig.load(None, paths, False, *args)  # asyncssh 2.18
    except (OSError, ValueError, TypeError, KeyError, asyncssh.Error):
        return None


@dataclass
class Resolved:
    """What one host resolves to, as ``ssh -G`` would print it: the address and port dialled, the
    login, the jump chain, the keys offered and the known_hosts checked (``hosts --ssh``, messages)."""

    target: str
    hostname: str
    port: int
    user: str
    jump: list[str]
    identity_files: list[str]
    known_hosts: list[str]
    config_files: list[str]

    @property
    def where(self) -> str:
        """The address and port actually dialled, named as the user named the host."""
        return _named(self.target, self.hostname, self.port)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def resolve(target: str, port: int | None, user: str | None, opts: TransportOptions, config: Any = UNREAD) -> Resolved:
    """``target`` as the connection will see it: the inventory's values first, then the ssh config
    (HostName, Port, User, ProxyJump, IdentityFile, UserKnownHostsFile), then ssh's defaults."""
    if config is UNREAD:
        config = config_for(target, port, user, opts)

    def get(key: str) -> Any:
        return config.get(key) if config is not None else None

    hostname = str(get("Hostname") or get("HostName") or target)
    cport = get("Port")
    try:
        jump = [f"{h.user + '@' if h.user else ''}{_hop_where(h, opts)}" for h in jump_of(config)]
    except ValueError as exc:
        jump = [f"(malformed ProxyJump: {exc})"]
    if opts.client_keys is not None:
        ids = list(opts.client_keys)
    else:
        ids = [str(Path(str(i)).expanduser()) for i in (get("IdentityFile") or ())]
    known = known_hosts_files(opts, config)  # as the connection checks them
    files = list(opts.ssh_config) if opts.ssh_config is not None else []
    if opts.ssh_config is None and config is not None:
        files = [str(Path("~", ".ssh", "config").expanduser())]
    return Resolved(
        target=target,
        hostname=hostname,
        port=int(port or cport or 22),
        user=str(user or get("User") or getpass.getuser()),
        jump=jump,
        identity_files=ids,
        known_hosts=known,
        config_files=files,
    )


def _named(target: str, hostname: str, port: int) -> str:
    return f"{target}:{port}" if hostname == target else f"{target} ({hostname}:{port})"


def dialled(target: str, port: int | None, config: Any) -> str:
    """``target`` as dialled under ``config`` (HostName, Port), cheaply: for every message."""
    name = str((config.get("Hostname") if config is not None else None) or target)
    return _named(target, name, int(port or (config.get("Port") if config is not None else None) or 22))


def _hop_where(hop: JumpHop, opts: TransportOptions) -> str:
    """A jump hop as dialled: its own ssh config's HostName and Port apply (one level, never a loop)."""
    return dialled(hop.host, hop.port, config_for(hop.host, hop.port, hop.user, opts))


def config_jump(target: str, port: int | None, user: str | None, opts: TransportOptions) -> list[JumpHop]:
    """The ProxyJump chain the ssh config gives ``target``, first hop first ([] for none or ``none``).

    Raises ValueError for a malformed chain.
    """
    return jump_of(config_for(target, port, user, opts))


def jump_of(config: Any) -> list[JumpHop]:
    value = config.get("ProxyJump") if config is not None else None
    return parse_jump_chain(value) if isinstance(value, str) and value else []
