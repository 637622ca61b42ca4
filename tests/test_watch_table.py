"""The live watch table fits the terminal: failures first and never below the edge, healthy hosts folded."""

from __future__ import annotations

import io

from rich.console import Console

from fleetdiag.records import WatchState
from fleetdiag.render import watch_rows, watch_table
from fleetdiag.watch import HostView


def _fleet(n: int = 30, bad: dict[str, WatchState] | None = None) -> list[HostView]:
    bad = bad if bad is not None else {"gpu30": WatchState.FAILED}
    views = []
    for i in range(1, n + 1):
        name = f"gpu{i:02d}"
        state = bad.get(name, WatchState.HEALTHY)
        reason = "CUDA error: an illegal memory access was encountered" if state == WatchState.FAILED else "serving"
        views.append(HostView(host=name, state=state, reason=reason, connected=True, rtt_ms=1.0 + i / 10))
    return views


def _screen(views: list[HostView], height: int = 20, width: int = 100) -> list[str]:
    buf = io.StringIO()
    console = Console(file=buf, width=width, height=height, color_system=None, legacy_windows=False)
    console.print(watch_table(views, height=console.height))
    return buf.getvalue().splitlines()


def test_thirty_hosts_in_twenty_rows_show_the_failed_one_and_fold_the_healthy():
    lines = _screen(_fleet())
    assert len(lines) <= 20, "\n".join(lines)
    text = "\n".join(lines)
    assert "gpu30" in text and "✗ failed" in text and "illegal memory access" in text
    assert "gpu[01-29]" in text and "✓ healthy" in text and "29 hosts" in text
    body = [ln for ln in lines if "gpu" in ln]
    assert "gpu30" in body[0], "the failed host is the first row"


def test_stalled_and_unreachable_keep_their_own_rows_before_the_healthy_range():
    bad = {"gpu07": WatchState.STALLED, "gpu12": WatchState.UNREACHABLE, "gpu30": WatchState.FAILED}
    lines = _screen(_fleet(bad=bad))
    hosts = [ln.split("│")[1].strip() if "│" in ln else "" for ln in lines]
    hosts = [h for h in hosts if h.startswith("gpu")]
    assert hosts == ["gpu30", "gpu07", "gpu12", "gpu[01-06,08-11,13-29]"]


def test_a_fleet_that_fits_keeps_one_row_per_host_worst_first():
    lines = _screen(_fleet(n=10, bad={"gpu09": WatchState.FAILED}), height=40)
    hosts = [ln.split("│")[1].strip() for ln in lines if "│" in ln and "gpu" in ln]
    assert hosts == ["gpu09", *(f"gpu{i:02d}" for i in range(1, 11) if i != 9)]


def test_without_a_height_every_host_has_a_row():
    rows = watch_rows(_fleet(), None)
    assert len(rows) == 30 and rows[0][1][0].host == "gpu30"


def test_even_a_tiny_screen_folds_every_state_worst_first():
    bad = {f"gpu{i:02d}": WatchState.FAILED for i in range(1, 8)} | {"gpu20": WatchState.STALLED}
    rows = watch_rows(_fleet(bad=bad), 3)
    assert [(s, len(vs)) for s, vs in rows] == [
        (WatchState.FAILED, 7),
        (WatchState.STALLED, 1),
        (WatchState.HEALTHY, 22),
    ]
