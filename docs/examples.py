"""The program output shown in README.md, produced by fleetdiag's own code.

README.md holds ``cog`` blocks that call these functions (``cog -r README.md``
rewrites them, from the project root; ``tests/test_docs.py`` fails when they drift). Inputs are fixed
(the demo's logs, the recorded H200 nvidia-smi, a fixed timing and clock) so
the text is the same on every machine.
"""

from __future__ import annotations

import io
from importlib import resources
from pathlib import Path

from fleetdiag import job as job_mod
from fleetdiag import render
from fleetdiag.analysis import load_rules
from fleetdiag.probe import finish
from fleetdiag.records import FunnelResult, Line, Timing

WIDTH = 80
NOW = 1_800_000_000.0  # a fixed remote clock


def _demo_log(name: str) -> str:
    return resources.files("fleetdiag").joinpath("data", "demo", name).read_text("utf-8")


def _funnel(text: str, path: str, idle: float) -> FunnelResult:
    lines, pos = [], 0
    for n, raw in enumerate(text.splitlines(keepends=True), 1):
        lines.append(Line(pos=pos, text=raw.rstrip("\n"), lineno=n))
        pos += len(raw.encode())
    return FunnelResult(path=path, size=pos, mtime=NOW - idle, now=NOW, tail=lines)


def _print(*renderables: object) -> str:
    buf = io.StringIO()
    out = render.Output(stdout=buf, color=False, width=WIDTH)
    for r in renderables:
        out.print(r)
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())


def host_card() -> str:
    """The seeds' failure: uk-node's vLLM launch, TP 2 × DP 2 with two GPUs visible."""
    fr = _funnel(_demo_log("dp_rank.log"), "/workspace/logs/vllm.log", idle=40)
    timing = Timing(connect_ms=2400.0, rtt_ms=240.0, exec_ms=310.0, total_ms=2950.0, round_trips=1, bytes=14100)
    res = finish("uk-node", fr, load_rules(), timing=timing)
    res.address = "uk-node"
    res.evidence = []
    return _print(render.host_card(res, traceback_lines=12))


def job_view() -> str:
    """The real two-node torchrun failure of the multinode corpus (the demo's fr-node-a/b)."""
    rules = load_rules()
    results = []
    for host, name in (("node0", "job_node_a.log"), ("node1", "job_node_b.log")):
        fr = _funnel(_demo_log(name), f"/workspace/{host}/train.log", idle=60)
        res = finish(host, fr, rules, timing=Timing(rtt_ms=2.0, round_trips=1))
        kept = job_mod.job_facts(res, [ln.text for ln in fr.lines()])
        if kept is not None:
            res.facts["job"] = kept
        res.facts["log_mtime"] = fr.mtime
        results.append(res)
    roots = job_mod.root_causes(results)
    return _print(render.fleet_view(results, root_causes=roots))


def preflight() -> str:
    """The seeds' launch checked before it runs: the recorded 2× H200 nvidia-smi, one GPU busy."""
    from fleetdiag import preflight as pf

    smi = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "nvidia-smi"
    launch = pf.plan(["vllm", "serve", "Qwen/Qwen3.6-27B", "-tp", "2", "-dp", "2"], {"CUDA_VISIBLE_DEVICES": "0,1"})
    raw = {
        "nvidia_smi": ["/usr/bin/nvidia-smi"],
        "gpu": (smi / "nvidia-smi-query-busy.csv").read_text().splitlines(),
        "app": (smi / "nvidia-smi-apps.csv").read_text().splitlines(),
    }
    checks, facts = pf.evaluate(launch, raw)
    status = pf.FAIL if any(c.status == pf.FAIL for c in checks) else pf.PASS
    res = pf.PreflightResult(host="uk-node", status=status, checks=checks, facts=facts)
    return _print(*render.preflight_view(launch, [res], launch.to_dict()))


if __name__ == "__main__":  # a quick look: python docs/examples.py
    print(host_card())
    print(job_view())
    print(preflight())


def kernel_alone() -> str:
    """``fleetdiag analyze --kernel dmesg.txt``: the real gpu-burn report's dmesg (a fatal AER, then Xid 79)."""
    from fleetdiag.evidence.host import apply_collection
    from fleetdiag.evidence.offline import read_kernel_file
    from fleetdiag.records import HEALTHY, HostResult

    path = Path(__file__).resolve().parents[1] / "tests" / "corpus_kernel" / "gpuburn1-aer-fatal-surprise-down.kern.log"
    kc = read_kernel_file(path)
    res = HostResult(host="-", verdict=HEALTHY, summary="no application log given")
    res = apply_collection(res, FunnelResult(status="ok"), kc, live=False)
    return _print(render.host_card(res))
