"""`fleetdiag demo`: the embedded default works end to end over real SSH."""

from __future__ import annotations

from click.testing import CliRunner

from fleetdiag.cli import main


def test_demo_probes_the_simulated_fleet():
    result = CliRunner().invoke(main, ["--no-color", "demo"], env={"COLUMNS": "160"})
    out = result.output
    assert result.exit_code == 0, out  # every simulated node got the verdict its story calls for
    assert "AssertionError: DP adjusted local rank 3 is out of bounds" in out
    assert "TP 2 × DP 2 = 4 workers, but the host has 2 GPUs" in out
    assert "CUDA error: invalid device ordinal" in out
    for host, verdict in (("uk-node", "FAILED"), ("cn-node", "FAILED"), ("us-node", "HEALTHY"), ("de-node", "STALLED"),
                          ("fr-node-a", "FAILED"), ("fr-node-b", "FAILED")):
        assert f"{host}  {verdict}" in out, host
    # the two-node job: node B's rank broke it, node A shows only the NCCL consequence
    flat = " ".join(out.split())  # the fleet view's title wraps
    assert "job root cause: fr-node-b · rank 1 · RuntimeError: mat1 and mat2 shapes" in flat
    assert "1 other host failed as a consequence: fr-node-a (NCCL remote error" in flat
    assert "consequence of fr-node-b (job root cause)" in out
