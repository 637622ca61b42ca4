"""The exit-code contract (README, "Exit codes"), decided in one place."""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum
from typing import Any

from .records import DEGRADED, FAILED, NO_LOG, STALLED, UNREACHABLE, CheckStatus, HostResult


class Exit(IntEnum):
    OK = 0  # every selected host is healthy or starting
    FAILED = 1  # at least one host failed, stalled or is degraded (a faulty GPU)
    USAGE = 2  # bad arguments, inventory or selector
    UNREACHABLE = 3  # no failure found, but some host was unreachable or had no readable log
    INTERNAL = 4  # a bug in fleetdiag
    BUSY = 5  # another sweep holds the lock
    INTERRUPTED = 130  # Ctrl-C: what a shell reports for a command ended by SIGINT (128 + 2)
    PIPE_CLOSED = 141  # the reader of stdout went away (`| head`): what a shell reports for SIGPIPE (128 + 13)


def exit_for(results: Iterable[HostResult]) -> Exit:
    verdicts = {r.verdict for r in results}
    if verdicts & {FAILED, STALLED, DEGRADED}:
        return Exit.FAILED
    if verdicts & {UNREACHABLE, NO_LOG}:
        return Exit.UNREACHABLE
    return Exit.OK


def preflight_exit(results: Iterable[Any]) -> Exit:
    """preflight: a failed check is FAILED, an unreachable host UNREACHABLE, else OK (warnings allowed)."""
    statuses = {r.status for r in results}
    if CheckStatus.FAIL in statuses:
        return Exit.FAILED
    if CheckStatus.UNREACHABLE in statuses:
        return Exit.UNREACHABLE
    return Exit.OK
