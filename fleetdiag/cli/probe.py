"""``fleetdiag probe``: why did the launch on these hosts die?"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import click
from rich.text import Text

from ..exitcodes import Exit, exit_for
from ..inventory import fold
from ..plan import jump_resolver, settings_from  # noqa: F401  (jump_resolver: re-exported)
from ..probe import ProbeSettings
from ..records import SCHEMA_VERSION, HostResult, report_json
from ..render import (
    FORMATS,
    TABLE_FIRST,
    FleetProgress,
    fleet_csv,
    fleet_title,
    fleet_view,
    host_card,
    incident_report,
    job_cards,
    report_text,
)
from ..ssh.scheduler import CostMemory, default_deadline
from ..ssh.spread import probe_fleet
from . import (
    Context,
    View,
    check_logs,
    complete_selector,
    fanout_options,
    handle_errors,
    main,
    output_options,
    pass_ctx,
    select_hosts,
    transport_options,
    view_options,
)
from .connections import persist_option


def inventory_or_adhoc(ctx: Context, selectors: tuple[str, ...]):
    """The inventory's hosts; with no inventory anywhere (no -i, no FLEETDIAG_INVENTORY, no file
    found), the selectors themselves as ``[user@]host[:port]`` or ssh aliases."""
    from ..inventory import ENV_VAR, InventoryError, InventoryNotFound
    from ..inventory.adhoc import adhoc_inventory

    try:
        inv = ctx.inventory()
    except InventoryNotFound as missing:
        if ctx.inventory_arg or os.environ.get(ENV_VAR):
            raise
        try:
            inv = adhoc_inventory(selectors)
        except InventoryError as bad:
            raise InventoryError(
                f"{missing}; and '{bad.key}' is not a host to probe without one: {bad.message}"
            ) from None
        if ctx.redactor is not None:
            ctx.redactor.seed_inventory(inv)
        return inv, list(inv)
    return inv, select_hosts(inv, selectors)


def emit(
    ctx: Context,
    results: list[HostResult],
    fmt: str | None,
    cards: bool = True,
    all_cards: bool = False,
    view: View | None = None,
) -> None:
    """Print results in the chosen format (cards, json, csv, md, html or already-streamed jsonl).

    One host: its card. Several: one card per root cause (the first host of
    each group that is in trouble, the others named under it), then the fleet
    view; with many hosts the fleet view comes first, so the answer is on the first
    screen. ``all_cards`` prints every host's card instead; ``view`` filters the hosts
    (``--only``/``--hide``) and, with ``--summary``, prints the table alone.
    """
    from ..job import root_causes

    env = ctx.out
    view = view or View()
    total = len(results)
    title = fleet_title(results)  # the whole fleet's counts, whatever the filter shows
    all_rcs = root_causes(results) if total > 1 else []
    results = view.keep(results)
    kept = {r.host for r in results}
    rcs = [rc for rc in all_rcs if rc.host in kept]
    note = view.note(total, len(results))
    if fmt == "json":
        from ..job import report

        env.json(report_json(results, report(results)))
    elif fmt == "jsonl":  # the host lines streamed as they came; the job-level answer needs them all
        from ..job import report

        env.jsonl({"version": SCHEMA_VERSION, "event": "summary", "root_causes": report(results)})
    elif fmt == "csv":
        env.document(fleet_csv([env.shown(r) for r in results], [env.shown(rc) for rc in rcs]))
    elif fmt in ("md", "html"):
        rep = incident_report([env.shown(r) for r in results], [env.shown(rc) for rc in rcs])
        if note:
            rep.notes.append(note)
        env.document(report_text(rep, fmt))
    elif fmt is None:
        rcs = [env.shown(rc) for rc in rcs]
        results = [env.shown(r) for r in results]
        several = total > 1
        table_first = several and (view.summary or total >= TABLE_FIRST)
        if several and table_first and results:
            env.print(fleet_view(results, title=title, root_causes=rcs))
        if cards and not view.summary:
            if all_cards or len(results) == 1:
                for r in results:
                    env.print(host_card(r))
            else:
                print_job_cards(env, results, rcs)
        if several and not table_first and results:
            env.print(fleet_view(results, title=title, root_causes=rcs))
        if note:
            env.print(Text(note, style="dim"), soft_wrap=True)


def print_job_cards(env, results: list[HostResult], rcs: list) -> None:
    """``render.job_cards``, printed (lines wrap softly, cards fit the terminal)."""
    from rich.text import Text

    for item in job_cards(results, rcs):
        env.print(item, soft_wrap=isinstance(item, Text))


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
@click.argument("selectors", nargs=-1, required=True, shell_complete=complete_selector)
@click.option(
    "--log",
    help="Log to read: a name from the inventory's logs, or a path/glob [default: the first "
    "configured log; none configured: found on the host from the job's process].",
)
@click.option(
    "--path-prepend", metavar="DIR", help="Remote directory searched first for host tools such as nvidia-smi."
)
@fanout_options
@click.option("--save", type=click.Path(file_okay=False), help="Keep the evidence: raw funnel output per host in DIR.")
@click.option("--all-cards", is_flag=True, help="With several hosts, print every host's card, not one per root cause.")
@click.option(
    "--no-stacks",
    is_flag=True,
    help="A stalled host: skip the second round trip that reads where its processes wait (py-spy, /proc).",
)
@view_options
@output_options(formats=FORMATS)
@transport_options
@persist_option
@pass_ctx
@handle_errors
def probe(
    ctx: Context,
    selectors: tuple[str, ...],
    fmt: str | None,
    fanout: int,
    per_address: int,
    deadline: float | None,
    workers: int,
    save: str | None,
    all_cards: bool,
    no_stacks: bool,
    view: View,
    **kw,
) -> None:
    """Run the funnel on the selected hosts and print one card per host.

    SELECTOR: a host, a group, all, a glob (uk-*), a range (gpu[01-04]), a,b or !exclusion.
    With no inventory anywhere: [user@]host[:port], an ~/.ssh/config alias, ^hosts.txt or -
    (stdin); without --log, the host finds its job's log itself.
    With several hosts, hosts with the same root cause share one card and the
    fleet view folds them into a range (gpu[01-04,07]).
    """
    inv, hosts = inventory_or_adhoc(ctx, selectors)
    check_logs(hosts, kw.get("log"))
    from .connections import persist_from

    persist = persist_from(kw, inv)
    settings = settings_from(inv, kw, rules_pending=ctx.rules_soon())
    settings.persist = persist
    settings.save_dir = Path(save).absolute() if save else None  # the workers run from /
    settings.stacks = not no_stacks
    t = settings.transport
    deadline = deadline or default_deadline(t.connect_timeout, t.command_timeout)
    results: list[HostResult] = []
    show = ctx.out.err.is_terminal and len(hosts) > 1

    interrupted = False

    async def go() -> None:
        nonlocal interrupted
        with FleetProgress(ctx.out.err, len(hosts), enabled=show) as bar:
            try:
                async for res in probe_fleet(
                    hosts,
                    settings,
                    fanout,
                    deadline=deadline,
                    per_address=per_address or None,
                    memory=cost_memory() if len(hosts) > fanout else None,  # order matters only with a queue
                    progress=bar if show else None,
                    workers=workers or None,
                ):
                    if not results:  # a bad --rules file stops here, before any output (exit 2)
                        await settings.rules_ready()
                    results.append(res)
                    if fmt == "jsonl" and view.keep([res]):
                        ctx.out.jsonl(res.to_json())
            except asyncio.CancelledError:  # Ctrl-C: keep the hosts that answered, as sweep does
                interrupted = True
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()

    asyncio.run(go())
    if interrupted:
        unfinished = interrupted_results(hosts, results, settings)
        if fmt == "jsonl":
            for res in view.keep(unfinished):
                ctx.out.jsonl(res.to_json())
        results += unfinished
    order = {h.name: i for i, h in enumerate(hosts)}
    results.sort(key=lambda r: order.get(r.host, 0))
    if len(hosts) == 1 and persist > 0 and not interrupted:  # the next identical command sends it ahead
        remember_request(ctx)
    emit(ctx, results, fmt, all_cards=all_cards, view=view)
    if interrupted:
        ctx.out.error(
            Text(
                f"fleetdiag probe: interrupted; {len(unfinished)} host(s) unfinished: "
                f"{fold([r.host for r in unfinished])}",
                style="yellow",
            ),
            soft_wrap=True,
        )
        raise SystemExit(int(Exit.INTERRUPTED))
    raise SystemExit(int(exit_for(results)))


def remember_request(ctx: Context) -> None:
    """Keep this probe's request for the next identical command line (``ssh.keeper.ahead``), with the
    inventory file that decided it."""
    from ..inventory import InventoryError, find_inventory
    from ..ssh.keeper import ahead

    try:
        files = [str(find_inventory(ctx.inventory_arg))]
    except InventoryError:
        files = []
    ahead.remember(files=files)


def interrupted_results(hosts: list, results: list[HostResult], settings: ProbeSettings) -> list[HostResult]:
    """An ``interrupted`` placeholder for every host that had not answered when Ctrl-C came."""
    from ..ssh.scheduler import INTERRUPTED, placeholder
    from ..sweep import _log_of

    seen = {r.host for r in results}
    return [placeholder(h, "interrupted", INTERRUPTED, _log_of(h, settings)) for h in hosts if h.name not in seen]
