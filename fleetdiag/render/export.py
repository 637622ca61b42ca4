"""Filters (``--only``/``--hide``) and every export: csv, the incident, history and lemons reports as
Markdown and as a self-contained HTML page."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import units
from ..facts import summary_lines
from ..records import (
    UNREACHABLE,
    VERDICTS,
    HostResult,
)
from ..units import ago
from .card import EXPLAIN, _strip_common_prefix, cascade_text, plural, source_text
from .job import troubles
from .table import group_reason

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
