"""Tables that fit the terminal: the fleet view, the progress line, the watch table, preflight's view."""

from __future__ import annotations

import copy
import re
import time
from collections import Counter
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from ..records import (
    HEALTHY,
    STARTING,
    UNREACHABLE,
    VERDICTS,
    CheckStatus,
    HostResult,
    WatchState,
)
from ..units import ago
from .card import EXPLAIN, ICON, STYLE, PathSafe, fmt_ms, one_line, plural, short_fold
from .output import visible


class HostsCell:
    """A fleet row's host names: the whole fold, or its short form (``node[03-48] (31 hosts)``)
    when the table would otherwise squeeze the error column. A host name is never cut."""

    def __init__(self, names: list[str], prefix: str = "", style: str = "") -> None:
        from ..inventory import fold

        self.names = list(names)
        self.prefix = prefix
        self.style = style
        self.full = prefix + fold(self.names)
        self.short = False

    @property
    def text(self) -> str:
        if not self.short:
            return self.full
        return self.prefix + short_fold(self.names, width=16).replace(" (", "\n(", 1)

    def __str__(self) -> str:
        return self.full

    def __rich_console__(self, console: Console, options: Any) -> Any:
        yield Text(self.text, style=self.style)

    def __rich_measure__(self, console: Console, options: Any) -> Measurement:
        w = max(cell_len(ln) for ln in self.text.split("\n"))
        return Measurement(w, w)


class FittingTable(Table):
    """A table that, too wide for the screen, first shortens its host folds (``node[03-48] (31 hosts)``),
    then drops its least important columns (``rtt``, then ``n``) before it would crop a host name:
    ``cn…`` names no host anyone can ssh to."""

    drop_first = ("rtt", "n")
    icons_only = "verdict"  # then this column keeps only its first word, the icon (``✗``)
    min_text = 16  # the narrowest the wrapping column is allowed to get
    roomy_text = 36  # a fold is shortened before the error column gets narrower than this

    def __rich_console__(self, console: Console, options: Any) -> Any:
        table: Table = self
        folds = [c for col in self.columns for c in col._cells if isinstance(c, HostsCell)]
        for c in folds:
            c.short = False
        if folds and self._needed(console, options, table, self.roomy_text) > options.max_width:
            for c in folds:
                c.short = True
        for name in (*self.drop_first, self.icons_only):
            if self._needed(console, options, table) <= options.max_width:
                break
            table = copy.copy(table)
            if name == self.icons_only:
                table.columns = [_icons_only(c) if c.header == name else c for c in table.columns]
            else:
                table.columns = [c for c in table.columns if c.header != name]
        yield from Table.__rich_console__(table, console, options)

    @staticmethod
    def _needed(console: Console, options: Any, table: Table, min_text: int | None = None) -> int:
        """Cells the table needs with every no-wrap column whole and the others at ``min_text``."""
        floor = FittingTable.min_text if min_text is None else min_text
        total = len(table.columns) + 1 + 2 * len(table.columns) * table.padding[1]  # borders and padding
        for col in table.columns:
            cells = [Measurement.get(console, options, c) for c in (col.header, *col.cells)]
            if col.no_wrap and not col.ratio:
                total += max((m.maximum for m in cells), default=0)
            elif col.ratio:  # a one-line column that takes what is left (cut with …): the floor alone
                total += floor
            else:  # its longest word (a path as short as it can get), and never under the floor
                longest = max((m.maximum for m in cells), default=0)
                total += max(min(floor, longest), *(m.minimum for m in cells))
        return total


def _icons_only(col: Any) -> Any:
    """A copy of ``col`` whose cells keep their first word: ``✗ failed`` → ``✗`` (the title counts verdicts)."""
    col = copy.copy(col)
    col.header = "v"
    col._cells = [
        Text(c.plain.split()[0], style=c.style) if isinstance(c, Text) and c.plain.split() else c for c in col._cells
    ]
    return col


# Many hosts: the fleet table comes before the cards (which scroll), so the answer is on the first screen.
TABLE_FIRST = 8

_ENDPOINT_RE = re.compile(r"\[?[0-9A-Za-z_.:-]*[0-9A-Za-z]\]?:\d{1,5}\b")


def group_reason(results: list[HostResult]) -> str:
    """A fleet row's reason: its first host's, and, when the hosts were dialled at different addresses
    (``connection refused by 10.0.0.4:22`` on one, ``10.0.0.5:22`` on the next), every address, so a
    folded row never names one address for hosts on five."""
    text = one_line(results[0])
    if len(results) < 2 or results[0].decisive is not None:
        return text
    if results[0].verdict in (HEALTHY, STARTING) and len({one_line(r) for r in results}) > 1:
        return EXPLAIN.get(results[0].verdict, text)  # one host's "ready: …" line does not speak for the others
    seen: list[str] = []
    for r in results:
        for m in _ENDPOINT_RE.findall(r.error or ""):
            if m not in seen:
                seen.append(m)
    if len(seen) < 2:
        return text
    first = _ENDPOINT_RE.search(text)
    if first is None:
        return text
    listed = ", ".join(seen[:4]) + (f", … {len(seen) - 4} more" if len(seen) > 4 else "")
    return text[: first.start()] + f"{len(seen)} addresses ({listed})" + text[first.end() :]


def fleet_title(results: list[Any]) -> str:
    """``50 hosts: 4 failed · 5 unreachable · 41 healthy``: a filtered view keeps the whole fleet's title."""
    counts = Counter(r.verdict for r in results)
    return f"{plural(len(results), 'host')}: " + " · ".join(f"{counts[v]} {v}" for v in VERDICTS if counts[v])


def fleet_view(results: list[HostResult], title: str | None = None, root_causes: list[Any] | None = None) -> Table:
    """One row per root cause, hosts folded into a range (``gpu[01-04,07]``).

    Like ``clush -b``, but hosts group by the fingerprint of their decisive
    error (or kind of unreachability), not by identical output: the same
    assertion with different pids and timestamps is one row. With
    ``root_causes`` (fleetdiag.job.RootCause, as shown) the view opens with
    each job's line, and the hosts that failed as its consequence fold into
    one row under the root's, not rows of their own.
    """
    from ..job import summary_line
    from ..store import group_by_cause

    rcs = list(root_causes or [])
    victims = {h for rc in rcs for h in rc.affected}
    groups = group_by_cause(r for r in results if r.host not in victims)
    heading = Text(title or fleet_title(results))
    for rc in rcs:
        heading.append("\n" + summary_line(rc), style="bold")
    table = FittingTable(title=heading, title_justify="left", expand=False)
    table.add_column("hosts", no_wrap=True, style="bold")
    table.add_column("n", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("decisive error / reason", overflow="fold")
    table.add_column("rtt", justify="right", no_wrap=True)
    by_host = {r.host: r for r in results}
    for g in groups:
        ex = g.example
        d = ex.decisive
        category = (
            Text(f"  {d.category}", style="dim") if d is not None and d.category not in (None, "", "other") else None
        )
        cause = PathSafe(group_reason(g.results), after=category)
        table.add_row(
            HostsCell(g.hosts),
            str(len(g.results)),
            Text(f"{ICON.get(g.verdict, '')} {g.verdict}", style=STYLE.get(g.verdict, "")),
            cause,
            _rtt_range(g.results),
        )
        for rc in rcs:  # the job's consequences, right under the row of its root
            if rc.host not in g.hosts:
                continue
            folded = [by_host[h] for h in rc.affected if h in by_host]
            if not folded:
                continue
            kinds = sorted({k for _h, k, _d in rc.consequences})
            verdict = folded[0].verdict
            table.add_row(
                HostsCell([r.host for r in folded], prefix="└ "),
                str(len(folded)),
                Text(f"{ICON.get(verdict, '')} {verdict}", style=STYLE.get(verdict, "")),
                Text(f"consequence of {rc.host} (job root cause): {', '.join(kinds)}", style="dim"),
                _rtt_range(folded),
            )
    return table


def _rtt_range(results: list[HostResult]) -> str:
    return _ms_range([r.timing.rtt_ms for r in results if r.timing.rtt_ms is not None])


def _ms_range(values: list[float]) -> str:
    rtts = sorted(values)
    if not rtts:
        return "-"
    if len(rtts) == 1 or fmt_ms(rtts[0]) == fmt_ms(rtts[-1]):
        return fmt_ms(rtts[0])
    return f"{fmt_ms(rtts[0]).split()[0]}–{fmt_ms(rtts[-1])}"


class _WaitingColumn(ProgressColumn):
    """Verdicts so far and the host kept waiting longest, recomputed at every refresh."""

    def __init__(self, owner: FleetProgress):
        super().__init__()
        self.owner = owner

    def render(self, task: Any) -> Text:
        return self.owner.status()


class FleetProgress:
    """A transient progress line while hosts are probed; does nothing when not enabled.

    Use as the scheduler's ``progress`` callback inside ``with``. It draws on
    the console it is given (stderr, so stdout stays clean for ``--json``).
    """

    def __init__(self, console: Console, total: int, enabled: bool = True, label: str = "probing"):
        self._console = console
        self.enabled = enabled and total > 0
        self.total = total
        self.running: dict[str, float] = {}
        self.counts: Counter[str] = Counter()
        self._bar: Progress | None = None
        self._task: Any = None
        if self.enabled:
            self._bar = Progress(
                SpinnerColumn(),
                TextColumn(label),
                BarColumn(bar_width=24),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                _WaitingColumn(self),
                console=console,
                transient=True,
            )

    def __enter__(self) -> FleetProgress:
        if self._bar is not None:
            self._bar.start()
            self._task = self._bar.add_task("hosts", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, p: Any) -> None:
        """Take a ``scheduler.Progress`` snapshot."""
        self.running = p.running
        self.counts = p.counts
        if self._bar is not None:
            self._bar.update(self._task, completed=p.done)

    def status(self) -> Text:
        out = Text()
        for v in VERDICTS:
            if self.counts.get(v) and v != HEALTHY:
                out.append(f"{self.counts[v]} {v}  ", style=STYLE.get(v, ""))
        if self.running:
            now = time.monotonic()
            host, t0 = min(self.running.items(), key=lambda kv: kv[1])
            show = getattr(self._console, "show_data", None)
            host = show(host) if show is not None else visible(host)
            more = f" +{len(self.running) - 1}" if len(self.running) > 1 else ""
            out.append(f"waiting on {host} ({now - t0:.0f}s){more}", style="dim")
        return out


# --------------------------------------------------------------------------- watch

WATCH_STYLE = {**STYLE, WatchState.CONNECTING: "dim", WatchState.RECOVERED: "green"}
WATCH_ICON = {**ICON, WatchState.CONNECTING: "⋯", WatchState.RECOVERED: "↺"}


def watch_state_text(state: str, connected: bool = True) -> Text:
    text = Text(f"{WATCH_ICON.get(state, '')} {state}", style=WATCH_STYLE.get(state, ""))
    if not connected and state not in (UNREACHABLE, WatchState.CONNECTING):
        text.append(" ⟳", style="dim")  # reconnecting, still within the grace period
    return text


# Lines a watch table spends besides its rows: title, top border, header, header rule, bottom border.
WATCH_TABLE_CHROME = 5
# States whose hosts each keep a row of their own for as long as the screen allows; the others fold first.
_WATCH_QUIET = (WatchState.HEALTHY, WatchState.RECOVERED, WatchState.CONNECTING, WatchState.STARTING)


def watch_rows(views: list[Any], budget: int | None) -> list[tuple[str, list[Any]]]:
    """Which hosts get a row: ``(state, views)`` pairs, worst state first, inventory order within one.

    Every host has its own row when ``budget`` (rows the screen has) allows; else the quiet
    states fold into one row each (``gpu[01-29] ✓ healthy``), healthy first, then, if still
    too many, every state does. Trouble is never what falls off the screen.
    """
    rank = {s: i for i, s in enumerate(WatchState)}
    ordered = sorted(views, key=lambda v: rank.get(v.state, len(rank)))  # stable: inventory order within a state
    rows: list[tuple[str, list[Any]]] = [(v.state, [v]) for v in ordered]
    if budget is None or len(rows) <= budget:
        return rows
    by_state: dict[str, list[Any]] = {}
    for v in ordered:
        by_state.setdefault(v.state, []).append(v)
    folded: set[str] = set()
    for quiet in (*_WATCH_QUIET, *reversed(list(WatchState))):
        if quiet in by_state and len(by_state[quiet]) > 1:
            folded.add(quiet)
        rows = []
        for state, vs in sorted(by_state.items(), key=lambda kv: rank.get(kv[0], len(rank))):
            rows += [(state, vs)] if state in folded else [(state, [v]) for v in vs]
        if len(rows) <= budget:
            break
    return rows


class WatchFitTable(FittingTable):
    """The watch table's fitting: folds shortened first, then ``rtt`` dropped, then states as icons."""

    drop_first = ("rtt", "log age")
    icons_only = "state"
    roomy_text = 30


def watch_table(views: Any, title: str | None = None, height: int | None = None) -> Table:
    """The live dashboard: worst state first, one row per host while the screen has room.

    ``views`` are ``watch.HostView``s. With ``height`` (the terminal's lines) the table fits
    it: healthy hosts, then the other quiet states, fold into one row per state
    (``gpu[01-29]``, shortened to ``gpu[01-48] (29 hosts)`` on two lines when the screen is narrow)
    so that a failed host is never below the bottom edge. The reason column is one line; the whole
    decisive error is on the card printed when a host failed.
    """
    views = list(views)
    counts = Counter(v.state for v in views)
    head = " · ".join(f"{counts[s]} {s}" for s in WatchState if counts[s])
    table = WatchFitTable(title=title or f"{plural(len(views), 'host')}: {head}", title_justify="left", expand=True)
    table.add_column("host", no_wrap=True, style="bold")
    table.add_column("state", no_wrap=True)
    table.add_column("log age", justify="right", no_wrap=True)
    table.add_column("decisive error / reason", overflow="ellipsis", no_wrap=True, ratio=1)
    table.add_column("rtt", justify="right", no_wrap=True)
    budget = None if height is None else max(1, height - WATCH_TABLE_CHROME)
    rows = watch_rows(views, budget)
    for _ in range(2):  # a shortened fold takes two lines: leave room for them
        extra = sum(1 for _s, vs in rows if len(vs) > 1)
        if budget is None or not extra or len(rows) + extra <= budget:
            break
        rows = watch_rows(views, max(1, budget - extra))
    for state, vs in rows:
        if len(vs) > 1:
            idles = [i for i in (v.idle() for v in vs) if i is not None]
            rtts = [v.rtt_ms for v in vs if v.rtt_ms is not None]
            reasons = {" ".join((v.reason or "").split()) for v in vs}
            table.add_row(
                HostsCell([v.host for v in vs]),
                watch_state_text(state),
                ago(max(idles)) if idles else "-",
                Text(f"{len(vs)} hosts" + (f": {reasons.pop()}" if len(reasons) == 1 else ""), style="dim"),
                _ms_range(rtts),
            )
            continue
        v = vs[0]
        idle = v.idle()
        reason = Text(" ".join((v.reason or "").split()))
        if not v.connected and v.state not in (UNREACHABLE, WatchState.CONNECTING) and v.error:
            reason.append(f"  (reconnecting: {v.error})", style="dim")
        table.add_row(
            v.host,
            watch_state_text(v.state, v.connected),
            ago(idle) if idle is not None else "-",
            reason,
            fmt_ms(v.rtt_ms) if v.rtt_ms is not None else "-",
        )
    return table


def watch_event_line(ev: Any) -> Text:
    """A state change as one line that stays in the scrollback above the live table."""
    stamp = time.strftime("%H:%M:%S", time.localtime(ev.time))
    line = Text.assemble((stamp, "dim"), "  ", (ev.host, "bold"), "  ")
    if ev.previous:
        line.append(f"{ev.previous} → ", style="dim")
    line.append_text(watch_state_text(ev.state))
    if ev.reason:
        line.append("  " + " ".join(ev.reason.split()))
    return line


# --------------------------------------------------------------------------- preflight

PASS, WARN, FAIL, SKIP = CheckStatus.PASS, CheckStatus.WARN, CheckStatus.FAIL, CheckStatus.SKIP
PREFLIGHT_MARK = {PASS: ("✓", "green"), WARN: ("!", "yellow"), FAIL: ("✗", "bold red"), SKIP: ("–", "dim")}


def preflight_table(res: Any) -> Table:
    """One host: a row per check, status first, the arithmetic in full."""
    icon, style = {PASS: ("✓", "bold green"), FAIL: ("✗", "bold red")}.get(res.status, ("⚠", "bold magenta"))
    title = Text.assemble((f"{icon} {res.host} ", "bold"), (res.status.upper(), style))
    table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 1), expand=False)
    table.add_column(no_wrap=True)
    table.add_column(style="dim", no_wrap=True)
    table.add_column(overflow="fold")
    if res.error:
        table.add_row(Text("⚠", style="bold magenta"), "reach", Text(res.error, style="magenta"))
    for c in res.checks:
        mark, st = PREFLIGHT_MARK.get(c.status, ("?", ""))
        table.add_row(Text(mark, style=st), c.name, Text(c.detail, style="bold" if c.status == FAIL else ""))
    return table


def preflight_view(launch: Any, results: list[Any], launch_shown: dict[str, Any]) -> list[Any]:
    """``fleetdiag preflight``'s text: the launch's arithmetic, a table per host, and how many are ready."""
    head = f"launch: {launch.launcher}" + (f" · {launch_shown['arithmetic']}" if launch_shown["arithmetic"] else "")
    if launch.cuda_visible_devices is not None:
        head += f" · CUDA_VISIBLE_DEVICES={launch_shown.get('cuda_visible_devices', launch.cuda_visible_devices)}"
    items: list[Any] = [Text(head, style="dim")]
    for res in results:
        items += ["", preflight_table(res)]
    if len(results) > 1:
        bad = [r.host for r in results if r.status != PASS]
        ready = f"{len(results) - len(bad)}/{len(results)} hosts ready" + (f"; not: {', '.join(bad)}" if bad else "")
        items += ["", Text(ready, style="bold")]
    return items
