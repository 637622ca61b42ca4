"""``fleetdiag sweep`` (the whole fleet, from cron) and ``fleetdiag history``.

A sweep is safe to run unattended: it takes a lock so two never overlap,
writes its JSON report first (atomically) so no history problem can lose
the results, records them in the history store, then prints only the news
(new, changed, resolved incidents): quiet when nothing changed, so cron
mails only when there is something to read. Ctrl-C, SIGTERM or SIGHUP keeps what
was found so far.

The engine (``SweepJob``, ``execute``) lives in ``fleetdiag.sweep``; this
module parses options and prints the outcome.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.text import Text

from .. import units
from ..exitcodes import Exit
from ..inventory import fold
from ..records import SCHEMA_VERSION
from ..render import FleetProgress, Output
from ..render.history import (
    change_lines,
    current_lines,
    fleet_line,
    history_lines,
    history_table,
    lemon_lines,
    news_of,
)
from ..render.listing import fits
from ..ssh.scheduler import INTERNAL, INTERRUPTED, default_deadline
from ..store import (
    DEFAULT_KEEP_DAYS,
    Change,
    Changes,
    LockBusy,
    Store,
    StoreError,
    default_db_path,
    default_report_path,
)
from ..sweep import (  # noqa: F401  (re-exported: the engine lived here)
    NOTIFY_TIMEOUT,
    SweepJob,
    SweepOutcome,
    execute,
    notify_payload,
    run_notify,
)
from . import (
    Context,
    Duration,
    View,
    check_logs,
    complete_selector,
    fanout_options,
    handle_errors,
    main,
    output_options,
    pass_ctx,
    run_async,
    select_hosts,
    transport_options,
    view_options,
)
from .connections import persist_option

SWEEP_FORMATS = ("text", "json", "csv", "md", "html")

# --------------------------------------------------------------------------- printing the news


_when = units.when


def print_outcome(
    env: Output, out: SweepOutcome, fmt: str | None = None, job: SweepJob | None = None, view: View | None = None
) -> None:
    """The news on stdout (nothing when nothing changed); problems on stderr.

    Everything goes through ``env``: redacted under --redact, host text made visible. ``view``
    (--only/--hide) keeps the news of the hosts whose trouble has those verdicts; csv, md and html
    write the fleet as this sweep found it (with the news in the report). Only what is printed is
    shown (copied visible): the news' lines need each trouble's words, not every host's whole record,
    and a copy of 5,000 results was the largest thing a sweep held.
    """
    view = view or View()
    raw = out
    store_error = env.shown(str(raw.store_error)) if raw.store_error else None
    report = env.shown(str(raw.report)) if raw.report else None
    for note in ([env.shown(raw.report_error)] if raw.report_error else []) + (
        [f"history not updated: {store_error}" + (f"; this sweep's results are in {report}" if report else "")]
        if store_error
        else []
    ):
        env.err.print(Text(f"fleetdiag sweep: {note}", style="bold red"), soft_wrap=True)
    if raw.interrupted:
        unfinished = [env.shown(r.host) for r in raw.results if r.error_kind == INTERRUPTED]
        env.err.print(
            Text(
                f"fleetdiag sweep: interrupted; {len(unfinished)} host(s) unfinished: {fold(unfinished)}",
                style="yellow",
            ),
            soft_wrap=True,
        )
    bugs = [env.shown(r.host) for r in raw.results if r.error_kind == INTERNAL]
    if bugs:
        env.err.print(
            Text(
                f"fleetdiag sweep: internal error while probing {fold(bugs)} (a bug: please report; "
                "details in the report)",
                style="bold red",
            ),
            soft_wrap=True,
        )
    for note in raw.notes:
        env.err.print(Text(f"fleetdiag sweep: {env.shown(note)}", style="yellow"), soft_wrap=True)
    if fmt == "json":
        env.json(
            {
                "version": SCHEMA_VERSION,
                "sweep": raw.meta(job) if job else None,
                "report": str(raw.report) if raw.report else None,
                "changes": raw.changes.to_json() if raw.changes is not None else None,
                "error": str(raw.store_error) if raw.store_error else None,
                "exit": int(raw.exit),
            }
        )
        return
    changes = _filtered_changes(env.shown(news_of(raw.changes)), view) if raw.changes is not None else None
    if fmt in ("csv", "md", "html") or view.summary or changes is None:
        _print_fleet(env, raw, fmt, view, changes)
        return
    lines = change_lines(changes)
    if not lines:
        return
    for line in lines:
        env.print(line, soft_wrap=True)
    env.print(Text(fleet_line(raw.results, report), style="dim"), soft_wrap=True)


def _print_fleet(env: Output, raw: SweepOutcome, fmt: str | None, view: View, changes: Changes | None) -> None:
    """The outputs that show every host (csv, md, html, --summary, the troubles when the history is
    unusable): the results are shown whole here."""
    out = env.shown(raw)
    results = view.keep(out.results)
    note = view.note(len(out.results), len(results))
    if fmt in ("csv", "md", "html"):
        from ..job import root_causes
        from ..render import fleet_csv, incident_report, report_text

        kept = {r.host for r in results}
        rcs = [rc for rc in root_causes(out.results) if rc.host in kept] if len(out.results) > 1 else []
        if fmt == "csv":
            env.document(fleet_csv(results, rcs))
            return
        rep = incident_report(results, rcs, title="fleetdiag sweep report")
        if note:
            rep.notes.append(note)
        if changes is not None:
            news = [line.plain.split("\n")[0] for line in change_lines(changes)]
            rep.extra.append(("changes since the last sweep", ["news"], [[n] for n in news] or [["nothing changed"]]))
        env.document(report_text(rep, fmt))
        return
    lines = current_lines(results) if changes is None else change_lines(changes)
    if view.summary:
        from ..render import fleet_title, fleet_view

        for line in lines:
            env.print(line, soft_wrap=True)
        env.print(fleet_view(results, title=fleet_title(out.results)))
        if note:
            env.print(Text(note, style="dim"), soft_wrap=True)
        return
    if not lines:
        return
    for line in lines:
        env.print(line, soft_wrap=True)
    env.print(Text(fleet_line(out.results, out.report), style="dim"), soft_wrap=True)


def _filtered_changes(changes: Changes, view: View) -> Changes:
    """The news of the troubles ``--only``/``--hide`` keep (judged by the trouble's verdict)."""
    if not (view.only or view.hide):
        return changes

    def keep(c: Change) -> bool:
        v = str(c.incident.verdict)
        return (not view.only or v in view.only) and v not in view.hide

    return Changes(
        new=[c for c in changes.new if keep(c)],
        changed=[c for c in changes.changed if keep(c)],
        resolved=[c for c in changes.resolved if keep(c)],
        sweep_id=changes.sweep_id,
    )


# --------------------------------------------------------------------------- commands

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@main.command()
@click.argument("selectors", nargs=-1, required=True, shell_complete=complete_selector)
@click.option(
    "--db",
    type=click.Path(dir_okay=False),
    envvar="FLEETDIAG_DB",
    help="History database [default: the user data dir, see README].",
)
@click.option(
    "--report",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Where to write the JSON report, atomically; - for stdout (the news then goes to stderr) "
    "[default: the user state dir].",
)
@click.option(
    "--prometheus",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Also write the results as a node_exporter textfile-collector file (*.prom), atomically.",
)
@click.option("--notify", metavar="CMD", help="Run CMD (through sh) with the new incidents as JSON on stdin.")
@click.option("--log", help="Log to read: a name from the inventory's logs, or a path/glob.")
@fanout_options
@click.option(
    "--keep-days",
    type=Duration(unit=86400.0),
    default=DEFAULT_KEEP_DAYS,
    show_default=True,
    help="How long to keep per-sweep results (90d, 12h, or days; incidents are kept); 0: keep all.",
)
@view_options
@output_options(formats=SWEEP_FORMATS, json_help="Print the changes as one JSON document, even when empty.")
@transport_options
@persist_option
@pass_ctx
@handle_errors
def sweep(
    ctx: Context,
    selectors: tuple[str, ...],
    db: str | None,
    report: str | None,
    prometheus: str | None,
    notify: str | None,
    fanout: int,
    per_address: int,
    deadline: float | None,
    workers: int,
    keep_days: float,
    fmt: str | None,
    view: View,
    **kw: Any,
) -> None:
    """Probe the selected hosts for cron: report, history, and only what changed.

    \b
    Writes the JSON report, records every host in the history, and prints the
    new, changed and resolved incidents since the last sweep: nothing when
    nothing changed. Exit codes as for probe; 5 when another sweep holds the lock.
    """
    from ..plan import settings_from

    inv = ctx.inventory()
    hosts = select_hosts(inv, selectors)
    check_logs(hosts, kw.get("log"))
    to_stdout = report == "-"
    spool = None
    if to_stdout:  # the report is written whole, then copied to stdout: a reader never sees half of it
        import tempfile

        spool = tempfile.TemporaryDirectory(prefix="fleetdiag-report-")
        report = str(Path(spool.name) / "report.json")
    from .connections import persist_from

    persist = persist_from(kw, inv, default=0.0)  # run from cron: no keeper left behind unless asked
    settings = settings_from(inv, kw, ctx.rules())
    settings.persist = persist
    t = settings.transport
    job = SweepJob(
        hosts=hosts,
        settings=settings,
        selector=",".join(selectors),
        db=Path(db).expanduser() if db else default_db_path(),
        report=Path(report).expanduser() if report else default_report_path(),
        deadline=deadline or default_deadline(t.connect_timeout, t.command_timeout),
        fanout=fanout,
        per_address=per_address or None,
        workers=workers or None,
        keep_days=keep_days,
        notify=notify,
        progress=ctx.out.err.is_terminal,
        redactor=ctx.redactor,
        prometheus=Path(prometheus).expanduser() if prometheus else None,
    )

    async def go() -> SweepOutcome:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        for sig in STOP_SIGNALS:  # cron's timeout, systemd, a closed terminal: keep the results so far, like Ctrl-C
            try:
                loop.add_signal_handler(sig, task.cancel)  # type: ignore[union-attr]
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        try:
            bar = FleetProgress(ctx.out.err, len(job.hosts), label="sweeping") if job.progress else None
            return await execute(job, bar)
        finally:
            for sig in STOP_SIGNALS:
                try:
                    loop.remove_signal_handler(sig)
                except (NotImplementedError, RuntimeError, ValueError):
                    pass

    try:
        out = run_async(go())
    except LockBusy as exc:
        ctx.out.err.print(Text(f"fleetdiag sweep: {ctx.out.shown(str(exc))}", style="bold red"), soft_wrap=True)
        raise SystemExit(int(Exit.BUSY)) from None
    if spool is not None:
        try:
            text = out.report.read_text() if out.report else None
        finally:
            spool.cleanup()
        out.report = None
        if text is not None:
            ctx.out.json(json.loads(text), indent=1)
        news = Output(stdout=sys.stderr, color=ctx.out.color, redactor=ctx.out.redactor)
        print_outcome(news, out, fmt, job, view)
        raise SystemExit(int(out.exit))
    print_outcome(ctx.out, out, fmt, job, view)
    raise SystemExit(int(out.exit))


class When(click.ParamType):
    """A moment for ``--since``/``--until``: a duration back from now (``2h``, ``3d``) or a date and time
    (``2026-05-09``, ``2026-05-09T15:00``, ``2026-05-09 15:00+02:00``; local time without a zone)."""

    name = "WHEN"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, float):
            return value
        from datetime import datetime

        from ..units import parse_duration

        text = str(value).strip()
        try:
            return time.time() - parse_duration(text)
        except ValueError:
            pass
        try:
            return datetime.fromisoformat(text).timestamp()
        except ValueError:
            self.fail(f"expected a duration back from now (2h, 3d) or a date/time (2026-05-09T15:00), got {text!r}")


@main.command()
@click.argument("selectors", nargs=-1, shell_complete=complete_selector)
@click.option(
    "--db",
    type=click.Path(dir_okay=False),
    envvar="FLEETDIAG_DB",
    help="History database [default: the user data dir].",
)
@click.option("--open", "open_only", is_flag=True, help="Only incidents not resolved yet.")
@click.option("--since", type=When(), help="Only incidents seen since then: 2h, 3d, or 2026-05-09T15:00.")
@click.option("--until", type=When(), help="Only incidents that began before then (same forms as --since).")
@click.option(
    "--host",
    "host_sel",
    multiple=True,
    metavar="SELECTOR",
    shell_complete=complete_selector,
    help="Only these hosts (a selector, as the arguments; repeatable).",
)
@click.option(
    "--verdict", multiple=True, metavar="VERDICTS", help="Only incidents of these verdicts (failed,stalled…)."
)
@click.option(
    "--lemons",
    is_flag=True,
    help="Hosts whose trouble recurs: the same fingerprint back --recur times, or again after a reboot.",
)
@click.option("--recur", type=click.IntRange(2), default=3, show_default=True, help="Episodes that make a lemon.")
@output_options(formats=("text", "json", "md", "html"), json_help="One JSON document.")
@pass_ctx
@handle_errors
def history(
    ctx: Context,
    selectors: tuple[str, ...],
    db: str | None,
    open_only: bool,
    since: float | None,
    until: float | None,
    host_sel: tuple[str, ...],
    verdict: tuple[str, ...],
    lemons: bool,
    recur: int,
    fmt: str | None,
) -> None:
    """Incidents from the sweep history: first seen, last seen, count, resolved.

    SELECTOR (default: every host in the history) is resolved with the
    inventory when there is one; hosts no longer in it match by name, glob or range.
    --lemons lists the hosts whose incidents recur instead (a node to drain, not a job to fix).
    """
    from ..render import parse_verdicts

    try:
        verdicts = parse_verdicts(verdict, "--verdict") or None
    except ValueError as exc:
        raise click.BadParameter(str(exc).split(": ", 1)[1], param_hint="--verdict") from None
    if since is not None and until is not None and until < since:
        raise click.BadParameter("--until is before --since", param_hint="--until")
    selectors = tuple(selectors) + tuple(host_sel)
    path = Path(db).expanduser() if db else default_db_path()
    try:
        with Store(path, readonly=True) as store:
            names = _select_stored(ctx, selectors, store.hosts()) if selectors else None
            if lemons:
                recs = [r for r in store.recurrences(names, since=since, until=until) if r.lemon(recur)]
                if verdicts:
                    recs = [r for r in recs if r.verdict in verdicts]
            else:
                incidents = store.incidents(names, open_only=open_only, since=since, until=until, verdicts=verdicts)
    except StoreError as exc:
        ctx.out.err.print(Text(f"fleetdiag history: {ctx.out.shown(str(exc))}", style="bold red"), soft_wrap=True)
        raise SystemExit(int(Exit.USAGE)) from None  # like a bad inventory: input the user controls
    if ctx.redactor is not None:  # the inventory's numbering first, then hosts only the history knows
        from ..inventory import InventoryError

        try:
            ctx.inventory()
        except InventoryError:
            pass
        ctx.redactor.add_hosts(i.host for i in (recs if lemons else incidents))
    if lemons:
        print_lemons(ctx.out, recs, path, recur, fmt)
        return
    if fmt == "json":
        ctx.out.json({"version": SCHEMA_VERSION, "db": str(path), "incidents": [i.to_json() for i in incidents]})
        return
    if fmt in ("md", "html"):
        from ..render import history_report, report_text

        shown = [ctx.out.shown(i) for i in incidents]
        ctx.out.document(report_text(history_report(shown, ctx.out.shown(str(path))), fmt))
        return
    if not incidents:
        ctx.out.print(f"no incidents{' open' if open_only else ''} in {path}")
        return
    print_history(ctx.out, incidents, path)


def print_lemons(out: Output, recs: list[Any], path: Path, recur: int, fmt: str | None) -> None:
    """``history --lemons``: one line per host and trouble that keeps coming back."""
    shown = [out.shown(r) for r in recs]
    if fmt == "json":
        out.json(
            {
                "version": SCHEMA_VERSION,
                "db": str(out.shown(str(path))),
                "recur": recur,
                "lemons": [{**r.to_json(), "why": r.lemon(recur)} for r in shown],
            }
        )
        return
    if fmt in ("md", "html"):
        from ..render import lemons_report, report_text

        out.document(report_text(lemons_report(shown, out.shown(str(path)), recur), fmt))
        return
    if not shown:
        out.print(f"no recurring incidents in {path} (back {recur} times or after a reboot)")
        return
    for line in lemon_lines(shown, recur):
        out.print(line, soft_wrap=True)


def print_history(out: Output, incidents: list[Any], path: Path) -> None:
    """The incidents as a table when it fits; narrow (a pipe is 80 columns): one block per incident,
    nothing squeezed to nothing."""
    shown = [out.shown(i) for i in incidents]
    table = history_table(shown, out.shown(str(path)))
    if fits(out, table):
        out.print(table)
    else:
        for line in history_lines(shown, out.shown(str(path))):
            out.print(line, soft_wrap=True)


def _select_stored(ctx: Context, selectors: Sequence[str], stored: list[str]) -> list[str]:
    """Inventory selectors first; else the same selection rules (``,`` ``!`` ``&``, globs, ranges) over the
    host names in the history, so hosts no longer in the inventory can still be asked about."""
    from ..inventory import InventoryError, select, select_names

    try:
        return [h.name for h in select(ctx.inventory(), selectors)]
    except InventoryError:
        return select_names(stored, list(selectors))
