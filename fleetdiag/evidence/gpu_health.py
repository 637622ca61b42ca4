"""GPU health from ``nvidia-smi --query-gpu --format=csv`` and from the errors nvidia-smi prints.

Field names differ across drivers (``clocks_throttle_reasons.*`` before 535, ``clocks_event_reasons.*`` after);
both are read. "[N/A]" and "[Not Supported]" mean unknown, never zero.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .kernel import bus_key

_LOST = re.compile(
    r"Unable to determine the device handle for GPU\s*(?P<bus>[0-9A-Fa-f:.]+)?|GPU is lost|"
    r"(?P<bus2>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)[^\n]*GPU is lost"
)

# clocks_event_reasons.active bit mask (nvml.h): the reasons that mean the hardware is holding the clocks down
_MASK_BITS = {
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}


@dataclass
class GpuHealth:
    """One GPU's health; ``faults`` are plain phrases, ``degrading`` the ones that make the host degraded."""

    index: int | None = None
    bus: str | None = None  # bus key 'bb:dd'
    bus_id: str | None = None  # as nvidia-smi printed it
    uuid: str | None = None
    lost: bool = False
    ecc_uncorrected_volatile: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    clock_reasons: list[str] = field(default_factory=list)
    pcie_gen: tuple[int | None, int | None] = (None, None)  # current, max
    pcie_width: tuple[int | None, int | None] = (None, None)
    faults: list[str] = field(default_factory=list)
    degrading: list[str] = field(default_factory=list)
    recovery_action: str | None = None  # nvidia-smi -q's 'GPU Recovery Action' when it asks for one


def _val(v: str | None) -> str | None:
    if v is None:
        return None
    v = v.strip()
    if not v or v.startswith("[") or v.lower() in ("n/a", "not supported", "unknown error"):
        return None
    return v


def _int(v: str | None) -> int | None:
    v = _val(v)
    if v is None:
        return None
    m = re.match(r"-?\d+", v)
    return int(m.group()) if m else None


def _bool(v: str | None) -> bool | None:
    v = _val(v)
    if v is None:
        return None
    lv = v.lower()
    if lv in ("yes", "active", "true", "enabled"):
        return True
    if lv in ("no", "not active", "false", "disabled"):
        return False
    n = _int(v)
    return None if n is None else n > 0


def _field(name: str) -> str:
    """'clocks_throttle_reasons.hw_slowdown [x]' -> 'clocks_reasons.hw_slowdown'."""
    n = name.strip().split(" [")[0].strip().lower()
    return n.replace("clocks_throttle_reasons.", "clocks_reasons.").replace("clocks_event_reasons.", "clocks_reasons.")


def parse_health(lines: list[str] | str) -> list[GpuHealth]:
    """Per-GPU health from the CSV (with its header) and any lost-GPU messages mixed into the output."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    gpus: list[GpuHealth] = []
    header: list[str] | None = None
    lost: list[str | None] = []
    for raw in lines:
        m = _LOST.search(raw)
        if m:
            lost.append(bus_key(m.group("bus") or m.group("bus2")))
            continue
        cells = [c.strip() for c in raw.split(",")]
        if header is None:
            if any(c.lower().startswith(("index", "pci.bus_id", "uuid")) for c in cells):
                header = [_field(c) for c in cells]
            continue
        if len(cells) != len(header):
            continue
        row = dict(zip(header, cells))
        g = GpuHealth(index=_int(row.get("index")), bus_id=_val(row.get("pci.bus_id")), uuid=_val(row.get("uuid")))
        g.bus = bus_key(g.bus_id)
        g.ecc_uncorrected_volatile = _int(row.get("ecc.errors.uncorrected.volatile.total"))
        g.retired_pages_pending = _bool(row.get("retired_pages.pending"))
        g.remapped_rows_pending = _bool(row.get("remapped_rows.pending"))
        g.remapped_rows_failure = _bool(row.get("remapped_rows.failure"))
        for k, v in row.items():
            if k.startswith("clocks_reasons.") and k != "clocks_reasons.active" and _bool(v):
                g.clock_reasons.append(k.split(".", 1)[1])
        mask = _val(row.get("clocks_reasons.active"))
        if mask and mask.lower().startswith("0x"):
            bits = int(mask, 16)
            g.clock_reasons += [n for b, n in _MASK_BITS.items() if bits & b and n not in g.clock_reasons]
        g.pcie_gen = (_int(row.get("pcie.link.gen.current")), _int(row.get("pcie.link.gen.max")))
        g.pcie_width = (_int(row.get("pcie.link.width.current")), _int(row.get("pcie.link.width.max")))
        if g.index is None and _val(row.get("index")) is None and g.bus is None and g.uuid is None:
            g.lost = True  # a row of unknowns: nvidia-smi reached the GPU list but not the GPU
        gpus.append(g)
    for b in lost:
        hit = next((g for g in gpus if b and g.bus == b), None)
        if hit is None:
            hit = GpuHealth(bus=b, bus_id=b)
            gpus.append(hit)
        hit.lost = True
    for g in gpus:
        _judge(g)
    return gpus


def _judge(g: GpuHealth) -> None:
    if g.lost:
        g.degrading.append("GPU lost: nvidia-smi cannot reach it")
    if g.ecc_uncorrected_volatile:
        g.degrading.append(f"{g.ecc_uncorrected_volatile} uncorrectable ECC errors (volatile)")
    if g.remapped_rows_failure:
        g.degrading.append("row remapping failed")
    if g.recovery_action:
        g.degrading.append(f"the driver asks for: {g.recovery_action}")
    cur, mx = g.pcie_width
    if cur is not None and mx is not None and 0 < cur < mx:
        g.degrading.append(f"PCIe link width x{cur} of x{mx}")
    g.faults = list(g.degrading)
    if g.retired_pages_pending:
        g.faults.append("retired pages pending (reset to activate)")
    if g.remapped_rows_pending:
        g.faults.append("remapped rows pending (reset to activate)")
    for r in g.clock_reasons:
        if r.startswith("hw_") or r == "sw_thermal_slowdown":
            g.faults.append(f"clocks held down: {r.replace('_', ' ')}")
    gc, gm = g.pcie_gen
    if gc is not None and gm is not None and 0 < gc < gm:
        g.faults.append(f"PCIe gen {gc} of {gm} (normal when idle)")


def degraded(gpus: list[GpuHealth]) -> list[str]:
    """Why a host is degraded (lost GPU, uncorrectable ECC, remap failure, narrower link); empty when it is not."""
    out = []
    for g in gpus:
        name = f"GPU {g.index}" if g.index is not None else f"GPU {g.bus_id or '?'}"
        out += [f"{name}: {d}" for d in g.degrading]
    return out


def is_degraded(gpus: list[GpuHealth]) -> bool:
    return bool(degraded(gpus))


# ------------------------------------------------------------------ nvidia-smi's other outputs (a ticket's attachments)

_Q_GPU = re.compile(r"^GPU (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$")
_Q_KV = re.compile(r"^(?P<indent> *)(?P<key>[^:]+?)\s*:\s*(?P<val>.*?)\s*$")
_TABLE_ROW = re.compile(
    r"^\|\s+(?P<index>\d+)\s+\S.*?\|\s+(?P<bus>[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s+\w+\s+\|"
    r"\s+(?P<ecc>\d+|N/A)\s+\|"
)
_REASONS = {
    "hw slowdown": "hw_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power brake slowdown": "hw_power_brake_slowdown",
    "sw thermal slowdown": "sw_thermal_slowdown",
}


def parse_smi_text(text: str) -> list[GpuHealth]:
    """GPU health from whatever nvidia-smi output a ticket carries: ``--query-gpu`` CSV (with its header),
    ``nvidia-smi -q`` text (sections per GPU), the plain table (index, bus id, volatile uncorrectable ECC),
    and the errors it prints for a GPU it cannot reach. Parts of several may be pasted together."""
    lines = text.splitlines()
    if any(re.match(r"\s*(?:index|pci\.bus_id|uuid)\b", ln) for ln in lines):
        return parse_health(lines)
    gpus: list[GpuHealth] = []
    by_bus: dict[str, GpuHealth] = {}

    def gpu_for(bus_id: str) -> GpuHealth:
        key = bus_key(bus_id) or bus_id
        if key not in by_bus:
            g = GpuHealth(bus=bus_key(bus_id), bus_id=bus_id)
            by_bus[key] = g
            gpus.append(g)
        return by_bus[key]

    for ln in lines:
        m = _TABLE_ROW.match(ln)
        if m:
            g = gpu_for(m["bus"])
            g.index = int(m["index"])
            if m["ecc"].isdigit():
                g.ecc_uncorrected_volatile = int(m["ecc"])
    _parse_q(lines, gpu_for)
    lost = parse_health([ln for ln in lines if _LOST.search(ln)])
    for lg in lost:
        hit = next((g for g in gpus if lg.bus and g.bus == lg.bus), None)
        if hit is None:
            gpus.append(lg)
        else:
            hit.lost = True
    for g in gpus:
        g.faults, g.degrading = [], []
        _judge(g)
    return gpus


def _parse_q(lines: list[str], gpu_for: Any) -> None:
    """``nvidia-smi -q``: 'GPU 00000000:55:00.0' opens a GPU; the keys below it nest by four spaces."""
    g: GpuHealth | None = None
    path: list[str] = []
    order = 0
    vol_ecc: int | None = None
    for raw in lines:
        m = _Q_GPU.match(raw)
        if m:
            _close_ecc(g, vol_ecc)
            g, path, vol_ecc = gpu_for(m["bus"]), [], None
            if g.index is None:
                g.index = order
            order += 1
            continue
        if g is None or not raw.startswith("    "):
            continue
        kv = _Q_KV.match(raw)
        indent = len(raw) - len(raw.lstrip(" "))
        path = path[: indent // 4 - 1]
        if kv is None or not kv["val"]:  # a section heading
            path.append((kv["key"] if kv else raw).strip())
            continue
        key, val = kv["key"].strip(), kv["val"]
        where = " > ".join([*path, key]).lower()
        k = key.lower()
        if k == "gpu uuid":
            g.uuid = val
        elif where.startswith("ecc errors > volatile") and (
            "uncorrectable" in k or (k == "total" and "double bit" in where)
        ):
            n = _int(val)
            if n is not None:
                vol_ecc = (vol_ecc or 0) + n
        elif where.startswith("retired pages") and k.startswith("pending"):
            g.retired_pages_pending = _bool(val)
        elif where.startswith("remapped rows") and k == "pending":
            g.remapped_rows_pending = _bool(val)
        elif where.startswith("remapped rows") and k.startswith("remapping failure"):
            g.remapped_rows_failure = _bool(val)
        elif "pcie generation" in where and k in ("max", "current"):
            cur, mx = g.pcie_gen
            g.pcie_gen = (_int(val), mx) if k == "current" else (cur, _int(val))
        elif "link width" in where and k in ("max", "current"):
            cur, mx = g.pcie_width
            g.pcie_width = (_int(val), mx) if k == "current" else (cur, _int(val))
        elif (
            path
            and path[0].lower() in ("clocks event reasons", "clocks throttle reasons")
            and k in _REASONS
            and _bool(val)
        ):
            g.clock_reasons.append(_REASONS[k])
        elif k == "gpu recovery action" and val.lower() not in ("none", "n/a"):
            g.recovery_action = val
    _close_ecc(g, vol_ecc)


def _close_ecc(g: GpuHealth | None, vol_ecc: int | None) -> None:
    if g is not None and vol_ecc is not None:
        g.ecc_uncorrected_volatile = vol_ecc
