"""Collecting facts: the remote snippets, their variables, and the facts dict built from what they print.

The funnel script carries a small read-only snippet (:data:`SNIPPET`, the
files ``remote/facts_gpu.sh`` and ``remote/facts_serve.sh``) that prints
``F<TAB>key<TAB>value`` records; :func:`build` turns them into the facts
dict of a HostResult and :func:`merge_log_facts` adds what the log itself
says about the launch.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from .. import remote
from ..redact import redact_argv, redact_cmdline
from .launch import parallel_from_log, parse_launch
from .nvidia_smi import (
    APP_QUERY,
    GPU_QUERY,
    attach_processes,
    parse_apps_csv,
    read_gpu_csv,
)

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
# What both snippets need (fd_f, the timeout prefix, the PATH): the probe runs the GPU part beside the
# funnel (its two nvidia-smi calls need nothing the funnel finds) and the serving part after it.
BASE_SNIPPET = remote.load("facts_base.sh")
GPU_SNIPPET = BASE_SNIPPET + remote.load("facts_gpu.sh")

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


def _not_understood(rejected: list[str]) -> str:
    first = rejected[0][:120]  # as read: the output edge escapes it
    return f"output not understood ({len(rejected)} line{'s' if len(rejected) != 1 else ''} not a GPU row): {first}"


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
        gpus, rejected = read_gpu_csv("\n".join(raw.get("gpu", [])))
        # a line that is not a GPU row means the output is not nvidia-smi's answer: never count it as GPUs
        facts["nvidia_smi"] = f"failed: {_not_understood(rejected)}" if rejected else "ok"
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
