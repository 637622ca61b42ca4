"""A job across hosts: which node broke it.

A multi-node job fails on every node at once and most nodes only show a
consequence (a peer's NCCL error, a watchdog timeout, the agent's SIGTERM).
This package takes one ``HostEvidence`` per failed host and names, per job,
the host and rank whose own failure started it. Pure: no I/O; the rules come
from ``job.rules`` (data/peer.yaml).

Order of evidence: a local-origin failure beats a peer-caused one even when
the peer-caused one is stamped earlier; among local-origin failures the
earliest by corrected time wins; without any, the straggler that others'
watchdog evidence leaves out, or the rank a launcher reports killed.

Rooms: ``clock`` (a host's clock against ours, its log times), ``evidence`` (the records in and out,
from a ``HostResult``), ``lines`` (what one host's lines say: its own line, launcher reports, ranks,
endpoints, collectives), ``membership`` (which hosts ran one job), ``roots`` (the root cause of each
job, its words), ``report`` (what a probe keeps for later, the roles marked before any output).
"""

from __future__ import annotations

from .clock import (  # noqa: F401
    CLOCK_DEADBAND_S,
    clock_offset,
    clock_sample,
    normalise,
)
from .evidence import (  # noqa: F401
    KEEP_WIDTH,
    LOOPBACK,
    WINDOW_S,
    HostEvidence,
    RootCause,
    evidence_from_result,
)
from .lines import (  # noqa: F401
    LauncherReport,
    classify,
    endpoint_ere,
    endpoints,
    event_time,
    facts_ranks,
    is_launcher_line,
    launcher_report,
    oom_line,
    own_line,
    ranks_of,
)
from .membership import (  # noqa: F401
    groups,
)
from .report import (  # noqa: F401
    KEEP_LINES,
    QUIET_LINES,
    assign_roles,
    clip,
    job_facts,
    keep_lines,
    mark,
    report,
)
from .roots import (  # noqa: F401
    consequence_text,
    node_evidence,
    root_causes,
    summary_line,
)
