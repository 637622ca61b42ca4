"""``fleetdiag probe``: why did the launch on these hosts die?"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import click

from ..exitcodes import exit_for
from ..probe import ProbeSettings
from ..records import HostResult, report_json
from ..inventory import fold
from ..render import FleetProgress, fleet_view, host_card
from ..scheduler import CostMemory, default_deadline, probe_many
from .connections import persist_option
from . import Context, fanout_options, handle_errors, main, output_options, pass_ctx, transport_from, transport_options


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
    from .connections import persist_from

    return ProbeSettings(
        log=kw.pop("log", None),
        rules=ctx.rules(),
        transport=transport_from(kw),
        jump_resolver=jump_resolver(inv),
        path_prepend=kw.pop("path_prepend", None),
        persist=persist_from(kw, inv),
    )


def emit(ctx: Context, results: list[HostResult], fmt: str | None, cards: bool = True, all_cards: bool = False) -> None:
    """Print results in the chosen format (cards, json or already-streamed jsonl).

    One host: its card. Several: one card per root cause (the first host of
    each group that is in trouble, the others named under it), then the fleet
    view; ``all_cards`` prints every host's card instead.
    """
    env = ctx.out
    if fmt == "json":
        env.json(report_json(results))
    elif fmt is None:
        results = [env.shown(r) for r in results]
        if cards and (all_cards or len(results) == 1):
            for r in results:
                env.print(host_card(r))
        elif cards:
            from rich.text import Text

            from ..store import group_by_cause, incident_key

            for g in group_by_cause(results):
                if incident_key(g.example) is None:
                    continue
                env.print(host_card(g.example))
                if len(g.results) > 1:
                    others = fold(g.hosts[1:])
                    env.print(Text(f"  same root cause on {len(g.results) - 1} more: {others}", style="bold"),
                              soft_wrap=True)
        if len(results) > 1:
            env.print(fleet_view(results))


def cost_memory() -> CostMemory:
    """What the sweep history knows of each host's cost (read only; probe never writes it)."""
    from ..store import Store, StoreError, default_db_path

    path = Path(os.environ.get("FLEETDIAG_DB") or default_db_path())
    if not path.exists():
        return CostMemory()
    try:
        with Store(path, timeout=0.5, readonly=True) as store:
            return CostMemory(store.costs())
    except StoreError:
        return CostMemory()


@main.command()
@click.argument("selectors", nargs=-1, required=True)
@click.option("--log", help="Log to read: a name from the inventory's logs, or a path/glob.")
@click.option("--path-prepend", metavar="DIR", help="Remote directory searched first for host tools such as nvidia-smi.")
@fanout_options
@click.option("--save", type=click.Path(file_okay=False), help="Keep the evidence: raw funnel output per host in DIR.")
@click.option("--all-cards", is_flag=True, help="With several hosts, print every host's card, not one per root cause.")
@output_options
@transport_options
@persist_option
@pass_ctx
@handle_errors
def probe(ctx: Context, selectors: tuple[str, ...], fmt: str | None, fanout: int, per_address: int,
          deadline: float | None, save: str | None, all_cards: bool, **kw) -> None:
    """Run the funnel on the selected hosts and print one card per host.

    SELECTOR: a host, a group, all, a glob (uk-*), a range (gpu[01-04]), a,b or !exclusion.
    With several hosts, hosts with the same root cause share one card and the
    fleet view folds them into a range (gpu[01-04,07]).
    """
    from ..inventory import select

    inv = ctx.inventory()
    hosts = select(inv, selectors)
    settings = settings_from(ctx, inv, kw)
    settings.save_dir = Path(save) if save else None
    t = settings.transport
    deadline = deadline or default_deadline(t.connect_timeout, t.command_timeout)
    results: list[HostResult] = []
    show = ctx.out.err.is_terminal and len(hosts) > 1

    async def go() -> None:
        with FleetProgress(ctx.out.err, len(hosts), enabled=show) as bar:
            async for res in probe_many(hosts, settings, fanout, deadline=deadline, per_address=per_address or None,
                                        memory=cost_memory(), progress=bar if show else None):
                results.append(res)
                if fmt == "jsonl":
                    ctx.out.jsonl(res.to_json())

    asyncio.run(go())
    order = {h.name: i for i, h in enumerate(hosts)}
    results.sort(key=lambda r: order.get(r.host, 0))
    emit(ctx, results, fmt, all_cards=all_cards)
    raise SystemExit(int(exit_for(results)))
