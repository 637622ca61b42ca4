"""What the node already knows about the job: its processes' rank variables, torchelastic error files,
PyTorch Flight Recorder dumps (``remote/node.sh``, the probe's own trip), and NCCL RAS (the second trip).

Everything here is host data: parsed, bounded, never executed. A Flight Recorder dump is a pickle; it is read
with an unpickler that builds only plain containers (dict, list, tuple, str, bytes, numbers, bool, None) and
refuses every class, so a hostile file can make at most a refusal, never a call. Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .. import remote
from ..redact import redact_cmdline

SCRIPT = remote.load("node.sh")
MAX_PROCS = 16
MAX_FILES = 8
ERR_BYTES = 64 * 1024
FR_BYTES = 2 * 1024 * 1024
TOTAL_BYTES = 3 * 1024 * 1024  # of all files one probe sends (base64: 4 MiB of the 8 MiB output cap)
FR_ENTRIES = 4096  # entries of one dump looked at (its last ones)
DEFAULT_FR_PREFIX = "/tmp/nccl_trace_rank_"
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def script_vars(fr_prefix: str | None = None) -> dict[str, object]:
    """The variables remote/node.sh reads (the funnel quotes and exports each)."""
    return {
        "FD_NODE_PROCS": MAX_PROCS,
        "FD_NODE_FILES": MAX_FILES,
        "FD_NODE_ERRB": ERR_BYTES,
        "FD_NODE_FRB": FR_BYTES,
        "FD_NODE_TOTAL": TOTAL_BYTES,
        "FD_NODE_FR": fr_prefix or "",
    }


def _text(v: Any, cap: int = 300) -> str:
    s = _CTRL.sub(" ", str(v))
    return s if len(s) <= cap else s[:cap] + " …"


# ---------------------------------------------------------------- the restricted unpickler


class RefusedPickle(ValueError):
    """The dump asked for something other than plain containers."""


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings, bytes, numbers, bools and None; refuses every global (no class is
    ever looked up, so no constructor or reducer can run) and every persistent id."""

    def find_class(self, module: str, name: str) -> Any:
        raise RefusedPickle(f"the dump names {_text(module, 60)}.{_text(name, 60)}: not read (plain data only)")

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickle("the dump refers to a persistent object: not read")


def load_plain(data: bytes) -> Any:
    """A pickle's plain data, or RefusedPickle / ValueError."""
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except RefusedPickle:
        raise
    except (pickle.UnpicklingError, EOFError, IndexError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise ValueError(f"not a readable pickle: {type(e).__name__}") from None
    except MemoryError:
        raise ValueError("not a readable pickle: too large") from None


# ---------------------------------------------------------------- Flight Recorder


@dataclass
class FlightRecord:
    """One rank's Flight Recorder dump: where its collectives stood when it was written."""

    path: str
    rank: int | None
    world: int | None = None
    version: str | None = None
    fmt: str = "pickle"  # pickle | json
    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None
    op: str | None = None  # the last entry's profiling name (nccl:all_reduce)
    state: str | None = None  # the last entry's state
    entries: int = 0
    mtime: float | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "rank": self.rank,
            "world": self.world,
            "version": self.version,
            "format": self.fmt,
            "last_enqueued": self.last_enqueued,
            "last_started": self.last_started,
            "last_completed": self.last_completed,
            "op": self.op,
            "state": self.state,
            "entries": self.entries,
            "mtime": self.mtime,
            **({"error": self.error} if self.error else {}),
        }

    def text(self) -> str:
        """'rank 1: enqueued #5, completed #5 (gloo:all_reduce)'."""
        if self.error:
            return f"{self.path}: {self.error}"
        who = f"rank {self.rank}" if self.rank is not None else self.path
        bits = [f"enqueued #{self.last_enqueued}" if self.last_enqueued is not None else None]
        if self.last_started is not None and self.last_started >= 0:
            bits.append(f"started #{self.last_started}")
        if self.last_completed is not None:
            bits.append(f"completed #{self.last_completed}")
        return f"{who}: " + ", ".join(b for b in bits if b) + (f" ({self.op})" if self.op else "")


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, (str, bytes)) and re.fullmatch(rb"-?\d{1,18}" if isinstance(v, bytes) else r"-?\d{1,18}", v):
        return int(v)
    return None


def _rank_from_path(path: str) -> int | None:
    m = re.search(r"(\d+)(?:\.json|\.pkl|\.pickle)?$", path)
    return int(m.group(1)) if m else None


def parse_flight_recorder(data: bytes, path: str = "", mtime: float | None = None) -> FlightRecord:
    """One dump (pickle as torch writes it by default, or its JSON form) into a FlightRecord.

    The collectives' state comes from ``pg_status`` of the default group (last enqueued/started/completed),
    else from the entries' ``collective_seq_id`` and ``state``. The rank is the dump file's number (torch
    names it ``PREFIX<rank>``); the world, the default group's ``ranks``.
    """
    rec = FlightRecord(path=path, rank=_rank_from_path(path), mtime=mtime)
    try:
        if data[:1] in (b"{", b"["):
            rec.fmt = "json"
            doc = json.loads(data.decode("utf-8", "replace"))
        else:
            doc = load_plain(data)
    except (ValueError, RecursionError) as e:
        rec.error = _text(e, 160)
        return rec
    if not isinstance(doc, dict):
        rec.error = "not a Flight Recorder dump (no mapping at its top)"
        return rec
    doc = {(k.decode("utf-8", "replace") if isinstance(k, bytes) else k): v for k, v in doc.items()}
    rec.version = _text(doc.get("version"), 20) if doc.get("version") is not None else None
    entries = doc.get("entries")
    if not isinstance(entries, list):
        entries = []
    rec.entries = len(entries)
    status = doc.get("pg_status")
    pg = None
    if isinstance(status, dict) and status:
        pg = status.get("0") if isinstance(status.get("0"), dict) else next(iter(status.values()))
    if isinstance(pg, dict):
        rec.last_enqueued = _int(pg.get("last_enqueued_collective"))
        rec.last_started = _int(pg.get("last_started_collective"))
        rec.last_completed = _int(pg.get("last_completed_collective"))
    tail = [e for e in entries[-FR_ENTRIES:] if isinstance(e, dict)]
    if tail:
        last = tail[-1]
        rec.op = _text(last.get("profiling_name"), 80) if last.get("profiling_name") else None
        rec.state = _text(last.get("state"), 20) if last.get("state") else None
        if rec.last_enqueued is None:
            seqs = [s for e in tail if (s := _int(e.get("collective_seq_id"))) is not None]
            rec.last_enqueued = max(seqs) if seqs else None
            done = [
                s
                for e in tail
                if (s := _int(e.get("collective_seq_id"))) is not None and str(e.get("state")) == "completed"
            ]
            rec.last_completed = max(done) if done else None
    cfg = doc.get("pg_config")
    if isinstance(cfg, dict):
        for v in cfg.values():
            ranks = v.get("ranks") if isinstance(v, dict) else None
            if isinstance(ranks, str):
                nums = re.findall(r"\d+", ranks[:100_000])
                if nums:
                    rec.world = len(nums)
                    break
            elif isinstance(ranks, list):
                rec.world = len(ranks)
                break
    if rec.last_enqueued is None and not rec.error:
        rec.error = "no collective in the dump"
    return rec


# ---------------------------------------------------------------- torchelastic error files


@dataclass
class ErrorFile:
    """A rank's torchelastic error file (``@record``): its exception and when it was raised."""

    path: str
    message: str | None = None
    time: str | None = None  # ISO 8601 UTC
    timestamp: float | None = None
    last_frame: str | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "message": self.message,
            "time": self.time,
            "timestamp": self.timestamp,
            "last_frame": self.last_frame,
            **({"error": self.error} if self.error else {}),
        }


def parse_error_file(data: bytes, path: str = "") -> ErrorFile:
    """torchelastic's error JSON: ``{"message": {"message": …, "extraInfo": {"py_callstack": …, "timestamp": …}}}``
    (or a plain ``message`` string). Only the message's last line, the time and the innermost frame are kept."""
    out = ErrorFile(path=path)
    try:
        doc = json.loads(data.decode("utf-8", "replace"))
    except ValueError:
        out.error = "not JSON"
        return out
    msg = doc.get("message") if isinstance(doc, dict) else None
    info: dict[str, Any] = {}
    if isinstance(msg, dict):
        info = msg.get("extraInfo") if isinstance(msg.get("extraInfo"), dict) else {}
        msg = msg.get("message")
    if not isinstance(msg, str) or not msg.strip():
        out.error = "no message in it"
        return out
    lines = [ln for ln in msg.strip().splitlines() if ln.strip()]
    out.message = _text(lines[-1].strip() if lines else msg, 400)
    ts = _int(info.get("timestamp"))
    if ts is not None and 0 < ts < 10**11:
        out.timestamp = float(ts)
        out.time = datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")
    stack = info.get("py_callstack")
    if isinstance(stack, str):
        frames = re.findall(r'File "([^"\n]{1,300})", line (\d+), in ([^\n]{1,100})', stack[-20000:])
        if frames:
            f, ln, fn = frames[-1]
            out.last_frame = _text(f"{fn.strip()} ({f.rsplit('/', 1)[-1]}:{ln})", 200)
    return out


# ---------------------------------------------------------------- the records of remote/node.sh


@dataclass
class NodeFacts:
    procs: list[dict[str, Any]] = field(default_factory=list)
    error_files: list[ErrorFile] = field(default_factory=list)
    flight_recorder: list[FlightRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "procs": self.procs,
            "error_files": [e.to_json() for e in self.error_files],
            "flight_recorder": [d.to_json() for d in self.flight_recorder],
            "notes": self.notes,
        }


_ENV_OK = re.compile(r"^[A-Z][A-Z0-9_]{0,40}$")


def _proc(rest: str) -> dict[str, Any] | None:
    m = re.match(r"pid=(\d+) ppid=(\S+) state=(\S+) env=(\S*) cmd=(.*)$", rest)
    if not m:
        return None
    env: dict[str, str] = {}
    for kv in m.group(4).split(","):
        k, eq, v = kv.partition("=")
        if eq and _ENV_OK.match(k) and len(env) < 40:
            env[k] = _text(v, 256)
    return {
        "pid": int(m.group(1)),
        "ppid": int(m.group(2)) if m.group(2).isdigit() else None,
        "state": _text(m.group(3), 4),
        "env": env,
        "cmdline": redact_cmdline(_text(m.group(5).strip(), 512)),  # an --api-key never reaches a report
    }


def parse_node(records: list[str] | None) -> dict[str, Any] | None:
    """``facts["node"]`` from remote/node.sh's ``N`` records (None when it said nothing)."""
    if not records:
        return None
    nf = NodeFacts()
    files: dict[str, tuple[str, float | None, str]] = {}  # id -> kind, mtime, path
    chunks: dict[str, list[str]] = {}
    hexes: dict[str, list[str]] = {}
    budget = 2 * MAX_FILES * FR_BYTES
    for rec in records:
        kind, _, rest = rec.partition("\t")
        if kind == "proc" and len(nf.procs) < MAX_PROCS:
            p = _proc(rest)
            if p is not None and all(q["pid"] != p["pid"] for q in nf.procs):
                nf.procs.append(p)
        elif kind == "file" and len(files) < 2 * MAX_FILES:
            parts = rest.split("\t", 4)
            if len(parts) == 5 and parts[1] in ("errfile", "fr"):
                fid, fk, _size, mt, path = parts
                files[fid] = (fk, float(mt) if mt.isdigit() else None, _text(path, 400))
        elif kind in ("b64", "hex"):
            fid, _, data = rest.partition("\t")
            if fid in files and budget > 0:
                budget -= len(data)
                (chunks if kind == "b64" else hexes).setdefault(fid, []).append(data.strip())
        elif kind == "note" and len(nf.notes) < 16:
            nf.notes.append(_text(rest, 300))
    for fid, (fk, mt, path) in files.items():
        try:
            if fid in chunks:
                data = base64.b64decode("".join(chunks[fid]), validate=False)
            elif fid in hexes:
                data = binascii.unhexlify("".join(hexes[fid]))
            else:
                continue
        except (ValueError, binascii.Error):
            nf.notes.append(f"{path}: its bytes arrived garbled")
            continue
        if fk == "errfile":
            nf.error_files.append(parse_error_file(data[:ERR_BYTES], path))
        else:
            nf.flight_recorder.append(parse_flight_recorder(data[:FR_BYTES], path, mt))
    _dedupe_ranks(nf)
    return nf.to_json()


def _dedupe_ranks(nf: NodeFacts) -> None:
    """One dump per rank (torch may write both the pickle and its JSON): the readable one, the newer."""
    best: dict[Any, FlightRecord] = {}
    for d in nf.flight_recorder:
        key = d.rank if d.rank is not None else d.path
        cur = best.get(key)
        if cur is None or (cur.error and not d.error) or (not d.error and (d.mtime or 0) > (cur.mtime or 0)):
            best[key] = d
    nf.flight_recorder = sorted(best.values(), key=lambda d: (d.rank is None, d.rank or 0, d.path))


def rows(node: dict[str, Any] | None, rank: int | None = None) -> list[tuple[str, str]]:
    """The card's rows: the error file(s), the Flight Recorder dumps, the job's processes."""
    if not isinstance(node, dict):
        return []
    out: list[tuple[str, str]] = []
    for e in node.get("error_files") or []:
        if not isinstance(e, dict):
            continue
        if e.get("message"):
            txt = str(e["message"]) + (f" · at {e['time']}" if e.get("time") else "")
            txt += f" · in {e['last_frame']}" if e.get("last_frame") else ""
            out.append(("error file", f"{txt} ({e.get('path')})"))
        elif e.get("error"):
            out.append(("error file", f"{e.get('path')}: {e['error']}"))
    dumps = [d for d in node.get("flight_recorder") or [] if isinstance(d, dict)]
    if dumps:
        for i, d in enumerate(dumps[:4]):
            rec = FlightRecord(
                path=str(d.get("path")),
                rank=d.get("rank"),
                last_enqueued=d.get("last_enqueued"),
                last_started=d.get("last_started"),
                last_completed=d.get("last_completed"),
                op=d.get("op"),
                error=d.get("error"),
            )
            out.append(("flight rec." if i == 0 else "", rec.text()))
        if len(dumps) > 4:
            out.append(("", f"… {len(dumps) - 4} more dumps (see --json)"))
    procs = [p for p in node.get("procs") or [] if isinstance(p, dict)]
    ranked = [p for p in procs if (p.get("env") or {}).get("RANK")]
    if ranked:
        bits = []
        for p in ranked[:4]:
            env = p["env"]
            bits.append(
                f"pid {p['pid']} rank {env.get('RANK')}"
                + (f"/{env['WORLD_SIZE']}" if env.get("WORLD_SIZE") else "")
                + (f" via {env['MASTER_ADDR']}:{env.get('MASTER_PORT', '?')}" if env.get("MASTER_ADDR") else "")
            )
        out.append(("job procs", "; ".join(bits) + (f"; … {len(ranked) - 4} more" if len(ranked) > 4 else "")))
    return out
