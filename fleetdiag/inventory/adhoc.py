"""Hosts named on the command line, with no inventory file: ``[user@]host[:port]`` or an ssh alias,
comma lists, ``^hosts.txt`` (one a line) or ``-`` (the same from stdin).

Each value is checked like an inventory value (``host_problem``, ``user_problem``,
the port range) so a typo or a shell metacharacter never reaches ssh.
"""

from __future__ import annotations

from typing import TextIO

from .fields import host_problem, user_problem
from .model import Host, Inventory, InventoryError
from .selection import is_list, read_list


def parse_target(text: str) -> Host:
    """``[user@]host[:port]``, ``[user@][v6addr]:port``, or a bare ssh config alias."""
    user = None
    rest = text
    if "@" in text:
        user, rest = text.rsplit("@", 1)
        why = user_problem(user)
        if why:
            raise InventoryError(f"user '{user}' {why}", key=text)
    port: int | None = None
    host = rest
    if rest.startswith("["):
        addr, sep, tail = rest[1:].partition("]")
        if not sep:
            raise InventoryError("unclosed '[' in an IPv6 address", key=text)
        host = addr
        if tail:
            if not tail.startswith(":"):
                raise InventoryError(f"expected ':PORT' after ']', got '{tail}'", key=text)
            port = _port(tail[1:], text)
    elif rest.count(":") == 1:
        host, _, p = rest.partition(":")
        port = _port(p, text)
    why = host_problem(host)
    if why:
        raise InventoryError(f"host '{host}' {why}", key=text)
    return Host(name=text, address=None if host == text else host, port=port, user=user)


def _port(p: str, text: str) -> int:
    if not p.isdigit() or not 1 <= int(p) <= 65535:
        raise InventoryError(f"port '{p}' is not a number from 1 to 65535", key=text)
    return int(p)


def _terms(sel: str, stdin: TextIO | None) -> list[tuple[str, str]]:
    """(where, term) pairs: a comma list, ``^FILE`` (one host a line, ``#`` comments) or ``-`` (stdin)."""
    if is_list(sel):
        return read_list(sel, stdin)
    return [(sel, t.strip()) for t in sel.split(",") if t.strip()]


def adhoc_inventory(selectors: tuple[str, ...] | list[str], stdin: TextIO | None = None) -> Inventory:
    """An inventory of the hosts named on the command line (comma lists, ``^hosts.txt``, ``-``), in order."""
    hosts: dict[str, Host] = {}
    for sel in selectors:
        for where, term in _terms(sel, stdin):
            try:
                h = parse_target(term)
            except InventoryError as e:
                e.key = f"{where}: {e.key}" if where != sel else e.key
                raise
            hosts.setdefault(h.name, h)
    if not hosts:
        raise InventoryError("no host named")
    return Inventory(path=None, hosts=hosts, groups={})
