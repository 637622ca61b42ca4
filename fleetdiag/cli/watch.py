"""``fleetdiag watch``: a live dashboard of the selected hosts, updated by the hosts themselves."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from contextlib import aclosing
from typing import Any

import click

from ..exitcodes import exit_for
from . import (  # noqa: F401
    DURATION,
    Context,
    Duration,
    View,
    check_logs,
    complete_selector,
    handle_errors,
    main,
    pass_ctx,
    select_hosts,
    transport_from,
    transport_options,
    view_options,
)


@main.command()
@click.argument("selectors", nargs=-1, required=True, shell_complete=complete_selector)
@click.option("--log", help="Log to follow: a name from the inventory's logs, or a path/glob.")
@click.option(
    "--path-prepend", metavar="DIR", help="Remote directory searched first for host tools such as nvidia-smi."
)
@click.option(
    "--stall-after",
    type=DURATION,
    default="10m",
    show_default=True,
    help="No log growth for this long: stalled (an inventory funnel.stall_after wins per host).",
)
@click.option(
    "--wait-limit",
    type=DURATION,
    default="15m",
    show_default=True,
    help="Waiting for a server / loading for this long: stalled.",
)
@click.option(
    "--process",
    metavar="PATTERN",
    help="pgrep -f pattern of the serving process: gone while the log names no error = stalled.",
)
@click.option(
    "--grace",
    type=DURATION,
    default="10s",
    show_default=True,
    help="A dropped connection that stays down this long makes the host unreachable.",
)
@click.option("--heartbeat", type=DURATION, default="2s", show_default=True, help="Remote heartbeat period.")
@click.option("--duration", type=DURATION, help="Stop after this long and print the summary [default: until Ctrl-C].")
@click.option(
    "--jsonl", is_flag=True, help="Stream state-change events as JSON lines (for piping) instead of the table."
)
@click.option("--no-facts", is_flag=True, help="Skip the GPU/serving-process facts in the first snapshot.")
@view_options(summary=False, states=True)
@transport_options
@pass_ctx
@handle_errors
def watch(
    ctx: Context,
    selectors: tuple[str, ...],
    log: str | None,
    path_prepend: str | None,
    stall_after: float,
    wait_limit: float,
    process: str | None,
    grace: float,
    heartbeat: float,
    duration: float | None,
    jsonl: bool,
    no_facts: bool,
    view: View,
    **kw: Any,
) -> None:
    """Watch hosts live: each keeps one SSH connection and pushes what changes.

    \b
    States: connecting, starting, healthy, failed (the decisive error, as probe),
    stalled (log not growing, waiting too long, or --process gone),
    unreachable (down past --grace), no-log, recovered (healthy after trouble).
    Each change is printed above the table and stays in the scrollback; Ctrl-C
    prints a summary. Exit code as probe, from the final states.
    """
    from ..plan import jump_resolver
    from ..render import host_card, watch_event_line, watch_table
    from ..watch import FAILED, TROUBLE, Watch, WatchSettings

    inv = ctx.inventory()
    hosts = select_hosts(inv, selectors)
    check_logs(hosts, log)
    settings = WatchSettings(
        log=log,
        rules=ctx.rules(),
        transport=transport_from(kw),
        stall_after=stall_after,
        wait_limit=wait_limit,
        process=process,
        grace=grace,
        heartbeat=heartbeat,
        facts=not no_facts,
        jump_resolver=jump_resolver(inv),
        path_prepend=path_prepend,
    )
    w = Watch(hosts, settings)
    out = ctx.out
    live_table = out.is_tty and not jsonl

    def table(live: bool = False) -> Any:
        """The dashboard; live, it fits the terminal's height (healthy hosts fold, failures stay on screen)."""
        views = list(w.views.values())
        kept = view.keep(views)
        note = view.note(len(views), len(kept))
        title = None
        if note:  # the counts stay the whole fleet's; the rows are the filter's
            from collections import Counter

            from ..records import WatchState
            from ..render import plural

            counts = Counter(v.state for v in views)
            head = " · ".join(f"{counts[s]} {s}" for s in WatchState if counts[s])
            title = f"{plural(len(views), 'host')}: {head} · {note}"
        return watch_table([out.shown(v) for v in kept], title=title, height=out.out.height if live else None)

    jobs_told: set[tuple[str, tuple[str, ...]]] = set()

    def new_root_causes() -> list[Any]:
        """A job's root cause, once, as soon as the failed hosts' evidence names it."""
        from ..job import root_causes

        fresh = []
        for rc in root_causes(w.results()):
            key = (rc.host, tuple(rc.affected))
            if key not in jobs_told:
                jobs_told.add(key)
                fresh.append(rc)
        return fresh

    def on_event(ev: Any, console: Any = out.out) -> None:
        if not view.keep([ev]):  # --only/--hide: the events of the states kept
            return
        if jsonl:
            out.jsonl(ev.to_json())
            if ev.state == FAILED:
                for rc in new_root_causes():
                    out.jsonl({"version": 1, "event": "root_cause", "time": round(time.time(), 3), **rc.to_json()})
            return
        console.print(watch_event_line(out.shown(ev)), soft_wrap=True)
        if ev.state == FAILED:  # the whole story, once, where the scrollback keeps it
            console.print(host_card(out.shown(w.views[ev.host].to_result())))
            from rich.text import Text

            from ..job import summary_line

            for rc in new_root_causes():
                console.print(Text(summary_line(out.shown(rc)), style="bold red"), soft_wrap=True)

    async def go() -> None:
        async with aclosing(w.events()) as events:
            if not live_table:
                try:
                    async for ev in events:
                        on_event(ev)
                except BrokenPipeError:  # `watch --jsonl | head -3`: the reader is done, so are we
                    closed["stdout"] = True
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return
            from rich.live import Live

            with Live(
                console=out.out,
                get_renderable=lambda: table(live=True),
                refresh_per_second=4,
                transient=False,
                redirect_stdout=False,
            ) as live:
                async for ev in events:
                    on_event(ev, live.console)

    async def bounded() -> None:
        import signal

        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        for sig in (signal.SIGTERM, signal.SIGHUP):  # systemd, timeout(1), a closed terminal: end with the summary
            try:
                loop.add_signal_handler(sig, task.cancel)  # type: ignore[union-attr]
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        if duration is None:
            await go()
            return
        try:
            await asyncio.wait_for(go(), duration)
        except (asyncio.TimeoutError, TimeoutError):
            pass

    closed = {"stdout": False}
    interrupted = False
    try:
        asyncio.run(bounded())
    except (KeyboardInterrupt, asyncio.CancelledError):
        interrupted = True
    results = w.results()
    states = {v.host: v.state for v in w.views.values()}
    if jsonl:
        if not closed["stdout"]:
            from ..job import report

            rcs = report(results)
            summary = {
                "version": 1,
                "event": "summary",
                "time": round(time.time(), 3),
                "interrupted": interrupted,
                "hosts": [{**r.to_json(), "state": states[r.host]} for r in results],
                "root_causes": rcs,
            }
            out.jsonl(summary)
    else:
        if not live_table:
            out.print(table())
        for v in view.keep(list(w.views.values())):
            if v.state in TROUBLE and v.state != FAILED:  # failed cards were printed when they happened
                out.print(host_card(out.shown(v.to_result())))
        counts = ", ".join(f"{n} {s}" for s, n in _counts(w.views.values()).items())
        out.print(out.markup("[bold]watch {}[/]: {}", "interrupted" if interrupted else "ended", counts))
    raise SystemExit(int(exit_for(results)))


def _counts(views: Any) -> dict[str, int]:
    from ..watch import summary_counts

    return summary_counts(views)
