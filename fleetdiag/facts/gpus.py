"""GPU visibility: what ``CUDA_VISIBLE_DEVICES`` leaves a process, by CUDA's own rule.

The one place that counts visible GPUs: entries are taken in order up to the
first one that names no GPU of the host (or repeats one) — CUDA stops there,
so ``0,9,1`` on a 4-GPU host exposes one GPU, not three.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Visibility:
    """What ``CUDA_VISIBLE_DEVICES`` leaves a process, against the host's GPUs."""

    count: int | None  # GPUs the process will see (None: unknown)
    indices: list[int] = field(default_factory=list)  # host indices, in visible order (when known)
    invalid: list[str] = field(default_factory=list)  # entries naming no GPU of this host
    text: str = ""  # how to say it: "CUDA_VISIBLE_DEVICES=0,1 exposes 2 GPUs"


def gpu_index(g: Mapping[str, Any]) -> int | None:
    """A GPU dict's index, or None when it has no usable one (facts from JSON or an old record)."""
    v = g.get("index")
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    return int(v) if isinstance(v, str) and v.isdigit() else None


def _resolve(entry: str, host: Sequence[Mapping[str, Any]]) -> int | None:
    """A CUDA_VISIBLE_DEVICES entry → host GPU index; -1 valid but unplaced (MIG, no GPU list); None: names no GPU."""
    if re.fullmatch(r"[0-9]+", entry):
        n = int(entry)
        if not host or any(gpu_index(g) == n for g in host):
            return n
        if all(gpu_index(g) is None for g in host):  # GPUs without indices: place by position
            return n if n < len(host) else None
        return None
    if entry.startswith("MIG-"):
        return -1
    if entry.startswith("GPU-"):
        if not host:
            return -1
        for g in host:
            if g.get("uuid") and str(g["uuid"]).startswith(entry):
                return gpu_index(g) if gpu_index(g) is not None else -1
    return None


def visibility(cvd: str | None, gpus: Sequence[Mapping[str, Any]] | None) -> Visibility:
    """CUDA's rule: the listed devices in order, up to the first entry that names none (or repeats one)."""
    host = [g for g in gpus or [] if isinstance(g, Mapping)]
    if cvd is None:
        if not host:
            return Visibility(None, text="GPU count unknown")
        idx = [i for i in (gpu_index(g) for g in host) if i is not None]
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
