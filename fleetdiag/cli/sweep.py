"""``fleetdiag sweep`` (the whole fleet, from cron) and ``fleetdiag history``.

A sweep is safe to run unattended: it takes a lock so two never overlap,
writes its JSON report first (atomically) so no history problem can lose
the results, records them in the history store, then prints only the news
(new, changed, resolved incidents): quiet when nothing changed, so cron
mails only when there is something to read. Ctrl-C or SIGTERM keeps what
was found so far.

``execute`` is a plain coroutine (no click) so ``fleetdiag demo`` runs the
same sweep inside its own event loop.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import click
from rich.table import Table
from rich.text import Text

from .. import units
from ..units import ago
from ..exitcodes import Exit, exit_for
from ..probe import ProbeSettings
from ..records import SCHEMA_VERSION, VERDICTS, HostResult, report_json
from ..render import ICON, STYLE, Env, FleetProgress, Output
from ..scheduler import (
    DEFAULT_FANOUT,
    DEFAULT_PER_ADDRESS,
    INTERNAL,
    INTERRUPTED,
    CostMemory,
    default_deadline,
    placeholder,
    probe_many,
)
from ..store import (
    DEFAULT_KEEP_DAYS,
    Change,
    Changes,
    LockBusy,
    Store,
    StoreError,
    SweepLock,
    default_db_path,
    default_report_path,
    describe,
    group_by_cause,
    incident_key,
    write_atomic,
)
from . import Context, handle_errors, main, pass_ctx, transport_options

NOTIFY_TIMEOUT = 60.0


@dataclass
class SweepJob:
    """Everything one sweep needs; built by the CLI (or the demo)."""

    hosts: Sequence[Any]
    settings: ProbeSettings
    selector: str
    db: Path
    report: Path
    deadline: float | None
    fanout: int = DEFAULT_FANOUT
    per_address: int | None = DEFAULT_PER_ADDRESS
    keep_days: float = DEFAULT_KEEP_DAYS
    notify: str | None = None
    progress: bool = False
    redactor: Any = None  # --redact: the report and the printed news are redacted; the history keeps real names


@dataclass
class SweepOutcome:
    results: list[HostResult]
    started: float
    finished: float
    interrupted: bool = False
    changes: Changes | None = None  # None: the history could not be used
    store_error: StoreError | None = None
    report: Path | None = None  # None: the report could not be written
    report_error: str | None = None
    notes: list[str] = field(default_factory=list)  # warnings for stderr

    @property
    def exit(self) -> Exit:
        return exit_for(self.results)

    def meta(self, job: SweepJob) -> dict[str, Any]:
        return {
            "started": _iso(self.started),
            "finished": _iso(self.finished),
            "selector": job.selector,
            "hosts": len(self.results),
            "interrupted": self.interrupted,
            "deadline": job.deadline,
            "db": str(job.db),
        }


_iso = units.iso


async def execute(job: SweepJob, env: Env) -> SweepOutcome:
    """Lock, probe, write the report, record history, notify. Raises LockBusy."""
    with SweepLock.for_db(job.db):
        store: Store | None = None
        store_error: StoreError | None = None
        try:
            store = Store(job.db)
            memory = CostMemory(store.costs())
        except StoreError as exc:
            store_error, memory = exc, CostMemory()
        try:
            started = time.time()
            results, interrupted = await _probe(job, env, memory)
            out = SweepOutcome(results, started, time.time(), interrupted, store_error=store_error)
            doc = report_json(results, sweep=out.meta(job))  # marks each job's hosts for the history too
            if job.redactor is not None:
                doc = job.redactor.obj(doc)
            try:
                out.report = write_atomic(job.report, json.dumps(doc, indent=1) + "\n")
            except OSError as exc:
                out.report_error = f"cannot write the report {job.report}: {exc.strerror or exc}"
            if store is not None:
                try:
                    out.changes = store.record_sweep(
                        results, started=started, finished=out.finished, selector=job.selector,
                        report=str(out.report) if out.report else None, interrupted=interrupted,
                        unknown=[r.host for r in results if r.facts.get("error_kind") == INTERRUPTED],
                        costs=memory.pairs(), keep_days=job.keep_days,
                    )
                except StoreError as exc:
                    out.store_error = exc
        finally:
            if store is not None:
                store.close()
        if job.notify and out.changes is not None and (out.changes.new or out.changes.changed):
            out.notes += run_notify(job.notify, notify_payload(job, out), out.report)
        elif job.notify and out.changes is None:
            out.notes.append("--notify skipped: without the history, what is new cannot be known")
        return out


async def _probe(job: SweepJob, env: Env, memory: CostMemory) -> tuple[list[HostResult], bool]:
    """Probe every host; on cancellation (Ctrl-C, SIGTERM) keep what arrived."""
    results: list[HostResult] = []
    interrupted = False
    with FleetProgress(env.err, len(job.hosts), enabled=job.progress, label="sweeping") as bar:
        try:
            async for res in probe_many(
                job.hosts, job.settings, job.fanout, deadline=job.deadline, per_address=job.per_address,
                memory=memory, progress=bar if job.progress else None,
            ):
                results.append(res)
        except asyncio.CancelledError:
            interrupted = True
            task = asyncio.current_task()
            if task is not None and hasattr(task, "uncancel"):
                task.uncancel()
    seen = {r.host for r in results}
    for h in job.hosts:
        if h.name not in seen:
            results.append(placeholder(h, "interrupted", INTERRUPTED, _log_of(h, job.settings)))
    order = {h.name: i for i, h in enumerate(job.hosts)}
    results.sort(key=lambda r: order.get(r.host, len(order)))
    return results, interrupted


def _log_of(host: Any, settings: ProbeSettings) -> str | None:
    try:
        return host.log_path(settings.log)[1]
    except Exception:
        return None


# --------------------------------------------------------------------------- notify


def notify_payload(job: SweepJob, out: SweepOutcome) -> dict[str, Any]:
    """The --notify document (redacted under --redact, like the report)."""
    assert out.changes is not None
    doc = {
        "version": SCHEMA_VERSION,
        "sweep": out.meta(job),
        "report": str(out.report) if out.report else None,
        "new": [c.to_json() for c in out.changes.new],
        "changed": [c.to_json() for c in out.changes.changed],
    }
    return job.redactor.obj(doc) if job.redactor is not None else doc


def run_notify(command: str, payload: dict[str, Any], report: Path | None) -> list[str]:
    """Run the user's command through sh with the JSON on stdin; problems become warnings."""
    env = dict(os.environ)
    if report is not None:
        env["FLEETDIAG_REPORT"] = str(report)
    try:
        proc = subprocess.run(command, shell=True, input=json.dumps(payload, indent=1).encode(), env=env,
                              timeout=NOTIFY_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return [f"--notify command did not finish within {NOTIFY_TIMEOUT:g}s and was killed: {command}"]
    except OSError as exc:
        return [f"--notify command could not run: {exc}"]
    if proc.returncode != 0:
        return [f"--notify command exited with status {proc.returncode}: {command}"]
    return []


# --------------------------------------------------------------------------- printing the news

_KIND_STYLE = {"NEW": "bold red", "CHANGED": "bold yellow", "RESOLVED": "bold green", "NOW": "bold"}




_when = units.when


def _fold(hosts: list[str]) -> str:
    from ..inventory import fold

    return fold(hosts)


def _entry(kind: str, hosts: list[str], verdict: str, text: str, width: int, extra: list[str]) -> Text:
    line = Text()
    line.append(f"{kind:<9}", style=_KIND_STYLE.get(kind, "bold"))
    line.append(f" {_fold(hosts):<{width}}", style="bold")
    line.append(f"  {verdict:<11}", style=STYLE.get(verdict, ""))
    line.append(f"  {text}")
    for e in extra:
        line.append("\n" + " " * 10 + e, style="dim")
    return line


def _detail(rec: dict[str, Any] | None) -> list[str]:
    """Category and hint of a stored record, one short line."""
    d = (rec or {}).get("decisive") or {}
    bits = [b for b in (d.get("category") if d.get("category") != "other" else None,
                        f"hint: {d['hint']}" if d.get("hint") else None) if b]
    job = ((rec or {}).get("facts") or {}).get("job") or {}
    if job.get("role") == "root":  # the job's one incident (fleetdiag.job)
        bits.insert(0, "job root cause" + (f" (rank {job['rank']})" if job.get("rank") is not None else "")
                    + f"; {len(job.get('affected') or [])} other host(s) failed as a consequence: "
                    + _fold(list(job.get("affected") or [])))
    elif job.get("role") == "consequence":
        bits.insert(0, f"a consequence of {job.get('root')} (job root cause)")
    return [" · ".join(bits)] if bits else []


def change_lines(changes: Changes) -> list[Text]:
    """New, changed and resolved incidents, hosts with the same fingerprint on one line."""
    entries: list[tuple[str, list[str], str, str, list[str]]] = []

    def grouped(items: list[Change], key) -> list[list[Change]]:
        groups: dict[Any, list[Change]] = {}
        for c in items:
            groups.setdefault(key(c), []).append(c)
        return sorted(groups.values(), key=lambda g: (VERDICTS.index(g[0].incident.verdict)
                                                      if g[0].incident.verdict in VERDICTS else 99, g[0].host))

    for g in grouped(changes.new, lambda c: c.incident.fingerprint):
        inc = g[0].incident
        extra = _detail(inc.record)
        again = [c for c in g if c.recurred]
        if again:
            extra.append(f"back again: first seen {_when(min(c.incident.first_seen for c in again))}, "
                         f"resolved in between")
        entries.append(("NEW", [c.host for c in g], inc.verdict, inc.summary, extra))
    for g in grouped(changes.changed, lambda c: (c.previous.fingerprint if c.previous else "", c.incident.fingerprint)):
        inc, prev = g[0].incident, g[0].previous
        extra = _detail(inc.record)
        if prev is not None:
            extra.append(f"was {prev.verdict}: {prev.summary}")
        entries.append(("CHANGED", [c.host for c in g], inc.verdict, inc.summary, extra))
    for g in grouped(changes.resolved, lambda c: (c.incident.fingerprint, c.verdict)):
        inc = g[0].incident
        lasted = max((c.incident.resolved_at or c.incident.last_seen) - c.incident.since for c in g)
        entries.append(("RESOLVED", [c.host for c in g], g[0].verdict or "ok",
                        f"was {inc.verdict}: {inc.summary}",
                        [f"lasted {ago(lasted)}, seen in {max(c.incident.count for c in g)} sweep(s)"]))
    width = max((len(_fold(h)) for _, h, _, _, _ in entries), default=0)
    return [_entry(k, h, v, t, width, x) for k, h, v, t, x in entries]


def current_lines(results: list[HostResult]) -> list[Text]:
    """Every host in trouble now (when the history cannot say what is new)."""
    groups = [g for g in group_by_cause(results) if incident_key(g.example) is not None]
    width = max((len(g.folded) for g in groups), default=0)
    return [_entry("NOW", g.hosts, g.verdict, describe(g.example), width, []) for g in groups]


def fleet_line(results: list[HostResult], out: SweepOutcome) -> str:
    counts = {v: sum(1 for r in results if r.verdict == v) for v in VERDICTS}
    head = " · ".join(f"{n} {v}" for v, n in counts.items() if n)
    where = f" · report {out.report}" if out.report else ""
    return f"{len(results)} hosts: {head}{where}"


def print_outcome(env: Output, out: SweepOutcome, fmt: str | None = None, job: SweepJob | None = None) -> None:
    """The news on stdout (nothing when nothing changed); problems on stderr.

    Everything goes through ``env``: redacted under --redact, host text made visible.
    """
    raw, out = out, env.shown(out)
    store_error = env.shown(str(raw.store_error)) if raw.store_error else None
    for note in ([out.report_error] if out.report_error else []) + (
        [f"history not updated: {store_error}" + (f"; this sweep's results are in {out.report}" if out.report else "")]
        if store_error else []
    ):
        env.err.print(Text(f"fleetdiag sweep: {note}", style="bold red"), soft_wrap=True)
    if out.interrupted:
        unfinished = [r.host for r in out.results if r.facts.get("error_kind") == INTERRUPTED]
        env.err.print(Text(f"fleetdiag sweep: interrupted; {len(unfinished)} host(s) unfinished: "
                           f"{_fold(unfinished)}", style="yellow"), soft_wrap=True)
    bugs = [r.host for r in out.results if r.facts.get("error_kind") == INTERNAL]
    if bugs:
        env.err.print(Text(f"fleetdiag sweep: internal error while probing {_fold(bugs)} (a bug: please report; "
                           "details in the report)", style="bold red"), soft_wrap=True)
    for note in out.notes:
        env.err.print(Text(f"fleetdiag sweep: {note}", style="yellow"), soft_wrap=True)
    if fmt == "json":
        env.json({
            "version": SCHEMA_VERSION,
            "sweep": raw.meta(job) if job else None,
            "report": str(raw.report) if raw.report else None,
            "changes": raw.changes.to_json() if raw.changes is not None else None,
            "error": str(raw.store_error) if raw.store_error else None,
            "exit": int(raw.exit),
        })
        return
    if out.changes is None:
        lines = current_lines(out.results)
    else:
        lines = change_lines(out.changes)
    if not lines:
        return
    for line in lines:
        env.print(line, soft_wrap=True)
    env.print(Text(fleet_line(out.results, out), style="dim"), soft_wrap=True)


# --------------------------------------------------------------------------- commands


@main.command()
@click.argument("selectors", nargs=-1, required=True)
@click.option("--db", type=click.Path(dir_okay=False), envvar="FLEETDIAG_DB",
              help="History database [default: the user data dir, see README].")
@click.option("--report", type=click.Path(dir_okay=False),
              help="Where to write the JSON report, atomically [default: the user state dir].")
@click.option("--notify", metavar="CMD", help="Run CMD (through sh) with the new incidents as JSON on stdin.")
@click.option("--log", help="Log to read: a name from the inventory's logs, or a path/glob.")
@click.option("--fanout", type=click.IntRange(1), default=DEFAULT_FANOUT, show_default=True, help="Hosts probed at once.")
@click.option("--per-address", type=click.IntRange(0), default=DEFAULT_PER_ADDRESS, show_default=True,
              help="Concurrent SSH handshakes per address:port (sshd MaxStartups); 0: no limit.")
@click.option("--deadline", type=click.FloatRange(0, min_open=True),
              help="Seconds one host may take before it counts as unreachable [default: 2×connect-timeout + timeout + 10].")
@click.option("--keep-days", type=click.FloatRange(0), default=DEFAULT_KEEP_DAYS, show_default=True,
              help="Days of per-sweep results to keep (incidents are kept); 0: keep all.")
@click.option("--json", "fmt", flag_value="json", help="Print the changes as one JSON document, even when empty.")
@transport_options
@pass_ctx
@handle_errors
def sweep(ctx: Context, selectors: tuple[str, ...], db: str | None, report: str | None, notify: str | None,
          fanout: int, per_address: int, deadline: float | None, keep_days: float, fmt: str | None, **kw: Any) -> None:
    """Probe the selected hosts for cron: report, history, and only what changed.

    \b
    Writes the JSON report, records every host in the history, and prints the
    new, changed and resolved incidents since the last sweep: nothing when
    nothing changed. Exit codes as for probe; 5 when another sweep holds the lock.
    """
    from ..inventory import select
    from .probe import settings_from

    inv = ctx.inventory()
    hosts = select(inv, selectors)
    settings = settings_from(ctx, inv, kw)
    t = settings.transport
    job = SweepJob(
        hosts=hosts, settings=settings, selector=",".join(selectors),
        db=Path(db).expanduser() if db else default_db_path(),
        report=Path(report).expanduser() if report else default_report_path(),
        deadline=deadline or default_deadline(t.connect_timeout, t.command_timeout),
        fanout=fanout, per_address=per_address or None, keep_days=keep_days, notify=notify,
        progress=ctx.out.err.is_terminal, redactor=ctx.redactor,
    )

    async def go() -> SweepOutcome:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        try:  # SIGTERM (cron's timeout, systemd) keeps the results so far, like Ctrl-C
            loop.add_signal_handler(signal.SIGTERM, task.cancel)  # type: ignore[union-attr]
        except (NotImplementedError, RuntimeError, ValueError):
            pass
        try:
            return await execute(job, ctx.out)
        finally:
            try:
                loop.remove_signal_handler(signal.SIGTERM)
            except (NotImplementedError, RuntimeError, ValueError):
                pass

    try:
        out = asyncio.run(go())
    except LockBusy as exc:
        ctx.out.err.print(Text(f"fleetdiag sweep: {ctx.out.shown(str(exc))}", style="bold red"), soft_wrap=True)
        raise SystemExit(int(Exit.BUSY))
    print_outcome(ctx.out, out, fmt, job)
    raise SystemExit(int(out.exit))


@main.command()
@click.argument("selectors", nargs=-1)
@click.option("--db", type=click.Path(dir_okay=False), envvar="FLEETDIAG_DB",
              help="History database [default: the user data dir].")
@click.option("--open", "open_only", is_flag=True, help="Only incidents not resolved yet.")
@click.option("--json", "fmt", flag_value="json", help="One JSON document.")
@pass_ctx
@handle_errors
def history(ctx: Context, selectors: tuple[str, ...], db: str | None, open_only: bool, fmt: str | None) -> None:
    """Incidents from the sweep history: first seen, last seen, count, resolved.

    SELECTOR (default: every host in the history) is resolved with the
    inventory when there is one; hosts no longer in it match by name, glob or range.
    """
    path = Path(db).expanduser() if db else default_db_path()
    try:
        with Store(path, readonly=True) as store:
            names = _select_stored(ctx, selectors, store.hosts()) if selectors else None
            incidents = store.incidents(names, open_only=open_only)
    except StoreError as exc:
        ctx.out.err.print(Text(f"fleetdiag history: {ctx.out.shown(str(exc))}", style="bold red"), soft_wrap=True)
        raise SystemExit(int(Exit.USAGE))  # like a bad inventory: input the user controls
    if ctx.redactor is not None:  # the inventory's numbering first, then hosts only the history knows
        from ..inventory import InventoryError

        try:
            ctx.inventory()
        except InventoryError:
            pass
        ctx.redactor.add_hosts(i.host for i in incidents)
    if fmt == "json":
        ctx.out.json({"version": SCHEMA_VERSION, "db": str(path), "incidents": [i.to_json() for i in incidents]})
        return
    if not incidents:
        ctx.out.print(f"no incidents{' open' if open_only else ''} in {path}")
        return
    ctx.out.print(history_table([ctx.out.shown(i) for i in incidents], ctx.out.shown(str(path))))


def history_table(incidents: list[Any], path: Path) -> Table:
    """Incidents, one row each: state, cause, first and last seen, count, resolved."""
    now = time.time()
    n_open = sum(1 for i in incidents if i.open)
    table = Table(title=f"{len(incidents)} incidents ({n_open} open) from {path}", title_justify="left")
    for col, kw in (("host", {"no_wrap": True, "style": "bold"}), ("state", {"no_wrap": True}),
                    ("cause", {"overflow": "fold"}), ("first seen", {"no_wrap": True}),
                    ("last seen", {"no_wrap": True}), ("count", {"justify": "right"}),
                    ("resolved", {"no_wrap": True})):
        table.add_column(col, **kw)
    for i in incidents:
        state = Text(f"{ICON.get(i.verdict, '')} {i.verdict}", style=STYLE.get(i.verdict, "")) if i.open \
            else Text(f"✓ was {i.verdict}", style="dim")
        table.add_row(Text(i.host), state, Text(i.summary), _when(i.first_seen), f"{ago(now - i.last_seen)} ago",
                      str(i.count), _when(i.resolved_at) if i.resolved_at is not None else "open")
    return table


def _select_stored(ctx: Context, selectors: Sequence[str], stored: list[str]) -> list[str]:
    """Inventory selectors first; else names, globs and ranges over the hosts in the history."""
    from ..inventory import InventoryError, select, split_selector

    try:
        return [h.name for h in select(ctx.inventory(), selectors)]
    except InventoryError as first:
        chosen: list[str] = []
        for sel in selectors:
            for part in split_selector(sel):
                neg = part.startswith("!")
                names = _match_names(part[1:] if neg else part, stored)
                chosen = [n for n in chosen if n not in names] if neg else chosen + [n for n in names if n not in chosen]
        if not chosen:
            raise first
        return chosen


def _match_names(pattern: str, stored: list[str]) -> list[str]:
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

    if any(c in pattern for c in "*?"):
        return [n for n in stored if fnmatch.fnmatchcase(n, pattern)]
    try:
        wanted = set(NodeSet(pattern, resolver=RESOLVER_NOGROUP))
    except NodeSetException:
        wanted = {pattern}
    return [n for n in stored if n in wanted]
