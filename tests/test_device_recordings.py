"""The recordings from the GPU host are consistent with their labels (tests/corpus_multinode,
tests/corpus_kernel_extra, tests/fixtures/device/h200_1gpu).

These are data checks: every label's texts are in the files they name, every evidence path
exists, and the Flight Recorder pickles hold only plain containers, so the parsers built on
them can be tested on exactly what a host would hand over.
"""

from __future__ import annotations

import json
import pickletools
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
MULTI = TESTS / "corpus_multinode"
KERNEL = TESTS / "corpus_kernel_extra"
H200 = TESTS / "fixtures" / "device" / "h200_1gpu"
KINDS = {"exception", "signal", "native", "hang", "oom", "dataloader", "errorfile", "two_jobs"}
LABELS = sorted(MULTI.glob("*.json"))
# opcodes that would make unpickling run or build anything but dicts, lists, strings and numbers
UNSAFE = {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "EXT1", "EXT2", "EXT4"}


def _paths(value: object) -> list[str]:
    """Every file path in an evidence value (a path, or a mapping of names to paths)."""
    if isinstance(value, str):
        return [value] if "/" in value else []
    if isinstance(value, dict):
        return [p for v in value.values() for p in _paths(v)]
    return []


def test_the_multinode_corpus_is_present() -> None:
    assert len(LABELS) >= 15
    held = [p.stem for p in LABELS if json.loads(p.read_text()).get("held_back")]
    assert 2 <= len(held) <= 4, held
    kinds = {json.loads(p.read_text())["kind"] for p in LABELS}
    assert kinds == KINDS, kinds


@pytest.mark.parametrize("path", LABELS, ids=lambda p: p.stem)
def test_multinode_label_matches_its_logs(path: Path) -> None:
    lab = json.loads(path.read_text())
    assert lab["id"] == path.stem and lab["kind"] in KINDS
    assert lab["root_host"] in lab["logs"] and 3 <= lab["nodes"] == len(lab["logs"]) <= 8
    assert lab["world_size"] == lab["nodes"] * lab["nproc_per_node"]
    text = {h: (MULTI / f).read_text(encoding="utf-8") for h, f in lab["logs"].items()}
    assert any(s in text[lab["root_host"]] for s in lab["root_line_any"]), lab["root_line_any"]
    assert f"[rank{lab['root_rank']}]" in text[lab["root_host"]]
    others = set(lab["logs"]) - {lab["root_host"]}
    assert set(lab["victims"]) | set(lab.get("cancelled", {})) == others
    for host, line in {**lab["victims"], **lab.get("cancelled", {})}.items():
        assert line in text[host], (host, line)
        assert not any(s in text[host] for s in lab["root_line_any"]), host
    for p in _paths(lab.get("evidence", {})):
        assert (MULTI / p).is_file(), p
    if lab.get("evidence", {}).get("kernel_line"):
        kern = MULTI / lab["evidence"]["kernel"][lab["root_host"]]
        assert lab["evidence"]["kernel_line"] in kern.read_text()


def test_two_jobs_are_two_labels_on_disjoint_hosts() -> None:
    a, b = (json.loads((MULTI / f"two_jobs_{x}.json").read_text()) for x in "ab")
    assert a["concurrent_with"] == "two_jobs_b" and b["concurrent_with"] == "two_jobs_a"
    assert not set(a["logs"]) & set(b["logs"]) and a["rendezvous"] != b["rendezvous"]


@pytest.mark.parametrize(
    "dump",
    sorted(
        [*H200.glob("fr_nccl/*.pkl"), *MULTI.glob("fr_gloo/fr/*.pkl"), H200 / "fr_nccl_timeout" / "fr_trace_rank_0"]
    ),
    ids=lambda p: p.name,
)
def test_flight_recorder_pickles_hold_only_plain_containers(dump: Path) -> None:
    data = dump.read_bytes()
    ops = {op.name for op, _, _ in pickletools.genops(data)}
    assert not ops & UNSAFE, ops & UNSAFE
    assert b"version" in data and b"2.10" in data


def test_flight_recorder_json_names_the_pending_collective() -> None:
    pending = json.loads((H200 / "fr_nccl" / "dump_nccl_trace_json_pending.json").read_text())
    last = pending["entries"][-1]
    assert (last["profiling_name"], last["state"], last["retired"]) == ("nccl:all_reduce", "scheduled", False)
    assert pending["pg_status"]["0"]["last_enqueued_collective"] == str(last["collective_seq_id"])
    gloo = {
        r: json.loads((MULTI / "fr_gloo" / "fr" / f"dump_fr_trace_json_{tag}_rank{r}.json").read_text())
        for r, tag in ((0, "error"), (1, "error"), (2, "sigterm"))
    }
    last_seq = {r: d["entries"][-1]["collective_seq_id"] for r, d in gloo.items()}
    assert last_seq[2] < last_seq[0] == last_seq[1]  # the straggler (rank 2) is one collective behind


def test_ras_answers() -> None:
    status = json.loads((H200 / "ras" / "status_idle.json").read_text())
    assert status["nccl_version"] == "2.28.9" and status["communicators"][0]["missing_ranks_count"] == 0
    assert "Job summary" in (H200 / "ras" / "status_idle.txt").read_text()
    for name in ("no_job_text", "after_exit_text", "disabled_text"):
        assert "Connection refused" in (H200 / "ras" / f"{name}.txt").read_text(), name


KERNEL_LABELS = sorted(KERNEL.glob("h200rec-*.json"))  # the recorded ones; the others are checked by test_corpus_labels


@pytest.mark.parametrize("path", KERNEL_LABELS, ids=lambda p: p.stem)
def test_kernel_label_matches_its_files(path: Path) -> None:
    lab = json.loads(path.read_text())
    assert lab["id"] == path.stem and lab["kind"] in {"xid-sw-app", "oom-killer"}
    kern = (KERNEL / lab["files"]["kern"]).read_text()
    app = (KERNEL / lab["files"]["app"]).read_text()
    assert lab["decisive_kernel_line"] in kern
    if lab["decisive_app_line"]:
        assert lab["decisive_app_line"] in app
    for line in [*lab["secondary_kernel_lines"], *lab["decoys"]]:
        assert line in kern or line in app, line
    on_decisive = [ln for ln in kern.split("\n") if lab["decisive_kernel_line"] in ln]
    assert not any(d in ln for d in lab["decoys"] for ln in on_decisive)
    if lab["xid"] is not None:
        assert f": {lab['xid']}, " in lab["decisive_kernel_line"]
