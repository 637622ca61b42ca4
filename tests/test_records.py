"""HostResult's typed facts: the fields other modules decide on, and the JSON that keeps them in ``facts``."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fleetdiag.records import (
    TYPED_FACTS,
    Clock,
    HostResult,
    JobFacts,
    JobRole,
    LogSilence,
    host_result_from_json,
)

PKG = Path(__file__).resolve().parent.parent / "fleetdiag"

CLOCK = {
    "local_receive": 1796116300.123,
    "remote_now": 1796116300.1,
    "rtt": 0.002,
    "measured": 0.022,
    "offset": 0.0,
    "zone": "+0200",
}
SILENCE = {
    "phase": "training",
    "stalled": True,
    "cadence_s": 2.0,
    "median_s": 2.0,
    "silent_s": 7200.0,
    "threshold_s": 600.0,
    "reason": "silent for 2.0 h",
}
# the facts of real probes, in the order the JSON has listed them (descriptive and typed interleaved)
RECORDS = [
    {
        "nvidia_smi": "ok",
        "parallel": {"tp": 2},
        "parallel_source": "log",
        "kernel_log": {"source": "dmesg", "boot": 1796000000},
        "clock": CLOCK,
        "zone": "+0200",
        "log_mtime": 1796116290.5,
        "node": {"procs": [], "error_files": [], "flight_recorder": [], "notes": ["x"]},
        "job": {
            "kind": "peer",
            "lines": ["[rank1] a", "[rank1] b"],
            "line": "[rank1] b",
            "chosen": "peer line",
            "signal": "SIGKILL",
            "role": "consequence",
            "root": "gpu01",
        },
    },
    {
        "nvidia_smi": "missing",
        "silence": SILENCE,
        "kernel_log": {"source": "none"},
        "clock": CLOCK,
        "zone": "+0200",
        "log_mtime": 1796109100.0,
        "job": {"kind": "", "lines": ["step 10"]},
        "stacks": {"procs": [{"pid": 7}], "exec_ms": 12.5},
    },
    {"error_kind": "refused"},
    {"job": {"kind": "", "lines": [], "role": "root", "rank": 3, "affected": ["b"], "why": "first", "time": "t"}},
]


def test_a_record_read_back_writes_the_same_json_byte_for_byte() -> None:
    for facts in RECORDS:
        doc = {"host": "h", "verdict": "failed", "facts": facts}
        res = host_result_from_json(json.loads(json.dumps(doc)))
        assert not set(TYPED_FACTS) & set(res.facts), res.facts  # lifted into the fields
        assert json.dumps(res.to_json()["facts"]) == json.dumps(facts)


def test_the_typed_fields_are_what_modules_read() -> None:
    res = host_result_from_json({"host": "h", "verdict": "failed", "facts": RECORDS[0]})
    assert res.clock == Clock(**CLOCK) and res.clock.zone == "+0200"
    assert res.log_mtime == 1796116290.5
    assert res.job == JobFacts("peer", ["[rank1] a", "[rank1] b"], "[rank1] b", "peer line", "SIGKILL")
    assert res.job_role == JobRole("consequence", root="gpu01")
    stalled = HostResult(host="s", verdict="stalled", facts=RECORDS[1])
    assert stalled.silence == LogSilence(**SILENCE) and stalled.facts["stacks"]["exec_ms"] == 12.5
    assert HostResult(host="d", verdict="unreachable", facts={"error_kind": "dns"}).error_kind == "dns"
    # a zone without a clock reading stays a zone; an empty record has no clock at all
    only_zone = HostResult(host="z", verdict="healthy", facts={"zone": "UTC"})
    assert only_zone.clock == Clock(zone="UTC") and only_zone.to_json()["facts"] == {"zone": "UTC"}
    assert HostResult(host="e", verdict="healthy").to_json()["facts"] == {}


def test_no_module_writes_a_typed_fact_into_the_facts_dict() -> None:
    """The fields are the one place: a write of ``facts["clock"]`` (or any typed key) would never reach the JSON
    (the package, the README's examples and the benchmarks)."""
    keys = "|".join(TYPED_FACTS)
    write = re.compile(rf"""facts(\[["']({keys})["']\]\s*=(?!=)|\.setdefault\(["']({keys})["']|\.update\()""")
    found = [
        f"{p.relative_to(PKG.parent)}:{n}: {line.strip()}"
        for p in sorted(
            [*PKG.rglob("*.py"), *(PKG.parent / "docs").rglob("*.py"), *(PKG.parent / "bench").rglob("*.py")]
        )
        if p.name != "preflight.py"  # a PreflightResult is another record: its facts are its own
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if write.search(line)
    ]
    assert not found, "\n".join(found)
