"""The sweep engine: lock, probe the fleet, write the report, record the history, notify.

A sweep is safe to run unattended: it takes a lock so two never overlap,
writes its JSON report first (atomically) so no history problem can lose
the results, records them in the history store. Cancellation (Ctrl-C,
SIGTERM, SIGHUP) keeps what was found so far.

``execute`` is a plain coroutine so ``fleetdiag sweep`` and ``fleetdiag demo``
run the same sweep; the CLI only parses options and prints the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from . import job as job_mod
from . import units
from .exitcodes import Exit, exit_for
from .probe import ProbeSettings
from .records import SCHEMA_VERSION, HostResult, report_json
from .ssh.scheduler import DEFAULT_FANOUT, DEFAULT_PER_ADDRESS, INTERRUPTED, CostMemory, placeholder
from .ssh.spread import probe_fleet
from .store import (
    DEFAULT_KEEP_DAYS,
    Changes,
    Store,
    StoreError,
    SweepLock,
    write_atomic,
)

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
    workers: int | None = None  # processes that probe the hosts (None: fleetdiag.ssh.spread decides)
    keep_days: float = DEFAULT_KEEP_DAYS
    notify: str | None = None
    progress: bool = False
    redactor: Any = None  # --redact: the report and the printed news are redacted; the history keeps real names
    prometheus: Path | None = None  # --prometheus: a node_exporter textfile-collector file (fleetdiag.prometheus)


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
            "history_error": str(self.store_error) if self.store_error else None,
        }


_iso = units.iso


async def execute(job: SweepJob, progress: Any = None) -> SweepOutcome:
    """Lock, probe, write the report, record history, notify. Raises LockBusy.

    ``progress``: the scheduler's progress callback, also a context manager (``render.FleetProgress``).
    """
    with contextlib.ExitStack() as held:
        store: Store | None = None
        store_error: StoreError | None = None
        try:  # a history that cannot be used costs the history, never the sweep: the report is still written
            held.enter_context(SweepLock.for_db(job.db))
            store = Store(job.db)
            memory = CostMemory(store.costs())
        except StoreError as exc:
            store_error, memory = exc, CostMemory()
        try:
            started = time.time()
            results, interrupted = await _probe(job, progress, memory)
            out = SweepOutcome(results, started, time.time(), interrupted, store_error=store_error)
            rcs = job_mod.assign_roles(results)  # the job analysis, once: the report's and the history's
            doc = report_json(results, [rc.to_json() for rc in rcs], sweep=out.meta(job))
            if job.redactor is not None:
                doc = job.redactor.obj(doc)
            try:
                out.report = write_atomic(job.report, functools.partial(_dump, doc))
            except OSError as exc:
                out.report_error = f"cannot write the report {job.report}: {exc.strerror or exc}"
            del doc  # the report is on disk: what follows needs only the results
            if store is not None:
                try:
                    out.changes = store.record_sweep(
                        results,
                        started=started,
                        finished=out.finished,
                        selector=job.selector,
                        report=str(out.report) if out.report else None,
                        interrupted=interrupted,
                        unknown=[r.host for r in results if r.error_kind == INTERRUPTED],
                        costs=memory.pairs(),
                        keep_days=job.keep_days,
                        root_causes=rcs,
                    )
                except StoreError as exc:
                    out.store_error = exc
            if job.prometheus is not None:
                out.notes += _write_metrics(job, out, store if out.changes is not None else None)
        finally:
            if store is not None:
                store.close()
        if job.notify and out.changes is not None and (out.changes.new or out.changes.changed):
            out.notes += run_notify(job.notify, notify_payload(job, out), out.report)
        elif job.notify and out.changes is None:
            out.notes.append("--notify skipped: without the history, what is new cannot be known")
        return out


def _dump(doc: Any, fh: TextIO) -> None:
    """The report streamed to its file: as one string it was ~20 KB a host at its peak."""
    json.dump(doc, fh, indent=1)
    fh.write("\n")


async def _probe(job: SweepJob, progress: Any, memory: CostMemory) -> tuple[list[HostResult], bool]:
    """Probe every host; on cancellation (Ctrl-C, SIGTERM) keep what arrived."""
    results: list[HostResult] = []
    interrupted = False
    with progress if progress is not None else contextlib.nullcontext():
        try:
            async for res in probe_fleet(
                job.hosts,
                job.settings,
                job.fanout,
                deadline=job.deadline,
                per_address=job.per_address,
                memory=memory,
                progress=progress,
                workers=job.workers,
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


def _write_metrics(job: SweepJob, out: SweepOutcome, store: Store | None) -> list[str]:
    """The --prometheus file; a problem is a warning, never the sweep's failure."""
    from .prometheus import SweepMetrics, render, write_textfile

    open_now: dict[str, Any] | None = None
    if store is not None:
        try:
            open_now = dict(store.open_incidents())
        except StoreError:
            open_now = None
    text = render(SweepMetrics(out.results, out.started, out.finished, out.interrupted, open_now), job.redactor)
    assert job.prometheus is not None
    try:
        write_textfile(job.prometheus, text)
    except OSError as exc:
        return [f"cannot write the metrics file {job.prometheus}: {exc.strerror or exc}"]
    return []


def _log_of(host: Any, settings: ProbeSettings) -> str | None:
    try:
        return host.log_path(settings.log)[1]
    except Exception:
        return None


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


SECRET_ENV_WORDS = ("PASS", "SECRET", "TOKEN", "KEY", "CRED", "AUTH")


def notify_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for the ``--notify`` command: fleetdiag's secrets (``FLEETDIAG_PASSPHRASE`` and any
    other ``FLEETDIAG_*`` that looks like a secret) stay in fleetdiag."""
    src = dict(os.environ if environ is None else environ)
    return {
        k: v
        for k, v in src.items()
        if not (k.upper().startswith("FLEETDIAG_") and any(w in k.upper() for w in SECRET_ENV_WORDS))
    }


def run_notify(command: str, payload: dict[str, Any], report: Path | None) -> list[str]:
    """Run the user's command through sh with the JSON on stdin; problems become warnings."""
    env = notify_environment()
    if report is not None:
        env["FLEETDIAG_REPORT"] = str(report)
    try:
        proc = subprocess.run(
            command,
            shell=True,
            input=json.dumps(payload, indent=1).encode(),
            env=env,
            timeout=NOTIFY_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return [f"--notify command did not finish within {NOTIFY_TIMEOUT:g}s and was killed: {command}"]
    except OSError as exc:
        return [f"--notify command could not run: {exc}"]
    if proc.returncode != 0:
        return [f"--notify command exited with status {proc.returncode}: {command}"]
    return []
