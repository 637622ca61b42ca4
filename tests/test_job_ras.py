"""NCCL RAS answers (fleetdiag.facts.ras): the text and JSON forms as NCCL's RAS documentation lays them out
(written here in that layout with this test's own values: no RAS answer was recorded on a live NCCL job yet),
the ``@@fd_ras`` records of the second trip, and a hang's straggler named from RAS."""

from __future__ import annotations

import json

from fleetdiag.facts import ras
from fleetdiag.job import root_causes
from fleetdiag.records import HostResult

TEXT_DEAD = """\
Job summary
===========

  Nodes  Processes         GPUs  Processes     GPUs
(total)   per node  per process    (total)  (total)
      2          4            1          8        8

Communicators... (2.10s)
=============

Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
    0         1         2       3-4         8         8   RUNNING  INCOMPLETE

Errors
======

DEAD
  1 job process is considered dead (unreachable via the RAS network)
  Process 40417 on node 10.0.3.12 managing GPU 2

#0-0 (5d1e0f3a9c2b7e44) INCOMPLETE
  Missing communicator data from 1 rank
  The missing rank: 6
"""

TEXT_BEHIND = """\
Communicators... (0.40s)
=============

Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
    0         1         2         4         8         8   RUNNING  MISMATCH

Warnings
========

#0-0 (77aa01c2d3e4f5a6) MISMATCH
  Communicator ranks have different collective operation counts
  7 ranks have launched up to operation 412
  1 rank has launched up to operation 411
  Rank 5 -- GPU 1 managed by process 40416 on node 10.0.3.12
"""

JSON_MISSING = {
    "nccl_version": "2.28.9",
    "communicators_count": 1,
    "communicators": [
        {
            "hash": "0x1",
            "size": 2,
            "ranks_count": 1,
            "missing_ranks_count": 1,
            "ranks": [{"rank": 0, "host": "10.0.3.11", "pid": 9001, "cuda_dev": 0}],
            "missing_ranks": [
                {"rank": 1, "host": "10.0.3.12", "pid": 9002, "cuda_dev": 0, "status": {"unresponsive": True}}
            ],
        }
    ],
}


def test_text_answers_name_dead_missing_and_behind_ranks() -> None:
    rep = ras.parse_text(TEXT_DEAD)
    assert rep.status == ["RUNNING INCOMPLETE"]
    assert [(n.why, n.rank, n.pid, n.host) for n in rep.named] == [
        ("dead", None, 40417, "10.0.3.12"),
        ("missing", 6, None, None),
    ]
    rep = ras.parse_text(TEXT_BEHIND)
    assert [(n.why, n.rank, n.pid, n.host, n.gpu) for n in rep.named] == [("behind", 5, 40416, "10.0.3.12", 1)]
    assert rep.summary == "RAS names rank 5 behind (pid 40416, node 10.0.3.12, GPU 1)"


def test_json_answer_names_the_missing_rank() -> None:
    rep = ras.parse_json(json.dumps(JSON_MISSING))
    assert rep.version == "2.28.9" and rep.fmt == "json"
    assert [(n.why, n.rank, n.host, n.pid) for n in rep.named] == [("unresponsive", 1, "10.0.3.12", 9002)]
    assert not ras.parse_json("{nope").available


def test_second_trip_records() -> None:
    none = ras.parse("@@fd_stacks_done\n@@fd_ras_start available=no reason=no job process has NCCL loaded\n")
    assert none is not None and not none.available
    assert none.summary == "RAS not available: no job process has NCCL loaded"
    assert ras.parse("@@fd_stacks_done\n") is None  # an older host script: nothing said
    silent = ras.parse("@@fd_ras_start available=yes via=nc format=text addr=localhost:28028\n\n@@fd_ras_end\n")
    assert silent is not None and not silent.available and "no answer on localhost:28028" in silent.reason
    other = ras.parse(
        "@@fd_ras_start available=yes via=nc format=text addr=localhost:28028\nHTTP/1.1 400\n@@fd_ras_end\n"
    )
    assert other is not None and not other.available and "not as RAS" in other.reason
    ok = ras.parse(f"@@fd_ras_start available=yes via=nc format=text addr=localhost:28028\n{TEXT_BEHIND}@@fd_ras_end\n")
    assert ok is not None and ok.available and ok.via == "nc" and ok.named[0].rank == 5
    hostile = ras.parse(
        "@@fd_ras_start available=yes via=nc format=text addr=x:1\n"
        + "Rank 1 -- GPU 0 managed by process 2 on node \x1b[31mevil\n" * 5000
    )
    assert hostile is not None and all("\x1b" not in (n.host or "") for n in hostile.named)


def test_a_hang_straggler_named_by_ras() -> None:
    """Two stalled NCCL nodes, both ranks seen waiting (no stack tells them apart): RAS names rank 5 behind."""
    rep = ras.parse_text(TEXT_BEHIND).to_json()
    hosts = []
    for node, ranks in (("gpu-a", range(0, 4)), ("gpu-b", range(4, 8))):
        procs = [
            {
                "pid": 100 + r,
                "rank": r,
                "wait": "collective",
                "via": "py-spy",
                "env": {"RANK": str(r), "WORLD_SIZE": "8"},
            }
            for r in ranks
        ]
        hosts.append(
            HostResult(host=node, verdict="stalled", summary="silent", facts={"stacks": {"procs": procs, "ras": rep}})
        )
    (rc,) = root_causes(hosts)
    assert (rc.host, rc.rank) == ("gpu-b", 5) and "NCCL RAS" in rc.why
    assert any(e.startswith("NCCL RAS on ") for e in rc.evidence)


H200 = __import__("pathlib").Path(__file__).resolve().parent / "fixtures" / "device" / "h200_1gpu" / "ras"


def _body(name: str) -> str:
    text = (H200 / name).read_text()
    return text.split("----- BEGIN BODY\n", 1)[1].split("----- END BODY", 1)[0] if "BEGIN BODY" in text else text


def test_real_answers_of_an_idle_and_a_pending_nccl_job() -> None:
    """Recorded on the H200 host (NCCL 2.28.9, one rank): RAS answers, names nobody; ncclras 2.28.9 has no -f."""
    for name in ("idle_text.txt", "pending_text.txt", "ncclras_idle.txt"):
        rep = ras.parse_text(_body(name))
        assert rep.available and rep.version == "2.28.9" and rep.status == ["RUNNING OK"] and rep.named == []
        assert rep.summary == "RAS answered (None, text): no rank singled out (RUNNING OK)"
    for name in ("idle_json.txt", "pending_json.txt"):
        rep = ras.parse_json(_body(name))
        assert rep.available and rep.version == "2.28.9" and rep.status == ["OK"] and rep.named == []
    assert "json" not in (H200 / "ncclras_idle_json.txt").read_text().split("Options:", 1)[1]  # the gate: no -f
    wrapped = "@@fd_ras_start available=yes via=ncclras format=text addr=localhost:28028\n"
    rep = ras.parse(wrapped + _body("idle_text.txt") + "@@fd_ras_end\n")
    assert rep is not None and rep.available and rep.via == "ncclras"
    refused = "@@fd_ras_start available=yes via=nc format=text addr=localhost:28028\n\n@@fd_ras_end\n"
    assert (H200 / "no_job_text.txt").read_text().count("Connection refused") == 1  # what nothing listening looks like
    assert "no RAS listening" in ras.parse(refused).reason
