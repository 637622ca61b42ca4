"""The part that runs beside the funnel (``FunnelSpec.side``: the kernel part) runs at the same
time as the funnel and the facts, and its output arrives after theirs, before the clock and the
end marker, with every part at the lowest priority."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from fleetdiag.analysis import load_rules
from fleetdiag.probe import spec_for
from fleetdiag.remote import funnel

DEMO = Path(__file__).resolve().parent.parent / "fleetdiag" / "data" / "demo" / "dp_rank.log"


def _spec(tmp_path: Path):
    one, two = tmp_path / "one", tmp_path / "two"
    os.mkfifo(one)
    os.mkfifo(two)
    spec = spec_for(str(DEMO), load_rules(user_default=False))
    # each half waits for the other: run one after the other, they would never finish
    spec.side = f"echo side-start > {one}; read _ < {two}; echo SIDE nice=$(nice)\n"
    spec.extra = f"read _ < {one}; echo EXTRA nice=$(nice); echo go > {two}\n"
    spec.last = "echo LAST\n"
    return spec


def test_side_part_runs_beside_the_funnel_and_prints_after_it(tmp_path):
    mark = funnel.new_mark()
    script = funnel.build_script(_spec(tmp_path), mark)
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30).stdout
    lines = out.splitlines()
    order = [ln.split()[0] for ln in lines if ln.split() and ln.split()[0] in ("EXTRA", "SIDE", "LAST")]
    assert order == ["EXTRA", "SIDE", "LAST"], out[-2000:]
    assert lines[0] == f"{mark} begin {funnel.VERSION}" and lines[-1] == f"{mark} end"
    fr = funnel.parse_output(out, mark)
    assert fr.status == "ok" and any("DP adjusted local rank 3" in ln.text for ln in fr.lines())
    # the renice happened before anything forked: both halves run at the lowest priority
    assert "SIDE nice=19" in out and "EXTRA nice=19" in out
