"""Short text about a host's facts for its card and preflight: GPUs, launch, parallelism."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..units import mib
from .launch import workers_of


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
        _, arith = workers_of(facts)
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
    head = f"{len(gpus)}× {'/'.join(names)}" + (f" ({mib(total)})" if total else "")
    busy, idle = [], []
    for g in gpus:
        used = g.get("memory_used_mib") or 0
        procs = g.get("processes") or []
        if procs or used > 1024:
            who = f", pid {procs[0]['pid']} {procs[0].get('name', '')}".rstrip() if procs else ""
            more = f" +{len(procs) - 1}" if len(procs) > 1 else ""
            busy.append(f"{g['index']} ({mib(used)}{who}{more})")
        else:
            idle.append(str(g["index"]))
    out = head
    if busy:
        out += " · busy: " + ", ".join(busy[:4]) + (f", … {len(busy) - 4} more" if len(busy) > 4 else "")
    if idle:
        out += " · idle: " + (",".join(idle) if len(idle) <= 8 else f"{len(idle)} GPUs")
    return out
