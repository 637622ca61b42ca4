"""The job analysis (``job.root_causes``) over synthetic fleets of failed hosts: its time against the fleet's size.

    .venv/bin/python bench/job_scale.py                 # 500, 1,000, 2,000 and 4,000 hosts
    .venv/bin/python bench/job_scale.py --hosts 250 1000

Three fleets, all failing within one window of two minutes, each host's record as a probe makes it:

- ``named``: jobs of 8 nodes, each with its own rendezvous endpoint; rank 0 fails on its own, the other 7 fail
  with gloo's "Connection closed by peer" naming rank 0's address (which the inventory knows);
- ``anonymous``: the same, but the peer's address is none a host has (naming nobody in the selection);
- ``one-job``: one job of every host, one endpoint, one world;
- ``no-endpoint``: one job whose ranks print no endpoint and name nobody, so only the failure window links them.

The target: 4 times the hosts costs less than 5 times the time (the analysis is linear in the fleet).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetdiag.job import HostEvidence, RootCause, root_causes  # noqa: E402

SHAPES = ("named", "anonymous", "one-job", "no-endpoint")
JOB = 8


def fleet(n: int, shape: str) -> list[HostEvidence]:
    """``n`` failed hosts' evidence in one of the SHAPES; rank 0 of each job is its root."""
    out = []
    for i in range(n):
        job, r = (0, i) if shape in ("one-job", "no-endpoint") else divmod(i, JOB)
        world = n if shape in ("one-job", "no-endpoint") else JOB
        net = f"{job // 250}.{job % 250}"
        stamp = f"2026-11-30 17:00:{i % 50:02d}"
        rank = job * JOB + r if world == JOB else r
        if r == 0:
            line = f"[rank{rank}]: RuntimeError: CUDA error: an illegal memory access was encountered"
        else:
            peer = f"10.{net}.2" if shape == "named" else f"172.{net}.2"
            line = (
                f"[rank{rank}]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
                f"Connection closed by peer [{peer}]:{20000 + r}"
            )
        head = [] if shape == "no-endpoint" else [f"{stamp} MASTER_ADDR=10.{net}.1:29500 world_size={world} rank={r}"]
        out.append(
            HostEvidence(
                host=f"node{i:05d}",
                line=line,
                message=line,
                time=stamp,
                rank=rank,
                lines=[*head, f"{stamp} {line}"],
                fingerprint="root" if r == 0 else "peer",
                address=f"10.{net}.{r + 2}" if shape == "named" else None,
            )
        )
    return out


def timed(n: int, shape: str, clock: Callable[[], float] = time.process_time) -> tuple[float, list[RootCause]]:
    """CPU seconds ``root_causes`` takes on a fresh fleet of ``n`` (the records are made outside the clock). CPU
    time, not wall time: on a shared machine the wall clock also counts the other processes' turns."""
    hosts = fleet(n, shape)
    t = clock()
    rcs = root_causes(hosts)
    return clock() - t, rcs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, nargs="+", default=[500, 1000, 2000, 4000])
    args = ap.parse_args()
    print(f"{'fleet':<12} " + " ".join(f"{n:>8}" for n in args.hosts) + "   4x hosts / time")
    missed = False
    for shape in SHAPES:
        secs = [min(timed(n, shape)[0] for _ in range(2)) for n in args.hosts]  # the best of two
        ratios = [
            secs[k2] / secs[k1]
            for k1, n1 in enumerate(args.hosts)
            for k2, n2 in enumerate(args.hosts)
            if n2 == 4 * n1 and secs[k1] > 0
        ]
        worst = max(ratios, default=0.0)
        missed |= worst >= 5
        verdict = f"{worst:.1f}x {'met' if worst < 5 else 'MISSED'}" if ratios else "-"
        print(f"{shape:<12} " + " ".join(f"{s:>7.3f}s" for s in secs) + f"   {verdict}")
    print("target: 4x the hosts < 5x the time (CPU seconds of the analysis alone)")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
