"""One host's card: what is wrong, where, why, what to do, how it was found; the styles and icons of verdicts."""

from __future__ import annotations

import os
import re
from typing import Any

from rich.cells import cell_len
from rich.console import Console, Group
from rich.measure import Measurement
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .. import units
from ..facts import summary_lines
from ..records import (
    DEGRADED,
    FAILED,
    HEALTHY,
    NO_LOG,
    STALLED,
    STARTING,
    UNREACHABLE,
    HostResult,
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
