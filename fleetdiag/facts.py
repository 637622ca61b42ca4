"""Host facts: the GPUs, the serving process and its parallelism, gathered in the probe's own round trip.

The seeds' failure (TP 2 × DP 2 under ``CUDA_VISIBLE_DEVICES=0,1``) is only
obvious once the error is put next to the host's GPUs and the launch's
parallel sizes. So the funnel script carries a small read-only snippet
(:data:`SNIPPET`) that asks ``nvidia-smi`` for the GPUs and their compute
processes, finds the serving process (``vllm serve``, torchrun, SGLang) with
its command line and ``CUDA_VISIBLE_DEVICES`` (from ``/proc/PID/environ``),
and greps the latest run of the log for the parallel settings. It prints
``F<TAB>key<TAB>value`` records; :func:`build` turns them into the ``facts``
dict of a HostResult, and :func:`refine_hint` puts the arithmetic into the
decisive error's hint.

Everything here is pure (no SSH, no UI); the shell text is data.
``fleetdiag preflight`` (preflight.py) reuses the GPU part and the launch
command parser.

The facts dict (JSON, ``HostResult.facts``), every key optional:

``nvidia_smi``
    ``"ok"``, ``"missing"`` (not on PATH: a fact, not an error) or
    ``"failed: <first line>"`` (driver trouble).
``gpus``
    ``[{index, name, uuid, memory_used_mib, memory_total_mib, utilization_pct,
    processes: [{pid, name, used_mib, cmdline}]}]``.
``cuda_visible_devices``
    the serving process's value (or the log's ``Setting CUDA_VISIBLE_DEVICES=``),
    a string; absent when unknown. ``cuda_visible_devices_source`` says where from.
``serving``
    ``{pid, cmdline, launcher, writes_log, environ, candidates}``.
``parallel``
    ints only: ``tp``, ``dp``, ``pp``, ``dp_local``, ``nproc_per_node``,
    ``nnodes``; ``parallel_source`` says where they were read.
"""

from __future__ import annotations

import ast
import math
import os
import re
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from . import remote

# ---------------------------------------------------------------- remote snippet

GPU_QUERY = ("index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu")
APP_QUERY = ("pid", "process_name", "used_memory", "gpu_uuid")
SMI_CAP = 256 * 1024  # bytes of one nvidia-smi answer (64 GPUs take ~7 KB); more is garbage
FACTS_TIMEOUT = 10  # seconds for each nvidia-smi call: a wedged driver must not eat the probe

# The serving processes we look for. Each starts with a bracket expression so
# the pattern never matches its own text in the script's command line.
SERVE_ERE = (
    r"[v]llm serve|[v]llm[.]entrypoints|[t]orchrun|[t]orch[.]distributed[.](run|launch)"
    r"|[s]glang[.]launch_server|[d]eepspeed "
)
# Log lines that state the launch's parallelism or GPU visibility.
LOG_ERE = (
    r"non-default args: |nproc_per_node|nproc-per-node|server_args=ServerArgs|"
    r"tensor_parallel_size=|Setting CUDA_VISIBLE_DEVICES="
)

# Shared by probe and preflight: GPUs and their compute processes. Every
# external command reads /dev/null, runs under $FTO (timeout) when there is
# one, and its output is cut in lines and bytes.
GPU_SNIPPET = remote.load("facts_gpu.sh")

# Probe only: the serving process and the latest run's parallel settings. It
# runs after the funnel's fd_log, which leaves $f (the log path), $rp (the
# latest run's start offset, empty unless the log was readable) and $start
# (the scanned window's start) behind.
SERVE_SNIPPET = remote.load("facts_serve.sh")

SNIPPET = GPU_SNIPPET + SERVE_SNIPPET


def snippet_vars(path_prepend: str | None = None, timeout: int = FACTS_TIMEOUT) -> dict[str, str]:
    """The shell variables the snippets read (the funnel quotes and exports each)."""
    return {
        "FD_FTMO": str(int(timeout)),
        "FD_FPATH": path_prepend or "",
        "FD_GPUQ": ",".join(GPU_QUERY),
        "FD_APPQ": ",".join(APP_QUERY),
        "FD_SERVE": SERVE_ERE,
        "FD_LOGRE": LOG_ERE,
        "FD_FSCAN": str(4 * 1024 * 1024),
        "FD_SMICAP": str(SMI_CAP),
        # set by fd_log only when the log was readable: start it empty
        "rp": "",
    }


# ---------------------------------------------------------------- nvidia-smi parsers


@dataclass
class GpuProcess:
    pid: int
    name: str = ""
    used_mib: int | None = None
    cmdline: str | None = None
    gpu_uuid: str | None = field(default=None, repr=False)


@dataclass
class Gpu:
    index: int
    name: str = ""
    uuid: str | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    utilization_pct: int | None = None
    processes: list[GpuProcess] = field(default_factory=list)

    @property
    def free_mib(self) -> int | None:
        if self.memory_total_mib is None or self.memory_used_mib is None:
            return None
        return max(0, self.memory_total_mib - self.memory_used_mib)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for p in d["processes"]:
            p.pop("gpu_uuid", None)
        return d


_NA = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "[insufficient permissions]"}
_HEADER_ALIASES = {"used_gpu_memory": "used_memory", "name": "name", "gpu_name": "name", "gpu_uuid": "gpu_uuid",
                   "process_name": "process_name"}


def _num(value: str) -> int | None:
    """``"19601"``, ``"19601 MiB"``, ``"36 %"``, ``"[N/A]"`` → int or None."""
    v = value.strip()
    if v.lower() in _NA:
        return None
    m = re.match(r"^(-?\d+(?:\.\d+)?)", v)
    if not m:
        return None
    return int(round(float(m.group(1))))


def _unit_free(name: str) -> str:
    return re.sub(r"\s*\[.*\]$", "", name.strip())


def _csv_rows(text: str, columns: Sequence[str]) -> list[dict[str, str]]:
    """Rows of ``nvidia-smi --format=csv`` output, with or without header and units.

    Without a header, fields are taken in ``columns`` order and any extra
    trailing fields are ignored; with one, columns are matched by name (the
    ``[MiB]``/``[%]`` units stripped), whatever their order.
    """
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    names = list(columns)
    head = [_unit_free(h) for h in lines[0].split(",")]
    known = set(columns) | set(_HEADER_ALIASES)
    if not head[0].isdigit() and any(h in known for h in head):
        names = [_HEADER_ALIASES.get(h, h) for h in head]
        lines = lines[1:]
    rows = []
    for ln in lines:
        if ln.lower().startswith("no running"):
            continue
        parts = [p.strip() for p in ln.split(", ")]
        if len(parts) > len(names) and "process_name" in names and names[-1] == "gpu_uuid":
            # a process name with ", " in it: pid first, memory and uuid last
            i = names.index("process_name")
            tail = len(names) - i - 1
            parts = parts[:i] + [", ".join(parts[i:len(parts) - tail])] + parts[len(parts) - tail:]
        rows.append(dict(zip(names, parts)))
    return rows


def parse_gpu_csv(text: str, columns: Sequence[str] = GPU_QUERY) -> list[Gpu]:
    """``nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu --format=csv[,noheader][,nounits]``."""
    gpus = []
    for row in _csv_rows(text, columns):
        idx = _num(row.get("index", ""))
        if idx is None:
            continue
        uuid = row.get("uuid") or None
        gpus.append(Gpu(index=idx, name=row.get("name", ""), uuid=uuid if uuid and uuid.lower() not in _NA else None,
                        memory_used_mib=_num(row.get("memory.used", "")),
                        memory_total_mib=_num(row.get("memory.total", "")),
                        utilization_pct=_num(row.get("utilization.gpu", ""))))
    return gpus


def parse_apps_csv(text: str, columns: Sequence[str] = APP_QUERY) -> list[GpuProcess]:
    """``nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv[,noheader][,nounits]``."""
    out = []
    for row in _csv_rows(text, columns):
        pid = _num(row.get("pid", ""))
        if pid is None:
            continue
        out.append(GpuProcess(pid=pid, name=row.get("process_name", ""), used_mib=_num(row.get("used_memory", "")),
                              gpu_uuid=row.get("gpu_uuid") or None))
    return out


_L_RE = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)\s*$")


def parse_smi_list(text: str) -> list[Gpu]:
    """``nvidia-smi -L``: index, name and UUID (MIG lines are skipped)."""
    out = []
    for ln in text.splitlines():
        m = _L_RE.match(ln.strip())
        if m:
            out.append(Gpu(index=int(m.group(1)), name=m.group(2), uuid=m.group(3)))
    return out


_T_GPU = re.compile(r"^\|\s+(\d+)\s+(.+?)\s+(?:On|Off)\s+\|")
_T_MEM = re.compile(r"(\d+)MiB\s*/\s*(\d+)MiB")
_T_UTIL = re.compile(r"\|\s*(\d+)%\s+\S+\s*\|")
_T_PROC = re.compile(r"^\|\s+(\d+)\s+(?:(?:N/A|\d+)\s+(?:N/A|\d+)\s+)?(\d+)\s+(?:C\+G|M\+C|C|G|M)\s+(.+?)\s+(\d+)MiB\s*\|")


def parse_smi_table(text: str) -> list[Gpu]:
    """The default ``nvidia-smi`` table: GPUs with memory and utilisation, and the Processes section."""
    gpus: list[Gpu] = []
    cur: Gpu | None = None
    in_procs = False
    for ln in text.splitlines():
        if "Processes:" in ln:
            in_procs = True
            continue
        if in_procs:
            m = _T_PROC.match(ln)
            if m:
                idx = int(m.group(1))
                for g in gpus:
                    if g.index == idx:
                        g.processes.append(GpuProcess(pid=int(m.group(2)), name=m.group(3), used_mib=int(m.group(4))))
            continue
        m = _T_GPU.match(ln)
        if m and not ln.startswith("| GPU "):
            cur = Gpu(index=int(m.group(1)), name=m.group(2).strip())
            gpus.append(cur)
            continue
        if cur is not None:
            mm = _T_MEM.search(ln)
            if mm and cur.memory_total_mib is None:
                cur.memory_used_mib, cur.memory_total_mib = int(mm.group(1)), int(mm.group(2))
                mu = _T_UTIL.search(ln[mm.end():])
                if mu:
                    cur.utilization_pct = int(mu.group(1))
    return gpus


def attach_processes(gpus: list[Gpu], procs: Iterable[GpuProcess], cmdlines: Mapping[int, str] | None = None) -> None:
    """Put each compute process under its GPU (joined on the GPU UUID)."""
    by_uuid = {g.uuid: g for g in gpus if g.uuid}
    for p in procs:
        if cmdlines and p.pid in cmdlines:
            p.cmdline = cmdlines[p.pid]
        g = by_uuid.get(p.gpu_uuid or "")
        if g is not None:
            g.processes.append(p)


# ---------------------------------------------------------------- secrets in command lines

# One owner: redact.py (re-exported here for the modules that import them from facts).
from .redact import SECRET_NAME as _SECRET_NAME, redact_argv, redact_cmdline, redact_env  # noqa: E402,F401


# ---------------------------------------------------------------- launch command parsing

VLLM, TORCHRUN, SGLANG = "vllm", "torchrun", "sglang"
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_WRAPPERS = {"nohup", "exec", "time", "command", "setsid", "stdbuf"}
_TORCHRUN_FLAGS = {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path", "-m", "--module",
                   "--use-env", "--use_env", "--redirects-all", "--tee-all"}


@dataclass
class Launch:
    """A serving or training launch command, as far as GPUs are concerned."""

    argv: list[str]
    launcher: str | None = None  # vllm | torchrun | sglang | None (not recognised)
    env: dict[str, str] = field(default_factory=dict)  # inline VAR=val prefixes (and --env)
    model: str | None = None
    tp: int | None = None
    dp: int | None = None
    pp: int | None = None
    dp_local: int | None = None
    nproc_per_node: int | None = None
    nproc_spec: str | None = None  # torchrun's nproc_per_node when not a number (gpu, auto, cpu)
    nnodes: str | None = None
    gpu_memory_utilization: float | None = None
    mem_fraction_static: float | None = None
    backend: str | None = None  # vLLM --distributed-executor-backend
    dp_attention: bool = False  # SGLang --enable-dp-attention: DP shares the TP GPUs
    config_file: str | None = None  # vLLM --config: sizes may hide in it
    notes: list[str] = field(default_factory=list)

    @property
    def cuda_visible_devices(self) -> str | None:
        return self.env.get("CUDA_VISIBLE_DEVICES")

    def parallel(self) -> dict[str, int]:
        """The ``facts["parallel"]`` shape: ints only, defaults filled for vLLM/SGLang."""
        out: dict[str, int] = {}
        if self.launcher in (VLLM, SGLANG):
            out = {"tp": self.tp or 1, "dp": self.dp or 1, "pp": self.pp or 1}
            if self.dp_local is not None:
                out["dp_local"] = self.dp_local
        if self.nproc_per_node is not None:
            out["nproc_per_node"] = self.nproc_per_node
        if self.nnodes and self.nnodes.isdigit():
            out["nnodes"] = int(self.nnodes)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with secret-looking values masked."""
        d = asdict(self)
        d["argv"], d["env"] = redact_argv(self.argv), redact_env(self.env)
        d["workers"], d["arithmetic"] = workers(self.parallel(), self.launcher, self.dp_attention)
        return d


def _opt_name(tok: str) -> str:
    name = tok.split("=", 1)[0]
    if name.startswith("--"):
        return "--" + name[2:].replace("_", "-")
    return name


def _options(argv: Sequence[str]) -> dict[str, str | bool]:
    """``--name value`` / ``--name=value`` / ``-tp 2`` pairs (names normalised to dashes; last wins)."""
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("-") and len(tok) > 1 and not re.match(r"^-\d", tok):
            name = _opt_name(tok)
            if "=" in tok:
                out[name] = tok.split("=", 1)[1]
            elif i + 1 < len(argv) and not (argv[i + 1].startswith("-") and not re.match(r"^-\d", argv[i + 1])):
                out[name] = argv[i + 1]
                i += 1
            else:
                out[name] = True
        i += 1
    return out


def _int(v: str | bool | None, what: str, notes: list[str]) -> int | None:
    if v is None or v is True or v is False:
        return None
    try:
        return int(str(v))
    except ValueError:
        notes.append(f"{what}={v!r} is not a number")
        return None


def _float(v: str | bool | None) -> float | None:
    try:
        return float(str(v)) if v not in (None, True, False) else None
    except ValueError:
        return None


def _first(opts: Mapping[str, str | bool], *names: str) -> str | bool | None:
    for n in names:
        if n in opts:
            return opts[n]
    return None


def parse_launch(command: str | Sequence[str], env: Mapping[str, str] | None = None) -> Launch:
    """Parse ``[VAR=val ...] [env ...] [nohup] vllm serve …`` / ``torchrun …`` / ``python -m sglang.launch_server …``.

    ``env`` (preflight's ``--env``) wins over inline ``VAR=val`` prefixes, as
    it is what the user says the launch will run under.
    """
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    launch = Launch(argv=list(argv))
    inline: dict[str, str] = {}
    i = 0
    while i < len(argv):  # peel VAR=val prefixes and wrappers (env, nohup, nice, uv run, sh -c)
        tok = argv[i]
        base = os.path.basename(tok)
        if _ENV_ASSIGN.match(tok):
            k, _, v = tok.partition("=")
            inline[k] = v
            i += 1
        elif base == "env":
            i += 1
            while i < len(argv) and argv[i].startswith("-"):
                i += 2 if argv[i] in ("-u", "--unset", "-C", "--chdir") else 1
        elif base == "nice":
            i += 1
            if argv[i:i + 1] == ["-n"]:
                i += 2
            elif i < len(argv) and argv[i].startswith("-"):
                i += 1
        elif base in ("uv", "poetry", "pipenv") and argv[i + 1:i + 2] == ["run"]:
            i += 2
        elif base in ("sh", "bash") and argv[i + 1:i + 2] == ["-c"] and i + 2 < len(argv):
            inner = parse_launch(argv[i + 2], {**inline, **dict(env or {})})
            inner.argv = list(argv)
            return inner
        elif base in _WRAPPERS:
            i += 1
        else:
            break
    launch.env = {**inline, **dict(env or {})}
    rest = argv[i:]
    if not rest:
        return launch
    base = os.path.basename(rest[0])
    body: list[str] = []
    if base == "vllm" and len(rest) > 1 and rest[1] == "serve":
        launch.launcher, body = VLLM, rest[2:]
        if body and not body[0].startswith("-"):
            launch.model = body[0]
    elif base in ("torchrun",):
        launch.launcher, body = TORCHRUN, rest[1:]
    elif re.match(r"^python[0-9.]*$", base):
        j = rest.index("-m") if "-m" in rest else -1
        mod = rest[j + 1] if 0 <= j < len(rest) - 1 else ""
        if mod.startswith("vllm.entrypoints"):
            launch.launcher, body = VLLM, rest[j + 2:]
        elif mod in ("torch.distributed.run", "torch.distributed.launch"):
            launch.launcher, body = TORCHRUN, rest[j + 2:]
        elif mod.startswith("sglang.launch_server"):
            launch.launcher, body = SGLANG, rest[j + 2:]
        else:  # python /venv/bin/vllm serve …: how a console script shows in /proc
            k = next((k for k in range(1, len(rest) - 1)
                      if os.path.basename(rest[k]) == "vllm" and rest[k + 1] == "serve"), None)
            if k is not None:
                launch.launcher, body = VLLM, rest[k + 2:]
                if body and not body[0].startswith("-"):
                    launch.model = body[0]
    if launch.launcher == TORCHRUN:
        _torchrun(launch, body)
    elif launch.launcher in (VLLM, SGLANG):
        _serve_opts(launch, body)
    return launch


def _serve_opts(launch: Launch, body: list[str]) -> None:
    o = _options(body)
    n = launch.notes
    if launch.launcher == VLLM:
        launch.tp = _int(_first(o, "-tp", "--tensor-parallel-size"), "tensor-parallel-size", n)
        launch.dp = _int(_first(o, "-dp", "--data-parallel-size"), "data-parallel-size", n)
        launch.pp = _int(_first(o, "-pp", "--pipeline-parallel-size"), "pipeline-parallel-size", n)
        launch.dp_local = _int(_first(o, "-dpl", "--data-parallel-size-local"), "data-parallel-size-local", n)
        launch.gpu_memory_utilization = _float(_first(o, "--gpu-memory-utilization"))
        b = _first(o, "--distributed-executor-backend")
        launch.backend = b if isinstance(b, str) else None
        cfg = _first(o, "--config")
        if isinstance(cfg, str):
            launch.config_file = cfg
            n.append(f"--config {cfg}: parallel sizes set there are not read")
        m = _first(o, "--model")
        if isinstance(m, str):
            launch.model = m
    else:
        launch.tp = _int(_first(o, "--tp-size", "--tp", "--tensor-parallel-size"), "tp-size", n)
        launch.dp = _int(_first(o, "--dp-size", "--dp", "--data-parallel-size"), "dp-size", n)
        launch.pp = _int(_first(o, "--pp-size", "--pipeline-parallel-size"), "pp-size", n)
        nn = _first(o, "--nnodes")
        launch.nnodes = nn if isinstance(nn, str) else None
        launch.dp_attention = _first(o, "--enable-dp-attention") is True
        launch.mem_fraction_static = _float(_first(o, "--mem-fraction-static"))
        m = _first(o, "--model-path", "--model")
        if isinstance(m, str):
            launch.model = m


def _torchrun(launch: Launch, body: list[str]) -> None:
    i = 0
    opts: dict[str, str] = {}
    while i < len(body):
        tok = body[i]
        if not tok.startswith("-"):
            break  # the training script: what follows is its own arguments
        name = _opt_name(tok)
        if "=" in tok:
            opts[name] = tok.split("=", 1)[1]
        elif name in _TORCHRUN_FLAGS:
            if name in ("-m", "--module"):
                break
        elif i + 1 < len(body):
            opts[name] = body[i + 1]
            i += 1
        i += 1
    spec = opts.get("--nproc-per-node")
    if spec is not None:
        if spec.isdigit():
            launch.nproc_per_node = int(spec)
        else:
            launch.nproc_spec = spec
    else:
        launch.nproc_per_node = 1  # torchrun's default
        launch.notes.append("no --nproc-per-node: torchrun starts 1 worker per node")
    launch.nnodes = opts.get("--nnodes")


def workers(parallel: Mapping[str, Any], launcher: str | None = None, dp_attention: bool = False) -> tuple[int | None, str]:
    """GPU workers one node needs, and the arithmetic that says so.

    vLLM: TP × PP × DP (DP-local when set, the DP ranks on this node).
    SGLang: TP × PP (× DP unless DP attention shares the TP GPUs), split over nnodes.
    torchrun: nproc_per_node.
    """
    def g(key: str) -> int | None:
        v = parallel.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    nproc = g("nproc_per_node")
    tp, dp, pp, dpl, nn = g("tp"), g("dp"), g("pp"), g("dp_local"), g("nnodes")
    if launcher == TORCHRUN or (nproc is not None and tp is None):
        if nproc is None:
            return None, ""
        return nproc, f"nproc_per_node {nproc} = {nproc} worker{'s' if nproc != 1 else ''}"
    if tp is None and dp is None and pp is None:
        return None, ""
    tp, pp = tp or 1, pp or 1
    parts = [f"TP {tp}"] + ([f"PP {pp}"] if pp > 1 else [])
    if launcher == SGLANG and dp_attention:
        n = tp * pp
        note = f" (DP {dp or 1} shares them: DP attention)" if (dp or 1) > 1 else ""
    elif dpl is not None:
        n = tp * pp * dpl
        parts.append(f"DP-local {dpl}")
        note = f" on this node (DP {dp} in all)" if dp and dp != dpl else ""
    else:
        n = tp * pp * (dp or 1)
        parts.append(f"DP {dp or 1}")
        note = ""
    if launcher == SGLANG and nn and nn > 1:
        per = math.ceil(n / nn)
        return per, f"{' × '.join(parts)} = {n} workers over {nn} nodes = {per} per node{note}"
    return n, f"{' × '.join(parts)} = {n} worker{'s' if n != 1 else ''}{note}"


# ---------------------------------------------------------------- GPU visibility


@dataclass
class Visibility:
    """What ``CUDA_VISIBLE_DEVICES`` leaves a process, against the host's GPUs."""

    count: int | None  # GPUs the process will see (None: unknown)
    indices: list[int] = field(default_factory=list)  # host indices, in visible order (when known)
    invalid: list[str] = field(default_factory=list)  # entries naming no GPU of this host
    text: str = ""  # how to say it: "CUDA_VISIBLE_DEVICES=0,1 exposes 2 GPUs"


def _resolve(entry: str, host: Sequence[Mapping[str, Any]]) -> int | None:
    """A CUDA_VISIBLE_DEVICES entry → host GPU index; -1 valid but unplaced (MIG, no GPU list); None: names no GPU."""
    if re.fullmatch(r"[0-9]+", entry):
        n = int(entry)
        if not host or any(int(g["index"]) == n for g in host):
            return n
        return None
    if entry.startswith("MIG-"):
        return -1
    if entry.startswith("GPU-"):
        if not host:
            return -1
        for g in host:
            if g.get("uuid") and str(g["uuid"]).startswith(entry):
                return int(g["index"])
    return None


def visibility(cvd: str | None, gpus: Sequence[Mapping[str, Any]] | None) -> Visibility:
    """CUDA's rule: the listed devices in order, up to the first entry that names none (or repeats one)."""
    host = list(gpus or [])
    if cvd is None:
        if not host:
            return Visibility(None, text="GPU count unknown")
        idx = [int(g["index"]) for g in host]
        return Visibility(len(host), idx, text=f"the host has {len(host)} GPU{'s' if len(host) != 1 else ''}")
    entries = [e.strip() for e in cvd.split(",")] if cvd.strip() else []
    count, indices, invalid, why = 0, [], [], []
    stopped = False
    for e in entries:
        idx = _resolve(e, host)
        if idx is None or (idx >= 0 and idx in indices):
            invalid.append(e)
            why.append(f"{e}: {'listed twice' if idx is not None else 'no such GPU on this host'}")
            stopped = True
            continue
        if not stopped:
            count += 1
            if idx >= 0:
                indices.append(idx)
    shown = f"CUDA_VISIBLE_DEVICES={cvd}" if cvd.strip() else "an empty CUDA_VISIBLE_DEVICES"
    text = f"{shown} exposes {count} GPU{'s' if count != 1 else ''}"
    if invalid:
        text += f" ({'; '.join(why)}: CUDA stops at the first bad entry)"
    return Visibility(count, indices, invalid, text)


# ---------------------------------------------------------------- from the log

_NDA = re.compile(r"non-default args: (\{.*)")
_TORCHRUN_LOG = re.compile(r"nproc[_-]per[_-]node\s*[:=]?\s*(\d+)")
_SGL_ARGS = re.compile(r"\b(tp_size|dp_size|pp_size|nnodes)=(\d+)")
_VLLM_ARGS = re.compile(r"\b(tensor_parallel_size|data_parallel_size|pipeline_parallel_size)=(\d+)")
_CVD_LOG = re.compile(r"Setting CUDA_VISIBLE_DEVICES=([0-9A-Za-z,-]*)")
_KEY = {"tensor_parallel_size": "tp", "data_parallel_size": "dp", "pipeline_parallel_size": "pp",
        "data_parallel_size_local": "dp_local", "tp_size": "tp", "dp_size": "dp", "pp_size": "pp", "nnodes": "nnodes"}


def parse_non_default_args(line: str) -> dict[str, Any] | None:
    """vLLM's ``non-default args: {...}`` (a Python literal), tolerating a cut line."""
    m = _NDA.search(line)
    if not m:
        return None
    text = m.group(1).strip()
    try:
        val = ast.literal_eval(text)
        if isinstance(val, dict):
            return val
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    # cut or odd: read the scalar entries one by one
    out: dict[str, Any] = {}
    for k, v in re.findall(r"'([A-Za-z_]+)': ('(?:[^'\\]|\\.)*'|-?\d+(?:\.\d+)?|True|False|None)", text):
        try:
            out[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            continue
    return out


def parallel_from_log(texts: Iterable[str]) -> tuple[dict[str, int], str | None, str | None]:
    """(parallel sizes, where they were read, CUDA_VISIBLE_DEVICES) from log lines; the last statement wins."""
    par: dict[str, int] = {}
    source = None
    cvd = None
    for t in texts:
        if "non-default args:" in t:
            nda = parse_non_default_args(t)
            if nda is not None:
                par = {"tp": 1, "dp": 1, "pp": 1}  # vLLM's defaults: the line lists only what differs
                for k, v in nda.items():
                    if k in _KEY and isinstance(v, int) and not isinstance(v, bool):
                        par[_KEY[k]] = v
                source = "log: vLLM non-default args"
                continue
        if "ServerArgs(" in t:
            found = {_KEY[k]: int(v) for k, v in _SGL_ARGS.findall(t)}
            if found:
                par = {"tp": 1, "dp": 1, "pp": 1, **found}
                source = "log: SGLang server_args"
                continue
        m = _TORCHRUN_LOG.search(t)
        if m:
            par = {"nproc_per_node": int(m.group(1))}
            source = "log: torchrun nproc_per_node"
            continue
        found = {_KEY[k]: int(v) for k, v in _VLLM_ARGS.findall(t)}
        if found and source is None:
            par = {"tp": 1, "dp": 1, "pp": 1, **found}
            source = "log: vLLM engine config"
        mc = _CVD_LOG.search(t)
        if mc:
            cvd = mc.group(1)
    return par, source, cvd


# ---------------------------------------------------------------- build the facts dict


def build(raw: Mapping[str, list[str]] | None, log_texts: Iterable[str] = ()) -> dict[str, Any]:
    """The facts dict from the snippet's ``F`` records and the log lines the funnel read."""
    raw = raw or {}
    facts: dict[str, Any] = {}

    def one(key: str) -> str | None:
        v = raw.get(key)
        return v[-1] if v else None

    smi = one("nvidia_smi")
    if smi == "missing":
        facts["nvidia_smi"] = "missing"
    elif one("nvidia_smi_error") is not None:
        facts["nvidia_smi"] = f"failed: {one('nvidia_smi_error')}"
    elif smi is not None:
        facts["nvidia_smi"] = "ok"
        gpus = parse_gpu_csv("\n".join(raw.get("gpu", [])))
        procs = parse_apps_csv("\n".join(raw.get("app", [])))
        cmds: dict[int, str] = {}
        for v in raw.get("app_cmd", []):
            pid, _, cmd = v.partition("\t")
            if pid.isdigit():
                cmds[int(pid)] = redact_cmdline(cmd.strip())
        attach_processes(gpus, procs, cmds)
        facts["gpus"] = [g.to_dict() for g in gpus]

    par: dict[str, int] = {}
    source = None
    launch = None
    pid = one("serve_pid")
    if pid is not None and pid.isdigit():
        argv = [a for a in (one("serve_cmd") or "").split("\t") if a]
        launch = parse_launch(argv)
        serving: dict[str, Any] = {
            "pid": int(pid),
            "cmdline": " ".join(shlex.quote(a) for a in redact_argv(argv)),
            "launcher": launch.launcher,
            "writes_log": one("serve_log") == "1",
            "environ": one("serve_environ") or "unknown",
            "candidates": int(one("serve_candidates") or 1),
        }
        facts["serving"] = serving
        trusted = serving["writes_log"] or serving["candidates"] == 1
        if trusted and one("serve_cvd") is not None:
            facts["cuda_visible_devices"] = one("serve_cvd")
            facts["cuda_visible_devices_source"] = f"environ of pid {pid}"
        elif trusted and one("serve_cvd_unset") is not None:
            facts["cuda_visible_devices_source"] = f"unset in environ of pid {pid} (all GPUs visible)"
        if trusted and launch.launcher:
            par = launch.parallel()
            source = f"command line of pid {pid}"

    texts = list(raw.get("logline", [])) + list(log_texts)
    lpar, lsource, lcvd = parallel_from_log(texts)
    if lpar:  # the latest run's own statement wins over the running process
        par, source = lpar, lsource
    if "cuda_visible_devices" not in facts and lcvd is not None and "cuda_visible_devices_source" not in facts:
        facts["cuda_visible_devices"] = lcvd
        facts["cuda_visible_devices_source"] = "log"
    if par:
        facts["parallel"] = par
        facts["parallel_source"] = source
    return facts


def merge_log_facts(facts: dict[str, Any], log_texts: Iterable[str]) -> dict[str, Any]:
    """Parallelism (and a logged CUDA_VISIBLE_DEVICES) from the log lines the funnel read.

    The latest run's own statement beats a running process's command line;
    a CUDA_VISIBLE_DEVICES from the log only fills a gap.
    """
    par, source, cvd = parallel_from_log(log_texts)
    if par and not str(facts.get("parallel_source", "")).startswith("log"):  # the run's own statement wins
        facts["parallel"], facts["parallel_source"] = par, source
    if cvd is not None and "cuda_visible_devices" not in facts and "cuda_visible_devices_source" not in facts:
        facts["cuda_visible_devices"], facts["cuda_visible_devices_source"] = cvd, "log"
    return facts


# ---------------------------------------------------------------- hints that use facts

_ORDINAL = re.compile(r"local rank (\d+) is out of bounds|invalid device ordinal", re.I)
_SIZE = r"([0-9]+(?:\.[0-9]+)?) ?([KMGT]i?B)"
_OOM_NEW = re.compile(r"Tried to allocate " + _SIZE + r"\. GPU (\d+) has a total capacity of " + _SIZE
                      + r" of which " + _SIZE + r" is free")
_OOM_OLD = re.compile(r"Tried to allocate " + _SIZE + r" \(GPU (\d+); " + _SIZE + r" total capacity;"
                      r"(?: " + _SIZE + r" already allocated;)? " + _SIZE + r" free")
_OOM_PROC = re.compile(r"Process (\d+) has " + _SIZE + r" memory in use")
_UNIT = {"KB": 1 / 1024 ** 2, "KiB": 1 / 1024 ** 2, "MB": 1 / 1024, "MiB": 1 / 1024, "GB": 1.0, "GiB": 1.0,
         "TB": 1024.0, "TiB": 1024.0}


def _gib(value: str, unit: str) -> float:
    return float(value) * _UNIT.get(unit, 1.0)


def fmt_gib(g: float) -> str:
    """138.00 → "138 GiB", 139.81 → "139.8 GiB", 0.098 → "98 MiB"."""
    if g < 1:
        return f"{g * 1024:.0f} MiB"
    s = f"{g:.1f}".rstrip("0").rstrip(".")
    return f"{s} GiB"


def fmt_mib(mib: int | float) -> str:
    return fmt_gib(mib / 1024)


def refine_hint(decisive: Any, facts: Mapping[str, Any]) -> str | None:
    """The decisive error's hint with the host's numbers in it, or None to keep the rule's hint.

    Returns None too when the hint already carries the arithmetic (the
    analyzer's own fact-aware hint wins: one source of wording).
    """
    if decisive is None:
        return None
    text = " ".join(x for x in (getattr(decisive, "message", ""), getattr(decisive, "line", "")) if x)
    tb = getattr(decisive, "traceback", None) or []
    if tb:
        text += " " + tb[-1]
    current = getattr(decisive, "hint", None) or ""
    out = None
    key = None
    if _ORDINAL.search(text):
        out, key = _ordinal_hint(text, facts)
    elif _OOM_NEW.search(text) or _OOM_OLD.search(text) or (
            getattr(decisive, "category", "") == "oom" and facts.get("gpus")):
        out, key = _oom_hint(text, facts)
    if out is None or (key and key in current):
        return None
    return out


def _ordinal_hint(text: str, facts: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(hint, its main clause): the clause decides whether the analyzer already said the same."""
    par = facts.get("parallel") or {}
    launcher = (facts.get("serving") or {}).get("launcher")
    n, arith = workers(par, launcher)
    gpus = facts.get("gpus")
    cvd = facts.get("cuda_visible_devices")
    m = re.search(r"local rank (\d+)", text)
    rank = int(m.group(1)) if m else None
    if cvd is not None:
        vis = visibility(cvd, gpus)
        if vis.count is None:
            return None, None
        if n is not None:
            if n <= vis.count:
                return None, None  # the facts do not explain it (another run's environment?): keep the rule's hint
            main = f"{arith}, but {vis.text}"
            return main + _fix(n, vis, gpus, par), main
        if rank is not None:
            main = f"local rank {rank} needs at least {rank + 1} GPUs, but {vis.text}"
            return main + ": lower the parallel sizes or expose more GPUs", main
        return None, None
    if n is None:
        if gpus and rank is not None:
            main = f"local rank {rank} needs at least {rank + 1} GPUs; the host has {len(gpus)}"
            return main + ": check CUDA_VISIBLE_DEVICES and the parallel sizes", main
        return None, None
    if gpus and n > len(gpus):
        main = f"{arith}, but the host has {len(gpus)} GPU{'s' if len(gpus) != 1 else ''}"
        return main + ": lower the parallel sizes", main
    if gpus:
        main = f"{arith} and the host has {len(gpus)} GPUs, so the launch saw fewer than {n}"
        return main + ": check CUDA_VISIBLE_DEVICES in its environment", main
    if rank is not None:
        main = f"{arith}, but local rank {rank} had no GPU, so at most {rank} were visible"
        return main + f": expose {n} GPUs in CUDA_VISIBLE_DEVICES or lower the parallel sizes", main
    main = f"{arith}, but fewer GPUs were visible"
    return main + f": expose {n} GPUs in CUDA_VISIBLE_DEVICES or lower the parallel sizes", main


def _fix(n: int, vis: Visibility, gpus: Sequence[Mapping[str, Any]] | None, par: Mapping[str, Any]) -> str:
    """What would make the numbers agree."""
    host = len(gpus or [])
    bits = []
    if host >= n:
        idle = [int(g["index"]) for g in gpus or [] if not g.get("processes")]
        pick = (vis.indices + [i for i in idle if i not in vis.indices])[:n] if len(idle) >= n else list(range(n))
        bits.append(f"expose {n} (e.g. CUDA_VISIBLE_DEVICES={','.join(map(str, pick))})")
    tp, dp = par.get("tp"), par.get("dp")
    if vis.count and tp and dp and dp > 1 and tp * (par.get("pp") or 1) <= vis.count:
        fit = max(1, vis.count // (tp * (par.get("pp") or 1)))
        bits.append(f"use DP {fit} with TP {tp}")
    elif vis.count:
        bits.append(f"lower the parallel sizes to {vis.count} workers")
    return (": " + " or ".join(bits)) if bits else ""


def _oom_hint(text: str, facts: Mapping[str, Any]) -> tuple[str | None, str | None]:
    gpus = {int(g["index"]): g for g in facts.get("gpus") or []}
    cvd = facts.get("cuda_visible_devices")
    vis = visibility(cvd, list(gpus.values())) if cvd is not None else None
    m = _OOM_NEW.search(text)
    asked = total = free = None
    dev = None
    if m:
        asked, dev, total, free = _gib(m.group(1), m.group(2)), int(m.group(3)), _gib(m.group(4), m.group(5)), _gib(m.group(6), m.group(7))
    else:
        m = _OOM_OLD.search(text)
        if m:
            asked, dev, total = _gib(m.group(1), m.group(2)), int(m.group(3)), _gib(m.group(4), m.group(5))
            free = _gib(m.group(8), m.group(9))
    parts: list[str] = []
    key = None
    phys = None
    if dev is not None:
        if vis is not None:
            phys = vis.indices[dev] if dev < len(vis.indices) else None
        elif str(facts.get("cuda_visible_devices_source", "")).startswith("unset"):
            phys = dev
        where = f"GPU {dev}" + (f" (host GPU {phys}, CUDA_VISIBLE_DEVICES={cvd})" if vis is not None and phys is not None and phys != dev else "")
        key = f"{fmt_gib(free)} free of {fmt_gib(total)}, asked {fmt_gib(asked)}"
        parts.append(f"{where}: {key}")
        others = [f"process {p} holds {fmt_gib(_gib(v, u))}" for p, v, u in _OOM_PROC.findall(text)]
        if asked > total:
            parts.append("more than the whole GPU: shard the model (raise TP/PP) or shrink batch / sequence length")
        elif others:
            parts.append(", ".join(others[:3]))
    busy = []
    for i, g in sorted(gpus.items()):
        if phys is not None and i != phys:
            continue
        for p in g.get("processes") or []:
            if p.get("used_mib"):
                cmd = (p.get("cmdline") or p.get("name") or "").strip()
                busy.append(f"GPU {i}: pid {p['pid']} {cmd[:60]} holds {fmt_mib(p['used_mib'])}")
    if busy:
        parts.append("nvidia-smi now: " + "; ".join(busy[:3]))
        key = key or busy[0]
    if not parts:
        return None, None
    return "; ".join(parts), key


# ---------------------------------------------------------------- short text for a card


def summary_lines(facts: Mapping[str, Any]) -> list[tuple[str, str]]:
    """At most three (label, text) rows for the host card: GPUs, launch, parallelism."""
    rows: list[tuple[str, str]] = []
    smi = facts.get("nvidia_smi")
    gpus = facts.get("gpus")
    if smi == "missing":
        rows.append(("gpus", "nvidia-smi not found on PATH"))
    elif smi and smi.startswith("failed"):
        rows.append(("gpus", f"nvidia-smi {smi}"))
    elif gpus is not None:
        rows.append(("gpus", gpu_summary(gpus)))
    bits = []
    if "cuda_visible_devices" in facts:
        bits.append(f"CUDA_VISIBLE_DEVICES={facts['cuda_visible_devices']}")
    elif facts.get("cuda_visible_devices_source", "").startswith("unset"):
        bits.append("CUDA_VISIBLE_DEVICES unset")
    par = facts.get("parallel")
    if par:
        n, arith = workers(par, (facts.get("serving") or {}).get("launcher"))
        if arith:
            bits.append(arith)
    serving = facts.get("serving")
    if serving:
        cmd = short_cmd(serving.get("cmdline") or "")
        bits.append(f"pid {serving['pid']}: {cmd[:80]}{'…' if len(cmd) > 80 else ''}")
    if bits:
        rows.append(("launch", " · ".join(bits)))
    return rows


_LAUNCHER_AT = re.compile(r"(?:^|[\s/])((?:vllm serve|torchrun|deepspeed)\b.*|-m (?:vllm|sglang|torch)\S*.*)")


def short_cmd(cmdline: str) -> str:
    """The command from its launcher on (``vllm serve …``), without the interpreter path in front."""
    m = _LAUNCHER_AT.search(cmdline)
    return m.group(1) if m else cmdline


def gpu_summary(gpus: Sequence[Mapping[str, Any]]) -> str:
    """``2× NVIDIA H200 (140.4 GiB) · busy: 1 (19.1 GiB, pid 561 python3) · idle: 0``."""
    if not gpus:
        return "nvidia-smi lists no GPU"
    names = sorted({str(g.get("name") or "?") for g in gpus})
    total = gpus[0].get("memory_total_mib")
    head = f"{len(gpus)}× {'/'.join(names)}" + (f" ({fmt_mib(total)})" if total else "")
    busy, idle = [], []
    for g in gpus:
        used = g.get("memory_used_mib") or 0
        procs = g.get("processes") or []
        if procs or used > 1024:
            who = f", pid {procs[0]['pid']} {procs[0].get('name', '')}".rstrip() if procs else ""
            more = f" +{len(procs) - 1}" if len(procs) > 1 else ""
            busy.append(f"{g['index']} ({fmt_mib(used)}{who}{more})")
        else:
            idle.append(str(g["index"]))
    out = head
    if busy:
        out += " · busy: " + ", ".join(busy[:4]) + (f", … {len(busy) - 4} more" if len(busy) > 4 else "")
    if idle:
        out += " · idle: " + (",".join(idle) if len(idle) <= 8 else f"{len(idle)} GPUs")
    return out
