"""A sweep as a node_exporter textfile-collector file, so alerts live where operators already look.

``fleetdiag sweep --prometheus /var/lib/node_exporter/textfile_collector/fleetdiag.prom`` writes one
file per sweep in the Prometheus text exposition format (version 0.0.4): every host's verdict as
an enumerated state (one series per verdict, 1 for the current one, 0 for the others, so an alert
resolves when the host recovers) labelled with the trouble's ``category`` and ``action`` class (who has
to act: docs/prometheus/alerts.yaml routes on it), whether the host has an open incident, its SSH round trip, and
the sweep's own time, duration and host count.

The file holds host names, verdicts and numbers only, never log text, so it is written 0644:
node_exporter runs as its own user and must read it. Under ``--redact`` the host names are the
redactor's placeholders. It is replaced atomically (a temp file in the same directory, fsync,
rename), so node_exporter never reads half a file; the temp name does not end in ``.prom``, so
the collector never picks it up.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .records import VERDICTS, HostResult

PROM_MODE = 0o644  # no log text inside; node_exporter (another user) must read it


@dataclass
class SweepMetrics:
    """What one sweep says about the fleet, ready to be written as metrics."""

    results: Sequence[HostResult]
    started: float  # unix time
    finished: float
    interrupted: bool = False
    open_incidents: dict[str, Any] | None = None  # host -> open incident; None: the history was unusable


def escape_label(value: str) -> str:
    """A label value as the exposition format wants it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _num(v: float) -> str:
    return repr(float(v)) if v != int(v) else str(int(v))


class _Doc:
    """Lines of one exposition document; HELP and TYPE once per family, before its samples."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]) -> None:
        self.lines.append(f"# HELP {name} {_escape_help(help_text)}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            inner = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
            self.lines.append(f"{name}{{{inner}}} {_num(value)}" if inner else f"{name} {_num(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def render(metrics: SweepMetrics, redactor: Any = None) -> str:
    """The exposition text for one sweep. Every per-host series carries a ``host`` label."""

    def name(host: str) -> str:
        return redactor.text(host) if redactor is not None else host

    from .store import action_class, category_of

    rs = list(metrics.results)
    doc = _Doc()
    verdicts = list(VERDICTS) + sorted({r.verdict for r in rs} - set(VERDICTS))

    def labels(r: HostResult, v: str) -> dict[str, str]:
        # category and action are the host's now, on every verdict's series, so an alert routes on them
        return {"host": name(r.host), "verdict": str(v), "category": category_of(r), "action": action_class(r)}

    doc.family(
        "fleetdiag_host_verdict",
        "gauge",
        "1 for the host's verdict in the last sweep, 0 for the other verdicts; category: the trouble's kind, "
        "action: who acts (hardware, driver, network, config, capacity, software, hang, access, consequence, none).",
        [(labels(r, v), 1 if r.verdict == v else 0) for r in rs for v in verdicts],
    )
    rtt = [r for r in rs if r.timing.rtt_ms is not None]
    doc.family(
        "fleetdiag_host_rtt_seconds",
        "gauge",
        "SSH round trip to the host measured by the last sweep.",
        [({"host": name(r.host)}, (r.timing.rtt_ms or 0.0) / 1000.0) for r in rtt],
    )
    if metrics.open_incidents is not None:
        inc = metrics.open_incidents
        doc.family(
            "fleetdiag_host_open_incident",
            "gauge",
            "1 while the host has an incident open in the sweep history, else 0.",
            [({"host": name(r.host)}, 1 if r.host in inc else 0) for r in rs],
        )
        doc.family("fleetdiag_open_incidents", "gauge", "Open incidents in the sweep history.", [({}, len(inc))])
    doc.family(
        "fleetdiag_history_ok",
        "gauge",
        "1 when the sweep history could be read and updated.",
        [({}, 1 if metrics.open_incidents is not None else 0)],
    )
    doc.family(
        "fleetdiag_sweep_last_timestamp_seconds",
        "gauge",
        "Unix time the last sweep finished.",
        [({}, round(metrics.finished, 3))],
    )
    doc.family(
        "fleetdiag_sweep_duration_seconds",
        "gauge",
        "How long the last sweep took.",
        [({}, round(metrics.finished - metrics.started, 3))],
    )
    doc.family(
        "fleetdiag_sweep_hosts",
        "gauge",
        "Hosts in the last sweep, by verdict.",
        [({"verdict": str(v)}, sum(1 for r in rs if r.verdict == v)) for v in verdicts],
    )
    doc.family(
        "fleetdiag_sweep_interrupted",
        "gauge",
        "1 when the last sweep was cut short (signal, Ctrl-C).",
        [({}, 1 if metrics.interrupted else 0)],
    )
    return doc.text()


def write_textfile(path: Path | str, text: str) -> Path:
    """Replace ``path`` atomically: node_exporter sees the old file or the new one, never a part.

    The temp file is created in the same directory (same filesystem, so the rename is atomic), with
    a name that does not end in ``.prom``; the directory's own mode is left alone (the collector's
    directory belongs to the operator).
    """
    from .store import write_atomic

    return write_atomic(path, text, mode=PROM_MODE, own_dir=False)
