"""Where each process of a stalled job waits: py-spy stacks, else /proc thread states.

Parses what ``fleetdiag/remote/stacks.sh`` sends (py-spy ``dump`` in its plain, ``--native`` or ``--json``
form, the /proc view of every thread) and names the wait: a collective or CUDA sync (the NCCL call is
asynchronous, so a rank stuck in a collective shows the next sync point, e.g. ``cuStreamSynchronize`` under
``.item()``), the data loader, a sleep, a socket, a lock, a queue, a child process. A rank outside any
collective while its peers wait in one is the straggler.

Pure: text in, dataclasses and ``evidence`` entries out (the shape of ``correlate.evidence``).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from .kernel import bus_key

# kinds, in the order they win: a high-level wait anywhere in the stack beats a low-level one inside it
# (the data loader's queue get ends in a lock; a collective's sync ends in a futex)
COLLECTIVE, DATA_LOADER, CHECKPOINT, COMPILE = "collective", "data-loader", "checkpoint", "compile"
QUEUE, CHILD, SOCKET, SLEEP, LOCK, IO = "queue", "child", "socket", "sleep", "lock", "io"
EVENT_LOOP = "event-loop"
RUNNING, STOPPED, ZOMBIE, UNKNOWN = "running", "stopped", "zombie", "unknown"

WHAT = {
    COLLECTIVE: "in a collective / CUDA sync",
    DATA_LOADER: "in the data loader",
    CHECKPOINT: "writing a checkpoint",
    COMPILE: "compiling (torch.compile)",
    QUEUE: "waiting on a queue (another process or thread must put)",
    CHILD: "waiting for a child process",
    EVENT_LOOP: "idle in its event loop (asyncio: waiting for I/O or a task)",
    SOCKET: "waiting on a socket (network I/O)",
    SLEEP: "sleeping",
    LOCK: "waiting on a lock / event",
    IO: "in uninterruptible I/O (disk, network file system or a driver)",
    RUNNING: "running on the CPU",
    STOPPED: "stopped (SIGSTOP or a tracer)",
    ZOMBIE: "exited, not yet reaped (zombie)",
    UNKNOWN: "waiting (where is unknown)",
}

_R = re.compile
# (kind, pattern on a frame's name, pattern on its file or library or None)
_RULES: list[tuple[str, re.Pattern[str], re.Pattern[str] | None]] = [
    (
        COLLECTIVE,
        _R(
            r"(?:^|[.:_])(?:all_reduce|allreduce|all_gather\w*|reduce_scatter\w*|broadcast\w*|barrier"
            r"|monitored_barrier|all_to_all\w*|_all_gather_base|reduce|send|recv|isend|irecv"
            r"|batch_isend_irecv|wait_tensor|_wait_for_pending_works)$"
        ),
        _R(r"distributed|c10d|nccl"),
    ),
    (COLLECTIVE, _R(r"nccl\w+|c10d::\w+.*wait|ProcessGroupNCCL|WorkNCCL|ncclGroupEnd|ncclCommInitRank"), None),
    (
        COLLECTIVE,
        _R(
            r"cuStreamSynchronize|cudaStreamSynchronize|cudaDeviceSynchronize|cuCtxSynchronize"
            r"|cudaEventSynchronize|cuEventSynchronize|cudaStreamWaitEvent|_local_scalar_dense"
            r"|cudaMemcpy$|cuMemcpyDtoH\w*|hipStreamSynchronize|hipDeviceSynchronize"
        ),
        None,
    ),
    (COLLECTIVE, _R(r"(?:^|\.)synchronize$"), _R(r"cuda|torch")),
    (
        DATA_LOADER,
        _R(r"_next_data|_get_data|_try_get_data|_next_index|fetch$|__next__"),
        _R(r"dataloader|_utils/fetch|data/"),
    ),
    (DATA_LOADER, _R(r"_MultiProcessingDataLoaderIter|_SingleProcessDataLoaderIter|DataLoader"), None),
    (
        CHECKPOINT,
        _R(
            r"save_checkpoint|save_state_dict|save_pretrained|save_model|_save$|_legacy_save|_write_file"
            r"|save_file$|_save_to_disk"
        ),
        _R(r"serialization|checkpoint|safetensors|trainer|save"),
    ),
    (COMPILE, _R(r"compile_fx|_compile|compile_inner|codegen|async_compile"), _R(r"_dynamo|_inductor")),
    (QUEUE, _R(r"(?:^|\.)get$|(?:^|\.)_recv_bytes$|(?:^|\.)poll$"), _R(r"queue|connection\.py|queues\.py")),
    (QUEUE, _R(r"acquire_read|dequeue|recv_pyobj|recv_multipart"), _R(r"shm_broadcast|zmq|message_queue")),
    (
        CHILD,
        _R(r"(?:^|\.)(?:wait|_wait|join|_try_wait|waitpid|communicate)$"),
        _R(r"subprocess|popen_|multiprocessing/process|process\.py"),
    ),
    (CHILD, _R(r"^(?:waitpid|wait4|__wait4|waitid)$"), None),
    (EVENT_LOOP, _R(r"(?:^|\.)(?:_run_once|run_forever|run_until_complete)$"), _R(r"asyncio|uvloop")),
    (
        SOCKET,
        _R(
            r"(?:^|[._])(?:recv|recv_into|recvfrom|recvmsg|accept|connect|readinto|sendall|select|poll"
            r"|epoll_wait|epoll_pwait|__poll|ppoll|pselect6?)$"
        ),
        None,
    ),
    (SLEEP, _R(r"^(?:clock_nanosleep|nanosleep|__nanosleep|usleep|sleep|time\.sleep|pysleep|time_sleep)$"), None),
    (SLEEP, _R(r"(?:^|\.)sleep$"), None),
    (LOCK, _R(r"(?:^|\.)(?:wait|acquire|join|_wait_for_tstate_lock)$"), _R(r"threading|synchronize\.py")),
    (
        LOCK,
        _R(
            r"PyThread_acquire_lock\w*|pthread_cond_\w*wait|__futex_abstimed_wait\w*|futex_wait\w*"
            r"|sem_(?:timed)?wait|lock_PyThread_acquire_lock|take_gil|PyCOND_WAIT"
        ),
        None,
    ),
]

# wchan -> kind, for the fallback without py-spy
_WCHAN: list[tuple[re.Pattern[str], str]] = [
    (_R(r"nanosleep|hrtimer_|schedule_timeout$|msleep"), SLEEP),
    (_R(r"futex"), LOCK),
    (_R(r"sk_wait|inet_csk_accept|tcp_|unix_stream|sock_|udp_|skb_"), SOCKET),
    (_R(r"epoll|poll_schedule|do_select|core_sys_select|do_sys_poll"), SOCKET),
    (_R(r"do_wait|kernel_wait|wait_consider"), CHILD),
    (_R(r"pipe_|wait_woken"), QUEUE),
    (_R(r"nvidia|nv_|uvm_|os_acquire|_nv\d"), IO),
]

_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {
    "threading",
    "queue",
    "socket",
    "selectors",
    "subprocess",
    "multiprocessing",
    "asyncio",
}


@dataclass
class Frame:
    """One frame, innermost first in a thread's list. Python frames have a line; native ones a library."""

    name: str
    file: str | None = None  # short file name (Python) or library (native)
    line: int | None = None
    path: str | None = None  # the full file name, where py-spy gives it (JSON)

    @property
    def native(self) -> bool:
        return self.line is None

    def __str__(self) -> str:
        if self.line is not None:
            return f"{self.name} ({self.file}:{self.line})"
        return self.name


@dataclass
class ThreadStack:
    """A thread as py-spy sees it."""

    tid: int | None
    name: str | None
    active: bool | None
    frames: list[Frame] = field(default_factory=list)


@dataclass
class ThreadState:
    """A thread as /proc sees it: state letter (R S D T Z ...) and kernel wait channel."""

    tid: int
    state: str
    wchan: str | None  # None: not readable ("0" for a non-running thread also means hidden)
    comm: str = ""


@dataclass
class Wait:
    """Where a process waits, and how we know."""

    kind: str
    what: str  # the phrase for the card
    at: str | None = None  # the frame or wchan that tells
    where: str | None = None  # the innermost frame of the program itself (not the standard library)
    via: str = "py-spy"  # py-spy | wchan


@dataclass
class ProcStack:
    """One process: its py-spy stacks, its /proc view, its rank."""

    pid: int
    cmdline: str = ""
    state: str | None = None
    ppid: int | None = None
    wchan: str | None = None
    gpu_fds: int | None = None
    syscall: int | None = None  # the main thread's syscall number (/proc/PID/syscall), arch-specific
    env: dict[str, str] = field(default_factory=dict)
    pyspy_status: str | None = None  # ok | denied | failed | timeout | None (not run)
    pyspy_mode: str | None = None  # native | plain | json
    pyspy_error: str | None = None
    threads: list[ThreadStack] = field(default_factory=list)
    tstates: list[ThreadState] = field(default_factory=list)
    thread_count: int | None = None
    gone: bool = False
    arch: str | None = None

    @property
    def rank(self) -> int | None:
        for k in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
            if self.env.get(k, "").isdigit():
                return int(self.env[k])
        m = re.search(r"--(?:global[_-])?rank[= ](\d+)", self.cmdline)
        return int(m.group(1)) if m else None

    @property
    def local_rank(self) -> int | None:
        for k in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"):
            if self.env.get(k, "").isdigit():
                return int(self.env[k])
        m = re.search(r"--local[_-]rank[= ](\d+)", self.cmdline)
        return int(m.group(1)) if m else None

    @property
    def gpu(self) -> int | None:
        """The GPU index it uses: a single CUDA_VISIBLE_DEVICES entry, else torchrun's device = local rank."""
        cvd = self.env.get("CUDA_VISIBLE_DEVICES")
        if cvd is not None:
            return int(cvd) if cvd.isdigit() else None
        return self.local_rank

    def main_thread(self) -> ThreadStack | None:
        for t in self.threads:
            if t.tid == self.pid or t.name == "MainThread":
                return t
        return self.threads[0] if self.threads else None


@dataclass
class GpuUse:
    """One GPU while the job is stalled: a rank spinning in NCCL keeps its GPU at 100 %, a straggler's idles."""

    index: int
    bus: str | None
    util: float | None  # percent


@dataclass
class StackReport:
    """Everything one run of stacks.sh said about one host."""

    now: float | None = None
    uid: int | None = None
    user: str | None = None
    pyspy: str | None = None  # its path, None when absent
    ptrace_scope: str | None = None
    arch: str | None = None  # uname -m: which syscall table /proc/PID/syscall numbers are in
    found: int | None = None  # processes found when no PIDs were given
    procs: list[ProcStack] = field(default_factory=list)
    gpus: list[GpuUse] = field(default_factory=list)
    gpu_of_pid: dict[int, int] = field(default_factory=dict)  # from nvidia-smi's compute apps
    gpu_error: str | None = None  # what nvidia-smi said instead of a table

    def util_of_pid(self, pid: int) -> float | None:
        idx = self.gpu_of_pid.get(pid)
        return next((g.util for g in self.gpus if g.index == idx), None) if idx is not None else None

    def notes(self) -> list[str]:
        """Facts for the card: py-spy missing, ptrace refused (with the fix), processes gone."""
        out: list[str] = []
        if self.pyspy is None:
            out.append(
                "py-spy is not installed on this host (pip install py-spy): "
                "where each process waits comes from /proc wchan and thread states"
            )
        denied = [p.pid for p in self.procs if p.pyspy_status == "denied"]
        if denied:
            scope = (
                f"kernel.yama.ptrace_scope={self.ptrace_scope}" if self.ptrace_scope not in (None, "-") else "ptrace"
            )
            who = f" as {self.user}" if self.user else ""
            out.append(
                f"ptrace not permitted{who} for pid {', '.join(map(str, denied))} ({scope}): py-spy cannot "
                "read the stacks; run fleetdiag as the job's user with ptrace_scope 0, or as root "
                "(CAP_SYS_PTRACE); fell back to /proc wchan and thread states"
            )
        for p in self.procs:
            if p.pyspy_status in ("failed", "timeout"):
                out.append(
                    f"py-spy {p.pyspy_status} on pid {p.pid}"
                    + (f": {p.pyspy_error}" if p.pyspy_error else "")
                    + "; fell back to /proc"
                )
        gone = [p.pid for p in self.procs if p.gone]
        if gone:
            out.append(f"pid {', '.join(map(str, gone))} exited before its stack was read")
        if self.gpu_error:
            out.append(f"nvidia-smi: {self.gpu_error}")
        if self.found == 0:
            out.append("no Python/torchrun/vLLM/SGLang/Ray process found on this host")
        return out


# ---------------------------------------------------------------- py-spy output

_THREAD = _R(r'^Thread (?P<tid>0x[0-9A-Fa-f]+|\d+) \((?P<st>[a-z+]+)\)(?:: "(?P<name>[^"]*)")?')
_PYLOC = _R(r"^(?P<file>.+):(?P<line>\d+)$")


def _frame(text: str) -> Frame | None:
    text = text.strip()
    if not text.endswith(")") or " (" not in text:
        return Frame(text) if text else None
    i = text.rfind(" (")
    name, loc = text[:i], text[i + 2 : -1]
    m = _PYLOC.match(loc)
    if m:
        return Frame(name, m.group("file"), int(m.group("line")))
    return Frame(name, loc)


def parse_pyspy(text: str) -> list[ThreadStack]:
    """py-spy ``dump`` plain or ``--native`` output → threads, frames innermost first."""
    if text.lstrip().startswith("["):
        return parse_pyspy_json(text)
    out: list[ThreadStack] = []
    cur: ThreadStack | None = None
    for raw in text.splitlines():
        m = _THREAD.match(raw)
        if m:
            tid = m.group("tid")
            cur = ThreadStack(
                int(tid, 16) if tid.startswith("0x") else int(tid), m.group("name"), m.group("st").startswith("active")
            )
            out.append(cur)
            continue
        if cur is None or not raw.startswith("    "):
            continue
        if raw.startswith("        "):  # --locals: arguments and locals under a frame
            continue
        f = _frame(raw)
        if f is not None:
            cur.frames.append(f)
    return out


def parse_pyspy_json(text: str) -> list[ThreadStack]:
    """py-spy ``dump --json`` output → threads. Unparsable JSON gives no threads."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    out: list[ThreadStack] = []
    for t in data if isinstance(data, list) else []:
        if not isinstance(t, dict):
            continue
        frames = []
        for f in t.get("frames") or []:
            if isinstance(f, dict) and f.get("name"):
                line = f.get("line")
                frames.append(
                    Frame(
                        str(f["name"]),
                        f.get("short_filename") or f.get("filename"),
                        int(line) if isinstance(line, int) and line > 0 else None,
                        f.get("filename"),
                    )
                )
        tid = t.get("os_thread_id") or t.get("thread_id")
        out.append(
            ThreadStack(
                int(tid) if isinstance(tid, int) else None,
                t.get("thread_name"),
                bool(t.get("active")) if t.get("active") is not None else None,
                frames,
            )
        )
    return out


# ---------------------------------------------------------------- stacks.sh output

_KV = _R(r"(\w+)=(\S*)")


def _kv(s: str) -> dict[str, str]:
    return dict(_KV.findall(s))


def _int(s: str | None) -> int | None:
    return int(s) if s is not None and s.lstrip("-").isdigit() else None


def parse_stacks(output: str) -> StackReport:
    """The whole output of ``fd_stacks_main`` → a :class:`StackReport`. Tolerates cut output."""
    rep = StackReport()
    cur: ProcStack | None = None
    mode: str | None = None  # "pyspy" | "threads" while inside a section
    buf: list[str] = []
    for raw in output.splitlines():
        if raw.startswith("@@fd_stacks_"):
            tag, _, rest = raw[len("@@fd_stacks_") :].partition(" ")
            kv = _kv(rest)
            if tag == "start":
                rep.now = float(kv["now"]) if _int(kv.get("now")) is not None else None
                rep.uid = _int(kv.get("uid"))
                rep.user = kv.get("user") or None
                rep.pyspy = None if kv.get("pyspy") in (None, "", "absent") else kv["pyspy"]
                rep.ptrace_scope = kv.get("ptrace_scope")
                rep.arch = kv.get("arch") or None
            elif tag == "found":
                rep.found = _int(kv.get("count"))
            elif tag == "proc":
                cur = ProcStack(
                    pid=int(kv["pid"]),
                    state=kv.get("state"),
                    ppid=_int(kv.get("ppid")),
                    wchan=None if kv.get("wchan") in (None, "-") else kv["wchan"],
                    gpu_fds=_int(kv.get("gpu_fds")),
                    syscall=_int(kv.get("syscall")),
                )
                rep.procs.append(cur)
            elif tag in ("gpus", "apps"):
                mode, cur = tag, None
            elif tag == "gpus_end":
                mode = None
            elif tag == "gone" and _int(kv.get("pid")) is not None:
                rep.procs.append(ProcStack(pid=int(kv["pid"]), gone=True))
            elif cur is None:
                continue
            elif tag == "cmdline":
                cur.cmdline = rest.strip()
            elif tag == "environ":
                cur.env = {k: v for k, v in (w.split("=", 1) for w in rest.split() if "=" in w)}
            elif tag == "pyspy":
                mode, buf = "pyspy", []
                cur.pyspy_mode = kv.get("mode")
            elif tag == "pyspy_end":
                text = "\n".join(buf)
                cur.pyspy_status = kv.get("status") or "failed"
                if cur.pyspy_status == "ok":
                    cur.threads = parse_pyspy(text)
                    if text.lstrip().startswith("["):
                        cur.pyspy_mode = "json"
                else:
                    first = next((ln.strip() for ln in buf if ln.strip()), "")
                    cur.pyspy_error = first[:200] or None
                mode = None
            elif tag == "threads":
                mode = "threads"
            elif tag == "threads_end":
                cur.thread_count = _int(kv.get("count"))
                mode = None
            continue
        if mode in ("gpus", "apps"):
            _gpu_row(rep, mode, raw)
            continue
        if cur is None:
            continue
        if mode == "pyspy":
            buf.append(raw)
        elif mode == "threads":
            parts = raw.split(" ", 3)
            if len(parts) >= 3 and parts[0].isdigit():
                cur.tstates.append(
                    ThreadState(
                        int(parts[0]),
                        parts[1],
                        None if parts[2] == "-" else parts[2],
                        parts[3] if len(parts) > 3 else "",
                    )
                )
    for p in rep.procs:
        p.arch = rep.arch
    return rep


# /proc/PID/syscall numbers of the waits that tell a rank's place apart (the main thread's), per arch
_SYSCALLS: dict[str, dict[int, str]] = {
    "x86_64": {202: "futex", 230: "clock_nanosleep", 35: "nanosleep", 0: "read", 17: "pread64", 45: "recvfrom"},
    "aarch64": {98: "futex", 115: "clock_nanosleep", 101: "nanosleep", 63: "read", 67: "pread64", 207: "recvfrom"},
}
# threads a communication library starts in each rank: a process that has them is a rank of a collective job
COMM_THREAD = _R(r"^(?:gloo_tcp_loop|pt_gloo_runloop|pt_nccl_\w+|ncclProxy\w*)")


def syscall_name(p: ProcStack) -> str | None:
    """The main thread's syscall by name, where the host's arch is known."""
    if p.syscall is None:
        return None
    return _SYSCALLS.get(p.arch or "", {}).get(p.syscall)


def comm_threads(p: ProcStack) -> list[str]:
    """The names of the process's communication-library threads (gloo, NCCL)."""
    return sorted({s.comm for s in p.tstates if COMM_THREAD.match(s.comm or "")})


def _gpu_row(rep: StackReport, mode: str, raw: str) -> None:
    """One nvidia-smi CSV row (noheader): 'index, bus, util' or 'pid, bus'; anything else is its error."""
    cells = [c.strip() for c in raw.split(",")]
    if mode == "gpus" and len(cells) == 3 and cells[0].isdigit():
        util = cells[2].rstrip(" %")
        rep.gpus.append(GpuUse(int(cells[0]), cells[1], float(util) if util.replace(".", "", 1).isdigit() else None))
    elif mode == "apps" and len(cells) == 2 and cells[0].isdigit():
        key = bus_key(cells[1])
        idx = next((g.index for g in rep.gpus if key is not None and bus_key(g.bus) == key), None)
        if idx is not None:
            rep.gpu_of_pid[int(cells[0])] = idx
    elif raw.strip() and rep.gpu_error is None and not raw.lstrip().startswith("No running"):
        rep.gpu_error = raw.strip()[:200]


# ---------------------------------------------------------------- naming the wait


def _module_root(f: Frame) -> str:
    name = (f.file or "").replace("\\", "/")
    return name.split("/", 1)[0].removesuffix(".py")


def _is_own(f: Frame) -> bool:
    """A Python frame of the program or its libraries, not the standard library's."""
    if f.native:
        return False
    if f.path and ("/lib/python" in f.path and "-packages/" not in f.path):
        return False  # the interpreter's own library, by its full path
    return _module_root(f) not in _STDLIB


def _classify(frames: list[Frame]) -> tuple[str, Frame] | None:
    for kind, name_rx, file_rx in _RULES:
        for f in frames:
            if name_rx.search(f.name) and (
                file_rx is None or file_rx.search(f.file or "") or file_rx.search(f.path or "")
            ):
                return kind, f
    return None


def _from_wchan(state: str | None, wchan: str | None) -> tuple[str, str | None]:
    st = (state or "?")[:1]
    if st == "R":
        return RUNNING, None
    if st == "D":
        return IO, wchan
    if st in ("T", "t"):
        return STOPPED, wchan
    if st in ("Z", "X"):
        return ZOMBIE, None
    if wchan and wchan != "0":
        for rx, kind in _WCHAN:
            if rx.search(wchan):
                return kind, wchan
        return UNKNOWN, wchan
    return UNKNOWN, None


def _outer_own(frames: list[Frame], idx: int, f: Frame) -> Frame | None:
    """The program's frame that called into the telling one: outward, outside the telling frame's folder
    (torch's all_reduce wrapper is not where the program waits; the training loop that called it is)."""

    def folder(g: Frame) -> str:
        return (g.file or "").rsplit("/", 1)[0]

    here = None if f.native else folder(f)
    later = [g for g in frames[idx + 1 :] if _is_own(g)]
    return next((g for g in later if here is None or folder(g) != here), later[0] if later else None)


def where_waits(p: ProcStack) -> Wait:
    """Name where one process waits: the py-spy stack of its main thread, else its main thread's wchan."""
    t = p.main_thread()
    if t is not None and t.frames:
        own = next((f for f in t.frames if _is_own(f)), None)
        hit = _classify(t.frames)
        if hit is not None:
            kind, f = hit
            outer = _outer_own(t.frames, t.frames.index(f), f)
            return Wait(kind, WHAT[kind], f.name, str(outer) if outer else None, "py-spy")
        if t.active:
            return Wait(RUNNING, WHAT[RUNNING], None, str(own or t.frames[0]), "py-spy")
        # idle in Python code that names nothing: the kernel says what it waits on
        main = next((s for s in p.tstates if s.tid == p.pid), None)
        kind, at = _from_wchan(main.state if main else p.state, main.wchan if main else p.wchan)
        if kind == UNKNOWN:
            return Wait(UNKNOWN, "idle", at, str(own or t.frames[0]), "py-spy")
        return Wait(kind, WHAT[kind], at, str(own or t.frames[0]), "py-spy+wchan")
    main = next((s for s in p.tstates if s.tid == p.pid), None)
    kind, at = _from_wchan(main.state if main else p.state, main.wchan if main else p.wchan)
    w = Wait(kind, WHAT[kind], at, None, "wchan")
    sc = syscall_name(p)
    comm = comm_threads(p)
    if sc in ("clock_nanosleep", "nanosleep") and kind in (UNKNOWN, LOCK, SLEEP):
        return Wait(SLEEP, WHAT[SLEEP] + f" (main thread in {sc})", at or sc, None, "wchan")
    if sc in ("read", "recvfrom", "pread64") and kind in (UNKNOWN, QUEUE, SOCKET, LOCK):
        kind = SOCKET if sc == "recvfrom" else QUEUE
        return Wait(kind, WHAT[kind] + f" (main thread in {sc})", at or sc, None, "wchan")
    futex = sc == "futex" or (sc is None and "futex" in str(at or ""))
    if futex and comm and kind in (UNKNOWN, LOCK):
        # a rank's main thread blocked on a futex while its gloo/NCCL threads run: where a collective waits
        # (a lock or queue of its own looks the same: /proc cannot tell them apart)
        return Wait(
            COLLECTIVE, f"in a collective, by /proc (main thread in futex beside {', '.join(comm)})", at, None, "wchan"
        )
    if kind == UNKNOWN and (main.wchan if main else p.wchan) == "0":
        w.what = "sleeping (its wait channel is hidden: not permitted to read it)"
    return w


def _threads_summary(p: ProcStack, limit: int = 4) -> str:
    """'40 threads: 33 futex_do_wait, 4 poll_schedule_timeout.constprop.0, 2 running'."""
    counts: dict[str, int] = {}
    for s in p.tstates:
        key = (
            "running"
            if s.state.startswith("R")
            else (f"D {s.wchan}" if s.state.startswith("D") else (s.wchan or s.state))
        )
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        return ""
    parts = sorted(counts.items(), key=lambda kv: -kv[1])
    body = ", ".join(f"{n} {k}" for k, n in parts[:limit]) + (", …" if len(parts) > limit else "")
    return f"{p.thread_count or len(p.tstates)} threads: {body}"


def who(p: ProcStack) -> str:
    rank = p.rank
    tag = f"rank {rank} (pid {p.pid})" if rank is not None else f"pid {p.pid}"
    prog = p.cmdline.split(" ")
    short = " ".join(x.rsplit("/", 1)[-1] for x in prog[:3] if x)
    return f"{tag} {short}".rstrip() if short else tag


def describe(p: ProcStack, w: Wait | None = None) -> str:
    """The card's line for one process: who, where it waits, and what tells."""
    if p.gone:
        return f"pid {p.pid}: exited before its stack was read"
    w = w or where_waits(p)
    line = f"{who(p)}: {w.what}"
    if w.at and w.kind not in (RUNNING,):
        line += f" — {w.at}"
    if w.where:
        line += f", called from {w.where}" if w.at else f" at {w.where}"
    if w.via == "wchan":
        summ = _threads_summary(p)
        line += (
            f" (from /proc: main thread {p.state or '?'}"
            + (f" in {w.at}" if w.at and w.at != "0" else "")
            + (f"; {summ}" if summ else "")
            + ")"
        )
    return line


BUSY = 90.0  # GPU utilisation (%) of a rank spinning in an NCCL kernel on a peer that never comes


def _waits_on_peers(w: Wait, util: float | None) -> bool:
    """In a collective by its stack, or running with its GPU busy (the plain stack shows only the Python line
    of the next CUDA sync, which spins; the NCCL kernel keeps the GPU at 100 %)."""
    return w.kind == COLLECTIVE or (w.kind == RUNNING and util is not None and util >= BUSY)


def stragglers(procs: list[ProcStack], util_of_pid: dict[int, float] | None = None) -> list[ProcStack]:
    """Ranks outside any collective while at least one peer waits in one: they hold the others up."""
    util = util_of_pid or {}
    # a launcher or agent (torchrun, an MPI launcher) holds the GPU device files and sleeps in its monitor
    # loop: it is the parent of a listed process, or has no rank where its neighbours have one
    parents = {p.ppid for p in procs if p.ppid is not None}
    any_rank = any(p.rank is not None for p in procs)
    ranked = [
        (p, where_waits(p))
        for p in procs
        if not p.gone
        and p.pid not in parents
        and (p.rank is not None or (not any_rank and ((p.gpu_fds or 0) > 0 or p.pid in util)))
    ]
    waiting = {p.pid for p, w in ranked if _waits_on_peers(w, util.get(p.pid))}
    if not waiting:
        return []
    return [p for p, _ in ranked if p.pid not in waiting]


def evidence(report: StackReport, gpu_of_pid: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """``evidence`` entries (source ``stack``), one per process; the straggler says so in its line.

    The GPU of a process: ``gpu_of_pid`` (the caller's), else nvidia-smi's compute apps from the same trip,
    else its CUDA_VISIBLE_DEVICES / LOCAL_RANK when it holds a GPU.
    """
    of_pid = {**report.gpu_of_pid, **(gpu_of_pid or {})}
    util_of = {g.index: g.util for g in report.gpus if g.util is not None}
    util = {p.pid: util_of[of_pid[p.pid]] for p in report.procs if of_pid.get(p.pid) in util_of}
    late = {p.pid for p in stragglers(report.procs, util)}
    out: list[dict[str, Any]] = []
    for p in report.procs:
        w = where_waits(p) if not p.gone else Wait(UNKNOWN, "exited", via="wchan")
        line = describe(p, w)
        gpu = of_pid.get(p.pid, p.gpu if (p.gpu_fds or 0) > 0 else None)
        if p.pid in util:
            busy = (
                " (busy: a CUDA sync or an NCCL kernel waiting on a peer)"
                if _waits_on_peers(w, util[p.pid]) and w.kind == RUNNING
                else ""
            )
            line += f"; GPU {gpu} at {util[p.pid]:g} %{busy}"
        if p.pid in late:
            line += " — the straggler: its peers wait for it in a collective"
        out.append(
            {
                "source": "stack",
                "time": report.now,
                "line": line,
                "pid": p.pid,
                "gpu": gpu,
                "kind": w.kind,
                "code": None,
            }
        )
    return out
