"""Shared pieces of the benchmarks: sshd, delay proxies, logs, measuring, tables.

Everything stays on 127.0.0.1: one real OpenSSH ``sshd`` (tests/sshd.py) and
``fleetdiag.delayproxy.DelayProxy`` instances (in a child process, so the
subprocess clients measured here all go through the same proxies).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.sshd import Sshd, ssh_argv, start_sshd  # noqa: E402

SEED_LOG = REPO / "fleetdiag" / "data" / "demo" / "dp_rank.log"
DECISIVE = "AssertionError: DP adjusted local rank 3 is out of bounds"
MB = 1024 * 1024


# --------------------------------------------------------------------------- tools on this machine


def fleetdiag_bin() -> str:
    """The installed console script next to this interpreter (the real CLI, not a shim)."""
    cand = Path(sys.executable).parent / "fleetdiag"
    if cand.exists():
        return str(cand)
    found = shutil.which("fleetdiag")
    if found:
        return found
    sys.exit(
        "fleetdiag is not installed for this interpreter: run `bash scripts/test` "
        "(makes .venv) or `pip install -e .`, then use that venv's python"
    )


def need_sshd() -> None:
    if not os.path.exists("/usr/sbin/sshd") or not shutil.which("ssh"):
        sys.exit(
            "needs OpenSSH: /usr/sbin/sshd and ssh (apt-get install openssh-server openssh-client; "
            "`bash scripts/test` installs them)"
        )


# --------------------------------------------------------------------------- measuring


@dataclass
class Measured:
    """One run of one command: wall time, CPU and peak memory of its process tree."""

    wall: float
    rc: int
    cpu: float  # user+sys seconds of the process and every descendant it reaped
    maxrss_mb: float  # the largest single process in the tree (wait4's ru_maxrss)
    tree_mb: float | None  # the largest sum over the whole tree, sampled (None: not sampled)
    out: bytes
    err: bytes
    timed_out: bool = False
    parts: str = ""  # each process's own peak RSS in the tree, largest first ("fleetdiag 120, spread 45, ...")
    at_peak: str = ""  # the tree at its largest sample, by process ("fleetdiag 90 + spread 4 x 70")


def _tree_rss_kb(root: int, each: dict[int, int] | None = None) -> int:
    """Sum of VmRSS over ``root`` and its descendants, from /proc; ``each`` gets every process's."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        rest = stat[stat.rfind(b")") + 2 :].split()
        pid, ppid = int(entry.name), int(rest[1])
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(rest[21]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    total, todo = 0, [root]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        if each is not None:
            each[p] = rss.get(p, 0)
        todo.extend(children.get(p, ()))
    return total


def _role(pid: int) -> str:
    """A process's short name for ``Measured.parts``: a fleetdiag child by its module, else argv[0]'s name."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    for a in argv:
        if a.startswith(b"fleetdiag."):
            return a.decode(errors="replace").rsplit(".", 1)[-1]
    name = Path(argv[0].decode(errors="replace")).name if argv and argv[0] else "?"
    if name.startswith("python") and len(argv) > 1:
        name = Path(argv[1].decode(errors="replace")).name or name
    return name


# the CLI under cProfile, run as `python -c PROFILED_CLI OUT ARGS...`: its console entry point ends with
# os._exit, which would skip the dump. Process time, so that a host's waits are not counted as its cost.
PROFILED_CLI = """
import cProfile, sys, time
from fleetdiag.cli import main
out = sys.argv.pop(1)
prof = cProfile.Profile(time.process_time)
try:
    prof.runcall(main.main, args=sys.argv[1:], prog_name="fleetdiag")
except BaseException:
    pass
finally:
    prof.dump_stats(out)
"""


def child_env(**extra: str) -> dict[str, str]:
    """The environment for measured commands: as a normal shell has it.

    PYTHONDONTWRITEBYTECODE is dropped so Python tools cache their bytecode
    as they do on a user's machine (with it set, every start recompiles).
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.setdefault("FLEETDIAG_PERSIST", "0")  # fresh connections unless a bench asks for kept ones
    env.update(extra)
    return env


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


GNU_TIME = "/usr/bin/time"


def run_measured(
    argv: Sequence[str],
    *,
    timeout: float = 600,
    env: dict | None = None,
    sample_tree: bool = False,
    cwd: str | None = None,
    stdin: bytes | None = None,
) -> Measured:
    """Run ``argv`` and measure it; output goes to temp files (no pipe can stall it).

    Peak RSS comes from GNU time (``/usr/bin/time -f %M``), a small C
    process: a child forked straight from this Python would inherit its
    ~60 MB high-water mark and report that instead of its own. Without GNU
    time, bench/_rusage.py (a small Python, ~10 MB of bias) stands in.
    """
    with tempfile.TemporaryDirectory(prefix="fleetdiag-bench-m-") as tmp:
        rus = Path(tmp) / "rusage"
        if os.path.exists(GNU_TIME):
            wrapped = [GNU_TIME, "-q", "-f", "%M %U %S", "-o", str(rus), "--", *argv]
        else:
            wrapped = [sys.executable, "-S", str(Path(__file__).with_name("_rusage.py")), str(rus), *argv]
        out = open(Path(tmp) / "out", "w+b")
        err = open(Path(tmp) / "err", "w+b")
        inp = open(Path(tmp) / "in", "w+b")
        if stdin is not None:
            inp.write(stdin)
            inp.seek(0)
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            wrapped,
            stdin=inp if stdin is not None else subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=env if env is not None else child_env(),
            cwd=cwd,
            start_new_session=True,
        )
        peak = [0]
        stop = threading.Event()
        killed = [False]
        own: dict[int, int] = {}  # pid: its largest RSS seen
        roles: dict[int, str] = {}
        at_peak: dict[int, int] = {}

        def sampler() -> None:
            while not stop.wait(0.2):
                try:
                    each: dict[int, int] = {}
                    total = _tree_rss_kb(proc.pid, each)
                    if total > peak[0]:
                        peak[0] = total
                        at_peak.clear()
                        at_peak.update(each)
                    for pid, kb in each.items():
                        if pid not in roles:
                            roles[pid] = _role(pid)
                        own[pid] = max(own.get(pid, 0), kb)
                except (OSError, ValueError, IndexError):
                    pass

        def killer() -> None:
            if not stop.wait(timeout):
                killed[0] = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass

        threads = [threading.Thread(target=killer, daemon=True)]
        if sample_tree:
            threads.append(threading.Thread(target=sampler, daemon=True))
        for t in threads:
            t.start()
        rc = proc.wait()
        wall = time.perf_counter() - t0
        stop.set()
        try:  # anything the command left behind in its session (e.g. an ssh ControlMaster)
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        maxrss_kb, cpu = 0.0, 0.0
        try:
            last = rus.read_text().strip().splitlines()[-1].split()
            maxrss_kb, cpu = float(last[0]), float(last[1]) + float(last[2])
        except (OSError, IndexError, ValueError):
            pass
        for fh in (out, err):
            fh.seek(0)
        result = Measured(
            wall, rc, cpu, maxrss_kb / 1024, peak[0] / 1024 if sample_tree else None, out.read(), err.read(), killed[0]
        )
        for fh in (out, err, inp):
            fh.close()
        big = sorted(((kb, roles.get(pid, "?")) for pid, kb in own.items() if kb >= 10240), reverse=True)
        result.parts = ", ".join(f"{r} {kb / 1024:.0f}" for kb, r in big[:8])
        by_role: dict[str, list[int]] = {}
        for pid, kb in at_peak.items():
            if kb >= 10240:
                by_role.setdefault(roles.get(pid, "?"), []).append(kb)
        result.at_peak = " + ".join(
            f"{r} {len(v)} x {sum(v) / len(v) / 1024:.0f}" if len(v) > 1 else f"{r} {v[0] / 1024:.0f}"
            for r, v in sorted(by_role.items(), key=lambda kv: -sum(kv[1]))
        )
        return result


def median(xs: Iterable[float]) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


# --------------------------------------------------------------------------- sshd and proxies


@dataclass
class Lab:
    """One sshd on 127.0.0.1 plus delay proxies in front of it, in a temp dir."""

    dir: Path
    sshd: Sshd
    proxy_ports: list[int] = field(default_factory=list)
    rtts: list[float] = field(default_factory=list)
    _proxyd: subprocess.Popen | None = None

    @classmethod
    def start(cls, rtts: Sequence[float], prefix: str = "fleetdiag-bench-") -> Lab:
        need_sshd()
        d = Path(tempfile.mkdtemp(prefix=prefix))
        sshd = start_sshd(d / "sshd")
        # FLEETDIAG_BENCH_HOST_NICE: the simulated hosts' sshd (and every session it forks) at this
        # nice value, so that on a machine the hosts oversubscribe the clients measured beside them
        # are not slowed by CPU contention that separate hosts would not cause (the funnel lowers
        # itself to 19 anyway). The proxies keep the clients' priority: they stand for the network.
        host_nice = os.environ.get("FLEETDIAG_BENCH_HOST_NICE")
        if host_nice and sshd.proc is not None:
            os.setpriority(os.PRIO_PROCESS, sshd.proc.pid, int(host_nice))
        lab = cls(d, sshd)
        lab._start_proxies(list(rtts))
        return lab

    def _start_proxies(self, rtts: list[float]) -> None:
        self._proxyd = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("_proxyd.py")), str(self.sshd.port), *map(str, rtts)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        assert self._proxyd.stdout is not None
        line = self._proxyd.stdout.readline()
        if not line:
            raise RuntimeError("delay proxies did not start")
        self.proxy_ports = json.loads(line)["ports"]
        self.rtts = rtts
        with open(self.sshd.known_hosts, "a") as fh:  # vouch for the sshd's key on every proxy port
            for port in self.proxy_ports:
                fh.write(f"[127.0.0.1]:{port} {self.sshd.host_pub}\n")

    def _ask(self, cmd: str) -> dict:
        assert self._proxyd is not None and self._proxyd.stdin and self._proxyd.stdout
        self._proxyd.stdin.write(cmd + "\n")
        self._proxyd.stdin.flush()
        return json.loads(self._proxyd.stdout.readline())

    def reset_counts(self) -> None:
        self._ask("reset")

    def exchanges(self) -> list[int]:
        return self._ask("stats")["exchanges"]

    def server_cpu(self) -> float:
        """CPU seconds spent so far by sshd's finished connections (and all they ran) plus the proxies.

        sshd -D reaps every connection's processes, and each of those reaps
        the shell and the funnel's grep/awk: the listener's cutime+cstime is
        the remote side's CPU. The proxies' own CPU is added: on this one
        machine it competes with the tools too.
        """
        tck = os.sysconf("SC_CLK_TCK")
        total = 0.0
        # /proc/PID/stat fields (1-based): 14 utime, 15 stime, 16 cutime, 17 cstime
        for pid, fields in (
            (self.sshd.proc.pid if self.sshd.proc else None, (14, 15, 16, 17)),
            (self._proxyd.pid if self._proxyd else None, (14, 15)),
        ):
            if pid is None:
                continue
            try:
                raw = Path(f"/proc/{pid}/stat").read_bytes()
            except OSError:
                continue
            rest = raw[raw.rfind(b")") + 2 :].split()
            total += sum(int(rest[k - 3]) for k in fields) / tck  # rest[0] is field 3
        return total

    def wait_idle(self, timeout: float = 20.0) -> bool:
        """Wait (bounded) until sshd has no connection left, so its CPU count is complete."""
        if not self.sshd.proc:
            return True
        me = str(self.sshd.proc.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            busy = False
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                try:
                    raw = Path(f"/proc/{entry.name}/stat").read_bytes()
                except OSError:
                    continue
                if raw[raw.rfind(b")") + 2 :].split()[1].decode() == me:
                    busy = True
                    break
            if not busy:
                return True
            time.sleep(0.2)
        return False

    def ssh_base(self, port: int) -> list[str]:
        """OpenSSH client argv for one proxy port (tests/sshd.py's ssh_argv: fresh connection, no ControlMaster)."""
        return ssh_argv(self.sshd, port)

    def write_ssh_config(self, path: Path, names: Sequence[str], ports: Sequence[int], pin_kex: bool) -> Path:
        """One ``Host`` block per simulated host, for every OpenSSH-based tool (and fleetdiag)."""
        lines = []
        for name, port in zip(names, ports):
            lines += [f"Host {name}", "    HostName 127.0.0.1", f"    Port {port}"]
        lines += [
            "Host *",
            f"    User {self.sshd.user}",
            f"    IdentityFile {self.sshd.client_key}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {self.sshd.known_hosts}",
            "    StrictHostKeyChecking yes",
            "    BatchMode yes",
            "    ControlMaster no",
            "    ConnectTimeout 30",
        ]
        if pin_kex:
            lines.append("    KexAlgorithms curve25519-sha256")
        path.write_text("\n".join(lines) + "\n")
        return path

    def stop(self) -> None:
        if self._proxyd is not None and self._proxyd.poll() is None:
            try:
                assert self._proxyd.stdin is not None
                self._proxyd.stdin.close()
                self._proxyd.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self._proxyd.kill()
        self.sshd.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def host_path() -> str | None:
    """``FLEETDIAG_BENCH_HOST_PATH``: a directory the simulated hosts search first for their tools,
    sent as the probe's own ``path_prepend`` by every tool (scale_device.sh puts the nvidia-smi
    stand-in there: bench/_simhost_nvidia_smi.sh)."""
    return os.environ.get("FLEETDIAG_BENCH_HOST_PATH") or None


def write_inventory(path: Path, lab: Lab, hosts: Sequence[tuple[str, int]], log: Path) -> Path:
    """A native fleetdiag inventory: each host is 127.0.0.1 on its own proxy port."""
    lines = ["hosts:"]
    extra = [f"    path_prepend: {json.dumps(host_path())}"] if host_path() else []
    for name, port in hosts:
        lines += [
            f"  {name}:",
            "    address: 127.0.0.1",
            f"    port: {port}",
            f"    user: {lab.sshd.user}",
            *extra,
            "    logs:",
            f"      vllm: {json.dumps(str(log))}",
        ]
    path.write_text("\n".join(lines) + "\n")
    return path


def fleetdiag_transport_args(lab: Lab) -> list[str]:
    return ["--known-hosts", str(lab.sshd.known_hosts), "--identity", str(lab.sshd.client_key)]


# --------------------------------------------------------------------------- logs

_WORDS = (
    "the model answer request token batch cache prefix user system assistant tool call json schema "
    "summary translate code review function python table value list number date city river book "
    "write explain compare describe plan steps short long first second final draft reply"
).split()
_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")


def _noise_chunk(size: int, rng: random.Random, pid: int = 5123) -> bytes:
    """~``size`` bytes of a busy vLLM server's INFO chatter (no error-shaped lines)."""
    out: list[str] = []
    n = 0
    t = 14 * 3600
    files = ("loggers.py:127", "logger.py:43", "async_llm.py:261", "launcher.py:86", "metrics.py:88")
    while n < size:
        t += rng.random() * 0.2
        ts = f"05-09 {int(t // 3600) % 24:02d}:{int(t // 60) % 60:02d}:{int(t) % 60:02d}"
        r = rng.random()
        rid = f"chatcmpl-{rng.getrandbits(128):032x}"
        if r < 0.35:
            line = (
                f"(APIServer pid={pid}) INFO:     127.0.0.1:{rng.randint(30000, 60999)} - "
                f'"{"POST" if rng.random() < 0.9 else "GET"} {rng.choice(_ROUTES)} HTTP/1.1" 200 OK'
            )
        elif r < 0.65:
            prompt = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 60)))
            line = (
                f"(APIServer pid={pid}) INFO {ts} [{files[1]}] Received request {rid}: prompt: "
                f"'<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n', params: SamplingParams("
                f"n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, temperature=0.7, "
                f"top_p=0.8, top_k=20, min_p=0.0, seed=None, stop=[], stop_token_ids=[], "
                f"max_tokens={rng.choice((256, 512, 1024, 2048))}, min_tokens=0, logprobs=None, "
                f"skip_special_tokens=True), prompt_token_ids: None, lora_request: None."
            )
        elif r < 0.9:
            line = f"(APIServer pid={pid}) INFO {ts} [{files[2]}] Added request {rid}."
        elif r < 0.99:
            line = (
                f"(APIServer pid={pid}) INFO {ts} [{files[0]}] Engine 000: Avg prompt throughput: "
                f"{rng.uniform(200, 4000):.1f} tokens/s, Avg generation throughput: {rng.uniform(50, 900):.1f} "
                f"tokens/s, Running: {rng.randint(0, 64)} reqs, Waiting: {rng.randint(0, 8)} reqs, "
                f"GPU KV cache usage: {rng.uniform(0, 90):.1f}%, Prefix cache hit rate: {rng.uniform(0, 80):.1f}%"
            )
        else:
            line = (
                f"(APIServer pid={pid}) WARNING {ts} [protocol.py:93] The following fields were present "
                f"in the request but ignored: {{'stream_options'}}"
            )
        out.append(line)
        n += len(line) + 1
    return ("\n".join(out) + "\n").encode()


_HEADER = """INFO 05-08 09:12:40 [__init__.py:239] Automatically detected platform cuda.
(APIServer pid=5123) INFO 05-08 09:12:44 [api_server.py:1880] vLLM API server version 0.20.1
(APIServer pid=5123) INFO 05-08 09:12:44 [utils.py:328] non-default args: {'model_tag': 'Qwen/Qwen3.6-27B', 'port': 8000, 'model': 'Qwen/Qwen3.6-27B', 'max_model_len': 8192, 'tensor_parallel_size': 2}
(EngineCore_DP0 pid=5301) INFO 05-08 09:13:55 [gpu_worker.py:298] Available KV cache memory: 31.42 GiB
(APIServer pid=5123) INFO 05-08 09:14:20 [api_server.py:1950] Starting vLLM API server 0 on http://0.0.0.0:8000
"""


def write_log(path: Path, total_bytes: int, failure: Path = SEED_LOG, seed: int = 7) -> Path:
    """The seeds' failure log at the end of ``total_bytes`` of an earlier, healthy run's chatter.

    An 8 MiB block of varied noise is generated once and repeated, so a 1 GB
    file takes seconds to write.
    """
    rng = random.Random(seed)
    fail = failure.read_bytes()
    block = _noise_chunk(min(8 * MB, max(64 * 1024, total_bytes)), rng)
    left = total_bytes - len(fail) - len(_HEADER)
    with open(path, "wb") as fh:
        fh.write(_HEADER.encode())
        while left > 0:
            piece = block if left >= len(block) else block[: block.rfind(b"\n", 0, left) + 1]
            if not piece:
                break
            fh.write(piece)
            left -= len(piece)
        fh.write(fail)
    return path


def warm(path: Path, times: int = 2) -> None:
    """Read a file through the page cache so every tool starts from the same, warm state."""
    for _ in range(times):
        with open(path, "rb") as fh:
            while fh.read(8 * MB):
                pass


# --------------------------------------------------------------------------- output


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]

    def fmt(r: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))

    return "\n".join([fmt(headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells])


def ratio(a: float, b: float) -> str:
    if not b or b != b or a != a:
        return "-"
    return f"{a / b:.2f}x"


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def dump_summary(path: str | None, data: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(data, indent=2))


# --------------------------------------------------------------------------- the funnel, for other tools


def funnel_command(log: str, facts: bool = True) -> tuple[str, str]:
    """The exec command probe_host sends for ``log`` (funnel + facts + kernel part + clock), and
    its marker: ``fleetdiag.probe.probe_command``, the very builder the probe uses, so other
    tools run the same remote work. ``facts=False``: the funnel alone."""
    from fleetdiag.analysis import load_rules
    from fleetdiag.inventory import Host
    from fleetdiag.inventory.model import LogSource
    from fleetdiag.probe import ProbeSettings, probe_command

    settings = ProbeSettings(facts=facts, kernel=facts, path_prepend=host_path())
    return probe_command(Host(name="bench"), LogSource("file", log), log, settings, load_rules())


@dataclass
class FunnelLab:
    """What a fleet bench sends: the warmed log every simulated host reads, the probe's exec command
    for it (also written to ``command_file`` for tools that read a file) and its marker."""

    log: Path
    command: str
    mark: str
    command_file: Path


def funnel_lab(directory: Path, log_mb: float) -> FunnelLab:
    log = write_log(directory / "vllm.log", int(log_mb * MB))
    warm(log)
    command, mark = funnel_command(str(log))
    cmd_file = directory / "command.sh"
    cmd_file.write_text(command)
    return FunnelLab(log, command, mark, cmd_file)


def complete_outputs(text: bytes | str, mark: str) -> int:
    """How many hosts' funnel output arrived whole (each ends with its end marker)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return text.count(f"{mark} end")
