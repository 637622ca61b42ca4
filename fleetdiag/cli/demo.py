"""``fleetdiag demo``: the product at work on a simulated fleet, in one command."""

from __future__ import annotations

import asyncio
import shlex
import signal
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.rule import Rule
from rich.text import Text

from ..job import root_causes
from ..probe import ProbeSettings
from ..records import HostResult
from ..render import fleet_view, host_card
from ..ssh.scheduler import probe_many
from . import Context, handle_errors, main, pass_ctx, run_async

if TYPE_CHECKING:
    from ..demo import DemoFleet


@main.command()
@click.option(
    "--serve", is_flag=True, help="Keep the simulated fleet running (Ctrl-C to stop) to try other commands on it."
)
@pass_ctx
@handle_errors
def demo(ctx: Context, serve: bool) -> None:
    """Probe a simulated failing fleet on a local SSH server (no setup, no root).

    Exits 0 when every simulated node got the verdict its story calls for (the
    product works on this machine), 1 otherwise; the exit codes probe and
    sweep would give are shown in the output.
    """
    from ..demo import DemoFleet, default_nodes  # the in-process SSH server needs asyncssh; load it only here
    from ..inventory import load_inventory, select

    out = _MarkupConsole(ctx)
    with tempfile.TemporaryDirectory(prefix="fleetdiag-demo-") as tmp:

        async def go() -> list[HostResult]:
            async with DemoFleet(Path(tmp)) as fleet:
                out.print(Rule("fleetdiag demo"))
                out.print(
                    f"A local SSH server on 127.0.0.1 plays {len(fleet.nodes)} GPU nodes, each behind a simulated "
                    "network delay.\n"
                    "Each node's vLLM log tells a different story:\n"
                )
                for n in fleet.nodes:
                    out.print(f"  [bold]{n.name}[/]  {n.rtt_ms:>4.0f} ms away  {n.story}")
                out.print(f"\nRunning [bold]fleetdiag -i {fleet.inventory} probe all[/] over real SSH …\n")
                inv = load_inventory(fleet.inventory)
                hosts = select(inv, ["all"])
                # the demo's nodes are this machine: its stalled node has no hung job to read stacks from
                settings = ProbeSettings(rules=ctx.rules(), transport=fleet.options, stacks=False)
                results = [r async for r in probe_many(hosts, settings)]
                order = {h.name: i for i, h in enumerate(hosts)}
                results.sort(key=lambda r: order[r.host])
                for r in results:
                    out.print(host_card(ctx.out.shown(r)))
                rcs = [ctx.out.shown(rc) for rc in root_causes(results)]
                out.print(fleet_view([ctx.out.shown(r) for r in results], root_causes=rcs))
                if rcs:
                    out.print(
                        "\nA job across nodes: fr-node-a and fr-node-b both failed, but only one broke the job. "
                        "fr-node-a's NCCL error is stamped first, yet it is a [bold]consequence[/] (a peer vanished); "
                        "the [bold]job root cause[/] line names the node and rank whose own error started it. "
                        "The se-nodes run a gloo job: two of them show only [bold]Connection closed by peer[/] "
                        "under their launcher's [bold]failed (exitcode: 1)[/]; that is each rank's own line, "
                        "peer-caused, and the job line names se-node-1 and how the job was formed."
                    )
                out.print(
                    "\nHow to read a card: [bold]cause[/] is the root-cause line fleetdiag chose; "
                    "[bold]cascade[/] counts the later errors it caused (the ones a tail or grep would show you first); "
                    "[bold]hint[/] says what to check."
                )
                await _sweeps(ctx, fleet, hosts, settings, Path(tmp))
                out.print(
                    "\nNext: put your own nodes in inventory.yaml (see the README), run [bold]fleetdiag probe all[/], "
                    'and put [bold]fleetdiag sweep all[/] in your crontab (README, "Sweep from cron").'
                )
                if serve:
                    ctx.out.print()
                    ctx.out.print(Text("Try: " + try_command(fleet)), soft_wrap=True)
                    ctx.out.print(
                        Text(
                            "Serving until Ctrl-C or SIGTERM; the fleet's files (and its private key) "
                            f"are removed then: {fleet.workdir}",
                            style="dim",
                        ),
                        soft_wrap=True,
                    )
                    loop = asyncio.get_running_loop()
                    task = asyncio.current_task()
                    for sig in (signal.SIGTERM, signal.SIGHUP):  # stop like Ctrl-C: the temp dir goes too
                        try:
                            loop.add_signal_handler(sig, task.cancel)  # type: ignore[union-attr]
                        except (NotImplementedError, RuntimeError, ValueError):
                            pass
                    try:
                        await asyncio.Event().wait()
                    except asyncio.CancelledError:
                        task.uncancel()  # type: ignore[union-attr]
                return results

        try:
            results = run_async(go())
        except KeyboardInterrupt:
            return
    if serve:
        return
    expected = {n.name: n.expect for n in default_nodes()}
    wrong = [r for r in results if expected.get(r.host) != r.verdict]
    for r in wrong:
        ctx.out.error(f"demo: {r.host} should be {expected.get(r.host)}, got {r.verdict}: {r.error or ''}")
    raise SystemExit(1 if wrong else 0)


def try_command(fleet: DemoFleet) -> str:
    """A probe of the served fleet that runs as printed (its own key, host keys and no ssh config)."""
    q = shlex.quote
    return (
        f"fleetdiag -i {q(str(fleet.inventory))} probe all --known-hosts {q(str(fleet.known_hosts))} "
        f"--identity {q(str(fleet.client_key))} --ssh-config /dev/null"
    )


class _MarkupConsole:
    """The demo's own narration is markup written here; everything else goes through the Output."""

    def __init__(self, ctx: Context):
        self.console = ctx.out.out

    def print(self, *objects: object, **kw: object) -> None:
        kw.setdefault("markup", True)
        self.console.print(*objects, **kw)


async def _sweeps(ctx: Context, fleet: DemoFleet, hosts: list, settings: ProbeSettings, tmp: Path) -> None:
    """What cron sees: a first sweep reports every incident, the next one only the change."""
    from importlib import resources

    from ..store import Store
    from ..sweep import SweepJob, execute
    from .sweep import print_history, print_outcome

    out = _MarkupConsole(ctx)
    db = tmp / "history.sqlite3"
    job = SweepJob(hosts=hosts, settings=settings, selector="all", db=db, report=tmp / "last-sweep.json", deadline=30.0)
    cmd = f"fleetdiag -i {fleet.inventory} sweep all --db {db}"
    out.print(Rule("sweep: what cron runs"))
    out.print(f"[bold]{cmd}[/]  (a JSON report, a history, and only the news since the last sweep)\n")
    first = await execute(job)
    print_outcome(ctx.out, first)
    out.print(
        f"exit code {int(first.exit)} · took {first.finished - first.started:.1f} s: as long as its "
        "slowest host; the next sweep starts that one first\n"
    )
    uk = next(n for n in fleet.nodes if n.name == "uk-node")
    original = uk.path.read_text("utf-8") if uk.path is not None else None
    if uk.path is not None:  # someone fixes the launch on uk-node
        uk.path.write_text(resources.files("fleetdiag").joinpath("data", "demo", "healthy.log").read_text("utf-8"))
        out.print("Someone relaunches vLLM on uk-node with DP=1; it comes up. The next sweep prints only that:\n")
    out.print(f"[bold]{cmd}[/]")
    try:
        second = await execute(job)
    finally:
        if uk.path is not None and original is not None:  # --serve keeps the fleet as described
            uk.path.write_text(original, "utf-8")
    print_outcome(ctx.out, second)
    if not second.changes:
        out.print("[dim](nothing changed: no output, so cron mails nothing)[/]")
    out.print(f"exit code {int(second.exit)} (failures remain on other nodes)\n")
    out.print(f"[bold]fleetdiag history --db {db}[/]")
    with Store(db, readonly=True) as store:
        print_history(ctx.out, store.incidents(), db)
