"""Is a silent log stalled? Judged against the log's own cadence, not only a fixed limit.

A training loop that wrote a line every 2 s and has been silent for 90 s is stuck (a hang in a collective,
a dead data loader); a server that finished its start-up and gets no requests may stay silent for hours and
is fine. So: the cadence is the typical gap between the recent lines' own time stamps (p90 of the gaps
between bursts), the silence is the remote clock minus the log's mtime, and the log is stalled when the
silence exceeds ``max(k × cadence, floor)`` while the writing process lives, but only in a phase where
silence is abnormal:

- ``training``: the latest phase line is step/iteration/epoch progress;
- ``starting``: no start-up-complete line yet, or a wait/loading line after the last one;
- ``serving``: start-up complete (``Application startup complete``, ``Uvicorn running on`` ...) and no
  training progress after it: silence is an idle server, never a stall.

Pure: lines in, a :class:`Silence` out. Times are read with the analyzer's line model.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..analysis.lines import PROGRESS, LogLine, parse_all, time_key
from ..records import Line

TRAINING, STARTING, SERVING = "training", "starting", "serving"

K = 10.0  # silent for this many typical gaps: stalled
FLOOR = 60.0  # never stalled by silence before this many seconds (a GC pause, a slow eval step)
FALLBACK = 600.0  # no cadence to judge by (too few time-stamped lines): the fixed limit
BURST = 0.05  # lines closer than this belong to one burst (a traceback, a multi-line report, one time stamp)
RECENT_GAPS = 64  # the cadence is taken over the latest gaps only: the log's current rhythm
MIN_GAPS = 3  # fewer gaps than this: no cadence

# Start-up complete: the service is up (the rules file's "ready" section says the same; pass its
# matcher to use a user's patterns too).
_READY = re.compile(
    r"Application startup complete|Uvicorn running on|The server is fired up and ready to roll"
    r"|Server is ready|Running on https?://|Serving on|listening on (?:port|https?://)"
    r"|Avg prompt throughput|\"(?:GET|POST) /\S* HTTP/1\.[01]\" 200"
)
# Still starting: waits, loading, compiling, graph capture (the rules file's "waiting" section adds the rest:
# hang.judge_silence passes its matcher, as for "ready").
_WAITING = re.compile(
    r"[Ww]aiting for .*(?:ready|to start|to come up|to be up|server|engine|health)|[Hh]ealth ?check"
    r"|Loading (?:safetensors checkpoint shards|(?:model )?weights)|Starting to load model"
    r"|Capturing (?:CUDA|cuda|ACL|HIP) graph|Waiting for init message|torch\.compile|Compiling"
)


@dataclass
class Silence:
    """The verdict on a log's silence, with its numbers and the one-line reason the card shows."""

    stalled: bool
    cadence_s: float | None  # typical gap between bursts (p90 of the recent gaps), None when unknown
    silent_s: float | None  # remote now - the log's mtime
    phase: str  # training | starting | serving
    reason: str
    threshold_s: float | None = None  # silence beyond this is a stall (None: silence never stalls here)
    median_s: float | None = None  # the median gap, for "it wrote every ~2 s"


def _fmt(s: float) -> str:
    if s < 10:
        return f"{s:.1f}".rstrip("0").rstrip(".") + " s"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _quantile(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    i = min(len(ys) - 1, max(0, round(q * (len(ys) - 1))))
    return ys[i]


def cadence(parsed: Sequence[LogLine], burst: float = BURST, recent: int = RECENT_GAPS) -> tuple[float, float] | None:
    """(p90, median) of the gaps between bursts of the recent time-stamped lines, or None with too few.

    Lines within ``burst`` seconds of the previous one join its burst, and gaps run from burst start to burst
    start, so a 5-line report every 30 s has a cadence of 30 s, not 0. A time that goes backwards
    (interleaved writers, a clock step) is skipped.
    """
    times = [t for t in (time_key(ln.time) for ln in parsed) if t is not None]
    gaps: list[float] = []
    last: float | None = None
    start: float | None = None
    for t in times:
        if last is None or start is None:
            last = start = t
            continue
        if t < last:
            continue  # out of order: keep the later reference
        if t - last >= burst:
            gaps.append(t - start)
            start = t
        last = t
    gaps = gaps[-recent:]
    if len(gaps) < MIN_GAPS:
        return None
    return _quantile(gaps, 0.9), _quantile(gaps, 0.5)


def phase(
    parsed: Sequence[LogLine],
    is_ready: Callable[[str], bool] | None = None,
    is_waiting: Callable[[str], bool] | None = None,
) -> tuple[str, LogLine | None]:
    """(phase, the line that decided it). The latest phase line decides; no such line: starting.

    ``is_ready`` / ``is_waiting`` add matchers (the rules file's ``ready``/``waiting`` sections).
    """
    for ln in reversed(parsed):
        text = ln.msg
        if PROGRESS.search(text):
            return TRAINING, ln
        if _WAITING.search(text) or (is_waiting is not None and is_waiting(ln.raw)):
            return STARTING, ln
        if _READY.search(text) or (is_ready is not None and is_ready(ln.raw)):
            return SERVING, ln
    return STARTING, None


def judge(
    lines: Sequence[Line] | Sequence[LogLine],
    mtime: float | None,
    now: float | None,
    *,
    alive: bool | None = None,
    k: float = K,
    floor: float = FLOOR,
    fallback: float = FALLBACK,
    is_ready: Callable[[str], bool] | None = None,
    is_waiting: Callable[[str], bool] | None = None,
) -> Silence:
    """Judge one log's silence. ``lines``: the log's latest lines (the funnel's tail; the latest run only).

    ``mtime`` and ``now`` are both the remote host's clock (the funnel reports both), so no clock sync is
    needed. ``alive``: whether the process writing the log still runs (False: an exit is not a stall;
    None: unknown, judged on the log alone).
    """
    parsed: list[LogLine] = [ln for ln in lines if isinstance(ln, LogLine)]
    if len(parsed) != len(lines):
        parsed = parse_all([ln for ln in lines if isinstance(ln, Line)])
    ph, by = phase(parsed, is_ready, is_waiting)
    cad = cadence(parsed)
    p90, med = cad if cad else (None, None)
    silent = max(0.0, now - mtime) if now is not None and mtime is not None else None
    what = {TRAINING: "training", STARTING: "starting up", SERVING: "serving"}[ph]
    if ph == STARTING and by is None:
        what = "starting up (no line says start-up completed)"
    if silent is None:
        return Silence(False, p90, None, ph, "the log's age is unknown (no mtime or remote clock)", None, med)
    if ph == SERVING:
        quote = f" (last: {by.msg.strip()[:80]})" if by is not None else ""
        return Silence(
            False,
            p90,
            silent,
            ph,
            f"serving and idle: start-up completed{quote}; silent for {_fmt(silent)}, which is normal "
            "for a server without requests",
            None,
            med,
        )
    threshold = max(k * p90, floor) if p90 is not None else fallback
    if p90 is not None:
        rhythm = f"it wrote every ~{_fmt(med or p90)}" + (f" (p90 {_fmt(p90)})" if med and p90 > 1.5 * med else "")
        limit = f"limit {_fmt(threshold)} = " + (
            f"{k:g} × {_fmt(p90)}" if k * p90 >= floor else f"the {_fmt(floor)} floor"
        )
    else:
        rhythm = "too few time-stamped lines to know its cadence"
        limit = f"the fixed {_fmt(fallback)} limit"
    if alive is False:
        return Silence(
            False, p90, silent, ph, f"{what}; silent for {_fmt(silent)}, but its process has exited", threshold, med
        )
    if silent > threshold:
        return Silence(True, p90, silent, ph, f"{what}, {rhythm}; silent for {_fmt(silent)} ({limit})", threshold, med)
    return Silence(
        False, p90, silent, ph, f"{what}, {rhythm}; silent for {_fmt(silent)}, within {limit}", threshold, med
    )
