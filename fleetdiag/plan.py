"""The plan step: inventory + command-line options → how to reach and read each host.

inventory → **plan** → remote funnel → analysis → report. Commands (probe, sweep, watch,
preflight) turn their options into :class:`~fleetdiag.probe.ProbeSettings` here, so the
rules for reaching a host (a ``jump`` naming an inventory host, the transport options)
are written once. Core: no click; ``options`` is the plain dict of parsed option values.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .probe import ProbeSettings, parse_jump
from .ssh.reach import COMMAND_TIMEOUT, CONNECT_TIMEOUT, TransportOptions

JumpResolver = Callable[[str], tuple[str, int | None, str | None]]


def jump_resolver(inv: Any) -> JumpResolver:
    """A ``jump`` hop may name an inventory host (its address, port, user); else it is ``user@host:port``."""

    def resolve(text: str) -> tuple[str, int | None, str | None]:
        host = inv.hosts.get(text)
        if host is not None:
            return host.target, host.port, host.user
        return parse_jump(text)

    return resolve


def absolute(path: str | None) -> str | None:
    """A path the user gave, made absolute here (``~`` expanded, relative to the command's cwd).

    The keeper and the workers run from ``/`` (``child.py``): a relative name resolved there
    would name another file, or none."""
    if not path:
        return path
    return os.path.abspath(os.path.expanduser(path))


def transport_options(options: dict[str, Any]) -> TransportOptions:
    """The transport options out of ``options`` (each is popped: what remains is the command's own)."""
    config = absolute(options.pop("ssh_config", None))
    return TransportOptions(
        known_hosts=absolute(options.pop("known_hosts", None)),
        accept_new=options.pop("accept_new", False),
        ssh_config=[config] if config else None,
        client_keys=[str(absolute(k)) for k in options.pop("identity", ()) or ()] or None,
        connect_timeout=options.pop("connect_timeout", CONNECT_TIMEOUT),
        command_timeout=options.pop("command_timeout", COMMAND_TIMEOUT),
    )


def settings_from(inv: Any, options: dict[str, Any], rules: Any = None, rules_pending: Any = None) -> ProbeSettings:
    """ProbeSettings for hosts of ``inv`` from the parsed options (``log``, ``path_prepend``, transport ones).

    ``rules_pending``: a Future of the rules loading in a thread while the first handshakes run.
    Relative paths (options and the inventory's ``identity_file``) are made absolute here.
    """
    for host in getattr(inv, "hosts", {}).values():
        if getattr(host, "identity_file", None):
            host.identity_file = absolute(host.identity_file)
    return ProbeSettings(
        log=options.pop("log", None),
        rules=rules,
        rules_pending=rules_pending,
        transport=transport_options(options),
        jump_resolver=jump_resolver(inv),
        path_prepend=options.pop("path_prepend", None),
    )
