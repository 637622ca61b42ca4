"""Everything fleetdiag shows: the one output edge, host cards, fleet and watch tables, job cards, exports.

Only this package and ``cli/`` know about rich. Every card answers, in order: what is wrong, where,
why we think so, what to do, how it was found. The names are re-exported here; each lives in one room:
``output`` (the edge: redaction, control characters made visible), ``card`` (one host), ``table``
(fleet view, progress, watch table, preflight), ``job`` (a job's root cause and the groups in trouble),
``export`` (filters, csv, the incident report as Markdown and HTML), ``history`` (sweep news, history and
lemons), ``listing`` (the hosts and the kept connections).
"""

from __future__ import annotations

from ..lazy import resolver

# Each name and the room that owns it, imported on first use: ``analyze --json`` writes through
# ``output`` and never loads the cards, tables and exports (rich's tables among them).
_OWNERS = {
    "_BLOCK_RE": "card",
    "_PATH_RE": "card",
    "EXPLAIN": "card",
    "ICON": "card",
    "STYLE": "card",
    "PathSafe": "card",
    "_below_the_log": "card",
    "_node_rows": "card",
    "_stack_rows": "card",
    "_strip_common_prefix": "card",
    "cascade_text": "card",
    "fit_paths": "card",
    "fmt_bytes": "card",
    "fmt_ms": "card",
    "found_text": "card",
    "host_card": "card",
    "one_line": "card",
    "plural": "card",
    "short_fold": "card",
    "shorten_path": "card",
    "source_text": "card",
    "_HTML_STYLE": "export",
    "CSV_COLUMNS": "export",
    "FORMATS": "export",
    "Report": "export",
    "ReportSection": "export",
    "_csv_cell": "export",
    "_fence": "export",
    "_html_table": "export",
    "_md_cell": "export",
    "_md_table": "export",
    "_md_text": "export",
    "filter_note": "export",
    "filter_results": "export",
    "fleet_csv": "export",
    "fleet_rows": "export",
    "history_report": "export",
    "host_section": "export",
    "incident_report": "export",
    "lemons_report": "export",
    "parse_verdicts": "export",
    "report_html": "export",
    "report_markdown": "export",
    "report_text": "export",
    "job_cards": "job",
    "troubles": "job",
    "_INVISIBLE": "output",
    "_VISIBLE": "output",
    "_VISIBLE_ONE_LINE": "output",
    "Env": "output",
    "Output": "output",
    "SafeConsole": "output",
    "visible": "output",
    "visible_obj": "output",
    "_ENDPOINT_RE": "table",
    "_WATCH_QUIET": "table",
    "PREFLIGHT_MARK": "table",
    "TABLE_FIRST": "table",
    "WATCH_ICON": "table",
    "WATCH_STYLE": "table",
    "WATCH_TABLE_CHROME": "table",
    "FittingTable": "table",
    "FleetProgress": "table",
    "HostsCell": "table",
    "WatchFitTable": "table",
    "_icons_only": "table",
    "_ms_range": "table",
    "_rtt_range": "table",
    "_WaitingColumn": "table",
    "fleet_title": "table",
    "fleet_view": "table",
    "group_reason": "table",
    "preflight_table": "table",
    "preflight_view": "table",
    "watch_event_line": "table",
    "watch_rows": "table",
    "watch_state_text": "table",
    "watch_table": "table",
}
_ROOMS = ("card", "export", "history", "job", "listing", "output", "table")


__getattr__ = resolver(__name__, _OWNERS, _ROOMS)
