"""Listings: the inventory's hosts (``hosts``) and the kept connections (``connections``), as a table
when it fits and one block per entry when it does not."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from ..units import ago, ms


def fits(out: Any, table: Table) -> bool:
    """Whether the table fits the width without folding a cell (an address or a path split is useless)."""
    console = out.out
    return console.measure(table, options=console.options.update_width(10**5)).maximum <= console.width


def hosts_table(title: Text, hosts: list[Any]) -> Table:
    """The inventory's hosts, one row each, as they may be shown."""
    table = Table(title=title, title_justify="left")
    for col in ("host", "target", "port", "user", "jump", "logs", "gpus", "groups"):
        table.add_column(col, no_wrap=col != "groups")
    for h in hosts:
        logs = "\n".join(f"{k}: {v}" for k, v in h.logs.items())
        cells = (
            h.name,
            h.target + ("" if h.address else "\n(ssh config)"),
            str(h.port or ""),
            h.user or "",
            h.jump or "",
            logs,
            str(h.gpus if h.gpus is not None else ""),
            ", ".join(h.groups),
        )
        table.add_row(*(Text(c) for c in cells))
    return table


def hosts_lines(hosts: list[Any]) -> list[Text]:
    """The hosts table for a width it does not fit: each address and path whole on its line."""
    out: list[Text] = []
    for h in hosts:
        target = (f"{h.user}@" if h.user else "") + h.target + (f":{h.port}" if h.port else "")
        head = Text.assemble((h.name, "bold"), "  ", target, "" if h.address else " (ssh config)")
        if h.jump:
            head.append(f"  via {h.jump}")
        if h.gpus is not None:
            head.append(f"  gpus {h.gpus}")
        if h.groups:
            head.append(f"  groups {', '.join(h.groups)}", style="dim")
        out.append(head)
        out += [Text(f"  {k}: {v}") for k, v in h.logs.items()]
    return out


def connections_table(kept: list[dict[str, Any]], shown: Any = str) -> Table:
    """The keeper's connections, one row each; ``shown`` makes a host's name or address printable."""
    table = Table(title=f"{len(kept)} kept connection{'s' if len(kept) != 1 else ''}", title_justify="left")
    for col in ("host", "address", "age", "idle", "RTT", "uses"):
        table.add_column(col)
    for c in kept:
        table.add_row(
            shown(c["host"]), shown(c["where"]), ago(c["age_s"]), ago(c["idle_s"]), ms(c["rtt_ms"]), str(c["uses"])
        )
    return table
