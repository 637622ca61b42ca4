"""A sweep's parent process: its peak memory per host, with no SSH.

    .venv/bin/python bench/parent_memory.py [--hosts 1000,2500] [--workers 4] [--log-mb 1]

Each size runs ``fleetdiag sweep`` (the real CLI, a fresh history, in a fresh process) over N
inventory hosts whose worker processes (``fleetdiag.ssh.spread``'s, started as the sweep starts
them) answer every host with the real analysis of one real answer: the probe's exec run once
through the local ``sh`` on the bench's 1 MB log. So the parent receives, holds, reports, records
and prints N real results, as at N simulated hosts, without N connections. Printed per size: the
parent's RSS at each phase's end and its peak (VmHWM) in it, and the slope between the sizes
(bytes per host); ``--trace`` adds tracemalloc (what Python holds, per host, by phase; slower).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import funnel_lab, table  # noqa: E402

HERE = Path(__file__).resolve().parent


def _status() -> tuple[float, float]:
    s = Path("/proc/self/status").read_text()
    kb = {k: int(s.split(k + ":")[1].split()[0]) for k in ("VmRSS", "VmHWM")}
    return kb["VmRSS"] / 1024, kb["VmHWM"] / 1024


def measured(n: int, workers: int, directory: Path, spec: Path, log: Path, trace: bool) -> dict:
    """One sweep of ``n`` hosts in this process (run as a child of ``main``); its phases."""
    import asyncio

    import fleetdiag.cli.sweep as cli_sweep
    import fleetdiag.store as store
    import fleetdiag.sweep as engine
    from fleetdiag.ssh import spread

    if trace:
        import tracemalloc

        tracemalloc.start()
    rows: list[dict] = []

    def phase(name: str, fn):
        def run(*a, **k):
            if trace:
                tracemalloc.reset_peak()
                before = tracemalloc.get_traced_memory()[0]
            r = fn(*a, **k)
            row = dict(zip(("rss_mb", "hwm_mb"), _status()), phase=name)
            if trace:
                now, peak = tracemalloc.get_traced_memory()
                row.update(held_b=(now - before) / n, peak_b=(peak - before) / n)
            rows.append(row)
            return r

        return run

    original_probe = engine._probe

    async def timed_probe(*a, **k):
        r = await original_probe(*a, **k)
        phase("probe (results all in)", lambda: None)()
        return r

    os.environ["FLEETDIAG_BENCH_REPLAY"] = str(spec)
    spread._BOOT = f"sys.path.insert(0, {str(HERE)!r}); from _replay_worker import main; sys.exit(main())"
    engine._probe = timed_probe
    engine.job_mod.assign_roles = phase("job analysis", engine.job_mod.assign_roles)
    engine.write_atomic = phase("report written", engine.write_atomic)
    store.Store.record_sweep = phase("history recorded", store.Store.record_sweep)
    cli_sweep.print_outcome = phase("news printed", cli_sweep.print_outcome)
    real_run = asyncio.run
    asyncio.run = phase("asyncio.run returned", real_run)
    inv = directory / "inventory.yaml"
    inv.write_text(
        "hosts:\n"
        + "".join(
            f"  h{i:05d}:\n    address: 10.{i // 65536}.{i // 256 % 256}.{i % 256}\n    user: u\n"
            f"    logs:\n      vllm: {json.dumps(str(log))}\n"
            for i in range(n)
        )
    )
    from fleetdiag.cli import main as cli

    rows.append(dict(zip(("rss_mb", "hwm_mb"), _status()), phase="imports"))
    t0 = time.perf_counter()
    db, report = directory / "history.sqlite3", directory / "report.json"
    argv = ["-i", str(inv), "sweep", "all", "--db", str(db), "--report", str(report), "--workers", str(workers)]
    with open(os.devnull, "w") as null:
        sys.stdout = null
        try:
            cli(argv, standalone_mode=False)
        except SystemExit:
            pass
        finally:
            sys.stdout = sys.__stdout__
    wall = time.perf_counter() - t0
    peak = _status()[1]  # before this bench reads the report back
    hosts = json.loads(report.read_text())["hosts"]
    return {
        "hosts": n,
        "answered": sum(1 for h in hosts if h.get("verdict") == "failed"),
        "wall_s": wall,
        "peak_mb": peak,
        "phases": rows,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", default="1000,2500", help="fleet sizes, each in a fresh process")
    ap.add_argument("--workers", type=int, default=4, help="worker processes (as --workers)")
    ap.add_argument("--log-mb", type=float, default=1)
    ap.add_argument("--trace", action="store_true", help="tracemalloc too (bytes Python holds per host, by phase)")
    ap.add_argument("--json-out")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        n, workers, directory, spec = args.child
        spec_doc = json.loads(Path(spec).read_text())
        doc = measured(int(n), int(workers), Path(directory), Path(spec), Path(spec_doc["log"]), args.trace)
        print(json.dumps(doc))
        return doc
    with tempfile.TemporaryDirectory(prefix="fleetdiag-bench-parent-") as tmp:
        d = Path(tmp)
        fun = funnel_lab(d, args.log_mb)
        answer = d / "answer.txt"
        out = subprocess.run(["sh", "-c", fun.command], capture_output=True, timeout=120).stdout
        answer.write_text(out.decode("utf-8", "replace"))
        spec = d / "spec.json"
        spec.write_text(json.dumps({"answer": str(answer), "mark": fun.mark, "log": str(fun.log)}))
        print(f"parent memory: one real answer of {len(out)} bytes for every host, workers {args.workers}", flush=True)
        runs = []
        for n in (int(x) for x in args.hosts.split(",")):
            run_dir = d / f"n{n}"
            run_dir.mkdir()
            child = [sys.executable, __file__, "--child", str(n), str(args.workers), str(run_dir), str(spec)]
            if args.trace:
                child.append("--trace")
            p = subprocess.run(child, capture_output=True, text=True, timeout=1800)
            if p.returncode:
                print(p.stderr[-2000:], file=sys.stderr)
                raise SystemExit(1)
            doc = json.loads(p.stdout.strip().splitlines()[-1])
            runs.append(doc)
            heads = ["phase (its end)", "RSS MB", "peak MB"] + (
                ["held B/host", "peak above B/host"] if args.trace else []
            )
            body = [
                [r["phase"], f"{r['rss_mb']:.1f}", f"{r['hwm_mb']:.1f}"]
                + ([f"{r.get('held_b', 0):.0f}", f"{r.get('peak_b', 0):.0f}"] if args.trace else [])
                for r in doc["phases"]
            ]
            print(
                f"\n{n} hosts: {doc['answered']}/{n} answered, {doc['wall_s']:.1f} s, parent peak {doc['peak_mb']:.1f} MB"
            )
            print(table(heads, body), flush=True)
        summary: dict = {"runs": runs}
        if len(runs) > 1:
            a, b = runs[0], runs[-1]
            slope = (b["peak_mb"] - a["peak_mb"]) * 1024 * 1024 / (b["hosts"] - a["hosts"])
            summary["slope_b_per_host"] = slope
            print(f"\nparent peak slope: {slope / 1024:.1f} KB per host ({a['hosts']} -> {b['hosts']} hosts)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
