"""One host, fresh connection: fleetdiag probe vs `ssh host true` vs the seeds' four ssh calls.

    .venv/bin/python bench/single_host.py [--repeat 3] [--rtts 20,240,500] [--log-mb 50]

One real OpenSSH sshd on 127.0.0.1, one DelayProxy per RTT in front of it;
every tool goes through the same proxy. The log is the seeds' failing vLLM
launch (fleetdiag/data/demo/dp_rank.log) at the end of ~50 MB of a healthy
run's INFO chatter. Each cell is the median of --repeat runs, the tools
interleaved round-robin. The proxy counts *exchanges* (how often the client
spoke again after the server answered): round trips actually spent.

Rows:
  ssh true           OpenSSH client, fresh connection (no ControlMaster), runs `true`
  4 seed calls       the seeds' manual funnel: tail -40, keyword grep, worker grep,
                     PID grep (four fresh ssh connections, one after another)
  fleetdiag probe    the installed console script in a subprocess: wall time
                     includes Python start-up, imports, inventory, analysis, JSON
  probe_host()       the same probe as a library call in a warm interpreter
                     (fresh SSH connection; imports excluded)
  ssh + funnel       OpenSSH client running the very script probe_host sends
                     (one exec): the funnel's design without fleetdiag's client
  own login          probe_host() with FLEETDIAG_SSH_LOGIN=standard: asyncssh's
                     login, three round trips more (what fleetdiag.ssh.sshfast saves)
  python start-up    `fleetdiag --version`: interpreter + CLI imports, no network
  funnel script      the same script through the local sh: the remote work alone
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    DECISIVE,
    MB,
    Lab,
    complete_outputs,
    dump_summary,
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

SEED_CALLS = [  # the seeds' four commands, verbatim but for the path
    "tail -40 {log}",
    'grep -E "error|OOM|memory|CUDA|torch.*cuda" {log}',
    'grep -E "Worker.*(ERROR|Error)|CUDA" {log}',
    'grep -A2 "Worker pid=7506.*ERROR" {log} | tail -20',
]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is shown (3..5)")
    ap.add_argument("--rtts", default="20,240,500", help="round-trip times in ms")
    ap.add_argument("--log-mb", type=float, default=50, help="size of the log (MB)")
    ap.add_argument("--json-out", help="write the numbers here (run_all.py uses it)")
    args = ap.parse_args(argv)
    rtts = [float(x) for x in args.rtts.split(",")]
    fd = fleetdiag_bin()
    lab = Lab.start(rtts)
    try:
        return run(lab, fd, rtts, args)
    finally:
        lab.stop()


def run(lab: Lab, fd: str, rtts: list[float], args) -> dict:
    log = write_log(lab.dir / "vllm.log", int(args.log_mb * MB))
    warm(log)
    hosts = [(f"h{int(r)}", port) for r, port in zip(rtts, lab.proxy_ports)]
    inv = write_inventory(lab.dir / "inventory.yaml", lab, hosts, log)
    print(
        f"log: {log.stat().st_size / MB:.1f} MiB ({log}); sshd 127.0.0.1:{lab.sshd.port}; "
        f"RTTs {', '.join(f'{r:g}' for r in rtts)} ms; median of {args.repeat}; load {load_average()}",
        flush=True,
    )

    def ssh_true(i: int):
        return [run_measured(lab.ssh_base(lab.proxy_ports[i]) + ["true"], timeout=120)]

    def seed_calls(i: int):
        base = lab.ssh_base(lab.proxy_ports[i])
        return [run_measured(base + [c.format(log=shlex.quote(str(log)))], timeout=300) for c in SEED_CALLS]

    def cli(i: int):
        m = run_measured(
            [fd, "-i", str(inv), "probe", hosts[i][0], "--json", *fleetdiag_transport_args(lab)], timeout=300
        )
        check_cli(m)
        return [m]

    def lib(i: int, *flags: str):
        m = run_measured(
            [
                sys.executable,
                str(Path(__file__).with_name("_probe_once.py")),
                str(inv),
                hosts[i][0],
                str(lab.sshd.known_hosts),
                str(lab.sshd.client_key),
                *flags,
            ],
            timeout=300,
        )
        try:
            data = json.loads(m.out.decode() or "{}")
        except ValueError:
            data = {}
        if data.get("verdict") != "failed" or DECISIVE not in (data.get("decisive") or ""):
            raise SystemExit(f"probe_host did not find the decisive error: {m.out[:500]!r} {m.err[-2000:]!r}")
        m.wall = data["wall_ms"] / 1000  # the library call alone
        if not flags:
            lib_detail.setdefault(i, []).append(data["timing"])
        return [m]

    command, mark = funnel_command(str(log))

    def ssh_funnel(i: int):
        m = run_measured(lab.ssh_base(lab.proxy_ports[i]) + [command], timeout=300)
        if complete_outputs(m.out, mark) != 1:
            raise SystemExit(f"ssh + funnel script: output incomplete (rc {m.rc}): {m.err.decode()[-1000:]}")
        return [m]

    lib_detail: dict[int, list[dict]] = {}
    tools = [
        ("ssh true", ssh_true),
        ("4 seed calls", seed_calls),
        ("fleetdiag probe (CLI)", cli),
        ("probe_host() in-process", lib),
        ("ssh + funnel script (1 call)", ssh_funnel),
        ("probe_host(), asyncssh's own login", lambda i: lib(i, "--standard-login")),
    ]

    # warm-up (pyc, page cache, sshd's first fork) at the lowest RTT: not counted
    for _name, fn in tools:
        fn(0)
    startup = [run_measured([fd, "--version"]).wall for _ in range(max(3, args.repeat))]
    local = [run_measured(["sh", "-c", command]) for _ in range(max(3, args.repeat))]
    for m in local:
        if complete_outputs(m.out, mark) != 1:
            raise SystemExit("the funnel script failed locally: " + m.err.decode()[-1000:])

    walls: dict[tuple[str, float], list[float]] = {}
    exch: dict[tuple[str, float], list[int]] = {}
    cpus: dict[tuple[str, float], list[float]] = {}
    for i, rtt in enumerate(rtts):
        for rep in range(args.repeat):
            for name, fn in tools:
                lab.reset_counts()
                ms = fn(i)
                walls.setdefault((name, rtt), []).append(sum(m.wall for m in ms))
                cpus.setdefault((name, rtt), []).append(sum(m.cpu for m in ms))
                exch.setdefault((name, rtt), []).append(lab.exchanges()[i])
            print(f"  RTT {rtt:g} ms: run {rep + 1}/{args.repeat} done", flush=True)

    rows = []
    summary: dict = {"rtts": rtts, "startup_s": median(startup), "rows": [], "targets": {}}
    for rtt in rtts:
        base_true = median(walls[("ssh true", rtt)])
        base_four = median(walls[("4 seed calls", rtt)])
        for name, _fn in tools:
            w = median(walls[(name, rtt)])
            e = median(exch[(name, rtt)])
            c = median(cpus[(name, rtt)])
            rows.append(
                [
                    name,
                    f"{rtt:g}",
                    f"{w:.2f}",
                    ratio(w, base_true),
                    ratio(w, base_four),
                    f"{e:g}",
                    f"{w * 1000 / rtt:.1f}",
                    f"{c * 1000:.0f}",
                ]
            )
            summary["rows"].append(
                {
                    "tool": name,
                    "rtt_ms": rtt,
                    "wall_s": w,
                    "vs_ssh_true": w / base_true,
                    "vs_four_calls": w / base_four,
                    "exchanges": e,
                    "cpu_ms": c * 1000,
                    "runs": walls[(name, rtt)],
                }
            )
    rows.append(["python start-up (fleetdiag --version)", "-", f"{median(startup):.2f}", "", "", "0", "", ""])
    rows.append(
        ["funnel script alone (local sh, no SSH)", "-", f"{median(m.wall for m in local):.2f}", "", "", "0", "", ""]
    )
    summary["funnel_local_s"] = median(m.wall for m in local)
    print(f"\nload average after: {load_average()}")
    print(
        table(["tool", "RTT ms", "wall s", "x ssh true", "x 4 calls", "exchanges", "wall/RTT", "client CPU ms"], rows)
    )

    print("\nprobe_host() timing breakdown (median ms): ")
    for i, rtt in enumerate(rtts):
        det = lib_detail.get(i, [])[-args.repeat :]
        if det:
            print(
                f"  RTT {rtt:g}: connect {median(d['connect_ms'] for d in det):.0f}, exec (open+funnel+read) "
                f"{median(d['exec_ms'] for d in det):.0f}, total {median(d['total_ms'] for d in det):.0f}, "
                f"payload {median(d['bytes'] for d in det) / 1024:.1f} KiB"
            )

    if 240.0 in rtts:
        cli_w = median(walls[("fleetdiag probe (CLI)", 240.0)])
        lib_w = median(walls[("probe_host() in-process", 240.0)])
        t = median(walls[("ssh true", 240.0)])
        f = median(walls[("4 seed calls", 240.0)])
        summary["targets"] = {
            "cli_vs_ssh_true": cli_w / t,
            "cli_vs_four": cli_w / f,
            "lib_vs_ssh_true": lib_w / t,
            "lib_vs_four": lib_w / f,
        }
        print("\ntargets at RTT 240 ms:")
        print(f"  fleetdiag probe (CLI) <= 1.00x ssh true : {cli_w / t:.2f}x  {verdict(cli_w <= t)}")
        print(f"  fleetdiag probe (CLI) <= 0.25x 4 calls  : {cli_w / f:.2f}x  {verdict(cli_w <= 0.25 * f)}")
        print(f"  probe_host() in-process <= 1.00x ssh true: {lib_w / t:.2f}x  {verdict(lib_w <= t)}")
        print(f"  probe_host() in-process <= 0.25x 4 calls : {lib_w / f:.2f}x  {verdict(lib_w <= 0.25 * f)}")
    dump_summary(args.json_out, summary)
    return summary


def check_cli(m) -> None:
    """The probe must have found the decisive line, or its time means nothing."""
    try:
        host = json.loads(m.out.decode())["hosts"][0]
    except (ValueError, KeyError, IndexError):
        raise SystemExit(f"fleetdiag probe gave no JSON (rc {m.rc}): {m.err.decode()[-2000:]}") from None
    line = (host.get("decisive") or {}).get("line") or ""
    if host.get("verdict") != "failed" or DECISIVE not in line:
        raise SystemExit(f"fleetdiag probe did not find the decisive error: {json.dumps(host)[:2000]}")


if __name__ == "__main__":
    main()
