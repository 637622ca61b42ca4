"""The launch: its command line, its parallel sizes, and the GPU count they need.

:func:`parse_launch` reads ``vllm serve``, torchrun and SGLang command lines
(preflight's command, the serving process's ``/proc`` cmdline);
:func:`parallel_from_log` reads the same sizes from what a run logged; and
:func:`workers` is the one place that turns sizes into GPUs per node, with
the arithmetic in words. Hints, preflight and the host card all count
through it.
"""

from __future__ import annotations

import ast
import math
import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..redact import redact_argv, redact_env

VLLM, TORCHRUN, SGLANG = "vllm", "torchrun", "sglang"
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_WRAPPERS = {"nohup", "exec", "time", "command", "setsid", "stdbuf"}
_TORCHRUN_FLAGS = {
    "--standalone",
    "--no-python",
    "--no_python",
    "--run-path",
    "--run_path",
    "-m",
    "--module",
    "--use-env",
    "--use_env",
    "--redirects-all",
    "--tee-all",
}


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
            if self.dp_attention:
                out["dp_attention"] = 1
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
            if argv[i : i + 1] == ["-n"]:
                i += 2
            elif i < len(argv) and argv[i].startswith("-"):
                i += 1
        elif base in ("uv", "poetry", "pipenv") and argv[i + 1 : i + 2] == ["run"]:
            i += 2
        elif base in ("sh", "bash") and argv[i + 1 : i + 2] == ["-c"] and i + 2 < len(argv):
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
            launch.launcher, body = VLLM, rest[j + 2 :]
        elif mod in ("torch.distributed.run", "torch.distributed.launch"):
            launch.launcher, body = TORCHRUN, rest[j + 2 :]
        elif mod.startswith("sglang.launch_server"):
            launch.launcher, body = SGLANG, rest[j + 2 :]
        else:  # python /venv/bin/vllm serve …: how a console script shows in /proc
            k = next(
                (k for k in range(1, len(rest) - 1) if os.path.basename(rest[k]) == "vllm" and rest[k + 1] == "serve"),
                None,
            )
            if k is not None:
                launch.launcher, body = VLLM, rest[k + 2 :]
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


def _int_of(v: Any) -> int | None:
    """A positive whole number from an int or its text (facts may come from JSON); else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if v > 0 else None
    if isinstance(v, str) and v.strip().isdigit():
        return int(v.strip()) or None
    return None


def workers(
    parallel: Mapping[str, Any], launcher: str | None = None, dp_attention: bool = False
) -> tuple[int | None, str]:
    """GPU workers one node needs, and the arithmetic that says so.

    vLLM: TP × PP × DP (DP-local when set, the DP ranks on this node).
    SGLang: TP × PP (× DP unless DP attention shares the TP GPUs), split over nnodes.
    torchrun: nproc_per_node. Sizes that are not positive whole numbers are not counted.
    """
    if not isinstance(parallel, Mapping):
        return None, ""
    nproc = _int_of(parallel.get("nproc_per_node"))
    tp, dp, pp = _int_of(parallel.get("tp")), _int_of(parallel.get("dp")), _int_of(parallel.get("pp"))
    dpl, nn = _int_of(parallel.get("dp_local")), _int_of(parallel.get("nnodes"))
    dp_attention = dp_attention or bool(_int_of(parallel.get("dp_attention")))
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
    elif dpl is not None and dpl != (dp or 1):
        n = tp * pp * dpl
        parts.append(f"DP-local {dpl}")
        note = f" on this node (DP {dp} in all)" if dp else ""
    else:
        n = tp * pp * (dp or dpl or 1)
        parts.append(f"DP {dp or dpl or 1}")
        note = ""
    if launcher == SGLANG and nn and nn > 1:
        per = math.ceil(n / nn)
        return per, f"{' × '.join(parts)} = {n} workers over {nn} nodes = {per} per node{note}"
    return n, f"{' × '.join(parts)} = {n} worker{'s' if n != 1 else ''}{note}"


_SOURCE_LAUNCHER = (("sglang", SGLANG), ("vllm", VLLM), ("torchrun", TORCHRUN))


def launcher_of(facts: Mapping[str, Any]) -> str | None:
    """The launcher behind the facts' parallel sizes: the serving process's, else the log's kind."""
    serving = facts.get("serving")
    if isinstance(serving, Mapping) and serving.get("launcher"):
        return str(serving["launcher"])
    source = str(facts.get("parallel_source") or "").lower()
    return next((name for key, name in _SOURCE_LAUNCHER if key in source), None)


def workers_of(facts: Mapping[str, Any]) -> tuple[int | None, str]:
    """:func:`workers` for a host's facts dict (``parallel`` and where it was read)."""
    par = facts.get("parallel")
    return workers(par, launcher_of(facts)) if isinstance(par, Mapping) else (None, "")


# ---------------------------------------------------------------- from the log

_NDA = re.compile(r"non-default args: (\{.*)")
_TORCHRUN_LOG = re.compile(r"nproc[_-]per[_-]node\s*[:=]?\s*(\d+)")
_SGL_ARGS = re.compile(r"\b(tp_size|dp_size|pp_size|nnodes)=(\d+)")
_SGL_DPA = re.compile(r"\benable_dp_attention=True\b")
_VLLM_ARGS = re.compile(r"\b(tensor_parallel_size|data_parallel_size|pipeline_parallel_size)=(\d+)")
_CVD_LOG = re.compile(r"Setting CUDA_VISIBLE_DEVICES=([0-9A-Za-z,-]*)")
_KEY = {
    "tensor_parallel_size": "tp",
    "data_parallel_size": "dp",
    "pipeline_parallel_size": "pp",
    "data_parallel_size_local": "dp_local",
    "tp_size": "tp",
    "dp_size": "dp",
    "pp_size": "pp",
    "nnodes": "nnodes",
}


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
                if _SGL_DPA.search(t):
                    par["dp_attention"] = 1
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
