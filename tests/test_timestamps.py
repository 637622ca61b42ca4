"""The one year and zone policy for log timestamps (fleetdiag.timestamps), and its users agreeing on it."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from fleetdiag import timestamps
from fleetdiag.evidence.kernel import Clock, split_time
from fleetdiag.job import normalise


def utc(*a: int) -> float:
    return datetime(*a, tzinfo=timezone.utc).timestamp()


JAN2 = utc(2027, 1, 2, 8, 0)


@pytest.mark.parametrize(
    "raw,ref,want",
    [
        ("12-31 23:59:00", JAN2, utc(2026, 12, 31, 23, 59)),  # Dec -> Jan: last year's December
        ("I1231 23:59:00.5", JAN2, utc(2026, 12, 31, 23, 59) + 0.5),
        ("Dec 31 23:59:00", JAN2, utc(2026, 12, 31, 23, 59)),
        ("01-02 07:00:00", JAN2, utc(2027, 1, 2, 7)),  # this year, before the reference
        ("01-02 20:00:00", JAN2, utc(2027, 1, 2, 20)),  # within a day's slack: still this year
        ("01-20 07:00:00", JAN2, utc(2026, 1, 20, 7)),  # 18 days ahead: the year before, never the future
        ("02-29 12:00:00", utc(2026, 12, 1), utc(2024, 2, 29, 12)),  # leap day: the last year that had one
        ("02-29 12:00:00", utc(2028, 3, 1), utc(2028, 2, 29, 12)),
        ("2027-02-01 00:00:00", JAN2, utc(2027, 2, 1)),  # a stamp that says its year keeps it
    ],
)
def test_year_rule(raw: str, ref: float, want: float) -> None:
    assert timestamps.epoch(raw, "UTC", ref) == pytest.approx(want)


def test_zone_rule_and_iso() -> None:
    ref = utc(2026, 11, 30, 18)
    # zone-less: read in the host's zone, in every spelling of it; UTC when unknown
    for z in ("+01:00", "+0100", 3600, "Europe/Berlin"):
        assert timestamps.epoch("11-20 14:37:16", z, ref) == utc(2026, 11, 20, 13, 37, 16)
    assert timestamps.epoch("11-20 14:37:16", None, ref) == utc(2026, 11, 20, 14, 37, 16)
    assert timestamps.epoch("11-20 14:37:16", "Not/AZone", ref) == utc(2026, 11, 20, 14, 37, 16)
    # zoned: its own zone wins over the host's
    assert timestamps.epoch("2026-11-20T14:37:16.5+02:00", 3600, ref) == utc(2026, 11, 20, 12, 37, 16) + 0.5
    assert timestamps.epoch("2026-11-20 14:37:16Z", 3600, ref) == utc(2026, 11, 20, 14, 37, 16)
    # ISO keeps what the host wrote; a zone-less stamp stays zone-less without a host zone
    assert timestamps.iso("12-31 23:59:59", JAN2) == "2026-12-31T23:59:59"
    assert timestamps.iso("626 06:24:44.9", JAN2) == "2026-06-26T06:24:44.900"
    assert timestamps.iso("05-09 15:15:08", JAN2, 3600) == "2026-05-09T15:15:08+01:00"
    assert timestamps.iso("2026-05-09 15:15:08Z", JAN2, 3600) == "2026-05-09T15:15:08+00:00"
    assert timestamps.iso("2026-05-09T15:15:08-0530", JAN2) == "2026-05-09T15:15:08-05:30"
    assert timestamps.iso("no time", JAN2) is None and timestamps.epoch(None) is None


def test_job_and_kernel_read_times_by_the_same_rule() -> None:
    ref = JAN2
    clock = Clock(now=ref, uptime=1000.0, tz_offset=3600)
    t, msg = split_time("Dec 31 23:59:00 node1 kernel: NVRM: Xid (PCI:0000:17:00): 79, GPU fell", clock, {})
    assert t == timestamps.epoch("12-31 23:59:00", 3600, ref) == utc(2026, 12, 31, 22, 59)
    assert msg.startswith("NVRM: Xid")
    assert normalise("[rank0]:[W1231 23:59:00.000 x.cpp:1]", 3600, ref, 2.0) == utc(2026, 12, 31, 22, 59) + 2.0
    # dmesg -H: a header without a year by the rule, the relative lines after it added to it
    state: dict[str, float | None] = {}
    t, _ = split_time("[Jan20 07:00] gpu fault", clock, state)
    assert t == utc(2026, 1, 20, 6, 0)
    t, _ = split_time("[  +1.500000] more", clock, state)
    assert t == utc(2026, 1, 20, 6, 0) + 1.5
    # boot seconds stay seconds since boot, added to the boot time the clock measured
    t, msg = split_time("[  12.500000] NVRM: loading NVIDIA UNIX", clock, {})
    assert t == pytest.approx(ref - 1000.0 + 12.5) and msg == "NVRM: loading NVIDIA UNIX"
    t, _ = split_time("[  12.500000] x", Clock(), {})
    assert t is None  # no clock reading: a boot offset is no time at all
