"""Controller CPU per host: fleetdiag beside the bare SSH library it is built on, and clush.

    .venv/bin/python bench/cpu_floor.py [--hosts 60] [--fanout 16] [--rtt 20] [--repeat 2]

N simulated hosts (one sshd, one DelayProxy each, bench/_common.py), every
row sends the probe's exact exec (``probe_command``) to every host and reads
its whole answer. Each row runs in a fresh process; the rows are interleaved
and repeated, the median is shown.

In-process rows (CPU of the measuring process from after its imports to the
last answer, over N):

  asyncssh, defaults           asyncssh.connect + conn.run, nothing chosen: the library's own floor
  asyncssh, <cipher>           the same with one cipher and curve25519 pinned (the cheapest asyncssh
                               can offer an OpenSSH server)
  asyncssh, kept connection    conn.run alone on connections opened beforehand: the warm floor
  ..., the answer written at once  the same, the host's answer held by ``dd iflag=fullblock`` and
                               written whole: what a channel packet per remote write costs
  fleetdiag probe_many         the real probe (fast login, analysis, facts), in-process
  analysis alone               parse + analysis of one host's real answer, offline (median of 200)

Whole-process rows (GNU time: the process and every child, start-up included, over N):

  fleetdiag sweep (CLI)        fresh connections; and warm (kept connections, keeper CPU counted)
  clush -f FANOUT              OpenSSH in C, one ssh process per host
  python start-up              ``fleetdiag --version`` once (divide by N for its share)

``--offline``: what grows with the fleet, with no SSH: the known_hosts lookup of one connection
(a fleet's file has a line per host: parsed per connection before, once per process now) and the
inventory load, at 60, 1,000 and 5,000 hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    Lab,
    child_env,
    complete_outputs,
    dump_summary,
    fleetdiag_bin,
    funnel_lab,
    load_average,
    median,
    run_measured,
    table,
)

CIPHERS = ("aes128-gcm@openssh.com", "chacha20-poly1305@openssh.com", "aes128-ctr")
KEX = "curve25519-sha256"


def cpu_now() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# --------------------------------------------------------------------------- the measured process


async def bare(spec: dict, cipher: str | None, kept: bool, whole: bool = False) -> tuple[float, int]:
    """asyncssh alone: connect, run the command, read everything, close; CPU of this process. ``whole``:
    the host's answer held until it is complete and written at once (``dd iflag=fullblock``), so it
    arrives in a few channel packets instead of one per remote write: what the packets cost."""
    import asyncssh

    cmd = Path(spec["command_file"]).read_text()
    if whole:
        cmd = "{ " + cmd + "\n} | dd bs=8M iflag=fullblock 2>/dev/null"
    kw: dict = {
        "username": spec["user"],
        "client_keys": [spec["key"]],
        # parsed once, as an SSHKnownHosts object: a path would be parsed again for every connection
        "known_hosts": asyncssh.read_known_hosts(spec["known_hosts"]),
        "agent_path": None,
        "connect_timeout": 60,
    }
    if cipher:
        kw["encryption_algs"] = [cipher]
        kw["kex_algs"] = [KEX]
        kw["compression_algs"] = ["none"]
        if not cipher.endswith(("gcm@openssh.com", "poly1305@openssh.com")):
            kw["mac_algs"] = ["hmac-sha2-256-etm@openssh.com"]
    sem = asyncio.Semaphore(spec["fanout"])
    ok = 0

    async def run(conn) -> None:
        nonlocal ok
        r = await conn.run(cmd, check=False, encoding=None)
        ok += complete_outputs(r.stdout or b"", spec["mark"])

    if kept:
        conns = await asyncio.gather(*(asyncssh.connect("127.0.0.1", p, **kw) for p in spec["ports"]))
        t0 = cpu_now()

        async def one_kept(conn) -> None:
            async with sem:
                await run(conn)

        await asyncio.gather(*(one_kept(c) for c in conns))
        cpu = cpu_now() - t0
        for c in conns:
            c.close()
        return cpu, ok
    t0 = cpu_now()

    async def one(port: int) -> None:
        async with sem:
            async with asyncssh.connect("127.0.0.1", port, **kw) as conn:
                await run(conn)

    await asyncio.gather(*(one(p) for p in spec["ports"]))
    return cpu_now() - t0, ok


async def fleetdiag_many(spec: dict) -> tuple[float, int]:
    """fleetdiag's probe_many in this process, over the same hosts; CPU after the imports."""
    from fleetdiag.inventory import Host
    from fleetdiag.probe import ProbeSettings
    from fleetdiag.ssh.scheduler import probe_many
    from fleetdiag.ssh.transport import TransportOptions

    t0 = cpu_now()
    opts = TransportOptions(
        known_hosts=spec["known_hosts"], client_keys=[spec["key"]], connect_timeout=60, command_timeout=120
    )
    settings = ProbeSettings(transport=opts, path_prepend=spec.get("path_prepend"))
    hosts = [
        Host(name=f"h{i:04d}", address="127.0.0.1", port=p, user=spec["user"], logs={"vllm": spec["log"]})
        for i, p in enumerate(spec["ports"])
    ]
    ok = 0
    async for res in probe_many(hosts, settings, spec["fanout"]):
        ok += res.verdict == "failed" and spec["decisive"] in ((res.decisive.line if res.decisive else "") or "")
    return cpu_now() - t0, ok


def analysis_alone(spec: dict) -> tuple[float, int]:
    """One host's real answer (the command through the local sh), parsed and analysed 200 times."""
    from fleetdiag.analysis import load_rules
    from fleetdiag.probe import host_facts, host_result
    from fleetdiag.remote.funnel import parse_output

    cmd = Path(spec["command_file"]).read_text()
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, timeout=120).stdout.decode("utf-8", "replace")
    rules = load_rules()
    times = []
    for _ in range(200):
        t0 = cpu_now()
        fr = parse_output(out, spec["mark"])
        host_result("h", fr, rules, 120.0, None, host_facts(fr), None)
        times.append(cpu_now() - t0)
    return median(times) * len(spec["ports"]), 1


def offline(sizes: tuple[int, ...] = (60, 1000, 5000)) -> None:
    """Per-connection known_hosts cost and inventory load, by fleet size (CPU, this process)."""
    import asyncssh
    import yaml

    from fleetdiag.inventory import load_inventory, yamlload
    from fleetdiag.ssh.transport import KnownHosts

    class PureLoader(yaml.SafeLoader):  # the inventory's loader on PyYAML's pure-Python parser, as before
        pass

    PureLoader.add_constructor("tag:yaml.org,2002:map", yamlload._construct_map)
    PureLoader.add_constructor("tag:yaml.org,2002:seq", yamlload._construct_seq)

    with tempfile.TemporaryDirectory(prefix="fleetdiag-bench-offline-") as tmp:
        pub = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
        rows = []
        for n in sizes:
            kh = Path(tmp) / f"known_hosts{n}"
            kh.write_text("".join(f"[127.0.0.1]:{20000 + i} {pub}\n" for i in range(n)))
            t0 = cpu_now()
            for i in range(20):  # as before: the whole file parsed for each connection
                asyncssh.import_known_hosts(kh.read_text()).match("127.0.0.1", "127.0.0.1", 20000 + i)
            each = (cpu_now() - t0) / 20
            KnownHosts([str(kh)])("127.0.0.1", "127.0.0.1", 20000)  # the first connection parses
            t0 = cpu_now()
            for i in range(200):
                KnownHosts([str(kh)])("127.0.0.1", "127.0.0.1", 20000 + i % n)
            cached = (cpu_now() - t0) / 200
            inv = Path(tmp) / f"inv{n}.yaml"
            inv.write_text(
                "hosts:\n"
                + "".join(
                    f"  h{i:05d}:\n    address: 127.0.0.1\n    port: {20000 + i}\n    user: root\n"
                    f"    logs:\n      vllm: /var/log/vllm.log\n"
                    for i in range(n)
                )
            )
            t0 = cpu_now()
            load_inventory(inv)
            load = cpu_now() - t0
            t0 = cpu_now()
            yaml.load(inv.read_text(), Loader=PureLoader)  # noqa: S506 (a safe loader)
            pure = cpu_now() - t0
            rows.append([n, f"{each * 1000:.2f}", f"{cached * 1000:.3f}", f"{pure:.2f}", f"{load:.2f}"])
    print(
        table(
            [
                "hosts",
                "known_hosts per connection, parsed each time (ms)",
                "parsed once (ms)",
                "inventory YAML, pure-Python parser (s)",
                "inventory load, libyaml (s)",
            ],
            rows,
        )
    )


def worker(mode: str, spec_file: str) -> None:
    spec = json.loads(Path(spec_file).read_text())
    if mode == "analysis":
        cpu, ok = analysis_alone(spec)
    elif mode == "fleetdiag":
        cpu, ok = asyncio.run(fleetdiag_many(spec))
    else:
        cipher = None if mode in ("bare", "kept", "kept_whole") else mode
        cpu, ok = asyncio.run(bare(spec, cipher, mode.startswith("kept"), mode == "kept_whole"))
    print(json.dumps({"cpu": cpu, "ok": ok}))


# --------------------------------------------------------------------------- the bench


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=60)
    ap.add_argument("--fanout", type=int, default=16)
    ap.add_argument("--rtt", type=float, default=20.0, help="every host's round trip (ms)")
    ap.add_argument("--log-mb", type=float, default=1)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-cli", action="store_true", help="skip the CLI sweep rows (in-process rows and clush only)")
    ap.add_argument("--offline", action="store_true", help="only what grows with the fleet, no SSH")
    ap.add_argument("--json-out")
    ap.add_argument("--only", help="comma-separated words: only the rows whose name holds one (clush always runs)")
    ap.add_argument("--worker", nargs=2, metavar=("MODE", "SPEC"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return {}
    if args.offline:
        offline()
        return {}
    n = args.hosts
    lab = Lab.start([args.rtt] * n)
    try:
        return run(lab, args)
    finally:
        lab.stop()


def run(lab: Lab, args) -> dict:
    from _common import DECISIVE, write_inventory

    n = args.hosts
    fd = fleetdiag_bin()
    fl = funnel_lab(lab.dir, args.log_mb)
    log, command, mark, cmd_file = fl.log, fl.command, fl.mark, fl.command_file
    spec = {
        "ports": lab.proxy_ports[:n],
        "user": lab.sshd.user,
        "key": str(lab.sshd.client_key),
        "known_hosts": str(lab.sshd.known_hosts),
        "command_file": str(cmd_file),
        "mark": mark,
        "fanout": args.fanout,
        "log": str(log),
        "decisive": DECISIVE,
        "path_prepend": os.environ.get("FLEETDIAG_BENCH_HOST_PATH") or None,
    }
    spec_file = lab.dir / "spec.json"
    spec_file.write_text(json.dumps(spec))
    names = [f"h{i + 1:04d}" for i in range(n)]
    ssh_config = lab.write_ssh_config(lab.dir / "ssh_config", names, spec["ports"], True)
    inv = write_inventory(lab.dir / "inventory.yaml", lab, list(zip(names, spec["ports"])), log)
    print(
        f"cpu floor: {n} hosts, fanout {args.fanout}, RTT {args.rtt:g} ms, log {args.log_mb:g} MiB, "
        f"request {len(command) / 1024:.1f} KiB, {os.cpu_count()} cores, load {load_average()}",
        flush=True,
    )

    def in_process(mode: str) -> tuple[float, int]:
        p = subprocess.run(
            [sys.executable, __file__, "--worker", mode, str(spec_file)],
            capture_output=True,
            text=True,
            timeout=900,
            env=child_env(),
        )
        try:
            r = json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            print(f"  {mode}: failed rc={p.returncode} {p.stderr[-800:]}", flush=True)
            return float("nan"), 0
        return r["cpu"], r["ok"]

    def clush() -> tuple[float, int]:
        m = run_measured(
            ["clush", "-f", str(args.fanout), "-w", f"h[0001-{n:04d}]", "-b", "-o", f"-F {ssh_config}", command],
            timeout=900,
            env=child_env(PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"),
        )
        return m.cpu, complete_outputs(m.out, mark)

    def cli(warm_run: bool) -> tuple[float, int]:
        tmp = Path(tempfile.mkdtemp(dir=lab.dir))
        base = [fd, "-i", str(inv), "sweep", "all", "--db", str(tmp / "h.sqlite3"), "--fanout", str(args.fanout)]
        base += ["--known-hosts", str(lab.sshd.known_hosts), "--identity", str(lab.sshd.client_key)]
        env = child_env(FLEETDIAG_DB=str(tmp / "h.sqlite3"))
        if warm_run:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from fleet import _keeper_cpu

            rt = tmp / "rt"
            env.update(FLEETDIAG_PERSIST="10m", FLEETDIAG_RUNTIME_DIR=str(rt))
            run_measured(base + ["--report", str(tmp / "r0.json")], env=env, timeout=900)
            k0 = _keeper_cpu(rt)
        m = run_measured(base + ["--report", str(tmp / "r.json")], env=env, timeout=900)
        cpu = m.cpu
        if warm_run:
            cpu += _keeper_cpu(rt) - k0
            subprocess.run([fd, "connections", "--close"], env=env, capture_output=True, timeout=60)
        try:
            hosts = json.loads((tmp / "r.json").read_text()).get("hosts", [])
        except (OSError, ValueError):
            hosts = []
        ok = sum(1 for h in hosts if DECISIVE in ((h.get("decisive") or {}).get("line") or ""))
        return cpu, ok

    rows: dict[str, callable] = {"asyncssh, defaults": lambda: in_process("bare")}
    for c in CIPHERS:
        rows[f"asyncssh, {c} + {KEX}"] = lambda c=c: in_process(c)
    rows["asyncssh, kept connection (exec only)"] = lambda: in_process("kept")
    rows["asyncssh, kept connection, the answer written at once (exec only)"] = lambda: in_process("kept_whole")
    rows["fleetdiag probe_many (in-process)"] = lambda: in_process("fleetdiag")
    if not args.no_cli:
        rows["fleetdiag sweep, CLI, fresh"] = lambda: cli(False)
        rows["fleetdiag sweep, CLI, warm (keeper counted)"] = lambda: cli(True)
    rows[f"clush -f {args.fanout} (ssh processes counted)"] = clush
    if args.only:
        words = [w.strip() for w in args.only.split(",") if w.strip()]
        rows = {k: fn for k, fn in rows.items() if k.startswith("clush") or any(w in k for w in words)}
    got: dict[str, list[tuple[float, int]]] = {k: [] for k in rows}
    for rep in range(args.repeat):
        for name, fn in rows.items():
            lab.wait_idle()
            got[name].append(fn())
            cpu, ok = got[name][-1]
            print(f"    {name}: {cpu * 1000 / n:.1f} ms/host, {ok}/{n} complete", flush=True)
        print(f"  round {rep + 1}/{args.repeat} done, load {load_average()}", flush=True)
    analysis = in_process("analysis")[0]
    startup = median(run_measured([fd, "--version"]).cpu for _ in range(3))

    clush_ms = median(c for c, _ in got[f"clush -f {args.fanout} (ssh processes counted)"]) * 1000 / n
    out, summary = [], {"hosts": n, "fanout": args.fanout, "rtt_ms": args.rtt, "rows": []}
    for name, vals in got.items():
        ms = median(c for c, _ in vals) * 1000 / n
        each = " / ".join(f"{c * 1000 / n:.1f}" for c, _ in vals)
        ok = min(k for _, k in vals)
        out.append([name, f"{ms:.1f}", each, f"{ms / clush_ms:.2f}x", f"{ok}/{n}"])
        summary["rows"].append({"row": name, "cpu_ms_per_host": ms, "runs": [c for c, _ in vals], "ok": ok})
    out.append(["analysis alone (one answer, offline)", f"{analysis * 1000 / n:.1f}", "-", "-", "-"])
    out.append([f"python start-up (fleetdiag --version) / {n}", f"{startup * 1000 / n:.1f}", "-", "-", "-"])
    summary.update(analysis_ms=analysis * 1000 / n, startup_cpu_s=startup, clush_ms=clush_ms, load=load_average())
    print(f"\ncontroller CPU per host, {n} hosts, fanout {args.fanout}; load {load_average()}")
    print(table(["row", "CPU ms/host (median)", "each run", "x clush", "complete"], out))
    dump_summary(args.json_out, summary)
    return summary


if __name__ == "__main__":
    main()
