"""``fleetdiag probe``: why did the launch on these hosts die?"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click

from ..exitcodes import exit_for
from ..probe import ProbeSettings
from ..records import HostResult, report_json
from ..render import fleet_view, host_card
from ..scheduler import DEFAULT_FANOUT, probe_many
from . import Context, handle_errors, main, output_options, pass_ctx, transport_from, transport_options


def jump_resolver(inv):
    """A ``jump`` value may name an inventory host; else it is ``user@host:port``."""
    from ..probe import parse_jump

    def resolve(text: str):
        host = inv.hosts.get(text)
        if host is not None:
            return host.target, host.port, host.user
        return parse_jump(text)

    return resolve


def settings_from(ctx: Context, inv, kw: dict) -> ProbeSettings:
    return ProbeSettings(
        log=kw.pop("log", None),
        rules=ctx.rules(),
        transport=transport_from(kw),
        jump_resolver=jump_resolver(inv),
    )


def emit(ctx: Context, results: list[HostResult], fmt: str | None, cards: bool = True) -> None:
    """Print results in the chosen format (cards, json or already-streamed jsonl)."""
    env = ctx.env
    if fmt == "json":
        click.echo(json.dumps(report_json(results), indent=2))
    elif fmt is None:
        if cards:
            for r in results:
                env.out.print(host_card(r))
        if len(results) > 1:
            from ..render import fleet_view

            env.out.print(fleet_view(results))


@main.command()
@click.argument("selectors", nargs=-1, required=True)
@click.option("--log", help="Log to read: a name from the inventory's logs, or a path/glob.")
@click.option("--fanout", type=int, default=DEFAULT_FANOUT, show_default=True, help="Hosts probed at once.")
@click.option("--save", type=click.Path(file_okay=False), help="Keep the evidence: raw funnel output per host in DIR.")
@output_options
@transport_options
@pass_ctx
@handle_errors
def probe(ctx: Context, selectors: tuple[str, ...], fmt: str | None, fanout: int, save: str | None, **kw) -> None:
    """Run the funnel on the selected hosts and print one card per host.

    SELECTOR: a host, a group, all, a glob (uk-*), a range (gpu[01-04]), a,b or !exclusion.
    """
    from ..inventory import select

    inv = ctx.inventory()
    hosts = select(inv, selectors)
    settings = settings_from(ctx, inv, kw)
    settings.save_dir = Path(save) if save else None
    results: list[HostResult] = []

    async def go() -> None:
        async for res in probe_many(hosts, settings, fanout):
            results.append(res)
            if fmt == "jsonl":
                click.echo(json.dumps(res.to_json()))

    asyncio.run(go())
    order = {h.name: i for i, h in enumerate(hosts)}
    results.sort(key=lambda r: order.get(r.host, 0))
    emit(ctx, results, fmt)
    raise SystemExit(int(exit_for(results)))
