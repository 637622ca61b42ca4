"""Where a warm sweep's controller CPU goes, per host: the CLI and the keeper under cProfile, in named parts.

    nice -n 10 .venv/bin/python bench/warm_profile.py [--hosts 100] [--fanout 32] [--rtt 20] [--top 25]

N simulated hosts (one sshd, one DelayProxy each, as bench/cpu_floor.py). A keeper is started by hand
under cProfile, a first sweep dials every host through it, then a second (warm) sweep runs under
cProfile too, with the keeper's profile switched on for that sweep only (SIGUSR1 on, SIGUSR2 off and
dump). Below ``spread.HOSTS_PER_WORKER`` hosts the sweep is one process, so the two profiles are all
of the warm sweep's controller CPU. Every function's own time is put in one part by its module, and
the parts are printed per host beside the processes' measured CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    DECISIVE,
    PROFILED_CLI,
    Lab,
    child_env,
    fleetdiag_bin,
    funnel_lab,
    load_average,
    run_measured,
    table,
    write_inventory,
)

PROFILED_KEEPER = """
import cProfile, signal, sys, time
from pathlib import Path
from fleetdiag.ssh.keeper.server import serve_forever
directory, out = Path(sys.argv[1]), sys.argv[2]
prof = cProfile.Profile(time.process_time)
signal.signal(signal.SIGUSR1, lambda *a: prof.enable())
def stop(*a):
    prof.disable()
    prof.dump_stats(out)
signal.signal(signal.SIGUSR2, stop)
sys.exit(serve_forever(directory, 600.0))
"""

# (part, substrings of a function's file or name; the first part that matches takes its own time)
PARTS = [
    ("crypto (cryptography, AES-GCM)", ("cryptography", "/crypto/", "_cipher", "aead")),
    ("asyncssh: packets, channels", ("asyncssh",)),
    ("keeper relay: frames, socket (fleetdiag/ssh/keeper)", ("fleetdiag/ssh/keeper",)),
    ("transport (fleetdiag/ssh)", ("fleetdiag/ssh/",)),
    ("funnel output parse (fleetdiag/remote)", ("fleetdiag/remote",)),
    ("analysis (fleetdiag/analysis)", ("fleetdiag/analysis",)),
    ("evidence (fleetdiag/evidence)", ("fleetdiag/evidence",)),
    ("facts (fleetdiag/facts)", ("fleetdiag/facts",)),
    ("job analysis (fleetdiag/job)", ("fleetdiag/job",)),
    ("store, history (fleetdiag/store)", ("fleetdiag/store",)),
    ("render, CLI (fleetdiag/render, cli)", ("fleetdiag/render", "fleetdiag/cli", "rich", "click")),
    ("probe, records, other fleetdiag", ("fleetdiag/",)),
    ("re (regex engine)", ("<method 'search' of 're.Pattern'", "<method 'match' of 're.Pattern'", "re/", "sre_")),
    ("json", ("json",)),
    ("sqlite3", ("sqlite3",)),
    ("yaml (rules, inventory)", ("yaml",)),
    ("imports", ("<frozen importlib", "importlib", "marshal")),
    ("asyncio, selectors, sockets", ("asyncio", "selectors", "socket", "<method 'recv", "<method 'send")),
]


def parts(stats_file: Path) -> tuple[dict[str, float], float, list[tuple[float, str]]]:
    st = pstats.Stats(str(stats_file))
    got: dict[str, float] = {}
    total = 0.0
    funcs: list[tuple[float, str]] = []
    for (file, line, name), (_cc, _nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        total += tt
        label = f"{file}:{line}({name})"
        funcs.append((tt, label))
        where = f"{file} {name}"
        part = next((p for p, keys in PARTS if any(k in where for k in keys)), "other (builtins, stdlib)")
        got[part] = got.get(part, 0.0) + tt
    funcs.sort(reverse=True)
    return got, total, funcs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=100)
    ap.add_argument("--fanout", type=int, default=32)
    ap.add_argument("--rtt", type=float, default=20.0)
    ap.add_argument("--log-mb", type=float, default=1)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json-out")
    ap.add_argument("--plain", action="store_true", help="no profilers: the warm sweep's CPU per host only")
    ap.add_argument("--prof-dir", help="keep the two profiles (cli.prof, keeper.prof) here")
    args = ap.parse_args()
    n = args.hosts
    lab = Lab.start([args.rtt] * n)
    keeper = None
    try:
        fd = fleetdiag_bin()
        fl = funnel_lab(lab.dir, args.log_mb)
        names = [f"h{i + 1:04d}" for i in range(n)]
        inv = write_inventory(lab.dir / "inventory.yaml", lab, list(zip(names, lab.proxy_ports[:n])), fl.log)
        rt = lab.dir / "rt"
        rt.mkdir(mode=0o700)
        kprof, cprof = lab.dir / "keeper.prof", lab.dir / "cli.prof"
        env = child_env(FLEETDIAG_DB=str(lab.dir / "h.sqlite3"), FLEETDIAG_PERSIST="10m", FLEETDIAG_RUNTIME_DIR=str(rt))
        keeper = subprocess.Popen(
            [sys.executable, "-c", PROFILED_KEEPER, str(rt), str(kprof)], env=env, stdin=subprocess.DEVNULL
        )
        for _ in range(100):
            if (rt / "keeper.sock").exists() or any(p.is_socket() for p in rt.iterdir()):
                break
            time.sleep(0.05)
        base = ["-i", str(inv), "sweep", "all", "--fanout", str(args.fanout)]
        base += ["--known-hosts", str(lab.sshd.known_hosts), "--identity", str(lab.sshd.client_key)]
        first = run_measured([fd, *base, "--report", str(lab.dir / "r0.json")], env=env, timeout=900)
        print(f"dial sweep: rc {first.rc}, {first.wall:.1f} s; load {load_average()}", flush=True)
        lab.wait_idle()
        k0 = _cpu(keeper.pid)
        if args.plain:
            m = run_measured([fd, *base, "--report", str(lab.dir / "r.json")], env=env, timeout=900)
        else:
            keeper.send_signal(signal.SIGUSR1)
            m = run_measured(
                [sys.executable, "-c", PROFILED_CLI, str(cprof), *base, "--report", str(lab.dir / "r.json")],
                env=env,
                timeout=900,
            )
            keeper.send_signal(signal.SIGUSR2)
            time.sleep(0.5)
        kcpu = _cpu(keeper.pid) - k0
        hosts = json.loads((lab.dir / "r.json").read_text()).get("hosts", [])
        ok = sum(1 for h in hosts if DECISIVE in ((h.get("decisive") or {}).get("line") or ""))
        print(
            f"warm sweep: {n} hosts, {ok} right, {m.wall:.1f} s; CLI CPU {m.cpu * 1000 / n:.1f} ms/host, "
            f"keeper {kcpu * 1000 / n:.1f} ms/host ({'no profiler' if args.plain else 'cProfile included'}); "
            f"load {load_average()}"
        )
        summary: dict = {"hosts": n, "cli_cpu_ms": m.cpu * 1000 / n, "keeper_cpu_ms": kcpu * 1000 / n, "parts": {}}
        if args.plain:
            if args.json_out:
                Path(args.json_out).write_text(json.dumps(summary, indent=1))
            return
        for who, f in (("CLI", cprof), ("keeper", kprof)):
            got, total, funcs = parts(f)
            rows = [[p, f"{t * 1000 / n:.2f}", f"{t / total:.0%}"] for p, t in sorted(got.items(), key=lambda x: -x[1])]
            rows.append(["profiled total", f"{total * 1000 / n:.2f}", "100%"])
            print(f"\n{who}: own time by part, ms/host")
            print(table(["part", "ms/host", "share"], rows))
            print(f"{who}: top {args.top} functions by own time (ms/host)")
            for tt, label in funcs[: args.top]:
                print(f"  {tt * 1000 / n:7.3f}  {label[-110:]}")
            summary["parts"][who] = {p: t * 1000 / n for p, t in got.items()}
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(summary, indent=1))
        if args.prof_dir:
            Path(args.prof_dir).mkdir(parents=True, exist_ok=True)
            for f in (cprof, kprof):
                shutil.copy(f, Path(args.prof_dir) / f.name)
    finally:
        if keeper is not None:
            keeper.kill()
            keeper.wait()
        lab.stop()


def _cpu(pid: int) -> float:
    """A live process's user + system CPU seconds (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    tempfile.tempdir = None
    main()
