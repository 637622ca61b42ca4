"""One owner per concept: human units, the str-Enum vocabularies and exit codes."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from fleetdiag import render, units
from fleetdiag.cli.watch import DURATION
from fleetdiag.exitcodes import Exit, exit_for, preflight_exit
from fleetdiag.inventory import parse_duration as inventory_parse_duration
from fleetdiag.preflight import FAIL, PASS, WARN, PreflightResult, exit_code
from fleetdiag.records import (
    FAILED,
    VERDICTS,
    CheckStatus,
    HostResult,
    LogStatus,
    Verdict,
    WatchState,
    host_result_from_json,
)


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("10m", 600.0),
        ("2h", 7200.0),
        ("90d", 90 * 86400.0),
        ("500ms", 0.5),
        ("1h30m", 5400.0),
        ("90s", 90.0),
        ("45", 45.0),
        (" 2.5m ", 150.0),
        (7, 7.0),
    ],
)
def test_parse_duration(text, seconds):
    assert units.parse_duration(text) == pytest.approx(seconds)
    assert DURATION.convert(text, None, None) == pytest.approx(seconds)  # the CLI's --stall-after, --grace …


@pytest.mark.parametrize("bad", ["10x", "-5", "m", "", True, float("nan"), "1h-2m"])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError):
        units.parse_duration(bad)
    with pytest.raises(click.BadParameter):
        DURATION.convert(bad, None, None)


def test_one_owner_with_thin_reexports():
    assert inventory_parse_duration is units.parse_duration
    assert render.fmt_ms is units.ms and render.fmt_bytes is units.size


def test_formats():
    assert [units.ago(s) for s in (45, 1500, 12600, 200000)] == ["45s", "25 min", "3.5 h", "2 days"]
    assert [units.ms(v) for v in (None, 42.4, 12345)] == ["-", "42 ms", "12.3 s"]
    assert [units.size(n) for n in (None, 0, 512, 1536, 3 * 1024**2, 5 * 1024**4)] == [
        "0 B",
        "0 B",
        "512 B",
        "1.5 KB",
        "3.0 MB",
        "5120.0 GB",
    ]
    assert [units.gib(g) for g in (138.0, 139.81, 0.098)] == ["138 GiB", "139.8 GiB", "100 MiB"]
    assert units.mib(143771) == "140.4 GiB"
    assert units.iso(None) is None and units.iso(0.0)[:4] in ("1970", "1969")
    assert units.when(None) == "-" and len(units.when(0.0)) == 16


def test_str_enums_are_the_schema_strings():
    assert [str(v) for v in VERDICTS] == [
        "failed",
        "stalled",
        "degraded",
        "unreachable",
        "no-log",
        "starting",
        "healthy",
    ]
    assert FAILED is Verdict.FAILED and FAILED == "failed" and f"{FAILED:<8}|" == "failed  |"
    res = HostResult(host="h", verdict=Verdict.STALLED)
    doc = json.loads(json.dumps(res.to_json()))
    assert doc["verdict"] == "stalled" and host_result_from_json(doc).verdict == Verdict.STALLED
    # a watch follows the log only (no kernel evidence): its states are the verdicts but degraded
    assert [s.value for s in WatchState][:4] == [v.value for v in VERDICTS if v != Verdict.DEGRADED][:4]
    assert LogStatus("no-match") is LogStatus.NO_MATCH and CheckStatus("pass") is PASS


def test_exit_codes_live_in_exitcodes():
    def pre(*statuses: str) -> list[PreflightResult]:
        return [PreflightResult(host=f"h{i}", status=s) for i, s in enumerate(statuses)]

    assert preflight_exit(pre(PASS, PASS)) is Exit.OK
    assert preflight_exit(pre(PASS, "unreachable")) is Exit.UNREACHABLE
    assert preflight_exit(pre("unreachable", FAIL)) is Exit.FAILED
    assert exit_code(pre(WARN)) == 0 and exit_code(pre(FAIL)) == 1  # the old name still answers
    assert exit_for([HostResult(host="a", verdict="no-log")]) is Exit.UNREACHABLE
    assert (
        exit_for([HostResult(host="a", verdict="unreachable"), HostResult(host="b", verdict="degraded")]) is Exit.FAILED
    )


def test_bad_duration_on_the_command_line_is_a_usage_error(tmp_path):
    from fleetdiag.cli import main

    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  a:\n    address: 127.0.0.1\n")
    r = CliRunner().invoke(main, ["-i", str(inv), "watch", "a", "--grace", "10x"])
    assert r.exit_code == 2 and "10x" in r.output
