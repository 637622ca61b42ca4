"""nvidia-smi output as GPUs and compute processes, every row checked before it counts.

nvidia-smi is a remote tool whose output can be anything (a wrapper's
banner, a half-loaded driver's message, a hostile host): a row becomes a GPU
only when its index is a small number seen once, its UUID looks like one and
its memory figures are numbers that fit. Rejected rows are returned so the
caller can say the output was not understood rather than count GPUs that do
not exist.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

GPU_QUERY = ("index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu")
APP_QUERY = ("pid", "process_name", "used_memory", "gpu_uuid")
MAX_GPUS = 64  # the funnel reads at most 64 GPU lines; a larger index is not a GPU of one host
MAX_MIB = 16 * 1024 * 1024  # 16 TiB: far above any GPU, far below garbage digits


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
_HEADER_ALIASES = {
    "used_gpu_memory": "used_memory",
    "name": "name",
    "gpu_name": "name",
    "gpu_uuid": "gpu_uuid",
    "process_name": "process_name",
}
_UUID = re.compile(r"^(?:GPU|MIG)-[0-9A-Za-z-]{1,64}$")


def _strict(value: str | None, unit: str = "") -> tuple[bool, int | None]:
    """(readable, number): a number with an optional unit, or N/A; anything else is not readable."""
    v = (value or "").strip()
    if v.lower() in _NA:
        return True, None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*" + (f"(?:{re.escape(unit)})?" if unit else ""), v)
    if not m:
        return False, None
    return True, round(float(m.group(1)))


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
            parts = parts[:i] + [", ".join(parts[i : len(parts) - tail])] + parts[len(parts) - tail :]
        rows.append({**dict(zip(names, parts)), "_line": ln})
    return rows


def read_gpu_csv(text: str, columns: Sequence[str] = GPU_QUERY) -> tuple[list[Gpu], list[str]]:
    """(GPUs, rejected lines) from ``nvidia-smi --query-gpu=… --format=csv[,noheader][,nounits]``.

    A line is a GPU only when every queried field is there and readable: a
    whole-number index below :data:`MAX_GPUS` not seen before, a UUID of
    the ``GPU-…`` shape (or N/A), memory in MiB no larger than the total,
    utilisation 0–100. Everything else is returned as rejected.
    """
    gpus: list[Gpu] = []
    bad: list[str] = []
    seen: set[int] = set()
    for row in _csv_rows(text, columns):
        gpu = _gpu_row(row, columns)
        if gpu is None or gpu.index in seen:
            bad.append(row["_line"])
            continue
        seen.add(gpu.index)
        gpus.append(gpu)
    return gpus, bad


def _gpu_row(row: Mapping[str, str], columns: Sequence[str]) -> Gpu | None:
    if any(c not in row for c in columns):
        return None  # too few fields
    idx = row.get("index", "").strip()
    if not idx.isdigit() or int(idx) >= MAX_GPUS:
        return None
    uuid = (row.get("uuid") or "").strip()
    if uuid.lower() in _NA:
        uuid = ""
    elif not _UUID.match(uuid):
        return None
    ok_used, used = _strict(row.get("memory.used"), "MiB")
    ok_total, total = _strict(row.get("memory.total"), "MiB")
    ok_util, util = _strict(row.get("utilization.gpu"), "%")
    if not (ok_used and ok_total and ok_util):
        return None
    if (total is not None and (total <= 0 or total > MAX_MIB)) or (used is not None and used > (total or MAX_MIB)):
        return None
    if util is not None and util > 100:
        return None
    name = (row.get("name") or "").strip()
    if "name" in columns and not name:
        return None
    return Gpu(
        index=int(idx), name=name, uuid=uuid or None, memory_used_mib=used, memory_total_mib=total, utilization_pct=util
    )


def parse_gpu_csv(text: str, columns: Sequence[str] = GPU_QUERY) -> list[Gpu]:
    """``nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu --format=csv[,noheader][,nounits]``.

    Only rows that pass :func:`read_gpu_csv`'s checks.
    """
    return read_gpu_csv(text, columns)[0]


def parse_apps_csv(text: str, columns: Sequence[str] = APP_QUERY) -> list[GpuProcess]:
    """``nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv[,noheader][,nounits]``.

    A row needs a positive whole-number pid; its GPU UUID, when not of the
    ``GPU-…`` shape, joins no GPU.
    """
    out = []
    for row in _csv_rows(text, columns):
        pid = row.get("pid", "").strip()
        if not pid.isdigit() or int(pid) == 0:
            continue
        uuid = (row.get("gpu_uuid") or "").strip()
        ok, used = _strict(row.get("used_memory"), "MiB")
        out.append(
            GpuProcess(
                pid=int(pid),
                name=row.get("process_name", ""),
                used_mib=used if ok else None,
                gpu_uuid=uuid if _UUID.match(uuid) else None,
            )
        )
    return out


_L_RE = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)\s*$")


def parse_smi_list(text: str) -> list[Gpu]:
    """``nvidia-smi -L``: index, name and UUID (MIG lines are skipped; a repeated index counts once)."""
    out: list[Gpu] = []
    for ln in text.splitlines():
        m = _L_RE.match(ln.strip())
        if (
            m
            and int(m.group(1)) < MAX_GPUS
            and _UUID.match(m.group(3))
            and all(g.index != int(m.group(1)) for g in out)
        ):
            out.append(Gpu(index=int(m.group(1)), name=m.group(2), uuid=m.group(3)))
    return out


_T_GPU = re.compile(r"^\|\s+(\d+)\s+(.+?)\s+(?:On|Off)\s+\|")
_T_MEM = re.compile(r"(\d+)MiB\s*/\s*(\d+)MiB")
_T_UTIL = re.compile(r"\|\s*(\d+)%\s+\S+\s*\|")
_T_PROC = re.compile(
    r"^\|\s+(\d+)\s+(?:(?:N/A|\d+)\s+(?:N/A|\d+)\s+)?(\d+)\s+(?:C\+G|M\+C|C|G|M)\s+(.+?)\s+(\d+)MiB\s*\|"
)


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
        if (
            m
            and not ln.startswith("| GPU ")
            and int(m.group(1)) < MAX_GPUS
            and all(g.index != int(m.group(1)) for g in gpus)
        ):
            cur = Gpu(index=int(m.group(1)), name=m.group(2).strip())
            gpus.append(cur)
            continue
        if cur is not None:
            mm = _T_MEM.search(ln)
            if mm and cur.memory_total_mib is None:
                cur.memory_used_mib, cur.memory_total_mib = int(mm.group(1)), int(mm.group(2))
                mu = _T_UTIL.search(ln[mm.end() :])
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
