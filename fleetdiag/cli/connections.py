"""``fleetdiag connections``: what the keeper holds open, and ``--persist`` for the commands that probe."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from . import Context, handle_errors, main, pass_ctx


def _duration(ctx: click.Context, param: click.Parameter, value: Any) -> float | None:
    if value is None:
        return None
    from ..units import parse_duration

    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def persist_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--persist DURATION`` (also $FLEETDIAG_PERSIST): keep each host's connection open after the command."""
    return click.option(
        "--persist",
        metavar="DURATION",
        envvar="FLEETDIAG_PERSIST",
        callback=_duration,
        help="Keep each host's SSH connection open this long after use, for the next command "
        "(like ssh ControlPersist) [default: 10m, sweep 0; 0: close at exit; $FLEETDIAG_PERSIST].",
    )(fn)


def persist_from(kw: dict[str, Any], inv: Any = None, default: float | None = None) -> float:
    """Seconds to keep connections: --persist, else $FLEETDIAG_PERSIST, else the inventory's defaults.persist,
    else ``default`` (10 minutes when not given; ``sweep`` passes 0: a cron job leaves nothing running)."""
    from ..ssh.keeper import DEFAULT_PERSIST

    value = kw.pop("persist", None)
    if value is None:
        value = getattr(inv, "persist", None)
    if value is None:
        value = DEFAULT_PERSIST if default is None else default
    return float(value)


@main.command()
@click.option("--close", is_flag=True, help="Close every kept connection and end the keeper.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@pass_ctx
@handle_errors
def connections(ctx: Context, close: bool, as_json: bool) -> None:
    """List the SSH connections kept open for the next command (host, age, idle, RTT)."""
    from ..ssh.keeper import close_kept, list_kept

    env = ctx.out
    if close:
        n = close_kept()
        if as_json:
            env.json({"closed": n or 0, "keeper": n is not None})
        else:
            env.print("no keeper running" if n is None else f"closed {n} connection{'s' if n != 1 else ''}")
        return
    kept = list_kept()
    if env.redactor is not None:  # --redact: the keeper's host names and addresses are names like any other
        env.redactor.add_hosts(n for c in kept or [] for n in (c.get("host"), *_where_names(str(c.get("where", "")))))
    if as_json:
        env.json({"keeper": kept is not None, "connections": kept or []})
        return
    if not kept:
        env.print("no kept connections" if kept is not None else "no keeper running: no kept connections")
        return
    from ..render.listing import connections_table

    env.print(connections_table(kept, env.shown))


def _where_names(where: str) -> list[str]:
    """The names in a kept connection's ``where``: ``gpu01:22`` or ``gpu01 (10.0.0.1:42022)``."""
    name, _, dialled = where.partition(" (")
    return [n for n in (name.rpartition(":")[0] if not dialled else name, dialled.rstrip(")").rpartition(":")[0]) if n]
