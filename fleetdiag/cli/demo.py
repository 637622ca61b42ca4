"""``fleetdiag demo``: the product at work on a simulated fleet, in one command."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import click
from rich.rule import Rule

from ..demo import DemoFleet
from ..exitcodes import exit_for
from ..probe import ProbeSettings
from ..records import HostResult
from ..render import fleet_view, host_card
from ..scheduler import probe_many
from . import Context, handle_errors, main, pass_ctx


@main.command()
@click.option("--serve", is_flag=True, help="Keep the simulated fleet running (Ctrl-C to stop) to try other commands on it.")
@pass_ctx
@handle_errors
def demo(ctx: Context, serve: bool) -> None:
    """Probe a simulated failing fleet on a local SSH server (no setup, no root)."""
    from ..inventory import load_inventory, select

    out = ctx.env.out
    with tempfile.TemporaryDirectory(prefix="fleetdiag-demo-") as tmp:

        async def go() -> list[HostResult]:
            async with DemoFleet(Path(tmp)) as fleet:
                out.print(Rule("fleetdiag demo"))
                out.print(
                    "A local SSH server on 127.0.0.1 plays four GPU nodes, each behind a simulated network delay.\n"
                    "Each node's vLLM log tells a different story:\n"
                )
                for n in fleet.nodes:
                    out.print(f"  [bold]{n.name}[/]  {n.rtt_ms:>4.0f} ms away  {n.story}")
                out.print(f"\nRunning [bold]fleetdiag -i {fleet.inventory} probe all[/] over real SSH …\n")
                inv = load_inventory(fleet.inventory)
                hosts = select(inv, ["all"])
                settings = ProbeSettings(rules=ctx.rules(), transport=fleet.options)
                results = [r async for r in probe_many(hosts, settings)]
                order = {h.name: i for i, h in enumerate(hosts)}
                results.sort(key=lambda r: order[r.host])
                for r in results:
                    out.print(host_card(r))
                out.print(fleet_view(results))
                out.print(
                    "\nHow to read a card: [bold]cause[/] is the root-cause line fleetdiag chose; "
                    "[bold]cascade[/] counts the later errors it caused (the ones a tail or grep would show you first); "
                    "[bold]hint[/] says what to check.\n"
                    "Next: put your own nodes in inventory.yaml (see the README) and run [bold]fleetdiag probe all[/]."
                )
                if serve:
                    out.print(f"\nServing. Try:  fleetdiag -i {fleet.inventory} --known-hosts ... (see {fleet.workdir})")
                    out.print(f"  options: --known-hosts {fleet.known_hosts} -k {fleet.client_key}")
                    try:
                        await asyncio.Event().wait()
                    except asyncio.CancelledError:
                        pass
                return results

        try:
            results = asyncio.run(go())
        except KeyboardInterrupt:
            return
    raise SystemExit(int(exit_for(results)) if not serve else 0)
