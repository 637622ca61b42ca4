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
    for host, verdict in (
        ("uk-node", "FAILED"),
        ("cn-node", "FAILED"),
        ("us-node", "HEALTHY"),
        ("de-node", "STALLED"),
        ("jp-node", "FAILED"),
        ("fr-node-a", "FAILED"),
        ("fr-node-b", "FAILED"),
        ("se-node-0", "FAILED"),
        ("se-node-1", "FAILED"),
        ("se-node-2", "FAILED"),
    ):
        assert f"{host}  {verdict}" in out, host
    # jp-node: the kernel's Xid 79 is the cause, the worker's CUDA error its consequence
    card = out[out.index("jp-node  FAILED") :]
    card = card[: card.index("╰")]
    assert "GPU has fallen off the bus" in card and "Xid 79 · hardware" in card and "kernel log (dmesg)" in card
    assert "consequence" in card and "RuntimeError: CUDA error: unspecified launch failure" in card
    assert "GPU lost: nvidia-smi cannot reach it" in card
    for healthy in ("us-node  HEALTHY", "uk-node  FAILED"):  # the benign H200 boot lines never take over
        other = out[out.index(healthy) :]
        assert "kernel line" not in other[: other.index("╰")]
    # the two-node job: node B's rank broke it, node A shows only the NCCL consequence
    flat = " ".join(out.split())  # the fleet view's title wraps
    assert "job root cause: fr-node-b · rank 1 · RuntimeError: mat1 and mat2 shapes" in flat
    assert "1 other host failed as a consequence: fr-node-a (peer closed the connection" in flat
    assert "consequence of fr-node-b (job root cause)" in out
    # the three-node gloo job: the victims' own line is gloo's closed connection, never their launcher's report
    assert "job root cause: se-node-1 · rank 1 · RuntimeError: mat1 and mat2 shapes" in flat
    assert "2 other hosts failed as a consequence: se-node-0 (peer closed the connection" in flat
    assert "se-node-2 (peer closed the connection" in flat and "job: ranks 0–2 of 3" in flat
