"""``fleetdiag hosts`` and ``fleetdiag check``: what the inventory resolves to."""

from __future__ import annotations

from dataclasses import asdict

import click
from rich.table import Table
from rich.text import Text

from . import Context, complete_selector, handle_errors, main, output_options, pass_ctx


@main.command()
@click.argument("selectors", nargs=-1, shell_complete=complete_selector)
@output_options
@pass_ctx
@handle_errors
def hosts(ctx: Context, selectors: tuple[str, ...], fmt: str | None) -> None:
    """List the resolved hosts and their settings (default: all)."""
    from ..inventory import select

    inv = ctx.inventory()
    chosen = select(inv, selectors or ("all",))
    out = ctx.out
    if fmt:
        rows = [asdict(h) for h in chosen]
        if fmt == "json":
            out.json({"version": 1, "inventory": str(inv.path), "hosts": rows})
        else:
            for row in rows:
                out.jsonl(row)
        return
    table = Table(title=Text(f"{len(chosen)} hosts from {out.shown(str(inv.path))}"), title_justify="left")
    for col in ("host", "target", "port", "user", "jump", "logs", "gpus", "groups"):
        table.add_column(col, overflow="fold")
    for h in (out.shown(h) for h in chosen):
        logs = "\n".join(f"{k}: {v}" for k, v in h.logs.items())
        cells = (h.name, h.target + ("" if h.address else " (ssh config)"), str(h.port or ""), h.user or "",
                 h.jump or "", logs, str(h.gpus if h.gpus is not None else ""), ", ".join(h.groups))
        table.add_row(*(Text(c) for c in cells))
    out.print(table)


@main.command()
@pass_ctx
@handle_errors
def check(ctx: Context) -> None:
    """Validate the inventory; every error names file, line and key (exit 2)."""
    from ..exitcodes import Exit
    from ..inventory import InventoryError

    try:
        inv = ctx.inventory()
    except InventoryError as exc:
        for e in exc.errors:  # each bad value on its own line, not only the first
            ctx.out.error(ctx.out.markup("[bold red]error:[/] {}", str(e)))
        raise SystemExit(int(Exit.USAGE)) from None
    ctx.out.print(ctx.out.markup("[green]ok[/]: {}: {} hosts, {} groups", inv.path, len(inv.hosts), len(inv.groups)))
