"""Everything fleetdiag shows: the one output edge, host cards, fleet and watch tables, job cards, exports.

Only this package and ``cli/`` know about rich. Every card answers, in order: what is wrong, where,
why we think so, what to do, how it was found. The names are re-exported here; each lives in one room:
``output`` (the edge: redaction, control characters made visible), ``card`` (one host), ``table``
(fleet view, progress, watch table, preflight), ``job`` (a job's root cause and the groups in trouble),
``export`` (filters, csv, the incident report as Markdown and HTML), ``history`` (sweep news, history and
lemons), ``listing`` (the hosts and the kept connections).
"""

from __future__ import annotations

from .card import (  # noqa: F401
    _BLOCK_RE,
    _PATH_RE,
    EXPLAIN,
    ICON,
    STYLE,
    PathSafe,
    _below_the_log,
    _node_rows,
    _stack_rows,
    _strip_common_prefix,
    cascade_text,
    fit_paths,
    fmt_bytes,
    fmt_ms,
    found_text,
    host_card,
    one_line,
    plural,
    short_fold,
    shorten_path,
    source_text,
)
from .export import (  # noqa: F401
    _HTML_STYLE,
    CSV_COLUMNS,
    FORMATS,
    Report,
    ReportSection,
    _csv_cell,
    _fence,
    _html_table,
    _md_cell,
    _md_table,
    _md_text,
    filter_note,
    filter_results,
    fleet_csv,
    fleet_rows,
    history_report,
    host_section,
    incident_report,
    lemons_report,
    parse_verdicts,
    report_html,
    report_markdown,
    report_text,
)
from .job import (  # noqa: F401
    job_cards,
    troubles,
)
from .output import (  # noqa: F401
    _INVISIBLE,
    _VISIBLE,
    _VISIBLE_ONE_LINE,
    Env,
    Output,
    SafeConsole,
    visible,
    visible_obj,
)
from .table import (  # noqa: F401
    _ENDPOINT_RE,
    _WATCH_QUIET,
    PREFLIGHT_MARK,
    TABLE_FIRST,
    WATCH_ICON,
    WATCH_STYLE,
    WATCH_TABLE_CHROME,
    FittingTable,
    FleetProgress,
    HostsCell,
    WatchFitTable,
    _icons_only,
    _ms_range,
    _rtt_range,
    _WaitingColumn,
    fleet_title,
    fleet_view,
    group_reason,
    preflight_table,
    preflight_view,
    watch_event_line,
    watch_rows,
    watch_state_text,
    watch_table,
)
