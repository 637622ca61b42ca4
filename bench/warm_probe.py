"""One host at a simulated RTT: a warm probe (kept connection) vs a fresh `ssh host true`.

    .venv/bin/python bench/warm_probe.py [--repeat 5] [--rtt 240] [--log-mb 5]

One real OpenSSH sshd on 127.0.0.1 behind a DelayProxy (bench/_proxyd.py);
every tool goes through the same proxy. The proxy counts *exchanges* (round
trips actually spent).

Rows:
  ssh true                 OpenSSH client, fresh connection (no ControlMaster), runs `true`
  fleetdiag probe, cold    the CLI with --persist 10m and no keeper yet: it starts one, which dials
  fleetdiag probe, warm    the CLI again: a channel on the keeper's kept connection
  fleetdiag probe, fresh   the CLI with --persist 0 (a direct connection, closed at exit)
  python start-up          `fleetdiag --version`: interpreter and CLI imports, no network

The floor of a warm probe, measured in the same runs: the interpreter (`python -c pass`), the
CLI's work before the command leaves for the keeper (bench/_first_send.py: a warm probe run
in-process, noting when it connects to the keeper's socket), one RTT, and the remote work
alone (the probe's exact exec through the local sh, no SSH).

Not a timed test: the ratio is printed beside its target (warm ≤ 0.3× ssh true).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    DECISIVE,
    MB,
    Lab,
    child_env,
    fleetdiag_bin,
    fleetdiag_transport_args,
    funnel_command,
    load_average,
    median,
    ratio,
    run_measured,
    table,
    verdict,
    warm,
    write_inventory,
    write_log,
)

from tests.procs import pids_with  # noqa: E402  (importable once _common put the repo on the path)


def keeper_pids(directory: Path) -> list[int]:
    return pids_with("fleetdiag.ssh.keeper", str(directory))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs per row; the median is shown")
    ap.add_argument("--rtt", type=float, default=240.0, help="round-trip time in ms")
    ap.add_argument("--log-mb", type=float, default=5, help="size of the log (MB)")
    ap.add_argument(
        "--gap",
        type=float,
        default=2.0,
        help="seconds between the previous command's end and the warm rows' 'after a gap' probes (0: none)",
    )
    args = ap.parse_args(argv)
    fd = fleetdiag_bin()
    lab = Lab.start([args.rtt])
    rt = Path(tempfile.mkdtemp(prefix="fleetdiag-bench-rt-")) / "rt"
    try:
        return run(lab, fd, rt, args)
    finally:
        for pid in keeper_pids(rt):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        lab.stop()


def run(lab: Lab, fd: str, rt: Path, args) -> dict:
    log = write_log(lab.dir / "vllm.log", int(args.log_mb * MB))
    warm(log)
    inv = write_inventory(lab.dir / "inventory.yaml", lab, [("far", lab.proxy_ports[0])], log)
    env = child_env(FLEETDIAG_RUNTIME_DIR=str(rt), FLEETDIAG_DB=str(lab.dir / "history.db"))
    print(
        f"log: {log.stat().st_size / MB:.1f} MiB; RTT {args.rtt:g} ms; median of {args.repeat}; load {load_average()}",
        flush=True,
    )

    timings: dict[str, list[dict]] = {}

    def probe(persist: str, label: str = "", ahead: bool = True) -> tuple[float, int]:
        lab.reset_counts()
        m = run_measured(
            [fd, "-i", str(inv), "probe", "far", "--json", "--persist", persist, *fleetdiag_transport_args(lab)],
            env=env if ahead else {**env, "FLEETDIAG_AHEAD": "0"},
            timeout=300,
        )
        host = json.loads(m.out.decode() or "{}").get("hosts", [{}])[0]
        if DECISIVE not in ((host.get("decisive") or {}).get("line") or ""):
            raise SystemExit(f"the probe did not find the decisive error (rc {m.rc}): {m.err.decode()[-1500:]}")
        timings.setdefault(label, []).append({**(host.get("timing") or {}), "cpu_s": m.cpu})
        return m.wall, lab.exchanges()[0]

    def ssh_true() -> tuple[float, int]:
        lab.reset_counts()
        m = run_measured(lab.ssh_base(lab.proxy_ports[0]) + ["true"], timeout=120)
        if m.rc != 0:
            raise SystemExit(f"ssh true failed: {m.err.decode()[-1000:]}")
        return m.wall, lab.exchanges()[0]

    run_measured([fd, "--version"], env=env)  # warm-up: pyc, page cache
    probe("0")
    command, _mark = funnel_command(str(log))
    floor: dict[str, list[float]] = {"python": [], "before": [], "remote": [], "first_send_wall": []}

    def first_send() -> None:
        """A warm probe in-process: when its run request left for the keeper (sent ahead or not)."""
        marks = lab.dir / "first-send"
        marks.unlink(missing_ok=True)
        argv = [sys.executable, str(Path(__file__).with_name("_first_send.py")), str(marks)]
        argv += ["-i", str(inv), "probe", "far", "--json", "--persist", "10m", *fleetdiag_transport_args(lab)]
        m = run_measured(argv, env=env, timeout=300)
        sends = marks.read_text().split() if marks.exists() else []
        if m.rc not in (0, 1) or not sends:
            raise SystemExit(f"the in-process warm probe failed (rc {m.rc}): {m.err.decode()[-1500:]}")
        floor["before"].append(float(sends[0]))
        floor["first_send_wall"].append(m.wall)

    rows: dict[str, list[tuple[float, int]]] = {
        "ssh true": [],
        "fleetdiag probe, cold (starts the keeper)": [],
        "fleetdiag probe, warm (kept connection)": [],
        "fleetdiag probe, warm, FLEETDIAG_AHEAD=0 (not sent ahead)": [],
    }
    if args.gap > 0:
        rows[f"fleetdiag probe, warm, {args.gap:g} s after the previous probe"] = []
        rows[f"fleetdiag probe, warm, FLEETDIAG_AHEAD=0, {args.gap:g} s after"] = []
    rows["fleetdiag probe, fresh (--persist 0)"] = []
    for rep in range(args.repeat):
        rows["ssh true"].append(ssh_true())
        run_measured([fd, "connections", "--close"], env=env)  # no keeper: the next probe is cold
        rows["fleetdiag probe, cold (starts the keeper)"].append(probe("10m", "cold"))
        # back to back: each right after the previous probe's process ended (the keeper's spare
        # channel for it opens when the previous command ends)
        rows["fleetdiag probe, warm (kept connection)"].append(probe("10m", "warm"))
        rows["fleetdiag probe, warm, FLEETDIAG_AHEAD=0 (not sent ahead)"].append(probe("10m", "noahead", False))
        if args.gap > 0:  # the same after a pause, as a person typing the next command would
            time.sleep(args.gap)
            rows[f"fleetdiag probe, warm, {args.gap:g} s after the previous probe"].append(probe("10m", "gap"))
            time.sleep(args.gap)
            rows[f"fleetdiag probe, warm, FLEETDIAG_AHEAD=0, {args.gap:g} s after"].append(
                probe("10m", "gap-noahead", False)
            )
        rows["fleetdiag probe, fresh (--persist 0)"].append(probe("0", "fresh"))
        probe("10m")  # the keeper dials again: the next one is warm
        first_send()
        floor["python"].append(run_measured([sys.executable, "-c", "pass"], env=env).wall)
        floor["remote"].append(run_measured(["sh", "-c", command], env=env, timeout=300).wall)
        print(f"  run {rep + 1}/{args.repeat} done", flush=True)
    run_measured([fd, "connections", "--close"], env=env)
    startup = median(run_measured([fd, "--version"], env=env).wall for _ in range(3))

    base = median(w for w, _ in rows["ssh true"])
    out = []
    summary: dict = {"rtt_ms": args.rtt, "rows": []}
    for name, vals in rows.items():
        w = median(v[0] for v in vals)
        e = median(v[1] for v in vals)
        out.append([name, f"{w:.2f}", ratio(w, base), f"{e:g}"])
        summary["rows"].append({"tool": name, "wall_s": w, "vs_ssh_true": w / base, "exchanges": e})
    out.append(["python start-up (fleetdiag --version)", f"{startup:.2f}", ratio(startup, base), "0"])
    print(f"\nload average after: {load_average()}")
    print(table(["tool", "wall s", "x ssh true", "exchanges"], out))
    print("\nprobe timing inside the command (median ms; CPU s of the command's process tree):")
    for label, det in timings.items():
        if label:
            print(
                f"  {label:11}: connect {median(d.get('connect_ms') or 0 for d in det):.0f}, start "
                f"{median(d.get('rtt_ms') or 0 for d in det):.0f} per trip "
                f"({median(d.get('round_trips') or 0 for d in det):g} trips), exec "
                f"{median(d.get('exec_ms') or 0 for d in det):.0f}, probe total "
                f"{median(d.get('total_ms') or 0 for d in det):.0f}, CPU {median(d['cpu_s'] for d in det):.2f}"
            )
    w = median(v[0] for v in rows["fleetdiag probe, warm (kept connection)"])
    py, before, remote = (median(floor[k]) for k in ("python", "before", "remote"))
    rtt = args.rtt / 1000
    phys = py + rtt + remote
    parts = [
        ["interpreter (python -c pass)", f"{py:.3f}"],
        ["CLI before the command leaves (in-process warm probe, after the interpreter)", f"{before:.3f}"],
        ["one RTT", f"{rtt:.3f}"],
        ["remote work alone (the probe's exec through sh, no SSH)", f"{remote:.3f}"],
        ["= floor: interpreter + RTT + remote work", f"{phys:.3f}  ({phys / base:.2f}x ssh true)"],
        ["  + the CLI before the request", f"{phys + before:.3f}  ({(phys + before) / base:.2f}x ssh true)"],
        ["warm probe measured (median)", f"{w:.3f}  ({w / base:.2f}x ssh true)"],
        ["in-process warm probe, whole (median)", f"{median(floor['first_send_wall']):.3f}"],
    ]
    print("\nthe floor of a warm probe (s, medians of the same runs):")
    print(table(["part", "s"], parts))
    summary["floor"] = {"python_s": py, "before_request_s": before, "rtt_s": rtt, "remote_s": remote, "floor_s": phys}
    summary["floor"]["floor_vs_ssh_true"] = phys / base
    print(
        f"\nwarm probe / fresh ssh true at {args.rtt:g} ms: {w / base:.2f}x (target <= 0.20x) "
        f"{verdict(w <= 0.2 * base)}"
    )
    summary["warm_vs_ssh_true"] = w / base
    summary["timings"] = timings
    return summary


if __name__ == "__main__":
    main()
