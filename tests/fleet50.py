"""A 50-host fleet on the loopback sshd: the inventory the fleet-view tests share.

node01-02 fail with the seeds' DP-rank assertion, node05 stalls-free with a NCCL error, node04/07/08/10/13
are unreachable on five different loopback addresses (a closed port), the rest are healthy.
"""

from __future__ import annotations

import json
from pathlib import Path

DEMO = Path(__file__).resolve().parent.parent / "fleetdiag" / "data" / "demo"
DP_RANK = (DEMO / "dp_rank.log").read_text()
HEALTHY_LOG = (DEMO / "healthy.log").read_text()
BROKEN_PIPE = (DEMO / "broken_pipe.log").read_text()
NAMES = [f"node{i:02d}" for i in range(1, 51)]
FAILED = ["node01", "node02"]
OTHER = ["node05"]
DOWN = ["node04", "node07", "node08", "node10", "node13"]
NOLOG: list[str] = []


def write_fleet(tmp: Path, sshd, closed_port: int) -> Path:
    """The inventory (and logs) of the 50 hosts; returns the inventory's path."""
    lines = ["hosts:"]
    for i, name in enumerate(NAMES):
        log = tmp / f"{name}.log"
        text = DP_RANK if name in FAILED else BROKEN_PIPE if name in OTHER else HEALTHY_LOG
        if name not in NOLOG:
            log.write_text(text)
        down = name in DOWN
        address = f"127.0.0.{2 + DOWN.index(name)}" if down else "127.0.0.1"
        lines += [
            f"  {name}:",
            f"    address: {address}",
            f"    port: {closed_port if down else sshd.port}",
            f"    user: {sshd.user}",
            "    logs:",
            f"      train: {json.dumps(str(log))}",
        ]
    path = tmp / "inventory.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def ssh_args(sshd) -> list[str]:
    return [
        "--known-hosts",
        str(sshd.known_hosts),
        "--identity",
        str(sshd.client_key),
        "--ssh-config",
        str(sshd.ssh_config),
        "--connect-timeout",
        "20",
    ]
