"""The warm probe's remote work taken apart on this machine (no SSH): each part alone, then the exec.

    .venv/bin/python bench/remote_split.py [--repeat 7] [--log-mb 5] [--json-out F]

Run it on a GPU host: the rows are the parts of the probe's one exec (``probe_command``, the very
script a probe sends, through ``sh -c``): each ``nvidia-smi`` call it makes, alone; the kernel part
alone (journalctl and its two GPU calls); the GPU facts alone; the exec without the kernel part,
without the GPU facts, with neither (the log funnel, the serving facts and the node part); and the
exec as sent. Medians of ``--repeat`` after one warm-up run each, wall ms.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import MB, host_path, warm, write_log  # noqa: E402


def _exec(log: str, *, facts_gpu: bool = True, serve: bool = True, node: bool = True, kernel: bool = True) -> str:
    """The probe's exec with parts left out (all True: exactly ``probe_command``'s). Works on trees whose
    probe sends the facts after the funnel (``SNIPPET``) and on those that send the GPU part beside it."""
    import fleetdiag.probe as probe_mod
    from fleetdiag.analysis import load_rules
    from fleetdiag.inventory import Host
    from fleetdiag.inventory.model import LogSource
    from fleetdiag.probe import ProbeSettings, probe_command

    fm, nm = probe_mod.facts_mod, probe_mod.node_mod
    names = [n for n in ("SNIPPET", "GPU_SNIPPET", "SERVE_SNIPPET") if hasattr(fm, n)]
    saved = {n: getattr(fm, n) for n in names}
    saved_node = nm.SCRIPT
    gpu, serve_part = saved["GPU_SNIPPET"], saved["SERVE_SNIPPET"]
    header = gpu[: gpu.index("fd_smi()")]  # fd_f, the timeout prefix, the PATH
    settings = ProbeSettings(facts=True, kernel=kernel, path_prepend=host_path())
    try:
        fm.GPU_SNIPPET = gpu if facts_gpu else ""
        fm.SERVE_SNIPPET = serve_part if serve else ""
        fm.SNIPPET = (gpu if facts_gpu else header) + (serve_part if serve else "")
        nm.SCRIPT = saved_node if node else ""
        return probe_command(Host(name="bench"), LogSource("file", log), log, settings, load_rules())[0]
    finally:
        for n, v in saved.items():
            setattr(fm, n, v)
        nm.SCRIPT = saved_node


def _alone(snippet: str, env: dict[str, str]) -> str:
    from fleetdiag import remote

    return remote.script(env, remote.load("prelude.sh"), snippet)


def commands(log: str) -> dict[str, list[str]]:
    from fleetdiag.facts import collect
    from fleetdiag.probe import kernel_command

    fv = collect.snippet_vars(host_path())
    kq = (
        "index,pci.bus_id,uuid,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending,"
        "remapped_rows.failure,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,"
        "clocks_event_reasons.hw_slowdown,clocks_event_reasons.hw_thermal_slowdown,"
        "clocks_event_reasons.hw_power_brake_slowdown,clocks_event_reasons.sw_thermal_slowdown"
    )
    smi = ["nvidia-smi"]
    rows: dict[str, list[str]] = {}
    if shutil.which("nvidia-smi"):
        rows["nvidia-smi (plain table)"] = smi
        rows["nvidia-smi -q"] = smi + ["-q"]
        rows["nvidia-smi --help-query-gpu (kernel part, 1 of 2)"] = smi + ["--help-query-gpu"]
        rows["nvidia-smi --query-gpu (kernel part's fields)"] = smi + [f"--query-gpu={kq}", "--format=csv"]
        rows["nvidia-smi --query-gpu (facts' fields)"] = smi + [
            f"--query-gpu={fv['FD_GPUQ']}",
            "--format=csv,noheader,nounits",
        ]
        rows["nvidia-smi --query-compute-apps (facts)"] = smi + [
            f"--query-compute-apps={fv['FD_APPQ']}",
            "--format=csv,noheader,nounits",
        ]
        both = f"--query-gpu={kq},{fv['FD_GPUQ']}"
        rows["nvidia-smi --query-gpu (both field lists in one call)"] = smi + [both, "--format=csv"]
    rows["journalctl -k -b (kernel part's read)"] = [
        "sh",
        "-c",
        "journalctl -k -b -q --no-pager -o short-iso-precise -n 200000 2>/dev/null | wc -l",
    ]
    rows["kernel part alone (kernel_command)"] = ["sh", "-c", kernel_command(host_path())[0]]
    rows["GPU facts alone (facts_gpu.sh)"] = ["sh", "-c", _alone(collect.GPU_SNIPPET, fv)]
    rows["log funnel alone (no facts, node or kernel part)"] = [
        "sh",
        "-c",
        _exec(log, facts_gpu=False, serve=False, node=False, kernel=False),
    ]
    rows["log funnel + serving facts"] = ["sh", "-c", _exec(log, facts_gpu=False, node=False, kernel=False)]
    rows["log funnel + node part"] = ["sh", "-c", _exec(log, facts_gpu=False, serve=False, kernel=False)]
    rows["exec without kernel part and GPU facts (log funnel, serve, node, clock)"] = [
        "sh",
        "-c",
        _exec(log, facts_gpu=False, kernel=False),
    ]
    rows["exec without the GPU facts"] = ["sh", "-c", _exec(log, facts_gpu=False)]
    rows["exec without the kernel part"] = ["sh", "-c", _exec(log, kernel=False)]
    rows["exec as a probe sends it"] = ["sh", "-c", _exec(log)]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--log-mb", type=float, default=5)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleetdiag-split-"))
    out: dict[str, dict[str, float]] = {}
    try:
        log = write_log(tmp / "vllm.log", int(args.log_mb * MB))
        warm(log)
        print(f"log {args.log_mb:g} MB; nvidia-smi: {shutil.which('nvidia-smi') or 'none'}", flush=True)
        for name, argv in commands(str(log)).items():
            first = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL)
            walls = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL)
                walls.append(time.perf_counter() - t0)
            med = statistics.median(walls) * 1000
            out[name] = {
                "median_ms": med,
                "min_ms": min(walls) * 1000,
                "bytes": len(first.stdout),
                "rc": first.returncode,
            }
            print(
                f"  {med:7.1f} ms (min {min(walls) * 1000:6.1f}; {len(first.stdout):6d} B, rc {first.returncode})  {name}",
                flush=True,
            )
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(out, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
