"""Run every benchmark and print one summary of the ratios and targets.

    .venv/bin/python bench/run_all.py            # the full set (~10-15 min on 2 cores)
    .venv/bin/python bench/run_all.py --quick    # a fast sanity pass (smaller, fewer repeats)

Each benchmark runs in its own process (its full tables stream through);
their numbers are kept in bench/out/*.json (git-ignored) and summarised here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"

BENCHES = {
    "single_host": (["single_host.py"], ["--repeat", "1", "--log-mb", "10"]),
    "fleet": (["fleet.py"], ["--sizes", "12,50", "--seq-sample", "1"]),
    "analyze_big": (["analyze_big.py"], ["--repeat", "1", "--sizes-mb", "50,256"]),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, one repeat: checks the benches run")
    ap.add_argument("--only", help="comma-separated subset: " + ",".join(BENCHES))
    ap.add_argument("--no-install", action="store_true", help="fleet: skip missing tools instead of installing")
    args = ap.parse_args()
    OUT.mkdir(exist_ok=True)
    chosen = args.only.split(",") if args.only else list(BENCHES)
    failed = []
    t0 = time.monotonic()
    for name in chosen:
        script, quick = BENCHES[name]
        extra = list(quick) if args.quick else []
        if name == "fleet" and args.no_install:
            extra.append("--no-install")
        out = OUT / f"{name}.json"
        out.unlink(missing_ok=True)
        print(f"\n======== {name} ========", flush=True)
        rc = subprocess.call([sys.executable, str(HERE / script[0]), *extra, "--json-out", str(out)])
        if rc != 0:
            failed.append(name)
    print(f"\n======== summary ({time.monotonic() - t0:.0f} s) ========")
    summarise(chosen)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


def load(name: str) -> dict | None:
    p = OUT / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def mark(ok: bool) -> str:
    return "met   " if ok else "MISSED"


def summarise(chosen: list[str]) -> None:
    s = load("single_host") if "single_host" in chosen else None
    if s:
        rows = {(r["tool"], r["rtt_ms"]): r for r in s["rows"]}
        print("single host (wall s, median; x ssh true / x the seeds' 4 calls):")
        for rtt in s["rtts"]:
            cli = rows.get(("fleetdiag probe (CLI)", rtt))
            lib = rows.get(("probe_host() in-process", rtt))
            t = rows.get(("ssh true", rtt))
            f = rows.get(("4 seed calls", rtt))
            if cli and lib and t and f:
                print(
                    f"  RTT {rtt:>4g} ms: ssh true {t['wall_s']:.2f}, 4 calls {f['wall_s']:.2f}, "
                    f"probe CLI {cli['wall_s']:.2f} ({cli['vs_ssh_true']:.2f}x / {cli['vs_four_calls']:.2f}x), "
                    f"probe_host() {lib['wall_s']:.2f} ({lib['vs_ssh_true']:.2f}x / {lib['vs_four_calls']:.2f}x)"
                )
        tg = s.get("targets") or {}
        if tg:
            print(
                f"  [{mark(tg['cli_vs_ssh_true'] <= 1.0)}] probe CLI <= 1.0x ssh true at 240 ms: {tg['cli_vs_ssh_true']:.2f}x"
            )
            print(
                f"  [{mark(tg['cli_vs_four'] <= 0.25)}] probe CLI <= 0.25x the 4 calls at 240 ms: {tg['cli_vs_four']:.2f}x"
            )
            print(
                f"  [{mark(tg['lib_vs_ssh_true'] <= 1.0)}] probe_host() <= 1.0x ssh true at 240 ms: {tg['lib_vs_ssh_true']:.2f}x"
            )
            print(
                f"  [{mark(tg['lib_vs_four'] <= 0.25)}] probe_host() <= 0.25x the 4 calls at 240 ms: {tg['lib_vs_four']:.2f}x"
            )
    f = load("fleet") if "fleet" in chosen else None
    if f:
        print(f"fleet (slowest host alone {f['slowest_alone_s']:.2f} s; fanout {f['fanout']}):")
        for n, d in f["sizes"].items():
            fd = d["rows"][0] if d["rows"] and d["rows"][0]["tool"].startswith("fleetdiag") else None
            if not fd:
                continue
            tg = d.get("targets") or {}
            vb = tg.get("vs_best_other")
            print(
                f"  {n} hosts: {fd['tool']} {fd['wall_s']:.2f} s, {fd['complete']}/{n} complete; "
                f"best other: {d['best_other']} {d['best_other_s']:.2f} s"
            )
            if vb is not None:
                print(f"  [{mark(vb <= 0.8)}] {n} hosts: <= 0.8x the best other tool: {vb:.2f}x")
            print(
                f"  [{mark(tg['vs_slowest_alone'] <= 1.1)}] {n} hosts: <= 1.1x the slowest host alone: "
                f"{tg['vs_slowest_alone']:.2f}x"
                + (
                    f" ({tg['vs_floor']:.2f}x this machine's floor: slowest host or CPU / cores)"
                    if "vs_floor" in tg
                    else ""
                )
            )
            if int(n) >= 200:
                print(f"  [{mark(tg['maxrss_mb'] <= 200)}] {n} hosts: peak RSS <= 200 MB: {tg['maxrss_mb']:.0f} MB")
        if f.get("skipped"):
            print("  skipped: " + "; ".join(f"{k}: {v}" for k, v in f["skipped"].items()))
    a = load("analyze_big") if "analyze_big" in chosen else None
    if a:
        tg = a["targets"]
        sizes = list(a["sizes"])
        big = a["sizes"][sizes[-1]]
        print(
            f"analyze ({sizes[-1]} MiB log):  grep -c ERROR {big['LC_ALL=C grep -c ERROR']['wall_s']:.2f} s, "
            f"fleetdiag analyze {big['fleetdiag analyze --json']['wall_s']:.2f} s"
        )
        print(f"  [{mark(tg['analyze_vs_grep'] <= 1.5)}] analyze <= 1.5x grep -c: {tg['analyze_vs_grep']:.2f}x")
        print(
            f"  [{mark(tg['rss_big_over_small'] <= 1.1)}] peak memory {sizes[-1]} MiB / {sizes[0]} MiB: "
            f"{tg['rss_big_over_small']:.2f}x"
        )


if __name__ == "__main__":
    sys.exit(main())
