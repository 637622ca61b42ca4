"""Narrow terminals: cards and the fleet view drop or fold, and never cut a path or a host name."""

from __future__ import annotations

import io
import json
import re
from importlib import resources

import pytest

from fleetdiag.analysis import load_rules
from fleetdiag.probe import finish
from fleetdiag.records import Decisive, FunnelResult, HostResult, Line, Timing
from fleetdiag.render import Output, fit_paths, fleet_view, host_card, shorten_path
from fleetdiag.store import group_by_cause

WIDTHS = (60, 80, 120)
LONG_LOG = "/workspace/serving/instances/qwen3-27b-tp2-dp2/replica-0042/logs/vllm-engine-core.log"
# A printed path fragment: an optional "…", then /segments (box-drawing characters and quotes end it).
FRAGMENT = re.compile(r"…?(?:/[\w.+-]+)+")
REAL = re.compile(r"(?:/[\w.+-]+)+")


def _card_result(log: str = LONG_LOG) -> HostResult:
    text = resources.files("fleetdiag").joinpath("data", "demo", "dp_rank.log").read_text("utf-8")
    lines, pos = [], 0
    for n, raw in enumerate(text.splitlines(keepends=True), 1):
        lines.append(Line(pos=pos, text=raw.rstrip("\n"), lineno=n))
        pos += len(raw.encode())
    fr = FunnelResult(path=log, size=pos, mtime=1_800_000_000.0 - 40, now=1_800_000_000.0, tail=lines)
    res = finish("uk-node", fr, load_rules(), timing=Timing(connect_ms=2400.0, rtt_ms=240.0, round_trips=1))
    res.evidence = []
    return res


def _render(renderable: object, width: int) -> str:
    buf = io.StringIO()
    Output(stdout=buf, color=False, width=width).print(renderable)
    return buf.getvalue()


def _real_paths(res: HostResult) -> set[str]:
    return set(REAL.findall(json.dumps(res.to_json())))


def _assert_paths_whole(text: str, real: set[str]) -> None:
    for line in text.splitlines():
        for frag in FRAGMENT.findall(line):
            tail = frag.removeprefix("…")
            assert any(p.endswith(tail) for p in real), f"path cut mid-segment: {frag!r} in\n{line}"


@pytest.mark.parametrize("width", WIDTHS)
def test_card_never_cuts_a_traceback_or_log_path(width):
    res = _card_result()
    real = _real_paths(res)
    assert any(p.endswith("/multiproc_executor.py") for p in real)
    text = _render(host_card(res, traceback_lines=12), width)
    assert max(len(ln) for ln in text.splitlines()) <= width
    _assert_paths_whole(text, real)
    assert "multiproc_executor.py" in text and "gpu_worker.py" in text  # shortened, never dropped
    assert "vllm-engine-core.log" in text
    if width >= 120:
        assert LONG_LOG in text  # room for it: the where row has it whole, on a line of its own if need be


def test_card_shortens_from_the_left_and_json_keeps_the_full_path():
    res = _card_result()
    text = _render(host_card(res, traceback_lines=12), 80)
    assert '"…/v1/executor/multiproc_executor.py", line 837, in worker_main' in text
    full = "/workspace/dflash/venv/lib/python3.12/site-packages/vllm/v1/executor/multiproc_executor.py"
    assert any(full in ln for ln in res.decisive.traceback)
    assert full in json.dumps(res.to_json())


def test_shorten_path_cuts_only_at_a_separator():
    p = "/workspace/dflash/venv/lib/python3.12/site-packages/vllm/v1/executor/multiproc_executor.py"
    assert shorten_path(p, 200) == p
    assert shorten_path(p, 40) == "…/vllm/v1/executor/multiproc_executor.py"
    assert shorten_path(p, 5) == "…/multiproc_executor.py"  # the file name stays whole even when wider
    line = f'  File "{p}", line 837, in worker_main'
    assert (
        fit_paths(line, 70, whole_line=True) == '  File "…/v1/executor/multiproc_executor.py", line 837, in worker_main'
    )
    assert len(fit_paths(line, 70, whole_line=True)) <= 70


def _fleet() -> list[HostResult]:
    names = ["cn-a100-rack07-node12", "cn-a100-rack07-node13", "cn-h200-rack01-node03"]
    out = []
    for i, name in enumerate(names):
        kind = ("torch.OutOfMemoryError: CUDA out of memory", "RuntimeError: NCCL error: unhandled system error")
        msg = f"{kind[i]} at {LONG_LOG}" if i < 2 else None
        d = Decisive(line=msg, message=msg, category="oom") if msg else None
        out.append(
            HostResult(host=name, verdict="failed" if d else "healthy", decisive=d, timing=Timing(rtt_ms=12.0 + i))
        )
    return out


@pytest.mark.parametrize("width", WIDTHS)
def test_fleet_view_keeps_host_names_whole(width):
    results = _fleet()
    text = _render(fleet_view(results), width)
    assert max(len(ln) for ln in text.splitlines()) <= width
    names = [g.folded for g in group_by_cause(results)]
    assert names == ["cn-a100-rack07-node[12-13]", "cn-h200-rack01-node03"]
    for name in names:
        assert name in text, f"{name} cut at width {width}:\n{text}"
    assert "cn…" not in text
    _assert_paths_whole(text, {LONG_LOG})
    if width >= 120:
        assert "rtt" in text and " n " in text  # room for every column
    if width == 60:
        assert "rtt" not in text  # dropped before a host name is cut
