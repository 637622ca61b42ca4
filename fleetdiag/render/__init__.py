"""Rich rendering of host results: the host card and the fleet summary.

Only this module and ``cli.py`` know about rich. Every card answers, in
order: what is wrong, where, why we think so, what to do, how it was found.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO, Any

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.markup import escape as rich_escape
from rich.measure import Measurement
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from .. import units
from ..facts import summary_lines
from ..records import (
    DEGRADED,
    FAILED,
    HEALTHY,
    NO_LOG,
    SCHEMA_VERSION,
    STALLED,
    STARTING,
    UNREACHABLE,
    VERDICTS,
    CheckStatus,
    HostResult,
    WatchState,
)
from ..units import ago

STYLE = {
    FAILED: "bold red",
    STALLED: "bold yellow",
    DEGRADED: "bold dark_orange",
    UNREACHABLE: "bold magenta",
    NO_LOG: "yellow",
    STARTING: "cyan",
    HEALTHY: "bold green",
}
ICON = {FAILED: "✗", STALLED: "⏸", DEGRADED: "▼", UNREACHABLE: "⚠", NO_LOG: "?", STARTING: "…", HEALTHY: "✓"}
EXPLAIN = {
    FAILED: "the log names an error that stopped the run",
    STALLED: "the log fell silent for longer than its own rhythm allows, while starting or training",
    DEGRADED: "no job failed, but a GPU is faulty: drain the node before the next job lands on it",
    UNREACHABLE: "fleetdiag could not reach the host",
    NO_LOG: "fleetdiag reached the host but could not read its log",
    STARTING: "still starting up",
    HEALTHY: "no error in the latest run",
}


# --------------------------------------------------------------------------- the output edge

# Every C0 control but newline and tab, DEL, every C1 control, and the bidi
# embedding/override/isolate marks: shown as escapes (``\x1b``, ``\u202e``),
# never passed to a terminal. One str.translate pass with a total table: the
# replacement text is printable ASCII, so nothing can re-form a sequence.
_INVISIBLE = [
    *range(0x00, 0x09),
    *range(0x0B, 0x20),
    *range(0x7F, 0xA0),
    0x061C,
    0x200E,
    0x200F,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
]
_VISIBLE = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _INVISIBLE}
_VISIBLE_ONE_LINE = {**_VISIBLE, 0x0A: "\\n", 0x09: "\\t"}


def visible(text: str, one_line: bool = False) -> str:
    """``text`` safe for a terminal: control and bidi characters made visible (``\\x1b``)."""
    return text.translate(_VISIBLE_ONE_LINE if one_line else _VISIBLE)


def visible_obj(o: Any, _inside: bool = False) -> Any:
    """A copy of a record (dataclass, dict, list, str) with every string passed through ``visible``.

    Inside a record a string is one value (a host name, a file name discovery found, a log line, a
    reason): its newlines and tabs are shown escaped too, so ``x.log\nERROR injected`` can never
    start a row of its own on a card. A bare string keeps its lines."""
    if isinstance(o, str):
        return visible(o, one_line=_inside)
    if isinstance(o, dict):
        return {(visible(k, True) if isinstance(k, str) else k): visible_obj(v, True) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        items = [visible_obj(v, True) for v in o]
        return type(o)(items) if isinstance(o, tuple) and not hasattr(o, "_fields") else items
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        new = copy.copy(o)
        for f in dataclasses.fields(o):
            try:
                object.__setattr__(new, f.name, visible_obj(getattr(o, f.name), True))
            except (AttributeError, TypeError):
                pass
        return new
    return o


class SafeConsole(Console):
    """A rich Console that never interprets data: no markup or emoji codes unless asked
    for, and every segment of text (not rich's own control codes) made visible on its
    way to the file, so no byte from a host can reach the terminal as a control."""

    def __init__(self, **kw: Any) -> None:
        self.show_data: Any = visible_obj  # how host data is shown here (the Output sets its redacting version)
        kw.setdefault("markup", False)
        kw.setdefault("emoji", False)
        kw.setdefault("highlight", False)
        super().__init__(**kw)

    def on_broken_pipe(self) -> None:
        """A closed stdout (``| head``): let the command end quietly, where it decides (rich would exit 1)."""
        self.quiet = True
        raise BrokenPipeError(32, "Broken pipe")

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            seg if seg.control else Segment(visible(seg.text), seg.style, None) for seg in buffer
        )


@dataclass
class Output:
    """Where every command writes, and how (httpie's Environment idea).

    Holds stdout and stderr consoles, whether stdout is a terminal, colour,
    width, the output format and the ``--redact`` redactor. Commands pass
    records through ``shown`` (text formats: redacted and made visible) or
    write JSON with ``json``/``jsonl`` (redacted, raw text escaped by JSON),
    so ``--redact`` and the terminal neutraliser are applied here, once.
    """

    stdout: IO[str] | None = None
    stderr: IO[str] | None = None
    color: bool | None = None
    width: int | None = None
    redactor: Any = None  # a fleetdiag.redact.Redactor under --redact
    format: str | None = None  # None (cards/tables) | json | jsonl
    out: Console = field(init=False)
    err: Console = field(init=False)

    def __post_init__(self) -> None:
        no_color = bool(os.environ.get("NO_COLOR")) or self.color is False
        self.out = SafeConsole(
            file=self.stdout,
            no_color=no_color,
            width=self.width,
            force_terminal=True if self.color else None,
            soft_wrap=False,
        )
        self.err = SafeConsole(file=self.stderr, stderr=self.stderr is None, no_color=no_color, width=self.width)
        # Off a terminal (a log file, cron mail, `2>&1 | grep`) a message is one line: never hard-wrapped at 80.
        self.err.soft_wrap = not self.err.is_terminal
        self.out.show_data = self.err.show_data = self.shown  # live views (progress, watch) redact through the console

    @property
    def is_tty(self) -> bool:
        return self.out.is_terminal

    # ------------------------------------------------------------ data on its way out

    def redacted(self, o: Any) -> Any:
        """``o`` as it may be shown: a redacted copy under --redact (the original stays real)."""
        if self.redactor is None:
            return o
        if isinstance(o, str):
            return self.redactor.text(o)
        if isinstance(o, HostResult):
            return self.redactor.result(o)
        return self.redactor.obj(o)

    def shown(self, o: Any) -> Any:
        """``o`` for a card or table: redacted, and every string made visible."""
        return visible_obj(self.redacted(o))

    # ------------------------------------------------------------ writing

    def print(self, *objects: Any, **kw: Any) -> None:
        """Print renderables on stdout; a plain string is data (redacted, no markup)."""
        self.out.print(*(self.shown(o) if isinstance(o, str) else o for o in objects), **kw)

    def error(self, *objects: Any, **kw: Any) -> None:
        """Print on stderr; a plain string is data (redacted, no markup)."""
        self.err.print(*(self.shown(o) if isinstance(o, str) else o for o in objects), **kw)

    def markup(self, template: str, *values: Any) -> Text:
        """Markup written by fleetdiag with data filled in as literal, redacted text."""
        return Text.from_markup(template.format(*(rich_escape(str(self.shown(str(v)))) for v in values)))

    def json(self, doc: Any, indent: int | None = 2) -> None:
        """One JSON document on stdout (redacted; control characters escaped by JSON)."""
        self._write(json.dumps(self.redacted(doc), indent=indent) + "\n")

    def jsonl(self, doc: Any) -> None:
        """One JSON line on stdout, flushed (for a pipe reading as it comes); every record names its schema version."""
        if isinstance(doc, dict) and "version" not in doc:
            doc = {"version": SCHEMA_VERSION, **doc}
        self.json(doc, indent=None)

    def document(self, text: str) -> None:
        """A whole document fleetdiag built (csv, Markdown, HTML) from records already ``shown``: written
        as it is, with any control character still in it made visible."""
        self._write(visible(text))

    def _write(self, text: str) -> None:
        f = self.stdout or sys.stdout
        f.write(text)
        f.flush()


Env = Output  # the older name


def _strip_common_prefix(lines: list[str]) -> list[str]:
    """Drop the process/level/time prefix all traceback lines share, for reading."""
    if len(lines) < 2:
        return lines
    prefix = os.path.commonprefix(lines)
    cut = max(prefix.rfind("] "), prefix.rfind(") "), prefix.rfind("]: "))
    if cut <= 0:
        return lines
    cut += 2 if prefix[cut : cut + 2] in ("] ", ") ") else 3
    return [ln[cut:] for ln in lines]


fmt_ms = units.ms  # the older names
fmt_bytes = units.size


def cascade_text(secondary: dict[str, int], limit: int = 5) -> str:
    if not secondary:
        return ""
    total = sum(secondary.values())
    items = sorted(secondary.items(), key=lambda kv: -kv[1])
    shown = ", ".join(f"{k} ×{v}" for k, v in items[:limit])
    more = f", … {len(items) - limit} more kinds" if len(items) > limit else ""
    return f"+ {total} secondary (consequences, not causes): {shown}{more}"


def source_text(src: dict[str, str] | None) -> str:
    """Which log was read and why: "stdout of pid 7321 (vllm serve) → /workspace/logs/vllm.log".
    Empty for a plain file named in the inventory (the "where" row already names it)."""
    if not src:
        return ""
    kind, detail, by = src.get("kind", ""), src.get("detail", ""), src.get("found_by", "")
    if kind == "file" and by.startswith(("the inventory", "--log")):
        return ""
    what = {
        "journal": f"journalctl -u {detail}",
        "docker": f"docker logs {detail[:12]}",
        "command": f"stdout of `{detail}`",
        "slurm": f"Slurm StdOut {detail}",
        "cri": f"kubelet log {detail}",
    }.get(kind, detail)
    return f"{by} → {what}" if by else what


# A path as logs print it: absolute or relative with at least one separator, up to a quote, space or bracket.
_PATH_RE = re.compile(r"(?:~|\.{1,2})?(?:/[^\s\"'()<>\[\],:;]+)+|[\w.+-]+(?:/[^\s\"'()<>\[\],:;]+)+")


def shorten_path(path: str, width: int) -> str:
    """``path`` shortened from the left at a ``/`` to at most ``width`` cells: ``…/vllm/v1/x.py``.

    Never cut inside a segment: the last segment stays whole even when it alone is wider."""
    if cell_len(path) <= width:
        return path
    parts = path.split("/")
    for i in range(1, len(parts)):
        tail = "/".join(parts[i:])
        if not tail or (i == 1 and not parts[0]):
            continue
        if cell_len("…/" + tail) <= width or i == len(parts) - 1:
            return "…/" + tail
    return path


def fit_paths(line: str, width: int, whole_line: bool) -> str:
    """``line`` with its paths shortened from the left so it fits ``width``: the whole line
    (``whole_line``, a traceback frame kept on one line) or else each space-separated word,
    so that wrapping at spaces never has to cut a path."""
    if cell_len(line) <= width:
        return line
    if whole_line:
        out = line
        for m in sorted(_PATH_RE.finditer(line), key=lambda m: -len(m.group())):
            over = cell_len(out) - width
            if over <= 0:
                break
            path = m.group()
            out = out.replace(path, shorten_path(path, max(1, cell_len(path) - over)), 1)
        if cell_len(out) <= width:
            return out
        line = out  # still too wide: wrap it at spaces, each word fitting
    words = re.split(r"(\s+)", line)
    for i, word in enumerate(words):
        over = cell_len(word) - width
        if over > 0:
            for m in sorted(_PATH_RE.finditer(word), key=lambda m: -len(m.group())):
                path = m.group()
                word = word.replace(path, shorten_path(path, max(1, cell_len(path) - over)), 1)
                over = cell_len(word) - width
                if over <= 0:
                    break
            words[i] = word
    return "".join(words)


class PathSafe:
    """Lines of text that keep every path whole at any width: too wide, a path is shortened
    from the left at a ``/`` (``…/site-packages/vllm/x.py``) and the line wraps only at
    spaces. The full text stays in ``--json``; a cut path could not be copied."""

    def __init__(self, text: str, style: str = "", whole_lines: bool = False, after: Text | None = None) -> None:
        self.lines = text.split("\n")
        self.style = style
        self.whole_lines = whole_lines
        self.after = after  # a styled word or two after the last line (a category)

    def __str__(self) -> str:
        return "\n".join(self.lines) + (self.after.plain if self.after is not None else "")

    def __rich_console__(self, console: Console, options: Any) -> Any:
        width = max(1, options.max_width)
        for i, line in enumerate(self.lines):
            text = Text(fit_paths(line, width, self.whole_lines), style=self.style, overflow="fold")
            if self.after is not None and i == len(self.lines) - 1:
                text.append_text(self.after)
            yield text

    def __rich_measure__(self, console: Console, options: Any) -> Measurement:
        after = cell_len(self.after.plain) if self.after is not None else 0
        longest = max((cell_len(ln) for ln in self.lines), default=0) + after
        words = [w for ln in self.lines for w in ln.split()]
        shortest = max((cell_len(shorten_path(w, 1)) for w in words), default=1)
        return Measurement(min(shortest, longest), longest).clamp(max_width=options.max_width)


def host_card(res: HostResult, traceback_lines: int = 40) -> Panel:
    """The card for one host: everything needed to act, nothing to scroll."""
    style = STYLE.get(res.verdict, "white")
    title = Text.assemble((f" {ICON.get(res.verdict, '')} {res.host} ", "bold"), (f" {res.verdict.upper()} ", style))
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(overflow="fold")
    d = res.decisive
    if d is not None and d.source != "log":
        _below_the_log(grid, res)
    elif d is not None:
        grid.add_row("cause", Text(d.message or d.line, style="bold"))
        where = [p for p in (d.process, d.time) if p]
        loc = f"line {d.lineno}" if d.lineno else (f"byte {d.pos}" if d.pos is not None else "")
        if res.log:
            loc = f"{loc} of {res.log}" if loc else res.log
        if loc:
            where.append(loc)
        grid.add_row("where", PathSafe(" · ".join(where)))
        grid.add_row("log line", PathSafe(d.line, style="dim"))
        # a line that is not the cause itself says what it is (peer-caused, launcher, wrapper)
        role = d.role if d.role and d.role != "cause" else None
        kind = " · ".join(x for x in (d.exception_type, d.category, role) if x)
        grid.add_row(
            "kind", Text(f"{kind} · confidence {d.confidence:.0%}" if kind else f"confidence {d.confidence:.0%}")
        )
        if d.reason:
            grid.add_row("why this", Text(d.reason))
        if d.hint:
            grid.add_row("hint", Text(d.hint, style="green"))
    else:
        grid.add_row("status", EXPLAIN.get(res.verdict, res.verdict))
        if res.error:
            grid.add_row("reason", Text(res.error, style=style))
        if res.summary:
            grid.add_row("log says", Text(res.summary))
    src = source_text(res.log_source)
    if src:
        grid.add_row("log from", PathSafe(src))
    if res.idle_seconds is not None and res.verdict != UNREACHABLE:
        grid.add_row(
            "log age",
            PathSafe(f"last written {ago(res.idle_seconds)} ago" + (f" · {res.log}" if d is None and res.log else "")),
        )
    cascade = cascade_text(res.secondary)
    if cascade:
        grid.add_row("cascade", Text(cascade))
    for label, text in summary_lines(res.facts or {}):  # the host's GPUs and the launch, two rows at most
        grid.add_row(label, Text(text, style="cyan"))
    kernel_log = (res.facts or {}).get("kernel_log")
    if isinstance(kernel_log, dict) and kernel_log.get("kernel_log") == "unreadable":
        grid.add_row("kernel log", Text(f"unreadable: {kernel_log.get('why', '')}", style="yellow"))
        grid.add_row("fix", Text(str(kernel_log.get("fix", "")), style="green"))
    faults = [e for e in res.evidence if e.get("source") == "gpu"]
    if faults and (d is None or d.source != "gpu"):
        grid.add_row(
            "GPU health",
            Text(
                "; ".join(f"GPU {e.get('gpu')}: {e.get('line')}" for e in faults[:6])
                + (f"; … {len(faults) - 6} more" if len(faults) > 6 else ""),
                style="bold dark_orange" if res.verdict == DEGRADED else "yellow",
            ),
        )
    _stack_rows(grid, res)
    _node_rows(grid, res)
    parts: list[Any] = [grid]
    if d is not None and d.traceback:
        tb = _strip_common_prefix(d.traceback)
        if len(tb) > traceback_lines:
            keep = traceback_lines // 2
            tb = tb[:keep] + [f"… {len(tb) - 2 * keep} frames (see --json for all) …"] + tb[-keep:]
        body = PathSafe("\n".join(tb), style="white", whole_lines=True)
        owner = "the consequence" if d.source != "log" else (d.process or "the failing process")
        parts.append(
            Panel(body, title=Text(f"traceback of {owner}"), title_align="left", border_style="dim", padding=(0, 1))
        )
    for m in res.markers:
        parts.append(Text(f"note: {m}", style="dim yellow"))
    parts.append(Text(found_text(res), style="dim"))
    return Panel(Group(*parts), title=title, title_align="left", border_style=style, padding=(0, 1))


def _stack_rows(grid: Table, res: HostResult) -> None:
    """Where each process of a stalled job waits (the second round trip's ``stack`` evidence), and what
    limited the view (py-spy missing, ptrace refused)."""
    waits = [e for e in res.evidence if e.get("source") == "stack"]
    for i, e in enumerate(waits[:8]):
        grid.add_row("waits" if i == 0 else "", Text(str(e.get("line") or ""), style="bold yellow"))
    if len(waits) > 8:
        grid.add_row("", Text(f"… {len(waits) - 8} more processes (see --json)"))
    info = (res.facts or {}).get("stacks")
    for note in (info.get("notes") or []) if isinstance(info, dict) else []:
        grid.add_row("stacks", Text(str(note), style="yellow"))


def _node_rows(grid: Table, res: HostResult) -> None:
    """What the node recorded about the job (fleetdiag.facts.node): its error file, Flight Recorder dumps, ranks."""
    from ..facts.node import rows

    for label, text in rows((res.facts or {}).get("node")):
        grid.add_row(label, PathSafe(text))
    ras = ((res.facts or {}).get("stacks") or {}).get("ras")
    if isinstance(ras, dict) and ras.get("summary"):
        grid.add_row("NCCL RAS", Text(str(ras["summary"]), style="yellow" if ras.get("available") else "dim"))


def _below_the_log(grid: Table, res: HostResult) -> None:
    """The rows of a cause found below the application (a kernel line or the GPU's health), its
    application error shown under it as the consequence."""
    d = res.decisive
    assert d is not None
    if res.verdict == DEGRADED:
        grid.add_row("status", Text(EXPLAIN[DEGRADED], style=STYLE[DEGRADED]))
    grid.add_row("cause", Text(d.message or d.line, style="bold"))
    where = "kernel log" if d.source == "kernel" else "nvidia-smi"
    src = (res.facts or {}).get("kernel_log")
    if d.source == "kernel" and isinstance(src, dict) and src.get("source"):
        where += f" ({src['source']})"
    grid.add_row("where", Text(" · ".join(p for p in (where, d.process, d.time) if p)))
    if d.source == "kernel":
        grid.add_row("kernel line", Text(d.line, style="dim"))
    kind = " · ".join(x for x in (d.exception_type, d.category) if x)
    grid.add_row("kind", Text(f"{kind} · confidence {d.confidence:.0%}"))
    if d.reason:
        grid.add_row("why this", Text(d.reason))
    if d.hint:
        grid.add_row("hint", Text(d.hint, style="green"))
    if d.consequence:
        grid.add_row("consequence", PathSafe(d.consequence + (f"  (in {res.log})" if res.log else "")))


def found_text(res: HostResult) -> str:
    t = res.timing
    bits = []
    if t.round_trips:
        bits.append(f"{t.round_trips} exec round trip{'s' if t.round_trips != 1 else ''}")
    if t.connect_ms is not None:
        bits.append(f"connect {fmt_ms(t.connect_ms)}")
    if t.rtt_ms is not None:
        bits.append(f"rtt ≈{fmt_ms(t.rtt_ms)}")
    if t.bytes:
        bits.append(f"{fmt_bytes(t.bytes)} read back")
    if t.total_ms is not None:
        bits.append(f"total {fmt_ms(t.total_ms)}")
    return "found with " + " · ".join(bits) if bits else ""


def one_line(res: HostResult) -> str:
    if res.decisive is not None:
        return res.decisive.message or res.decisive.line
    return res.error or res.summary or EXPLAIN.get(res.verdict, "")


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 host``, ``2 hosts``: a count and its noun, in agreement."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


_BLOCK_RE = re.compile(r"\[([^\[\]]*)\]")


def short_fold(names: list[str], width: int = 24) -> str:
    """A fold at most ``width`` cells wide when it can be: each range block cut to its first and last
    number and the count added (``node[03,06,09,11-48]`` → ``node[03-48] (31 hosts)``); still too wide,
    the first and last name (``gpu01…uk-node9 (31 hosts)``). The full list stays in ``--json``/csv."""
    from ..inventory import fold

    full = fold(names)
    if cell_len(full) <= width or len(names) < 2:
        return full

    def span(m: re.Match[str]) -> str:
        items = m.group(1).split(",")
        first, last = items[0].split("-")[0], items[-1].split("-")[-1]
        return f"[{first}-{last}]" if first != last else f"[{first}]"

    count = f" ({len(names)} hosts)"
    short = _BLOCK_RE.sub(span, full)
    if cell_len(short) + len(count) <= width or "," not in short:
        return short + count
    return f"{names[0]}…{names[-1]}{count}"


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


# --------------------------------------------------------------------------- filters and exports

FORMATS = ("text", "json", "jsonl", "csv", "md", "html")


def parse_verdicts(values: Iterable[str], option: str = "--only", choices: Iterable[str] = VERDICTS) -> set[str]:
    """``failed,stalled`` (repeatable, comma-separated) as a set of verdicts (``choices``: watch's
    states); a typo is a ValueError that suggests the verdict meant."""
    from ..inventory.model import did_you_mean

    names = [str(c) for c in choices]
    chosen: set[str] = set()
    for value in values:
        for word in value.split(","):
            word = word.strip().lower()
            if not word:
                continue
            if word not in names:
                raise ValueError(
                    f"{option}: unknown verdict '{word}'{did_you_mean(word, names)}; verdicts: {', '.join(names)}"
                )
            chosen.add(word)
    return chosen


def filter_results(results: Iterable[Any], only: set[str] | None = None, hide: set[str] | None = None) -> list[Any]:
    """The results (or watch views: anything with a ``verdict`` or ``state``) that ``--only`` keeps
    and ``--hide`` does not drop."""
    out = []
    for r in results:
        v = str(getattr(r, "state", None) or getattr(r, "verdict", ""))  # a watch view's state, else the verdict
        if only and v not in only:
            continue
        if hide and v in hide:
            continue
        out.append(r)
    return out


def filter_note(total: int, shown: int, only: set[str] | None, hide: set[str] | None) -> str:
    """What a filter left out, so an empty view never reads as "no trouble"."""
    if shown == total or not (only or hide):
        return ""
    what = " ".join(
        p
        for p in (
            f"--only {','.join(sorted(only))}" if only else "",
            f"--hide {','.join(sorted(hide))}" if hide else "",
        )
        if p
    )
    return f"{plural(total - shown, 'host')} of {total} not shown ({what})"


def fleet_rows(results: list[HostResult], root_causes: list[Any] | None = None) -> list[dict[str, Any]]:
    """The fleet table as records: one per row, its hosts in full (the csv export, the reports)."""
    from ..inventory import fold
    from ..store import action_class, category_of, group_by_cause

    rcs = list(root_causes or [])
    victims = {h for rc in rcs for h in rc.affected}
    by_host = {r.host: r for r in results}
    rows: list[dict[str, Any]] = []

    def row(members: list[HostResult], reason: str, root: str = "") -> dict[str, Any]:
        rtts = sorted(r.timing.rtt_ms for r in members if r.timing.rtt_ms is not None)
        ex = members[0]
        return {
            "hosts": fold([r.host for r in members]),
            "n": len(members),
            "verdict": str(ex.verdict),
            "category": category_of(ex),
            "action": action_class(ex),
            "reason": " ".join(reason.split()),
            "rtt_ms_min": round(rtts[0], 1) if rtts else "",
            "rtt_ms_max": round(rtts[-1], 1) if rtts else "",
            "consequence_of": root,
        }

    for g in group_by_cause(r for r in results if r.host not in victims):
        rows.append(row(g.results, group_reason(g.results)))
        for rc in rcs:
            if rc.host in g.hosts:
                folded = [by_host[h] for h in rc.affected if h in by_host]
                if folded:
                    kinds = sorted({k for _h, k, _d in rc.consequences})
                    rows.append(row(folded, f"consequence of {rc.host} (job root cause): {', '.join(kinds)}", rc.host))
    return rows


CSV_COLUMNS = ("hosts", "n", "verdict", "category", "action", "reason", "rtt_ms_min", "rtt_ms_max", "consequence_of")


def fleet_csv(results: list[HostResult], root_causes: list[Any] | None = None) -> str:
    """``--format csv``: the fleet table's rows, hosts folded in full (``gpu[01-04,07]``), RFC 4180 quoting;
    a cell that a spreadsheet would run as a formula (``=``, ``+``, ``-``, ``@``) starts with ``'``."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in fleet_rows(results, root_causes):
        w.writerow([_csv_cell(r[c]) for c in CSV_COLUMNS])
    return buf.getvalue()


def _csv_cell(v: Any) -> str:
    s = str(v)
    return "'" + s if s[:1] in ("=", "+", "-", "@") and not re.fullmatch(r"-?\d+(\.\d+)?", s) else s


# ---- the incident report (--format md / html)


@dataclass
class ReportSection:
    """One trouble in the incident report: a job's root, or a group of hosts with one cause."""

    title: str
    verdict: str
    rows: list[tuple[str, str]]  # label, text
    log_line: str = ""
    traceback: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    hint: str = ""


@dataclass
class Report:
    """What a ticket needs: the fleet in one line, each job's root cause, one section per trouble,
    the fleet table, and (sweep, history) the changes or incidents."""

    title: str
    summary: str
    roots: list[str] = field(default_factory=list)
    sections: list[ReportSection] = field(default_factory=list)
    table: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)  # title, header, rows


def host_section(res: HostResult, others: list[str], traceback_lines: int = 40) -> ReportSection:
    from ..inventory import fold
    from ..store import action_class, category_of

    d = res.decisive
    title = f"{res.host} — {res.verdict}"
    if others:
        title += f" (same cause on {plural(len(others), 'more host', 'more hosts')}: {fold(others)})"
    rows: list[tuple[str, str]] = []
    sec = ReportSection(title=title, verdict=str(res.verdict), rows=rows)
    if d is not None:
        rows.append(("cause", d.message or d.line))
        where = [p for p in (d.process, d.time) if p]
        loc = f"line {d.lineno}" if d.lineno else (f"byte {d.pos}" if d.pos is not None else "")
        if d.source == "kernel":
            loc = "kernel log"
        elif d.source == "gpu":
            loc = "nvidia-smi"
        elif res.log:
            loc = f"{loc} of {res.log}" if loc else res.log
        if loc:
            where.append(loc)
        rows.append(("where", " · ".join(where)))
        kind = [x for x in (d.exception_type, category_of(res)) if x]
        rows.append(("kind", " · ".join([*kind, f"action {action_class(res)}", f"confidence {d.confidence:.0%}"])))
        if d.reason:
            rows.append(("why this", d.reason))
        if d.consequence:
            rows.append(("consequence", d.consequence))
        sec.log_line = d.line
        sec.hint = d.hint or ""
        tb = _strip_common_prefix(list(d.traceback))
        if len(tb) > traceback_lines:
            keep = traceback_lines // 2
            tb = tb[:keep] + [f"… {len(tb) - 2 * keep} frames (see --json for all) …"] + tb[-keep:]
        sec.traceback = tb
    else:
        rows.append(("status", EXPLAIN.get(res.verdict, str(res.verdict))))
        if res.error:
            rows.append(("reason", res.error))
        if res.summary:
            rows.append(("log says", res.summary))
        rows.append(("kind", f"{category_of(res)} · action {action_class(res)}"))
    src = source_text(res.log_source)
    if src:
        rows.append(("log from", src))
    if res.idle_seconds is not None and res.verdict != UNREACHABLE:
        rows.append(("log age", f"last written {ago(res.idle_seconds)} ago"))
    cascade = cascade_text(res.secondary)
    if cascade:
        rows.append(("cascade", cascade))
    for label, text in summary_lines(res.facts or {}):
        rows.append((label, text))
    for e in res.evidence:
        line = str(e.get("line") or "").strip()
        if line and not (e.get("source") == "log" and d is not None and line == d.line.strip()):  # not twice
            src_name = str(e.get("source") or "evidence")
            sec.evidence.append(f"{src_name}: {line}" + (f" (GPU {e['gpu']})" if e.get("gpu") is not None else ""))
    sec.evidence = list(dict.fromkeys(sec.evidence))[:20]
    return sec


def troubles(results: list[HostResult], rcs: list[Any]) -> tuple[list[tuple[Any, HostResult]], list[Any]]:
    """What a multi-host answer shows, in order: each job's root cause with its root host's result,
    then the groups (``store.CauseGroup``) of the other hosts in trouble, one per root cause."""
    from ..store import group_by_cause, incident_key

    by_host = {r.host: r for r in results}
    roots: list[tuple[Any, HostResult]] = []
    done: set[str] = set()
    for rc in rcs:
        root = by_host.get(rc.host)
        if root is None:
            continue
        roots.append((rc, root))
        done.add(rc.host)
        done.update(rc.affected)
    groups = [
        g for g in group_by_cause(r for r in results if r.host not in done) if incident_key(g.example) is not None
    ]
    return roots, groups


def job_cards(results: list[HostResult], rcs: list[Any]) -> list[RenderableType]:
    """One card per root cause: each job's root first (its line, its card, its consequences
    folded under it), then one card per group of the other hosts in trouble."""
    from ..inventory import fold
    from ..job import consequence_text, summary_line

    out: list[RenderableType] = []
    roots, groups = troubles(results, rcs)
    for rc, root in roots:
        out.append(Text(summary_line(rc), style="bold red"))
        for ev in rc.evidence:  # what the nodes recorded: the root's error file, the Flight Recorder dumps, RAS
            out.append(Text(f"  {ev}", style="bold"))
        out.append(host_card(root))
        if rc.consequences:
            bits = [consequence_text(h, k, d) for h, k, d in rc.consequences]
            out.append(
                Text(
                    f"  failed as a consequence of {rc.host}: " + ", ".join(bits) + " (their cards: --all-cards)",
                    style="bold",
                )
            )
    for g in groups:
        out.append(host_card(g.example))
        if len(g.results) > 1:
            out.append(Text(f"  same root cause on {len(g.results) - 1} more: {fold(g.hosts[1:])}", style="bold"))
    return out


def incident_report(
    results: list[HostResult], root_causes: list[Any] | None = None, title: str = "fleetdiag incident report"
) -> Report:
    """The report of one probe or sweep, from results as they may be shown (already redacted)."""
    from ..job import consequence_text, summary_line

    rcs = list(root_causes or [])
    counts = Counter(r.verdict for r in results)
    rep = Report(
        title=title,
        summary=f"{plural(len(results), 'host')}: " + " · ".join(f"{counts[v]} {v}" for v in VERDICTS if counts[v]),
    )
    roots, groups = troubles(results, rcs)
    for rc, root in roots:
        rep.roots.append(summary_line(rc, width=200))
        sec = host_section(root, [])
        sec.title = f"job root cause: {sec.title}"
        if rc.consequences:
            sec.rows.append(("consequences", ", ".join(consequence_text(h, k, dl) for h, k, dl in rc.consequences)))
        rep.sections.append(sec)
    for g in groups:
        rep.sections.append(host_section(g.example, g.hosts[1:]))
    rep.table = fleet_rows(results, rcs)
    return rep


def history_report(incidents: list[Any], path: str) -> Report:
    """``history --format md|html`` from incidents as they may be shown: each open one's latest record
    (its decisive line, traceback, evidence, hint) as a section, then every incident in a table."""
    from ..records import host_result_from_json

    n_open = sum(1 for i in incidents if i.open)
    rep = Report(title="fleetdiag history", summary=f"{plural(len(incidents), 'incident')} ({n_open} open) from {path}")
    for i in incidents:
        if i.open and i.record:
            sec = host_section(host_result_from_json(i.record), [])
            sec.rows.insert(
                0, ("seen", f"since {units.when(i.since)} · {i.count} sweep(s) · first {units.when(i.first_seen)}")
            )
            rep.sections.append(sec)
    rows = [
        [
            i.host,
            i.verdict if i.open else f"was {i.verdict}",
            i.summary,
            units.when(i.first_seen),
            units.when(i.last_seen),
            i.count,
            units.when(i.resolved_at) if i.resolved_at is not None else "open",
        ]
        for i in incidents
    ]
    rep.extra.append(("incidents", ["host", "state", "cause", "first seen", "last seen", "count", "resolved"], rows))
    return rep


def lemons_report(recs: list[Any], path: str, recur: int) -> Report:
    """``history --lemons --format md|html``: the recurring troubles (``store.Recurrence``) as one table."""
    rep = Report(title="fleetdiag lemon nodes", summary=f"{plural(len(recs), 'recurring trouble')} in {path}")
    header = ["host", "verdict", "trouble", "episodes", "boots", "why", "last seen"]
    rows = [
        [r.host, r.verdict, r.summary, r.episodes, len(r.boots), r.lemon(recur), units.when(r.last_seen)] for r in recs
    ]
    rep.extra.append(("recurring troubles", header, rows))
    return rep


def _fence(lines: list[str]) -> str:
    """A Markdown code block no line of the data can close early."""
    text = "\n".join(lines)
    ticks = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, ticks + 1)
    return f"{fence}\n{text}\n{fence}"


def _md_cell(text: Any) -> str:
    return _md_text(str(text)) or " "


def _md_text(text: str) -> str:
    """Inline text with Markdown's active characters escaped (a log line is data, never markup)."""
    s = " ".join(text.split()).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_\[\]|~])", r"\\\1", s)  # emphasis, code, links, tables: the rest is inert inline


def report_markdown(rep: Report) -> str:
    """The report as Markdown for a ticket or a chat thread; every piece of host text escaped or fenced."""
    out = [f"# {_md_text(rep.title)}", "", f"**{_md_text(rep.summary)}**", ""]
    for note in rep.notes:
        out += [f"_{_md_text(note)}_", ""]
    for root in rep.roots:
        out += [f"> **{_md_text(root)}**", ""]
    for sec in rep.sections:
        out += [f"## {_md_text(sec.title)}", ""]
        out += [f"- **{label}**: {_md_text(text)}" for label, text in sec.rows]
        if sec.hint:
            out.append(f"- **hint**: {_md_text(sec.hint)}")
        out.append("")
        if sec.log_line:
            out += ["log line:", "", _fence([sec.log_line]), ""]
        if sec.traceback:
            out += ["traceback:", "", _fence(sec.traceback), ""]
        if sec.evidence:
            out += ["evidence:", "", _fence(sec.evidence), ""]
    for title, header, rows in rep.extra:
        out += [f"## {_md_text(title)}", "", _md_table(header, rows), ""]
    if rep.table:
        out += ["## fleet", "", _md_table(list(CSV_COLUMNS[:6]), [[r[c] for c in CSV_COLUMNS[:6]] for r in rep.table])]
        out.append("")
    return "\n".join(out)


def _md_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


_HTML_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:72em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left;vertical-align:top}
dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}dt{color:#666}dd{margin:0}
.failed{color:#b00}.stalled{color:#a60}.degraded{color:#c50}.unreachable{color:#808}.no-log{color:#a80}
.healthy{color:#080}.root{background:#fee;padding:.4em;border-left:4px solid #b00}.hint{color:#060}
"""


def report_html(rep: Report) -> str:
    """The report as one self-contained HTML page: inline style, no script, nothing fetched; every piece
    of host text escaped, so a log line is shown, never run."""
    import html

    def e(text: Any) -> str:
        return html.escape(str(text), quote=True)

    def cls(verdict: str) -> str:
        return re.sub(r"[^a-z-]", "", verdict)

    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        f"<title>{e(rep.title)}</title><style>{_HTML_STYLE}</style></head><body>",
        f'<h1 id="title">{e(rep.title)}</h1>',
        f'<p id="summary"><strong>{e(rep.summary)}</strong></p>',
    ]
    out += [f'<p class="note"><em>{e(n)}</em></p>' for n in rep.notes]
    out += [f'<p class="root"><strong>{e(r)}</strong></p>' for r in rep.roots]
    for i, sec in enumerate(rep.sections):
        out.append(f'<section id="s{i}"><h2 class="{cls(sec.verdict)}">{e(sec.title)}</h2><dl>')
        out += [f"<dt>{e(label)}</dt><dd>{e(text)}</dd>" for label, text in sec.rows]
        if sec.hint:
            out.append(f'<dt>hint</dt><dd class="hint">{e(sec.hint)}</dd>')
        out.append("</dl>")
        if sec.log_line:
            out.append(f'<p>log line</p><pre class="line">{e(sec.log_line)}</pre>')
        if sec.traceback:
            out.append(f'<p>traceback</p><pre class="traceback">{e(chr(10).join(sec.traceback))}</pre>')
        if sec.evidence:
            out.append(f'<p>evidence</p><pre class="evidence">{e(chr(10).join(sec.evidence))}</pre>')
        out.append("</section>")
    for title, header, rows in rep.extra:
        out.append(f"<h2>{e(title)}</h2>" + _html_table(header, rows))
    if rep.table:
        cols = list(CSV_COLUMNS[:6])
        out.append(
            '<h2>fleet</h2><div id="fleet">' + _html_table(cols, [[r[c] for c in cols] for r in rep.table]) + "</div>"
        )
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _html_table(header: list[str], rows: list[list[Any]]) -> str:
    import html

    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def report_text(rep: Report, fmt: str) -> str:
    """``--format md`` or ``--format html``."""
    return report_html(rep) if fmt == "html" else report_markdown(rep)
