"""A simulated fleet: fleetdiag next to clush, pssh, parallel-ssh, ansible and an ssh loop.

    .venv/bin/python bench/fleet.py [--sizes 50,200] [--fanout 64] [--log-mb 1] [--no-install]

N hosts, all the same loopback sshd, each behind its own DelayProxy (RTTs
20/240/500 ms in turn), each reading the same log (the seeds' failing vLLM
launch after --log-mb of INFO chatter). Every tool runs the same remote
work: the script fleetdiag.remote.funnel.build_script(...) + remote_command(...)
makes, i.e. exactly what fleetdiag's probe sends. Every tool gets the same
parallelism (--fanout) and a fresh connection per host.

Printed per fleet size: wall time, CPU seconds (the tool and every process
it ran), peak RSS of the largest process, peak RSS of the whole process tree
(sampled every 0.2 s), and how many hosts' output arrived whole. "slowest
host alone" is fleetdiag probing one 500 ms host by itself: the floor for a
fleet run. The sequential ssh loop is measured on a sample of hosts of every
RTT and extrapolated (--full-sequential runs it all: ~2.5 s a host).

The OpenSSH-based tools get ``KexAlgorithms curve25519-sha256`` (what
asyncssh negotiates with this sshd), so all pay the same key-exchange CPU;
--default-kex leaves OpenSSH at its default (sntrup761x25519: ~50 ms more
CPU per connection on each side, which 200 simulated hosts sharing two cores
feel). Optional tools install on first use (ansible-core and parallel-ssh
into their own venv, Debian pssh via apt-get); a tool that cannot be had is
skipped with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _tools  # noqa: E402
from _common import (  # noqa: E402
    DECISIVE,
    MB,
    Lab,
    Measured,
    child_env,
    complete_outputs,
    dump_summary,
    fleetdiag_bin,
    fleetdiag_transport_args,
    funnel_lab,
    load_average,
    median,
    ratio,
    run_measured,
    table,
    verdict,
    write_inventory,
)

from fleetdiag.ssh.scheduler import handshake_bound  # noqa: E402

MIX = (20.0, 240.0, 500.0)
TIMEOUT = 900  # seconds, per tool run: generous, but every run ends


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="50,200", help="fleet sizes")
    ap.add_argument("--fanout", type=int, default=64, help="parallel hosts for every tool")
    ap.add_argument("--log-mb", type=float, default=1, help="log size per host (MB); all hosts share 2 cores here")
    ap.add_argument(
        "--fanout-all",
        action="store_true",
        help="also run fleetdiag with fanout = fleet size (on 2 shared cores, 200 remote funnels at "
        "once starve each other past fleetdiag's 60 s command timeout)",
    )
    ap.add_argument(
        "--no-warm", action="store_true", help="skip the warm sweep (kept connections, after a dialling sweep)"
    )
    ap.add_argument(
        "--once", action="store_true", help="one fleetdiag sweep per size (no 2nd run): for the largest sizes"
    )
    ap.add_argument("--seq-sample", type=int, default=3, help="hosts per RTT for the extrapolated ssh loop")
    ap.add_argument("--full-sequential", action="store_true", help="run the ssh loop over every host")
    ap.add_argument(
        "--tools",
        default="fleetdiag,clush,pssh,parallel-ssh,ansible-raw,ansible-shell,ssh-loop",
        help="which tools to run (also: remote-alone, the probe's exec command through sh with no SSH)",
    )
    ap.add_argument("--no-install", action="store_true", help="skip tools that are missing instead of installing")
    ap.add_argument("--default-kex", action="store_true", help="leave OpenSSH tools at their default key exchange")
    ap.add_argument("--json-out", help="write the numbers here (run_all.py uses it)")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    n = max(sizes)
    lab = Lab.start([MIX[i % len(MIX)] for i in range(n)])
    try:
        return run(lab, sizes, args)
    finally:
        lab.stop()


class Fleet:
    """N hosts of one lab: names, ports, RTTs and every tool's inventory file."""

    def __init__(self, lab: Lab, n: int, log: Path, pin_kex: bool):
        self.lab = lab
        self.n = n
        self.width = max(3, len(str(n)))  # one padding for every name: h0001..h1000, as a nodeset folds it
        self.names = [f"h{i + 1:0{self.width}d}" for i in range(n)]
        self.ports = lab.proxy_ports[:n]
        self.rtts = lab.rtts[:n]
        d = lab.dir / f"fleet{n}"
        d.mkdir(exist_ok=True)
        self.dir = d
        self.inventory = write_inventory(d / "inventory.yaml", lab, list(zip(self.names, self.ports)), log)
        self.ssh_config = lab.write_ssh_config(d / "ssh_config", self.names, self.ports, pin_kex)
        (d / "hosts.txt").write_text("".join(f"{h}\n" for h in self.names))
        kex = "" if not pin_kex else " -o KexAlgorithms=curve25519-sha256"
        sshd = lab.sshd
        ini = ["[fleet]"] + [f"{h} ansible_host=127.0.0.1 ansible_port={p}" for h, p in zip(self.names, self.ports)]
        ini += [
            "",
            "[fleet:vars]",
            f"ansible_user={sshd.user}",
            f"ansible_ssh_private_key_file={sshd.client_key}",
            f"ansible_ssh_common_args='-o UserKnownHostsFile={sshd.known_hosts} -o IdentitiesOnly=yes"
            f" -o BatchMode=yes{kex}'",
            "ansible_python_interpreter=/usr/bin/python3",
        ]
        (d / "ansible.ini").write_text("\n".join(ini) + "\n")


def run(lab: Lab, sizes: list[int], args) -> dict:
    fd = fleetdiag_bin()
    fun = funnel_lab(lab.dir, args.log_mb)
    log, command, mark, cmd_file = fun.log, fun.command, fun.mark, fun.command_file
    wanted = set(args.tools.split(","))
    install = not args.no_install
    print(
        f"fleet bench: sizes {sizes}, fanout {args.fanout}, RTTs {'/'.join(f'{r:g}' for r in MIX)} ms in turn, "
        f"log {log.stat().st_size / MB:.1f} MiB per host, remote command {len(command) / 1024:.1f} KiB; "
        f"load {load_average()}",
        flush=True,
    )

    # ------------------------------------------------------------------ which tools are there
    skipped: dict[str, str] = {}
    clush, why = _tools.clush_bin()
    if not clush:
        skipped["clush"] = why
    pssh = None
    if "pssh" in wanted:
        pssh, why = _tools.debian_pssh(install)
        if not pssh:
            skipped["pssh (Debian)"] = why
    ansible = None
    if wanted & {"ansible-raw", "ansible-shell"}:
        py, why = _tools.pip_tool("ansible-core", "ansible", install)
        ansible = _tools.venv_bin(py, "ansible") if py else None
        if not ansible:
            skipped["ansible"] = why
    pssh_py = None
    if "parallel-ssh" in wanted:
        pssh_py, why = _tools.pip_tool("parallel-ssh", "pssh.clients", install)
        if not pssh_py:
            skipped["parallel-ssh (PyPI)"] = why
    sweep_ok = subprocess.run([fd, "sweep", "--help"], capture_output=True, env=child_env()).returncode == 0
    fd_label = "fleetdiag sweep" if sweep_ok else "fleetdiag probe --json"

    # ------------------------------------------------------------------ the floor: the slowest host alone
    slow = max(range(len(MIX)), key=lambda i: MIX[i])
    alone_fleet = Fleet(lab, len(MIX), log, not args.default_kex)
    alone = []
    for _ in range(3):
        m = run_measured(
            [
                fd,
                "-i",
                str(alone_fleet.inventory),
                "probe",
                alone_fleet.names[slow],
                "--json",
                *fleetdiag_transport_args(lab),
            ],
            timeout=TIMEOUT,
        )
        alone.append(m.wall)
    ssh_alone = [
        run_measured(lab.ssh_base(alone_fleet.ports[slow]) + [command], timeout=TIMEOUT).wall for _ in range(3)
    ]
    slowest = median(alone)
    print(
        f"slowest host alone ({MIX[slow]:g} ms): fleetdiag probe {slowest:.2f} s, "
        f"ssh + funnel {median(ssh_alone):.2f} s (median of 3)",
        flush=True,
    )

    summary: dict = {
        "sizes": {},
        "slowest_alone_s": slowest,
        "ssh_alone_s": median(ssh_alone),
        "skipped": skipped,
        "fanout": args.fanout,
        "log_mb": args.log_mb,
    }
    for n in sizes:
        fl = Fleet(lab, n, log, not args.default_kex)
        results: list[tuple[str, Measured, int, str, float]] = []
        lab.wait_idle()
        cpu0 = [lab.server_cpu()]

        def record(name: str, m: Measured, ok: int, note: str = "", scale: float = 1.0) -> None:
            if m.timed_out:
                note = (note + " timed out").strip()
            if not lab.wait_idle():  # every connection closed and reaped: its CPU is counted
                note = (note + " server CPU incomplete").strip()
            server = (lab.server_cpu() - cpu0[0]) * scale
            results.append((name, m, ok, note, server))
            print(
                f"  {n} hosts: {name}: {m.wall:.2f} s, {ok}/{n} complete {note}; CPU {m.cpu:.1f} s, "
                f"RSS largest {m.maxrss_mb:.0f} MB, tree {m.tree_mb or 0:.0f} MB (then: {m.at_peak}); own peaks (MB): {m.parts}",
                flush=True,
            )
            cpu0[0] = lab.server_cpu()

        if "fleetdiag" in wanted:
            m, ok = run_fleetdiag(fd, fl, args.fanout, sweep_ok)
            record(f"{fd_label} (fanout {args.fanout})", m, ok)
            if sweep_ok and not args.once:  # cron's steady state: the history orders the slowest hosts first
                m, ok = run_fleetdiag(fd, fl, args.fanout, sweep_ok, run_fleetdiag.last_tmp)  # type: ignore[attr-defined]
                record(f"{fd_label}, 2nd run (fanout {args.fanout})", m, ok, "history: slowest first")
            if args.fanout_all and n > args.fanout:
                m, ok = run_fleetdiag(fd, fl, n, sweep_ok)
                record(f"{fd_label} (fanout {n})", m, ok, "extra row")
            if sweep_ok and not args.no_warm:  # kept connections: a sweep dials, the next one reuses
                m, ok = warm_sweep(fd, fl, args.fanout)
                # sshd counts a connection's CPU when it closes: the kept ones close after both sweeps
                record(
                    f"{fd_label}, warm (fanout {args.fanout})",
                    m,
                    ok,
                    "kept connections, keeper CPU counted; server CPU: half of the dialling + warm sweeps",
                    0.5,
                )
        if "remote-alone" in wanted:  # the simulated hosts' own work: every host shares these cores
            m, ok = remote_alone(command, mark, n, args.fanout)
            record(f"remote command alone (sh, {args.fanout} at once, no SSH)", m, ok, "the hosts' floor here")
        if "clush" in wanted and clush:
            m = run_measured(
                [
                    clush,
                    "-f",
                    str(args.fanout),
                    "-w",
                    f"h[{1:0{fl.width}d}-{n:0{fl.width}d}]",
                    "-b",
                    "-o",
                    f"-F {fl.ssh_config}",
                    command,
                ],
                timeout=TIMEOUT,
                sample_tree=True,
            )
            record(f"clush -f {args.fanout} -b", m, complete_outputs(m.out, mark))
        if "pssh" in wanted and pssh:
            out = fl.dir / "pssh-out"
            m = run_measured(
                [
                    pssh,
                    "-h",
                    str(fl.dir / "hosts.txt"),
                    "-p",
                    str(args.fanout),
                    "-t",
                    "0",
                    "-x",
                    f"-F {fl.ssh_config}",
                    "-o",
                    str(out),
                    command,
                ],
                timeout=TIMEOUT,
                sample_tree=True,
            )
            ok = sum(complete_outputs(f.read_bytes(), mark) for f in out.glob("*")) if out.exists() else 0
            record(f"parallel-ssh (Debian pssh) -p {args.fanout}", m, ok)
        if "parallel-ssh" in wanted and pssh_py:
            m = run_measured(
                [
                    str(pssh_py),
                    str(Path(__file__).with_name("_pssh_lib.py")),
                    str(lab.sshd.client_key),
                    lab.sshd.user,
                    str(args.fanout),
                    str(cmd_file),
                    *map(str, fl.ports),
                ],
                timeout=TIMEOUT,
                sample_tree=True,
            )
            record(
                f"parallel-ssh (PyPI, libssh2) pool {args.fanout}",
                m,
                complete_outputs(m.out, mark),
                "no host-key check",
            )
        for module in ("raw", "shell"):
            if f"ansible-{module}" in wanted and ansible:
                m = run_ansible(ansible, fl, module, command, args.fanout)
                record(f"ansible -m {module} -f {args.fanout}", m, complete_outputs(m.out, mark))
        if "ssh-loop" in wanted:
            m, ok, note, scale = ssh_loop(lab, fl, command, mark, None if args.full_sequential else args.seq_sample)
            record("sequential ssh loop", m, ok, note, scale)

        summary["sizes"][str(n)] = report(n, results, slowest, fd_label, args)
    if skipped:
        print("\nskipped: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    dump_summary(args.json_out, summary)
    return summary


def remote_alone(command: str, mark: str, n: int, fanout: int) -> tuple[Measured, int]:
    """``n`` runs of the probe's exec command through the local sh, ``fanout`` at once, no SSH:
    what the simulated hosts cost this machine whatever the client (they all share its cores)."""
    import concurrent.futures
    import resource
    import time

    def one(_: int) -> bytes:
        return subprocess.run(["sh", "-c", command], capture_output=True, timeout=TIMEOUT).stdout

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(fanout) as pool:
        outs = list(pool.map(one, range(n)))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    ok = sum(complete_outputs(o, mark) for o in outs)
    return Measured(wall, 0, cpu, 0.0, None, b"", b""), ok


def _keeper_cpu(rt: Path) -> float:
    """CPU seconds of the keeper serving ``rt`` (0 when none runs)."""
    total = 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
            if b"fleetdiag.ssh.keeper" not in argv or str(rt).encode() not in argv:
                continue
            fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def warm_sweep(fd: str, fl: Fleet, fanout: int) -> tuple[Measured, int]:
    """A sweep on kept connections: one sweep dials every host (not measured), the next is; the
    keeper's CPU during the measured one is added to the sweep's own."""
    rt = Path(tempfile.mkdtemp(dir=fl.dir)) / "rt"
    env = {"FLEETDIAG_PERSIST": "10m", "FLEETDIAG_RUNTIME_DIR": str(rt)}
    try:
        run_fleetdiag(fd, fl, fanout, True, extra_env=env)
        before = _keeper_cpu(rt)
        m, ok = run_fleetdiag(fd, fl, fanout, True, extra_env=env)
        m.cpu += _keeper_cpu(rt) - before
        return m, ok
    finally:
        subprocess.run([fd, "connections", "--close"], env=child_env(**env), capture_output=True, timeout=60)


def run_fleetdiag(
    fd: str, fl: Fleet, fanout: int, sweep_ok: bool, tmp: Path | None = None, extra_env: dict | None = None
) -> tuple[Measured, int]:
    """One fleetdiag run; pass the ``tmp`` of an earlier run to sweep again with its history."""
    tmp = tmp or Path(tempfile.mkdtemp(dir=fl.dir))
    base = [fd, "-i", str(fl.inventory)]
    opts = ["--fanout", str(fanout), *fleetdiag_transport_args(fl.lab)]
    env = child_env(FLEETDIAG_DB=str(tmp / "history.sqlite3"), **(extra_env or {}))
    if sweep_ok:  # a first sweep: fresh history, nothing known of the hosts
        report_path = tmp / "report.json"
        m = run_measured(
            base + ["sweep", "all", "--db", str(tmp / "history.sqlite3"), "--report", str(report_path), *opts],
            timeout=TIMEOUT,
            env=env,
            sample_tree=True,
        )
        text = report_path.read_text() if report_path.exists() else "{}"
    else:
        m = run_measured(base + ["probe", "all", "--json", *opts], timeout=TIMEOUT, env=env, sample_tree=True)
        text = m.out.decode() or "{}"
    try:
        hosts = json.loads(text).get("hosts", [])
    except ValueError:
        hosts = []
    ok = sum(
        1 for h in hosts if h.get("verdict") == "failed" and DECISIVE in ((h.get("decisive") or {}).get("line") or "")
    )
    phases = []
    for key in ("connect_ms", "exec_ms", "total_ms"):
        vals = sorted(float((h.get("timing") or {}).get(key) or 0) for h in hosts)
        if vals:
            phases.append(f"{key[:-3]} p50 {vals[len(vals) // 2]:.0f} p90 {vals[len(vals) * 9 // 10]:.0f}")
    if phases:
        print("    per host (ms): " + ", ".join(phases), flush=True)
    if ok < fl.n:
        bad = [h for h in hosts if h.get("verdict") != "failed"][:3]
        print(
            f"    fleetdiag: {ok}/{fl.n} found the decisive error; e.g. "
            f"{[(h.get('host'), h.get('verdict'), h.get('error')) for h in bad]} rc={m.rc} "
            f"{m.err.decode()[-300:]}",
            flush=True,
        )
    run_fleetdiag.last_tmp = tmp  # type: ignore[attr-defined]
    return m, ok


def run_ansible(ansible: str, fl: Fleet, module: str, command: str, fanout: int) -> Measured:
    tmp = Path(tempfile.mkdtemp(dir=fl.dir))
    cfg = tmp / "ansible.cfg"
    cfg.write_text(
        f"[defaults]\nhost_key_checking = True\ninterpreter_python = /usr/bin/python3\nlocal_tmp = {tmp}/local\n"
    )
    env = child_env(
        ANSIBLE_CONFIG=str(cfg),
        ANSIBLE_HOME=str(tmp / "home"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_SSH_CONTROL_PATH_DIR=str(tmp / "cp"),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="0",
    )
    m = run_measured(
        [ansible, "all", "-i", str(fl.dir / "ansible.ini"), "-f", str(fanout), "-m", module, "-a", command],
        timeout=TIMEOUT,
        env=env,
        sample_tree=True,
    )
    end_masters(str(tmp / "cp"))
    return m


def end_masters(control_dir: str) -> None:
    """End the ControlPersist ssh masters ansible left behind (ours: their ControlPath is in our temp dir)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes()
        except OSError:
            continue
        if control_dir.encode() in cmdline and b"ssh" in cmdline.split(b"\0")[0]:
            try:
                os.kill(int(entry.name), signal.SIGTERM)
            except OSError:
                pass


def ssh_loop(lab: Lab, fl: Fleet, command: str, mark: str, per_rtt: int | None) -> tuple[Measured, int, str, float]:
    """One host after another with the OpenSSH client; a sample per RTT, extrapolated, unless per_rtt is None."""
    by_rtt: dict[float, list[int]] = {}
    for i, r in enumerate(fl.rtts):
        by_rtt.setdefault(r, []).append(i)
    chosen = [i for r, idx in by_rtt.items() for i in (idx if per_rtt is None else idx[:per_rtt])]
    walls: dict[float, list[float]] = {}
    ok = cpu = rss = 0.0
    for i in chosen:
        m = run_measured(["ssh", "-F", str(fl.ssh_config), fl.names[i], command], timeout=TIMEOUT)
        walls.setdefault(fl.rtts[i], []).append(m.wall)
        ok += complete_outputs(m.out, mark)
        cpu += m.cpu
        rss = max(rss, m.maxrss_mb)
    total = sum(sum(w) / len(w) * len(by_rtt[r]) for r, w in walls.items())
    scale = fl.n / len(chosen)
    note = "" if per_rtt is None else f"extrapolated from {len(chosen)} hosts"
    return Measured(total, 0, cpu * scale, rss, None, b"", b""), round(ok * scale), note, scale


def report(n: int, results, slowest: float, fd_label: str, args) -> dict:
    """The table for one fleet size, with each run's machine-bound floor.

    All simulated hosts share this machine's cores: a run cannot end before
    its slowest host, nor before (its own CPU + sshd's and the remote
    funnels' CPU + the proxies') / cores. "floor" is the larger of the two.
    """
    cores = os.cpu_count() or 1
    others = [r for r in results if not r[0].startswith(("fleetdiag", "remote"))]
    complete_others = [r[1].wall for r in others if r[2] >= n and not r[1].timed_out]
    best = min(complete_others) if complete_others else float("nan")
    best_name = next((r[0] for r in others if r[1].wall == best), "-")
    rows, out_rows = [], []
    for name, m, ok, note, server in results:
        floor = max(slowest, (m.cpu + server) / cores)
        rows.append(
            [
                name,
                f"{m.wall:.2f}",
                ratio(m.wall, slowest),
                ratio(m.wall, best),
                f"{m.cpu:.1f}",
                f"{m.cpu * 1000 / n:.1f}",
                f"{server:.1f}",
                f"{floor:.1f}",
                ratio(m.wall, floor),
                f"{m.maxrss_mb:.0f}",
                "-" if m.tree_mb is None else f"{m.tree_mb:.0f}",
                f"{ok}/{n}",
                note,
            ]
        )
        out_rows.append(
            {
                "tool": name,
                "wall_s": m.wall,
                "cpu_s": m.cpu,
                "cpu_ms_per_host": m.cpu * 1000 / n,
                "server_cpu_s": server,
                "floor_s": floor,
                "maxrss_mb": m.maxrss_mb,
                "tree_mb": m.tree_mb,
                "own_peaks_mb": m.parts,
                "tree_at_peak_mb": m.at_peak,
                "complete": ok,
                "note": note,
            }
        )
    print(
        f"\n{n} hosts (RTTs 20/240/500 ms in turn, fanout {args.fanout}); slowest host alone {slowest:.2f} s; "
        f"best other tool: {best_name}; {cores} cores (fleetdiag: at most {handshake_bound()} handshakes in "
        f"flight whatever the fanout); load {load_average()}"
    )
    print(
        table(
            [
                "tool",
                "wall s",
                "x slowest alone",
                "x best other",
                "CPU s",
                "CPU ms/host",
                "server CPU s",
                "floor s",
                "x floor",
                "peak RSS MB",
                "tree RSS MB",
                "complete",
                "note",
            ],
            rows,
        )
    )
    out = {"rows": out_rows, "best_other": best_name, "best_other_s": best}
    fd_rows = [r for r in results if r[0].startswith("fleetdiag")]
    if fd_rows:
        name, m, ok, _, server = fd_rows[0]
        out["targets"] = {
            "vs_best_other": m.wall / best if best == best else None,
            "vs_slowest_alone": m.wall / slowest,
            "maxrss_mb": m.maxrss_mb,
            "vs_floor": m.wall / max(slowest, (m.cpu + server) / cores),
        }
        print(f"targets for {name}:")
        print(
            f"  <= 0.80x the best other tool : {m.wall / best:.2f}x  {verdict(m.wall <= 0.8 * best)}"
            if best == best
            else "  <= 0.80x the best other tool : no other tool completed"
        )
        print(f"  <= 1.10x the slowest host alone: {m.wall / slowest:.2f}x  {verdict(m.wall <= 1.1 * slowest)}")
        if n >= 200:
            print(f"  peak RSS <= 200 MB            : {m.maxrss_mb:.0f} MB  {verdict(m.maxrss_mb <= 200)}")
        if ok < n:
            print(f"  (!) only {ok}/{n} hosts gave the decisive error")
    return out


if __name__ == "__main__":
    main()
