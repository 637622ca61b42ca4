"""A sweep worker for bench/parent_memory.py: every host of its share answered with the real
analysis of one real funnel answer (``$FLEETDIAG_BENCH_REPLAY``: a JSON file naming it), in the
worker protocol of ``fleetdiag.ssh.spread`` (a "start" and a "done" frame a host), no SSH."""

from __future__ import annotations

import json
import os
import pickle
import sys


def main() -> int:
    from fleetdiag.probe import host_facts, host_result
    from fleetdiag.remote.funnel import parse_output
    from fleetdiag.ssh import spread

    with open(os.environ["FLEETDIAG_BENCH_REPLAY"]) as fh:
        spec = json.load(fh)
    with open(spec["answer"]) as fh:
        answer = fh.read()
    job = pickle.loads(sys.stdin.buffer.read())
    rules = job["settings"].rules
    for h in job["hosts"]:
        spread._write("start", h.name)
        fr = parse_output(answer, spec["mark"])
        res = host_result(h.name, fr, rules, 120.0, None, host_facts(fr), None)
        res.address = h.target
        spread._write("done", res)
    return 0
