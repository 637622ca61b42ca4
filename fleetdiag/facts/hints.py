"""Hints with the host's numbers in them: the one engine for GPU arithmetic in a hint.

Two consumers, one arithmetic. The analyzer's rule hints (``hint_facts`` in
rules.yaml, rendered by ``analysis.hints``) take their fields from
:func:`fields`; the probe's :func:`refine_hint` writes the fuller sentence
(what to expose, which DP fits) for a GPU-ordinal or out-of-memory error.
Both count workers with :func:`~fleetdiag.facts.launch.workers` and visible
GPUs with :func:`~fleetdiag.facts.gpus.visibility`, so they cannot disagree
on a number: DP-local, SGLang's DP attention and nnodes, and CUDA stopping
at the first bad ``CUDA_VISIBLE_DEVICES`` entry are known to both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..units import gib, mib
from .gpus import Visibility, gpu_index, visibility
from .launch import workers_of

_SIZES = ("tp", "dp", "pp")
_OTHER_SIZES = ("dp_local", "nnodes", "nproc_per_node")


def _count(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if v >= 0 else None
    if isinstance(v, str) and v.strip().isdigit():
        return int(v.strip())
    return None


def _host(facts: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    gpus = facts.get("gpus")
    if isinstance(gpus, (list, tuple)):
        return [g for g in gpus if isinstance(g, Mapping)]
    return None


def _cvd(facts: Mapping[str, Any]) -> str | None:
    cvd = facts.get("cuda_visible_devices", facts.get("CUDA_VISIBLE_DEVICES"))
    if isinstance(cvd, (list, tuple)):
        cvd = ",".join(str(x) for x in cvd)
    return cvd.strip() if isinstance(cvd, str) else None


def fields(facts: Mapping[str, Any] | None) -> dict[str, Any]:
    """The fields a rule's ``hint_facts`` text can name, from a host's facts dict.

    Every scalar fact, plus: ``cuda_visible_devices``; ``visible_gpus`` (what
    it exposes by CUDA's rule, else the number of ``gpus``); ``visibility``
    (that in words) and ``exposed`` (the same, only when CUDA_VISIBLE_DEVICES
    is known); ``gpus`` (a count); ``tp``, ``dp``, ``pp`` (defaults 1 once
    one is known), ``dp_local``, ``nnodes``, ``nproc_per_node``; ``workers``
    (GPUs the launch needs on this node) and ``arithmetic`` (how, in words).
    Odd or missing facts leave fields out; this never raises.
    """
    out: dict[str, Any] = {}
    if not isinstance(facts, Mapping):
        return out
    for k, v in facts.items():
        if isinstance(k, str) and isinstance(v, (str, int, float)) and not isinstance(v, bool):
            out[k] = v
    host = _host(facts)
    if host is not None:
        out["gpus"] = len(host)
    elif _count(facts.get("gpus")) is not None:
        out["gpus"] = _count(facts.get("gpus"))
    cvd = _cvd(facts)
    if cvd is not None:
        vis = visibility(cvd, host)
        out["cuda_visible_devices"] = cvd
        out["visible_gpus"], out["visibility"], out["exposed"] = vis.count, vis.text, vis.text
    elif host is not None:
        vis = visibility(None, host)
        out["visible_gpus"], out["visibility"] = vis.count, vis.text
    elif "gpus" in out:
        n = out["gpus"]
        out["visible_gpus"], out["visibility"] = n, f"the host has {n} GPU{'s' if n != 1 else ''}"
    par = facts.get("parallel")
    if isinstance(par, Mapping):
        sizes = {k: _count(par.get(k)) for k in _SIZES}
        sizes = {k: v for k, v in sizes.items() if v}
        if sizes:
            out.update({k: sizes.get(k, 1) for k in _SIZES})
        out.update({k: _count(par.get(k)) for k in _OTHER_SIZES if _count(par.get(k))})
    n, arith = workers_of(facts)
    if n is not None:
        out["workers"], out["arithmetic"] = n, arith
    return out


_ORDINAL = re.compile(r"local rank (\d+) is out of bounds|invalid device ordinal", re.IGNORECASE)
_SIZE = r"([0-9]+(?:\.[0-9]+)?) ?([KMGT]i?B)"
_OOM_NEW = re.compile(
    r"Tried to allocate "
    + _SIZE
    + r"\. GPU (\d+) has a total capacity of "
    + _SIZE
    + r" of which "
    + _SIZE
    + r" is free"
)
_OOM_OLD = re.compile(
    r"Tried to allocate " + _SIZE + r" \(GPU (\d+); " + _SIZE + r" total capacity;"
    r"(?: " + _SIZE + r" already allocated;)? " + _SIZE + r" free"
)
_OOM_PROC = re.compile(r"Process (\d+) has " + _SIZE + r" memory in use")
_UNIT = {
    "KB": 1 / 1024**2,
    "KiB": 1 / 1024**2,
    "MB": 1 / 1024,
    "MiB": 1 / 1024,
    "GB": 1.0,
    "GiB": 1.0,
    "TB": 1024.0,
    "TiB": 1024.0,
}


def _gib(value: str, unit: str) -> float:
    return float(value) * _UNIT.get(unit, 1.0)


def refine_hint(decisive: Any, facts: Mapping[str, Any]) -> str | None:
    """The decisive error's hint with the host's numbers in it, or None to keep the rule's hint.

    For a GPU-ordinal error whose numbers the facts explain, and for an
    out-of-memory error; the sentence starts with the same arithmetic the
    rule's ``hint_facts`` would name (both come from :func:`fields`' engine).
    """
    if decisive is None or not isinstance(facts, Mapping):
        return None
    text = " ".join(x for x in (getattr(decisive, "message", ""), getattr(decisive, "line", "")) if x)
    tb = getattr(decisive, "traceback", None) or []
    if tb:
        text += " " + tb[-1]
    if _ORDINAL.search(text):
        return _ordinal_hint(text, facts)
    if _OOM_NEW.search(text) or _OOM_OLD.search(text) or (getattr(decisive, "category", "") == "oom" and _host(facts)):
        return _oom_hint(text, facts)
    return None


def _ordinal_hint(text: str, facts: Mapping[str, Any]) -> str | None:
    n, arith = workers_of(facts)
    gpus = _host(facts)
    cvd = _cvd(facts)
    m = re.search(r"local rank (\d+)", text)
    rank = int(m.group(1)) if m else None
    if cvd is not None:
        vis = visibility(cvd, gpus)
        if vis.count is None:
            return None
        if n is not None:
            if n <= vis.count:
                return None  # the facts do not explain it (another run's environment?): keep the rule's hint
            return f"{arith}, but {vis.text}" + _fix(n, vis, gpus, facts.get("parallel"))
        if rank is not None:
            return f"local rank {rank} needs at least {rank + 1} GPUs, but {vis.text}: lower the parallel sizes or expose more GPUs"
        return None
    if n is None:
        if gpus and rank is not None:
            return (
                f"local rank {rank} needs at least {rank + 1} GPUs; the host has {len(gpus)}: "
                "check CUDA_VISIBLE_DEVICES and the parallel sizes"
            )
        return None
    if gpus and n > len(gpus):
        return f"{arith}, but the host has {len(gpus)} GPU{'s' if len(gpus) != 1 else ''}: lower the parallel sizes"
    if gpus:
        return (
            f"{arith} and the host has {len(gpus)} GPUs, so the launch saw fewer than {n}: "
            "check CUDA_VISIBLE_DEVICES in its environment"
        )
    if rank is not None:
        return (
            f"{arith}, but local rank {rank} had no GPU, so at most {rank} were visible: "
            f"expose {n} GPUs in CUDA_VISIBLE_DEVICES or lower the parallel sizes"
        )
    return f"{arith}, but fewer GPUs were visible: expose {n} GPUs in CUDA_VISIBLE_DEVICES or lower the parallel sizes"


def _fix(n: int, vis: Visibility, gpus: Sequence[Mapping[str, Any]] | None, parallel: Any) -> str:
    """What would make the numbers agree."""
    par = parallel if isinstance(parallel, Mapping) else {}
    host = len(gpus or [])
    bits = []
    if host >= n:
        idle = [i for i in (gpu_index(g) for g in gpus or [] if not g.get("processes")) if i is not None]
        pick = (vis.indices + [i for i in idle if i not in vis.indices])[:n] if len(idle) >= n else list(range(n))
        bits.append(f"expose {n} (e.g. CUDA_VISIBLE_DEVICES={','.join(map(str, pick))})")
    tp, dp, pp = _count(par.get("tp")), _count(par.get("dp")), _count(par.get("pp")) or 1
    if vis.count and tp and dp and dp > 1 and tp * pp <= vis.count:
        bits.append(f"use DP {max(1, vis.count // (tp * pp))} with TP {tp}")
    elif vis.count:
        bits.append(f"lower the parallel sizes to {vis.count} workers")
    return (": " + " or ".join(bits)) if bits else ""


def _oom_hint(text: str, facts: Mapping[str, Any]) -> str | None:
    gpus = {i: g for g in _host(facts) or [] if (i := gpu_index(g)) is not None}
    cvd = _cvd(facts)
    vis = visibility(cvd, list(gpus.values())) if cvd is not None else None
    m = _OOM_NEW.search(text)
    asked = total = free = None
    dev = None
    if m:
        asked, dev, total, free = (
            _gib(m.group(1), m.group(2)),
            int(m.group(3)),
            _gib(m.group(4), m.group(5)),
            _gib(m.group(6), m.group(7)),
        )
    else:
        m = _OOM_OLD.search(text)
        if m:
            asked, dev, total = _gib(m.group(1), m.group(2)), int(m.group(3)), _gib(m.group(4), m.group(5))
            free = _gib(m.group(8), m.group(9))
    parts: list[str] = []
    phys = None
    if dev is not None and asked is not None and total is not None and free is not None:
        if vis is not None:
            phys = vis.indices[dev] if dev < len(vis.indices) else None
        elif str(facts.get("cuda_visible_devices_source", "")).startswith("unset"):
            phys = dev
        where = f"GPU {dev}" + (
            f" (host GPU {phys}, CUDA_VISIBLE_DEVICES={cvd})"
            if vis is not None and phys is not None and phys != dev
            else ""
        )
        parts.append(f"{where}: {gib(free)} free of {gib(total)}, asked {gib(asked)}")
        # each process once: the same OOM message is often logged by several ranks (#25)
        others = list(dict.fromkeys(f"process {p} holds {gib(_gib(v, u))}" for p, v, u in _OOM_PROC.findall(text)))
        if asked > total:
            parts.append("more than the whole GPU: shard the model (raise TP/PP) or shrink batch / sequence length")
        elif others:
            parts.append(", ".join(others[:3]))
    busy = []
    for i, g in sorted(gpus.items()):
        if phys is not None and i != phys:
            continue
        for p in g.get("processes") or []:
            if isinstance(p, Mapping) and p.get("used_mib"):
                cmd = str(p.get("cmdline") or p.get("name") or "").strip()
                busy.append(f"GPU {i}: pid {p.get('pid')} {cmd[:60]} holds {mib(p['used_mib'])}")
    if busy:
        parts.append("nvidia-smi now: " + "; ".join(busy[:3]))
    return "; ".join(parts) if parts else None
