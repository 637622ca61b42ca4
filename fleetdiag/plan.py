"""The plan step: inventory + command-line options → how to reach and read each host.

inventory → **plan** → remote funnel → analysis → report. Commands (probe, sweep, watch,
preflight) turn their options into :class:`~fleetdiag.probe.ProbeSettings` here, so the
rules for reaching a host (a ``jump`` naming an inventory host, the transport options)
are written once. Core: no click; ``options`` is the plain dict of parsed option values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .probe import ProbeSettings, parse_jump
from .reach import COMMAND_TIMEOUT, CONNECT_TIMEOUT, TransportOptions

JumpResolver = Callable[[str], tuple[str, int | None, str | None]]


def jump_resolver(inv: Any) -> JumpResolver:
    """A ``jump`` hop may name an inventory host (its address, port, user); else it is ``user@host:port``."""

    def resolve(text: str) -> tuple[str, int | None, str | None]:
        host = inv.hosts.get(text)
        if host is not None:
            return host.target, host.port, host.user
        return parse_jump(text)

    return resolve


def transport_options(options: dict[str, Any]) -> TransportOptions:
    """The transport options out of ``options`` (each is popped: what remains is the command's own)."""
    config = options.pop("ssh_config", None)
    return TransportOptions(
        known_hosts=options.pop("known_hosts", None),
        accept_new=options.pop("accept_new", False),
        ssh_config=[config] if config else None,
        client_keys=list(options.pop("identity", ())) or None,
        connect_timeout=options.pop("connect_timeout", CONNECT_TIMEOUT),
        command_timeout=options.pop("command_timeout", COMMAND_TIMEOUT),
    )


def settings_from(inv: Any, options: dict[str, Any], rules: Any = None, rules_pending: Any = None) -> ProbeSettings:
    """ProbeSettings for hosts of ``inv`` from the parsed options (``log``, ``path_prepend``, transport ones).

    ``rules_pending``: a Future of the rules loading in a thread while the first handshakes run.
    """
    return ProbeSettings(
        log=options.pop("log", None),
        rules=rules,
        rules_pending=rules_pending,
        transport=transport_options(options),
        jump_resolver=jump_resolver(inv),
        path_prepend=options.pop("path_prepend", None),
    )
